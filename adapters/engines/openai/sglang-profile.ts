/**
 * @module SGLang's series across its collectors (the first one of 2024 and later ones), and its
 * HiCache host tier. See docs/engines.md.
 */

import type { MetricSample } from "./exposition.js";
import type { HostTierSignals, ScrapedSignals, SignalField } from "./profile-types.js";
import {
  type ByName,
  clamp01,
  dataParallelSize,
  largestPositive,
  mean,
  pick,
  samplesOf,
  series,
  sum,
} from "./series-lookup.js";

/** Running requests: `num_running_reqs` in later versions; `num_requests_running` in the first collector (2024). */
const SGLANG_RUNNING = ["sglang:num_running_reqs", "sglang:num_requests_running"];
/** Waiting requests: `num_queue_reqs` in later versions; `num_requests_waiting` and `queue_req` in the first collector. */
const SGLANG_WAITING = ["sglang:num_queue_reqs", "sglang:num_requests_waiting", "sglang:queue_req"];
/** Names only the first collector exported. */
const SGLANG_LEGACY_ONLY = ["sglang:num_requests_running", "sglang:num_requests_waiting", "sglang:queue_req"];

/**
 * Cached prompt tokens. SGLang creates `sglang:cached_tokens_total` only when
 * a first token is served from cache, and splits it by `cache_source`
 * (device, host, storage) in newer builds; a `total` source, when present,
 * already sums the others.
 */
function sglangCachedTokens(byName: ByName): MetricSample[] | undefined {
  const cached = pick(byName, "sglang:cached_tokens_total");
  if (!cached) return undefined;
  const totals = cached.filter((s) => s.labels.cache_source === "total");
  return totals.length > 0 ? totals : cached;
}

/**
 * SGLang's HiCache: the host pool's size and use from
 * `sglang:hicache_host_{total,used}_tokens`, its hits from
 * `sglang:cached_tokens_total{cache_source="host"}`, its queries as the
 * prompts less their device hits (`cache_source="device"`), as vLLM counts
 * external queries. Undefined when the page shows no host pool.
 */
function sglangHostTier(byName: ByName, unknown: SignalField[]): HostTierSignals | undefined {
  const total = pick(byName, "sglang:hicache_host_total_tokens");
  const used = pick(byName, "sglang:hicache_host_used_tokens");
  const cached = series(byName, "sglang:cached_tokens_total");
  const hostHits = cached.filter((s) => s.labels.cache_source === "host");
  const deviceHits = cached.filter((s) => s.labels.cache_source === "device");
  if (!total && hostHits.length === 0) return undefined;
  const host: HostTierSignals = {};
  const capacity = Math.floor(sum(total));
  host.hostKvCapacityTokens = Math.max(0, capacity);
  if (capacity <= 0) unknown.push("hostKvCapacityTokens");
  else if (used) host.hostKvUsage = clamp01(sum(used) / capacity);
  const prompts = pick(byName, "sglang:prompt_tokens_total");
  if (prompts && hostHits.length > 0) {
    host.hostPrefixHitTokens = sum(hostHits);
    host.hostPrefixQueryTokens = Math.max(0, sum(prompts) - sum(deviceHits));
  }
  return host;
}

export function sglangSignals(byName: ByName): ScrapedSignals {
  const unknown: SignalField[] = [];
  const legacy = SGLANG_LEGACY_ONLY.some((n) => byName.has(n)) && !byName.has("sglang:num_running_reqs");
  const kv = pick(byName, "sglang:token_usage");
  const running = pick(byName, ...SGLANG_RUNNING);
  const waiting = pick(byName, ...SGLANG_WAITING);
  const capacity = pick(byName, "sglang:max_total_num_tokens");
  const preemptions = pick(byName, "sglang:num_retracted_requests_total");
  const prompts = pick(byName, "sglang:prompt_tokens_total");
  const cached = sglangCachedTokens(byName);
  const capacityTokens = Math.floor(sum(capacity));
  const blockSize = largestPositive(series(byName, "sglang:page_size")) ?? 0;
  const maxNumSeqs = largestPositive(series(byName, "sglang:max_running_requests")) ?? 0;

  if (!kv) unknown.push("kvUsage");
  // Prompts without cached tokens is a server that has not served a cached token yet, or one that
  // does not count them: either way the hit rate is not measured, and 0 queries says so.
  if (!(prompts && cached)) unknown.push("prefixCache");
  if (!running) unknown.push("running");
  if (!waiting) unknown.push("waiting");
  if (!preemptions) unknown.push("preemptions");
  if (capacityTokens <= 0) unknown.push("kvCapacityTokens");
  if (blockSize === 0) unknown.push("blockSize");
  if (maxNumSeqs === 0) unknown.push("maxNumSeqs");

  const signals: ScrapedSignals = {
    flavor: "sglang",
    profile: legacy ? "sglang-legacy" : "sglang",
    unknown,
    kvCapacitySource: capacityTokens > 0 ? "engine" : "unknown",
    kvUsage: clamp01(mean(kv)),
    prefixQueryTokens: prompts && cached ? sum(prompts) : 0,
    prefixHitTokens: prompts && cached ? sum(cached) : 0,
    running: sum(running),
    waiting: sum(waiting),
    // SGLang calls preemption "retraction"; the counter is cumulative like vLLM's.
    preemptions: sum(preemptions),
    kvCapacityTokens: Math.max(0, capacityTokens),
    blockSize,
    maxNumSeqs,
    dataParallelSize: dataParallelSize(samplesOf(byName, "sglang:")),
  };
  const host = sglangHostTier(byName, unknown);
  if (host) Object.assign(signals, host);
  const stated = pick(byName, "sglang:cache_hit_rate");
  if (stated) {
    // The first collector set this gauge in percent (as its log line printed it); later ones in 0–1.
    const value = mean(stated);
    signals.statedHitRate = clamp01(legacy || value > 1 ? value / 100 : value);
  }
  return signals;
}

/** Series that make a page SGLang's: a page with only counters or histograms is not enough to act on. */
export const SGLANG_CORE = [
  "sglang:token_usage",
  ...SGLANG_RUNNING,
  ...SGLANG_WAITING,
  "sglang:max_total_num_tokens",
];
