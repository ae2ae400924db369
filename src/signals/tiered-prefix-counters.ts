/** @module The window law's prefix-cache counters when a replica keeps a second KV tier in host memory. */

import type { EngineSignals } from "../engine.js";
import type { PrefixCounters } from "./hit-rate.js";

/**
 * Cumulative prefix-cache counters for the window law's hit rate: GPU memory alone, or — where a
 * host tier is seen (`hostTierTokens` > 0) — hits in either tier, since a prefix loaded from host
 * memory was not lost. Counted as lookups less the tokens neither tier had (the host tier's lookups
 * less its hits), which holds whether the engine's GPU counters include host hits (SGLang) or not
 * (vLLM).
 */
export function tieredPrefixCounters(signals: EngineSignals, hostTierTokens: number): PrefixCounters {
  const queries = signals.prefixQueryTokens;
  const hostQueries = signals.hostPrefixQueryTokens;
  const hostHits = signals.hostPrefixHitTokens;
  if (!(hostTierTokens > 0) || hostQueries === undefined || hostHits === undefined) {
    return { hits: signals.prefixHitTokens, queries };
  }
  return { hits: Math.max(0, queries - Math.max(0, hostQueries - hostHits)), queries };
}
