/** @module A replica's prefill rate (tokens per second), learned from observed prefills with an EWMA. */

/** Options of a `PrefillRateEstimator`. */
export interface PrefillRateOptions {
  /** Rate assumed before any sample, tokens/s. Default 10,000. */
  priorTokensPerSecond: number;
  /** The estimate never goes below this, tokens/s (> 0). Default 100. */
  floorTokensPerSecond: number;
  /** Weight of a new sample in the EWMA, 0 < α ≤ 1. Default 0.2. */
  alpha: number;
  /**
   * Samples with fewer prefill tokens are ignored, tokens. Default 1. Raise it
   * when step overhead dominates short prefills and would make the rate look low.
   */
  minSampleTokens: number;
}

/** Defaults of `PrefillRateEstimator`. */
export const DEFAULT_PREFILL_RATE_OPTIONS: Readonly<PrefillRateOptions> = Object.freeze({
  priorTokensPerSecond: 10_000,
  floorTokensPerSecond: 100,
  alpha: 0.2,
  minSampleTokens: 1,
});

function positive(name: string, value: number): void {
  if (!(typeof value === "number" && Number.isFinite(value) && value > 0)) {
    throw new RangeError(`${name} should be a positive finite number, got ${value}`);
  }
}

/**
 * Prefill rate estimate, tokens/s. Starts at the prior; each observed prefill
 * (tokens computed, time from the call reaching the engine to its first token)
 * moves it by α toward that sample's rate. Never below the floor, so a burst
 * of slow samples cannot drive predicted TTFT to infinity.
 */
export class PrefillRateEstimator {
  private readonly options: PrefillRateOptions;
  private ewma: number;
  private count = 0;

  constructor(options: Partial<PrefillRateOptions> = {}) {
    const resolved: PrefillRateOptions = {
      priorTokensPerSecond: options.priorTokensPerSecond ?? DEFAULT_PREFILL_RATE_OPTIONS.priorTokensPerSecond,
      floorTokensPerSecond: options.floorTokensPerSecond ?? DEFAULT_PREFILL_RATE_OPTIONS.floorTokensPerSecond,
      alpha: options.alpha ?? DEFAULT_PREFILL_RATE_OPTIONS.alpha,
      minSampleTokens: options.minSampleTokens ?? DEFAULT_PREFILL_RATE_OPTIONS.minSampleTokens,
    };
    positive("priorTokensPerSecond", resolved.priorTokensPerSecond);
    positive("floorTokensPerSecond", resolved.floorTokensPerSecond);
    if (!(resolved.alpha > 0 && resolved.alpha <= 1)) {
      throw new RangeError(`alpha should be in (0, 1], got ${resolved.alpha}`);
    }
    if (!(Number.isFinite(resolved.minSampleTokens) && resolved.minSampleTokens >= 0)) {
      throw new RangeError(
        `minSampleTokens should be a non-negative number, got ${resolved.minSampleTokens}`,
      );
    }
    this.options = resolved;
    this.ewma = resolved.priorTokensPerSecond;
  }

  /** Current estimate, tokens/s (≥ the floor). */
  rate(): number {
    return Math.max(this.options.floorTokensPerSecond, this.ewma);
  }

  /**
   * The rate assumed before any sample, tokens/s: what an idle replica is
   * priced at, where no sample can come from until a call runs there.
   */
  get prior(): number {
    return this.options.priorTokensPerSecond;
  }

  /** Samples that moved the estimate. */
  get samples(): number {
    return this.count;
  }

  /**
   * Feeds one observed prefill; returns the new estimate, tokens/s. Samples
   * below `minSampleTokens` or with no measurable time (a fully cached prompt,
   * a clock that did not move) carry no rate and are ignored.
   */
  observe(prefillTokens: number, prefillMs: number): number {
    if (!(Number.isFinite(prefillTokens) && prefillTokens >= 0)) {
      throw new RangeError(`prefillTokens should be a non-negative number, got ${prefillTokens}`);
    }
    if (!(Number.isFinite(prefillMs) && prefillMs >= 0)) {
      throw new RangeError(`prefillMs should be a non-negative number, got ${prefillMs}`);
    }
    if (prefillTokens === 0 || prefillTokens < this.options.minSampleTokens || prefillMs === 0)
      return this.rate();
    const sample = (prefillTokens / prefillMs) * 1000;
    this.ewma += this.options.alpha * (sample - this.ewma);
    this.count++;
    return this.rate();
  }

  toJSON(): { tokensPerSecond: number; samples: number } {
    return { tokensPerSecond: this.rate(), samples: this.count };
  }
}
