/** @module A conservative queue-drain estimate for `Retry-After`: completions counted over a sliding window. */

import { type Clock, realClock } from "../clock.js";

export interface DrainEstimatorOptions {
  /** Time source; default real time. */
  clock?: Clock;
  /** Length of the sliding window completions are counted over, ms. Default 30 000. */
  windowMs?: number;
  /** Number of buckets the window is kept in (its resolution). Default 30. */
  buckets?: number;
  /** Longest estimate returned, seconds. Default 60. */
  maxSeconds?: number;
  /** Completions recorded between two clock readings (1: every one is timed exactly). Default 64. */
  foldEvery?: number;
}

/**
 * Counts completions in a bucketed sliding window and turns "n calls ahead"
 * into seconds. Conservative on purpose: the rate divides by the whole window
 * even right after start-up (so it is never overestimated). With no
 * completion in the window, what is known is how long nothing has completed:
 * each call ahead is taken to need that long again — short right after
 * start-up (a fresh gate does not send clients away for a minute), growing
 * to `maxSeconds` when a replica is stuck. O(1) per `record`, O(buckets) per
 * estimate, fixed memory.
 */
export class DrainEstimator {
  private readonly clock: Clock;
  private readonly bucketMs: number;
  private readonly windowSeconds: number;
  private readonly maxSeconds: number;
  private readonly ids: Float64Array;
  private readonly counts: Float64Array;
  private readonly windowMs: number;
  private readonly foldEvery: number;
  private pending = 0;
  private lastFoldAt: number;
  /** When a completion was last recorded (or the estimator started), ms. */
  private lastCompletionAt: number;

  constructor(options: DrainEstimatorOptions = {}) {
    const { clock = realClock, windowMs = 30_000, buckets = 30, maxSeconds = 60, foldEvery = 64 } = options;
    if (!(Number.isFinite(windowMs) && windowMs > 0)) {
      throw new RangeError(`windowMs must be a positive number of ms, got ${windowMs}`);
    }
    if (!(Number.isInteger(buckets) && buckets >= 1)) {
      throw new RangeError(`buckets must be a positive integer, got ${buckets}`);
    }
    if (!(Number.isInteger(foldEvery) && foldEvery >= 1)) {
      throw new RangeError(`foldEvery must be a positive integer, got ${foldEvery}`);
    }
    if (!(maxSeconds >= 1)) throw new RangeError(`maxSeconds must be ≥ 1, got ${maxSeconds}`);
    this.clock = clock;
    this.bucketMs = windowMs / buckets;
    this.windowMs = windowMs;
    this.foldEvery = foldEvery;
    this.lastFoldAt = clock.now();
    this.lastCompletionAt = this.lastFoldAt;
    this.windowSeconds = windowMs / 1000;
    this.maxSeconds = maxSeconds;
    this.ids = new Float64Array(buckets).fill(Number.NEGATIVE_INFINITY);
    this.counts = new Float64Array(buckets);
  }

  /**
   * Records `count` completions now. The clock is read once per `foldEvery`
   * completions, not per call: completions since the last reading are spread
   * evenly over the time since then, which keeps a permit release cheap.
   */
  record(count = 1): void {
    if (this.foldEvery === 1) {
      const now = this.clock.now();
      this.lastFoldAt = now;
      if (count > 0) this.lastCompletionAt = now;
      this.add(Math.floor(now / this.bucketMs), count);
      return;
    }
    this.pending += count;
    if (this.pending >= this.foldEvery) this.fold();
  }

  /** Moves pending completions into the buckets covering (lastFoldAt, now]. */
  private fold(): void {
    const now = this.clock.now();
    const pending = this.pending;
    this.pending = 0;
    const since = this.lastFoldAt;
    this.lastFoldAt = now;
    if (pending === 0) return;
    this.lastCompletionAt = now;
    const span = now - since;
    if (span <= 0) {
      this.add(Math.floor(now / this.bucketMs), pending);
      return;
    }
    // Only the part of the interval inside the window can count; spread over the buckets it covers.
    const last = Math.floor(now / this.bucketMs);
    const first = Math.max(
      Math.floor(Math.max(since, now - this.windowMs) / this.bucketMs),
      last - this.ids.length + 1,
    );
    for (let id = first; id <= last; id++) {
      const overlap = Math.min(now, (id + 1) * this.bucketMs) - Math.max(since, id * this.bucketMs);
      if (overlap > 0) this.add(id, (pending * overlap) / span);
    }
  }

  private add(id: number, count: number): void {
    if (count <= 0) return;
    const n = this.ids.length;
    const i = ((id % n) + n) % n;
    if (this.ids[i] !== id) {
      this.ids[i] = id;
      this.counts[i] = 0;
    }
    this.counts[i]! += count;
  }

  /** Completions per second over the window (0 when none). */
  ratePerSecond(): number {
    this.fold();
    const newest = Math.floor(this.clock.now() / this.bucketMs);
    const oldest = newest - this.ids.length + 1;
    let total = 0;
    for (let i = 0; i < this.ids.length; i++) {
      const id = this.ids[i]!;
      if (id >= oldest && id <= newest) total += this.counts[i]!;
    }
    return total / this.windowSeconds;
  }

  /** Seconds until `ahead` calls have drained at the measured rate, capped at `maxSeconds`. */
  estimateSeconds(ahead: number): number {
    if (!(ahead > 0)) return 0;
    const rate = this.ratePerSecond();
    if (rate <= 0) {
      const quietSeconds = (this.clock.now() - this.lastCompletionAt) / 1000;
      return Math.min(this.maxSeconds, ahead * quietSeconds);
    }
    return Math.min(this.maxSeconds, ahead / rate);
  }

  /** `estimateSeconds(ahead)` in whole seconds, rounded up, never below 1 — a `Retry-After` value. */
  retryAfterSeconds(ahead: number): number {
    return Math.max(1, Math.ceil(this.estimateSeconds(ahead) - 1e-9));
  }
}
