/**
 * @module The token-window law (docs/library.md and docs/how-it-works.md#session-window-tokens-of-cache-footprint): one control step maps a
 * replica's KV usage, prefix hit rate and whether sessions wait to a window
 * W counted in tokens of cache footprint — as TCP counts its congestion
 * window in bytes, not packets. Admission mechanics live elsewhere and read
 * `size`.
 */

import { DEFAULT_GUARD_BAND_FRACTION, DEFAULT_WINDOW_LAW } from "../config/defaults.js";
import { checkRatio, checkWindowThresholds } from "./window-thresholds.js";

/** Parameters of the token law. Every size is in tokens. */
export interface TokenWindowOptions {
  /** The replica's KV capacity, tokens (> 0). */
  capacityTokens: number;
  /** Share of the capacity kept free for wrong predictions (the documented guard band), 0–1. */
  guardBandFraction: number;
  /** First W; default: capacity less the guard band. */
  initial: number;
  /** Smallest W; the mechanics raise it to the largest single footprint they hold. */
  min: number;
  /** Largest W; default: four times the capacity (idle sessions' caches are evictable). */
  max: number;
  /** α: tokens added per interval after the first cut; default capacity / 16. */
  increase: number;
  /** β: multiplicative cut on thrash, 0 < β < 1. */
  decrease: number;
  /** U_low: W grows only while KV usage is below it. */
  kvLow: number;
  /** U_high: above it, with a hit rate under H_low, W is cut. */
  kvHigh: number;
  /** H_low. */
  hitLow: number;
}

/** One control interval's signals. */
export interface TokenWindowSignal {
  /** KV held by running calls over the capacity, excluding evictable cache (0–1). */
  kvUsage: number;
  /**
   * The highest KV usage over the last few intervals (default: `kvUsage`): slow start doubles W
   * only while it stayed below U_low, so one quiet interval between busy ones does not double it.
   */
  kvUsagePeak?: number | undefined;
  /** Token-weighted prefix hit rate over the interval; undefined when nothing was looked up (no measurement). */
  hitRate?: number | undefined;
  /** Whether sessions wait for room in this window. */
  waiting: boolean;
}

/** The law's state between steps. */
export interface TokenWindowState {
  size: number;
  slowStart: boolean;
}

/** What one control step did and why. */
export type TokenWindowAction = "slow-start" | "increase" | "decrease" | "hold";

const MAX_OVER_CAPACITY = 4;
const INCREASE_SHARE = 1 / 16;

function checkTokens(name: string, value: number, least: number): void {
  if (!(Number.isFinite(value) && value >= least)) {
    throw new RangeError(`TokenWindow ${name} should be a number of tokens ≥ ${least}, got ${value}`);
  }
}

/** Fills in the defaults that follow the capacity and checks every option once; throws `RangeError` naming the value. */
export function resolveTokenWindowOptions(
  options: { capacityTokens: number } & Partial<TokenWindowOptions>,
): TokenWindowOptions {
  const capacity = options.capacityTokens;
  checkTokens("capacityTokens", capacity, 1);
  const guardBandFraction = options.guardBandFraction ?? DEFAULT_GUARD_BAND_FRACTION;
  checkRatio("TokenWindow", "guardBandFraction", guardBandFraction);
  const o: TokenWindowOptions = {
    capacityTokens: capacity,
    guardBandFraction,
    initial: options.initial ?? Math.max(1, Math.floor(capacity * (1 - guardBandFraction))),
    min: options.min ?? 1,
    max: options.max ?? capacity * MAX_OVER_CAPACITY,
    increase: options.increase ?? Math.max(1, Math.floor(capacity * INCREASE_SHARE)),
    decrease: options.decrease ?? DEFAULT_WINDOW_LAW.decrease,
    kvLow: options.kvLow ?? DEFAULT_WINDOW_LAW.kvLow,
    kvHigh: options.kvHigh ?? DEFAULT_WINDOW_LAW.kvHigh,
    hitLow: options.hitLow ?? DEFAULT_WINDOW_LAW.hitLow,
  };
  checkTokens("min", o.min, 1);
  checkTokens("max", o.max, o.min);
  checkTokens("increase", o.increase, 1);
  // An initial window outside [min, max] is clamped: the defaults follow the capacity, the bounds may be set alone.
  o.initial = Math.min(o.max, Math.max(o.min, o.initial));
  checkWindowThresholds("TokenWindow", o);
  return o;
}

/**
 * The token law, and nothing else.
 *
 * - Thrash, `U > U_high and H < H_low` (CONCUR's thresholds): `W = max(min, W·β)`,
 *   and slow start is over. An interval without lookups (H undefined) cannot cut.
 * - Sessions wait, nothing thrashes and `U < U_low`: W doubles per interval until the first
 *   cut (slow start), then grows by α (additive increase), up to max. Doubling also needs U
 *   below U_low over the last few intervals (`kvUsagePeak`): on `agents` one quiet interval
 *   between busy ones doubled W to twice the KV capacity, and the sessions it let in overflowed
 *   the cache. Adding α on one quiet interval risks a sixteenth of the capacity, and requiring a
 *   quiet horizon for it too left a window cut once on the Mooncake conversation trace without
 *   a host tier halved for the rest of the hour: the trace's one-off calls, outside the window,
 *   keep U above U_low for most of 10 s at a time.
 * - Otherwise W holds: growing a window nobody waits for only makes it meaningless
 *   (TCP's congestion-window validation, RFC 7661, for the same reason).
 */
export class TokenWindow {
  readonly options: Readonly<TokenWindowOptions>;
  private current: number;
  private floor: number;
  private slowStart = true;
  private action: TokenWindowAction = "hold";

  constructor(options: { capacityTokens: number } & Partial<TokenWindowOptions>) {
    this.options = Object.freeze(resolveTokenWindowOptions(options));
    this.current = this.options.initial;
    this.floor = this.options.min;
  }

  /** The window, tokens. */
  get size(): number {
    return this.current;
  }

  /** Whether W is still in slow start (no cut yet). */
  get inSlowStart(): boolean {
    return this.slowStart;
  }

  /** What the last `observe` did (`hold` before the first). */
  get lastAction(): TokenWindowAction {
    return this.action;
  }

  /**
   * Raises the floor W may be cut to (docs/how-it-works.md#session-window-tokens-of-cache-footprint: W_min defaults to the largest
   * single footprint, so a cut never leaves the largest session without room
   * alone). Never below the configured min; W itself is raised to it at once.
   */
  setFloor(tokens: number): void {
    this.floor = Math.min(this.options.max, Math.max(this.options.min, Math.ceil(tokens)));
    if (this.current < this.floor) this.current = this.floor;
  }

  /** Applies one control step; returns the new W, tokens. */
  observe(signal: TokenWindowSignal): number {
    const next = stepTokenWindow(
      this.options,
      this.floor,
      { size: this.current, slowStart: this.slowStart },
      signal,
    );
    this.current = next.size;
    this.slowStart = next.slowStart;
    this.action = next.action;
    return this.current;
  }

  /** One step of this law applied to another window state (a window shared by several frontends). */
  stepFrom(
    state: TokenWindowState,
    signal: TokenWindowSignal,
  ): TokenWindowState & { action: TokenWindowAction } {
    return stepTokenWindow(this.options, this.floor, state, signal);
  }

  toJSON(): { size: number; slowStart: boolean; lastAction: TokenWindowAction } {
    return { size: this.current, slowStart: this.slowStart, lastAction: this.action };
  }
}

/** One control step of the token law from `state`: the pure function behind `TokenWindow.observe`. */
export function stepTokenWindow(
  o: Readonly<TokenWindowOptions>,
  floor: number,
  state: TokenWindowState,
  signal: TokenWindowSignal,
): TokenWindowState & { action: TokenWindowAction } {
  const { kvUsage, hitRate, waiting } = signal;
  if (!(typeof kvUsage === "number" && Number.isFinite(kvUsage) && kvUsage >= 0)) {
    throw new RangeError(`kvUsage should be a non-negative ratio, got ${kvUsage}`);
  }
  const peak = signal.kvUsagePeak;
  if (peak !== undefined && !(Number.isFinite(peak) && peak >= 0)) {
    throw new RangeError(`kvUsagePeak should be a non-negative ratio or undefined, got ${peak}`);
  }
  if (hitRate !== undefined && !(Number.isFinite(hitRate) && hitRate >= 0)) {
    throw new RangeError(`hitRate should be a non-negative ratio or undefined, got ${hitRate}`);
  }
  const before = state.size;
  let size = before;
  let slowStart = state.slowStart;
  if (kvUsage > o.kvHigh && hitRate !== undefined && hitRate < o.hitLow) {
    slowStart = false;
    size = Math.max(floor, Math.floor(before * o.decrease));
  } else if (waiting && (slowStart ? Math.max(kvUsage, peak ?? kvUsage) : kvUsage) < o.kvLow) {
    const grown = slowStart ? before * 2 : before + o.increase;
    size = Math.min(o.max, Math.max(before, Math.floor(grown)));
  }
  const action: TokenWindowAction =
    size < before ? "decrease" : size > before ? (slowStart ? "slow-start" : "increase") : "hold";
  return { size, slowStart, action };
}
