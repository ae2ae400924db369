/** @module Token-weighted prefix-cache hit rate over the last control interval, from cumulative engine counters. */

/** Cumulative prefix-cache counters as an engine reports them, tokens. */
export interface PrefixCounters {
  /** Prompt tokens found in the prefix cache since the engine started. */
  hits: number;
  /** Prompt tokens looked up in the prefix cache since the engine started. */
  queries: number;
}

/** Options of a `HitRateMeter`. */
export interface HitRateMeterOptions {
  /** Value before any lookup was seen (0–1). Default 0. */
  initial?: number;
}

/** `value` within [0, 1]. */
export function clampRatio(value: number): number {
  return Math.min(1, Math.max(0, value));
}

/**
 * `Δhits / Δqueries` between consecutive readings (token-weighted, as docs/how-it-works.md#session-window-tokens-of-cache-footprint
 * asks), fed once per control interval.
 *
 * - First reading: no interval exists yet, so the engine's lifetime ratio
 *   stands in (a warm cache behind a freshly started scheduler is not
 *   mistaken for a cold one, which would shrink the window for nothing).
 * - An interval with no lookups holds the previous value: an idle replica
 *   tells nothing about its cache. `measured` says whether the last reading
 *   saw lookups, so a control law can tell a fresh rate from a held one.
 * - A counter that goes down means the engine (or one of the ranks summed
 *   into it) restarted: the reading becomes the new baseline and the value is
 *   held. It is not taken as a delta from zero because a sum over ranks only
 *   partly resets.
 */
export class HitRateMeter {
  private baseline: PrefixCounters | undefined;
  private current: number;
  private lastQueries = 0;
  private lastHits = 0;
  private sawLookups = false;

  constructor(options: HitRateMeterOptions = {}) {
    const initial = options.initial ?? 0;
    if (!(typeof initial === "number" && initial >= 0 && initial <= 1)) {
      throw new RangeError(`HitRateMeter initial should be in [0, 1], got ${initial}`);
    }
    this.current = initial;
  }

  /** The hit rate over the last interval that had lookups (0–1). */
  get value(): number {
    return this.current;
  }

  /** Whether the last reading's interval had lookups (false before the first, and after a reset). */
  get measured(): boolean {
    return this.sawLookups;
  }

  /** Tokens looked up and found in the last interval that had lookups. */
  get lastInterval(): { hits: number; queries: number } {
    return { hits: this.lastHits, queries: this.lastQueries };
  }

  /** Feeds one reading of the cumulative counters; returns the hit rate (0–1). */
  observe(counters: PrefixCounters): number {
    const { hits, queries } = counters;
    if (!(typeof hits === "number" && Number.isFinite(hits) && hits >= 0)) {
      throw new RangeError(`prefix cache hits should be a non-negative counter, got ${hits}`);
    }
    if (!(typeof queries === "number" && Number.isFinite(queries) && queries >= 0)) {
      throw new RangeError(`prefix cache queries should be a non-negative counter, got ${queries}`);
    }
    const previous = this.baseline;
    this.baseline = { hits, queries };
    this.sawLookups = false;
    if (previous === undefined) {
      if (queries > 0) this.set(hits, queries);
      return this.current;
    }
    if (hits < previous.hits || queries < previous.queries) return this.current;
    const dq = queries - previous.queries;
    if (dq > 0) this.set(hits - previous.hits, dq);
    return this.current;
  }

  /** Forgets the baseline (the replica was replaced); the value is held until the next interval. */
  resetBaseline(): void {
    this.baseline = undefined;
  }

  toJSON(): { hitRate: number; hits: number; queries: number } {
    return { hitRate: this.current, hits: this.lastHits, queries: this.lastQueries };
  }

  private set(hits: number, queries: number): void {
    this.sawLookups = true;
    this.lastHits = hits;
    this.lastQueries = queries;
    // Counters scraped at slightly different instants can show more hits than lookups.
    this.current = clampRatio(hits / queries);
  }
}

/**
 * The share of the predicted hits the cache delivered: measured ÷ predicted hit rate, at most 1 —
 * the token window's reading of the documented H (docs/how-it-works.md). A cache that thrashes loses
 * prefixes the router counted on; a workload with little reuse (the Mooncake conversation trace:
 * about 0.05 even with perfect routing) has a low hit rate that nothing lost, and reads as 1 here.
 * Undefined — no measurement, so no cut — when either rate is unmeasured, or the router predicted a
 * rate below `leastPredicted`: where it expected almost nothing, a low hit rate shows nothing lost.
 */
export function deliveredHitShare(
  measured: number | undefined,
  predicted: number | undefined,
  leastPredicted: number,
): number | undefined {
  if (measured === undefined || predicted === undefined || !(predicted >= leastPredicted) || predicted <= 0) {
    return undefined;
  }
  return Math.min(1, measured / predicted);
}
