/** @module Replica signals: prefill rate, windowed hit rate, staleness (re-exports only). */

export {
  deliveredHitShare,
  HitRateMeter,
  type HitRateMeterOptions,
  type PrefixCounters,
} from "./hit-rate.js";
export {
  DEFAULT_PREFILL_RATE_OPTIONS,
  PrefillRateEstimator,
  type PrefillRateOptions,
} from "./prefill-rate.js";
export { DEFAULT_STALE_AFTER_MS, isStale, SignalAge } from "./staleness.js";
export { ThrashEvidence, type ThrashReading } from "./thrash-evidence.js";
export { tieredPrefixCounters } from "./tiered-prefix-counters.js";
