/** @module The thresholds both window laws share (CONCUR's β, U_low, U_high, H_low), checked in one place. */

/** β and the thresholds of a window law. */
export interface WindowThresholds {
  decrease: number;
  kvLow: number;
  kvHigh: number;
  hitLow: number;
}

/** Throws a `RangeError` naming the law and the value when a threshold is out of range. */
export function checkWindowThresholds(law: string, o: WindowThresholds): void {
  if (!(typeof o.decrease === "number" && o.decrease > 0 && o.decrease < 1)) {
    throw new RangeError(`${law} decrease should be in (0, 1), got ${o.decrease}`);
  }
  for (const name of ["kvLow", "kvHigh", "hitLow"] as const) checkRatio(law, name, o[name]);
  if (o.kvLow > o.kvHigh) {
    throw new RangeError(`${law} kvLow (${o.kvLow}) should not exceed kvHigh (${o.kvHigh})`);
  }
}

/** Throws a `RangeError` unless `value` is a ratio in [0, 1]. */
export function checkRatio(law: string, name: string, value: number): void {
  if (!(typeof value === "number" && value >= 0 && value <= 1)) {
    throw new RangeError(`${law} ${name} should be in [0, 1], got ${value}`);
  }
}
