/** @module The AIMD session-window law (docs/library.md and docs/how-it-works.md#session-window-tokens-of-cache-footprint): one control step maps (KV usage, hit rate) to a window size. */

import { DEFAULT_WINDOW_LAW } from "../config/defaults.js";
import { checkWindowThresholds } from "./window-thresholds.js";

/** Parameters of the window law (defaults from CONCUR). */
export interface AimdOptions {
  /** Window before the first step, sessions. */
  initial: number;
  /** Smallest window, sessions (≥ 1). */
  min: number;
  /** Largest window, sessions. */
  max: number;
  /** α: sessions added per step while KV usage is low (whole number ≥ 1). */
  increase: number;
  /** β: multiplicative decrease, 0 < β < 1. */
  decrease: number;
  /** U_low: below this KV usage (0–1) the window grows. */
  kvLow: number;
  /** U_high: above this KV usage (0–1), with a low hit rate, the window shrinks. */
  kvHigh: number;
  /** H_low: below this prefix-cache hit rate (0–1), high KV usage shrinks the window. */
  hitLow: number;
}

/** docs/how-it-works.md#session-window-tokens-of-cache-footprint defaults: W = 8 in [1, 1024], α = 2, β = 0.5, U_low = 0.2, U_high = 0.5, H_low = 0.2. */
export const DEFAULT_AIMD_OPTIONS: Readonly<AimdOptions> = Object.freeze({
  initial: 8,
  min: 1,
  max: 1024,
  increase: 2,
  ...DEFAULT_WINDOW_LAW,
});

/** What one control step did. */
export type AimdAction = "increase" | "decrease" | "hold";

/** One control interval's signals. */
export interface AimdSignal {
  /** KV blocks held by running calls over all blocks, excluding evictable cache (0–1). */
  kvUsage: number;
  /** Token-weighted prefix-cache hit rate over the last interval (0–1). */
  hitRate: number;
}

function wholeAtLeast(name: string, value: number, least: number): void {
  if (!(Number.isSafeInteger(value) && value >= least)) {
    throw new RangeError(`AimdWindow ${name} should be a whole number ≥ ${least}, got ${value}`);
  }
}

/** Fills in defaults and checks the options once; throws `RangeError` naming the bad value. */
export function resolveAimdOptions(options: Partial<AimdOptions> = {}): AimdOptions {
  const o: AimdOptions = { ...DEFAULT_AIMD_OPTIONS };
  for (const key of Object.keys(DEFAULT_AIMD_OPTIONS) as (keyof AimdOptions)[]) {
    const value = options[key];
    if (value !== undefined) o[key] = value;
  }
  wholeAtLeast("min", o.min, 1);
  wholeAtLeast("max", o.max, o.min);
  wholeAtLeast("increase", o.increase, 1);
  if (!(Number.isSafeInteger(o.initial) && o.initial >= o.min && o.initial <= o.max)) {
    throw new RangeError(
      `AimdWindow initial should be a whole number in [${o.min}, ${o.max}], got ${o.initial}`,
    );
  }
  checkWindowThresholds("AimdWindow", o);
  return o;
}

/**
 * The window law, and nothing else: admission mechanics (who is active,
 * paused, waiting) live elsewhere and read `size`.
 *
 * `U < U_low → W += α` (capped at max); `U > U_high and H < H_low →
 * W = max(min, ⌊W·β⌋)`; otherwise hold. High KV usage with a good hit rate
 * holds: the sessions are sharing their cache, so their memory pays off.
 */
export class AimdWindow {
  /** The resolved options. */
  readonly options: Readonly<AimdOptions>;
  private current: number;
  private action: AimdAction = "hold";

  constructor(options?: Partial<AimdOptions>) {
    this.options = Object.freeze(resolveAimdOptions(options));
    this.current = this.options.initial;
  }

  /** The window, sessions: a whole number in [min, max]. */
  get size(): number {
    return this.current;
  }

  /** What the last `observe` did (`hold` before the first). */
  get lastAction(): AimdAction {
    return this.action;
  }

  /** Applies one control step; returns the new window size. */
  observe(signal: AimdSignal): number {
    const { kvUsage, hitRate } = signal;
    if (!(typeof kvUsage === "number" && Number.isFinite(kvUsage) && kvUsage >= 0)) {
      throw new RangeError(`kvUsage should be a non-negative ratio, got ${kvUsage}`);
    }
    if (!(typeof hitRate === "number" && Number.isFinite(hitRate) && hitRate >= 0)) {
      throw new RangeError(`hitRate should be a non-negative ratio, got ${hitRate}`);
    }
    const o = this.options;
    const before = this.current;
    if (kvUsage < o.kvLow) {
      this.current = Math.min(o.max, before + o.increase);
    } else if (kvUsage > o.kvHigh && hitRate < o.hitLow) {
      // The epsilon keeps ⌊W·β⌋ from losing a session to float error (0.29 × 100 = 28.999…).
      this.current = Math.max(o.min, Math.floor(before * o.decrease + 1e-9));
    }
    this.action = this.current > before ? "increase" : this.current < before ? "decrease" : "hold";
    return this.current;
  }

  toJSON(): { size: number; lastAction: AimdAction } {
    return { size: this.current, lastAction: this.action };
  }
}
