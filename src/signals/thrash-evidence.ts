/**
 * @module What the token window's law reads to tell thrash (docs/how-it-works.md#session-window-tokens-of-cache-footprint) over its last few control
 * intervals: the prefix hits the router predicted against those the cache delivered, and the
 * replica's KV usage.
 */

import type { PrefixCounters } from "./hit-rate.js";
import { clampRatio, deliveredHitShare } from "./hit-rate.js";

/** One control interval of one replica. */
interface Interval {
  /** Calls sent: predicted hit tokens and prompt tokens. */
  predictedHits: number;
  prompts: number;
  /** Calls that ended: their predicted hit tokens, and how many of those the engine reported cached. */
  settledPredicted: number;
  settledDelivered: number;
  /** The engine's prefix counters over the interval (lookups counted when it schedules a call). */
  hits: number;
  queries: number;
  /** KV held by running calls at the interval's end (0–1). */
  kvUsage: number;
}

function emptyInterval(): Interval {
  return {
    predictedHits: 0,
    prompts: 0,
    settledPredicted: 0,
    settledDelivered: 0,
    hits: 0,
    queries: 0,
    kvUsage: 0,
  };
}

/** The window law's reading of one replica over the horizon. */
export interface ThrashReading {
  /** Predicted hit rate of the calls sent (the last one seen where none were sent); undefined before any. */
  predicted: number | undefined;
  /** the documented H as the token window reads it (`deliveredHitShare`); undefined when not measured. */
  delivered: number | undefined;
  /** The highest KV usage at the end of an interval of the horizon. */
  kvUsagePeak: number;
}

/**
 * The evidence of one replica for its token window, over the last `horizonIntervals` control
 * intervals.
 *
 * **Delivered hits are paired with their predictions call by call** where the engine reports a
 * call's cached tokens (the API's `cached_tokens`; sticky once a call reported some): each call's
 * predicted hit tokens against its own cached tokens, counted when it ends. The engine's
 * cumulative counters stand in only where it does not. Counters compared with the predictions of
 * the same interval mismatch under load: a prediction is made when a call is sent, but the engine
 * counts the lookup when it schedules the call, and with 30,000–70,000-token prompts waiting behind
 * each other that is seconds later — a control interval or more. One interval then holds a long
 * prompt's predicted hit beside the lookups of other calls. On the Mooncake conversation trace at
 * 1.375 × its rate that read as 44 thrash episodes in the hour ("0.02–0.15 of the predicted hits
 * delivered"), each halving a window, while call by call the caches delivered 98 % of the hit
 * tokens predicted; `agents` showed the same false episode once.
 *
 * **The horizon** (several control intervals) keeps one call whose prefix really was lost (a
 * conversation back after its cache outlived host memory) from cutting a window alone, and W grows
 * only while KV usage stayed below U_low over all of it: on `agents`, a single interval at 0.19
 * between busy ones doubled W to twice the KV capacity in slow start, and the sessions it let in
 * overflowed the cache.
 */
export class ThrashEvidence {
  private readonly horizon: Interval[] = [];
  private open = emptyInterval();
  private lastPredictedRate: number | undefined;
  private reportsPerCall = false;
  private cuts = 0;

  /** `horizonIntervals`: how many closed control intervals the reading spans (an integer ≥ 1). */
  constructor(private readonly horizonIntervals = 1) {
    if (!(Number.isInteger(horizonIntervals) && horizonIntervals >= 1)) {
      throw new RangeError(
        `ThrashEvidence horizonIntervals should be an integer ≥ 1, got ${horizonIntervals}`,
      );
    }
  }

  /**
   * A call was sent here with `hitTokens` of its `promptTokens` predicted cached. Returns the
   * epoch to hand back to `ended` with the call's outcome.
   */
  sent(hitTokens: number, promptTokens: number): number {
    if (!(hitTokens >= 0 && promptTokens >= hitTokens)) {
      throw new RangeError(
        `predicted hits should be within [0, prompt tokens], got ${hitTokens} of ${promptTokens}`,
      );
    }
    this.open.predictedHits += hitTokens;
    this.open.prompts += promptTokens;
    return this.cuts;
  }

  /**
   * A call sent with `predictedHitTokens` ended; the engine reported `cachedTokens` of its prompt
   * cached. `sentEpoch` is what `sent` returned: a call sent before the window's last cut says
   * nothing of the window after it, so it is not counted — as TCP answers one loss episode with
   * one cut, not one for each segment of the old window found lost (NewReno's recovery point).
   */
  ended(predictedHitTokens: number, cachedTokens: number, sentEpoch: number): void {
    if (!(predictedHitTokens >= 0 && cachedTokens >= 0)) {
      throw new RangeError(
        `predicted and cached tokens should be non-negative counts, got ${predictedHitTokens} and ${cachedTokens}`,
      );
    }
    if (cachedTokens > 0) this.reportsPerCall = true;
    if (sentEpoch !== this.cuts) return;
    this.open.settledPredicted += predictedHitTokens;
    this.open.settledDelivered += Math.min(cachedTokens, predictedHitTokens);
  }

  /**
   * Closes the interval: the engine's counters over it (`measured`, tokens; undefined when it
   * looked nothing up) and its KV usage at the end. Intervals older than the horizon are dropped.
   */
  close(measured: PrefixCounters | undefined, kvUsage: number): void {
    this.open.hits = measured?.hits ?? 0;
    this.open.queries = measured?.queries ?? 0;
    this.open.kvUsage = kvUsage;
    this.horizon.push(this.open);
    this.open = emptyInterval();
    if (this.horizon.length > this.horizonIntervals) this.horizon.shift();
    const prompts = this.sum((i) => i.prompts);
    if (prompts > 0) this.lastPredictedRate = this.sum((i) => i.predictedHits) / prompts;
  }

  /**
   * The reading over the horizon. `delivered` is undefined — no measurement, so no cut — when no
   * call with predicted hits ended in it (or, without per-call counts, nothing was looked up), or
   * the predicted rate is below `leastPredicted` (`deliveredHitShare`).
   */
  read(leastPredicted: number): ThrashReading {
    const predicted = this.lastPredictedRate;
    let kvUsagePeak = 0;
    for (const interval of this.horizon) kvUsagePeak = Math.max(kvUsagePeak, interval.kvUsage);
    let delivered: number | undefined;
    if (this.reportsPerCall) {
      const settled = this.sum((i) => i.settledPredicted);
      delivered =
        settled > 0 && predicted !== undefined && predicted >= leastPredicted
          ? Math.min(1, this.sum((i) => i.settledDelivered) / settled)
          : undefined;
    } else {
      const queries = this.sum((i) => i.queries);
      const measured = queries > 0 ? clampRatio(this.sum((i) => i.hits) / queries) : undefined;
      delivered = deliveredHitShare(measured, predicted, leastPredicted);
    }
    return { predicted, delivered, kvUsagePeak };
  }

  /**
   * Forgets the hits the window acted on: a cut is answered by what happens after it, so one
   * episode of lost prefixes cuts once, not once for each interval it stays in the horizon, nor
   * again for calls already on their way when it cut (a new epoch). KV usage is kept.
   */
  forget(): void {
    this.cuts++;
    for (const interval of this.horizon) {
      interval.settledPredicted = 0;
      interval.settledDelivered = 0;
      interval.hits = 0;
      interval.queries = 0;
    }
  }

  private sum(of: (interval: Interval) => number): number {
    let total = 0;
    for (const interval of this.horizon) total += of(interval);
    return total;
  }
}
