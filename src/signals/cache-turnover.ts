/**
 * @module How long a block stays in a replica's GPU prefix cache: the cache's capacity over the rate
 * at which newly computed prompt tokens enter it (from the engine's cumulative prefix counters:
 * lookups less hits). An LRU cache holds a block about that long after its last use, so a session
 * expected back later than that will find its cache gone whatever its place in the window.
 */

/** Weight of a new interval's rate in the moving average. */
const ALPHA = 0.2;

/**
 * The inflow of computed prompt tokens into one replica's cache, tokens per second, smoothed over
 * control intervals. Generated tokens enter the cache too and are not counted (no engine states
 * them as a counter), so the turnover time it gives is an upper bound: conservative for a rule
 * that lets a session's place go when its cache would not outlive its absence.
 */
export class CacheTurnover {
  private last: { computed: number; at: number } | undefined;
  private rate: number | undefined;

  /**
   * Feeds cumulative counters read at `at` (clock ms): prompt tokens looked up and found. A
   * counter that went down (an engine restart) starts a new baseline.
   */
  observe(counters: { hits: number; queries: number }, at: number): void {
    const computed = counters.queries - counters.hits;
    if (!(Number.isFinite(computed) && Number.isFinite(at))) return;
    const last = this.last;
    this.last = { computed, at };
    if (last === undefined || computed < last.computed || !(at > last.at)) return;
    const sample = ((computed - last.computed) / (at - last.at)) * 1000;
    this.rate = this.rate === undefined ? sample : this.rate + ALPHA * (sample - this.rate);
  }

  /** Computed prompt tokens entering the cache per second; undefined before two readings. */
  get tokensPerSecond(): number | undefined {
    return this.rate;
  }

  /**
   * How long a block stays cached after its last use, ms: `capacityTokens` over the inflow;
   * Infinity while nothing enters the cache or nothing is known.
   */
  turnoverMs(capacityTokens: number): number {
    const rate = this.rate;
    if (rate === undefined || !(rate > 0) || !(capacityTokens > 0)) return Number.POSITIVE_INFINITY;
    return (capacityTokens / rate) * 1000;
  }
}
