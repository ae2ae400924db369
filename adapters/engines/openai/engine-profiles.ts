/**
 * @module Engine profiles: which of vLLM's and SGLang's series mean what, across
 * their versions, and which signals a page leaves unknown; llama.cpp's and TGI's
 * pages are read in `llamacpp-profile.ts` and `tgi-profile.ts`.
 *
 * One rule runs through it: the engine's own statement wins over a value
 * derived from other series, and a series the page does not carry is
 * unknown, never zero. A zero read from a missing series is a measurement
 * sluice would act on (a hit rate of 0 cuts the session window, a KV usage of
 * 0 grows it); an unknown one is reported as such and left to the operator.
 */

import type { EngineSignals } from "../../../src/engine.js";
import type { MetricSample, ParsedExposition } from "./exposition.js";
import { LLAMACPP_CORE, llamacppSignals } from "./llamacpp-profile.js";
import type { CapacitySource, EngineProfileName, ScrapedSignals, SignalField } from "./profile-types.js";
import {
  type ByName,
  clamp01,
  counterPair,
  dataParallelSize,
  groupByName,
  intLabel,
  largestPositive,
  mean,
  pick,
  samplesOf,
  series,
  sum,
} from "./series-lookup.js";
import { TGI_CORE, tgiSignals } from "./tgi-profile.js";

export {
  ALL_SIGNAL_FIELDS,
  type CapacitySource,
  ENGINE_PROFILES,
  type EngineFlavor,
  type EngineProfileName,
  type ScrapedSignals,
  type SignalField,
  unknownEngineSignals,
} from "./profile-types.js";

// --- vLLM ---------------------------------------------------------------------------------------

/** KV usage: renamed in 0.10 (the `gpu_` name stayed, deprecated, for a while). */
const VLLM_KV_USAGE = ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"];
/** Prefix-cache token counters (V1 only): `gpu_` names in 0.8–0.9, renamed in 0.10. */
const VLLM_PREFIX_PAIRS = [
  ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"],
  ["vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"],
] as const;
/** Series only the V0 engine exported (removed with it). */
const VLLM_V0_ONLY = [
  "vllm:gpu_prefix_cache_hit_rate",
  "vllm:cpu_cache_usage_perc",
  "vllm:num_requests_swapped",
];
/** Series only the V1 engine exports. */
const VLLM_V1_ONLY = [
  "vllm:kv_cache_usage_perc",
  "vllm:prefix_cache_queries_total",
  "vllm:gpu_prefix_cache_queries_total",
  "vllm:num_requests_waiting_by_reason",
];

/**
 * Whether a cache config is an attention + mamba model's: vLLM gives such a
 * model a `mamba_block_size` or a padded `mamba_page_size_padded`, and a
 * `mamba_cache_mode` of `align` or `all` when its prefix caching is on.
 * `vllm:cache_config_info` prints every `CacheConfig` field for every model,
 * and those fields default to `None` and `"none"` (`vllm/config/cache.py`),
 * so a plain transformer's page carries `mamba_*` labels too: their presence
 * says nothing.
 */
function isHybridConfig(info: MetricSample): boolean {
  const mode = info.labels.mamba_cache_mode?.trim().toLowerCase();
  return (
    intLabel(info, "mamba_block_size") !== undefined ||
    intLabel(info, "mamba_page_size_padded") !== undefined ||
    mode === "align" ||
    mode === "all"
  );
}

/**
 * The vLLM generation, from the series a page carries or declares: prometheus_client prints
 * `# HELP`/`# TYPE` for a labelled family before its first sample, and a declared family says
 * as much about the engine as a sampled one.
 */
function vllmProfile(byName: ByName, declared: ReadonlySet<string>, config: readonly MetricSample[]): string {
  const carries = (name: string) => byName.has(name) || declared.has(name);
  let generation = "vllm";
  if (VLLM_V1_ONLY.some(carries)) generation = "vllm-v1";
  else if (VLLM_V0_ONLY.some(carries)) generation = "vllm-v0";
  else {
    // vLLM V1 labels every engine-core series with its `engine` index.
    for (const list of byName.values()) {
      if (list.some((s) => s.name.startsWith("vllm:") && s.labels.engine !== undefined)) {
        generation = "vllm-v1";
        break;
      }
    }
  }
  return config.some(isHybridConfig) ? `${generation}+hybrid` : generation;
}

/**
 * KV capacity from `vllm:cache_config_info`, one sample per engine core.
 * Newer vLLM states `kv_cache_size_tokens` itself; it is preferred because
 * `num_gpu_blocks × block_size` overstates a hybrid model's pool (mamba state
 * takes part of each block's memory).
 *
 * The two labels count differently across data-parallel engine cores, though
 * every core's sample carries the front end's one cache config: vLLM's front
 * end adds up the cores' `num_gpu_blocks` as they report ready ("Sum values
 * from all engines in DP case", `vllm/v1/engine/core_client.py`), so each
 * sample already states the total and is read once; `kv_cache_size_tokens`
 * is a single core's figure, "not summed across DP ranks" (vLLM PR #42206),
 * so it is added up over the cores. An engine core that states neither
 * leaves the whole capacity unknown rather than understated.
 */
function vllmCapacity(
  byName: ByName,
  config: readonly MetricSample[],
): { tokens: number; source: CapacitySource } {
  const gauge = pick(byName, "vllm:kv_cache_size_tokens");
  if (gauge) {
    const tokens = Math.floor(sum(gauge));
    if (tokens > 0) return { tokens, source: "engine" };
  }
  if (config.length === 0) return { tokens: 0, source: "unknown" };
  const stated = config.map((info) => intLabel(info, "kv_cache_size_tokens"));
  if (stated.every((tokens) => tokens !== undefined)) {
    return { tokens: stated.reduce((total: number, tokens) => total + (tokens ?? 0), 0), source: "engine" };
  }
  let total = 0;
  for (const info of config) {
    const blocks = intLabel(info, "num_gpu_blocks");
    const size = intLabel(info, "block_size");
    if (blocks === undefined || size === undefined) return { tokens: 0, source: "unknown" };
    total = Math.max(total, blocks * size);
  }
  return { tokens: total, source: "derived" };
}

/** The host tier's signals, merged into a page's signals when the page shows one. */
type HostTierSignals = Pick<
  EngineSignals,
  | "hostKvCapacityTokens"
  | "hostKvUsage"
  | "hostPrefixQueryTokens"
  | "hostPrefixHitTokens"
  | "hostLoadTokensPerSecond"
>;

/** Whether a `cache_config_info` label states a positive number (vLLM prints `None` for an unset option). */
function positiveLabel(sample: MetricSample, label: string): boolean {
  const value = Number(sample.labels[label]?.trim());
  return Number.isFinite(value) && value > 0;
}

/**
 * vLLM's second tier: a KV connector that keeps prefixes outside GPU memory
 * (the native CPU offloading connector, LMCache). Read from
 * `vllm:external_prefix_cache_{queries,hits}_total` (tokens asked of the
 * connector — each prompt less its GPU hits — and tokens it supplied),
 * else LMCache's own lookup counters `lmcache:num_lookup_{tokens,hits}_total`
 * (which count whole prompts, GPU-cached part included, and repeat on every
 * worker: read once, `REPLICATED_LABELS`); the tier's size from
 * `cache_config_info` (`num_cpu_blocks × block_size` when `kv_offloading_size`
 * is set; vLLM leaves `num_cpu_blocks` at `None` with the offloading connector,
 * so it is usually unknown); the load rate from the tokens supplied over
 * `vllm:kv_offload_load_time_total`, else the deprecated
 * `vllm:kv_offload_total_time_total{transfer_type="CPU_to_GPU"}`, plus the reads
 * of any tier below host memory (`vllm:kv_offload_tiering_read_time_total`). Undefined
 * when the page shows no second tier (no offloading size, no transfer time, no
 * LMCache counters, and external counters never queried): the engine is
 * treated as one tier.
 */
function vllmHostTier(
  byName: ByName,
  config: readonly MetricSample[],
  unknown: SignalField[],
): HostTierSignals | undefined {
  const connector = counterPair(byName, [
    ["vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total"],
  ]);
  const lmcache = counterPair(byName, [["lmcache:num_lookup_tokens_total", "lmcache:num_lookup_hits_total"]]);
  const external = connector ?? lmcache;
  const offloading = config.filter((s) => positiveLabel(s, "kv_offloading_size"));
  // The flat name (newer vLLM) covers loads from any offload medium; the labelled one it
  // replaces, kept while the names migrate, only the CPU offloading connector's.
  const flatLoadTime = series(byName, "vllm:kv_offload_load_time_total");
  const loadTime =
    flatLoadTime.length > 0
      ? flatLoadTime
      : series(byName, "vllm:kv_offload_total_time_total").filter(
          (s) => s.labels.transfer_type?.toUpperCase() === "CPU_TO_GPU",
        );
  // vLLM (from late 2025, PR #26245) creates its external counters for every engine core, with a
  // KV connector or without one: never queried, and with nothing else to show a tier, they show none.
  const connectorQueried = (connector?.queries ?? 0) > 0;
  if (!connectorQueried && !lmcache && offloading.length === 0 && loadTime.length === 0) return undefined;
  const host: HostTierSignals = {};
  let capacity = 0;
  for (const info of offloading) {
    const blocks = intLabel(info, "num_cpu_blocks");
    const size = intLabel(info, "block_size");
    if (blocks === undefined || size === undefined) {
      capacity = 0;
      break;
    }
    capacity += blocks * size;
  }
  host.hostKvCapacityTokens = capacity;
  if (capacity === 0) unknown.push("hostKvCapacityTokens");
  if (external) {
    host.hostPrefixQueryTokens = external.queries;
    host.hostPrefixHitTokens = external.hits;
    // With tiers below host memory (vLLM's tiering offload: a filesystem, object store or peer
    // tier), a hit held there is read into host memory before it is loaded (secondary → CPU →
    // GPU), and the call waits for both: their reads count in the time its hits cost. Summed over
    // reads that may run side by side, the rate is a lower bound — a host hit is priced no cheaper
    // than it may be.
    const seconds = sum(loadTime) + sum(series(byName, "vllm:kv_offload_tiering_read_time_total"));
    if (seconds > 0 && external.hits > 0) host.hostLoadTokensPerSecond = external.hits / seconds;
  }
  return host;
}

function vllmSignals(byName: ByName, declared: ReadonlySet<string>): ScrapedSignals {
  const unknown: SignalField[] = [];
  const config = series(byName, "vllm:cache_config_info");
  const kv = pick(byName, ...VLLM_KV_USAGE);
  const running = pick(byName, "vllm:num_requests_running");
  const waiting = pick(byName, "vllm:num_requests_waiting");
  const preemptions = pick(byName, "vllm:num_preemptions_total");
  const prefix = counterPair(byName, VLLM_PREFIX_PAIRS);
  const capacity = vllmCapacity(byName, config);

  let blockSize = 0;
  let maxNumSeqs = 0;
  for (const info of config) {
    blockSize = Math.max(blockSize, intLabel(info, "block_size") ?? 0);
    // A per-rank limit, when a build states it: the largest, not the sum.
    maxNumSeqs = Math.max(maxNumSeqs, intLabel(info, "max_num_seqs") ?? 0);
  }
  if (!kv) unknown.push("kvUsage");
  if (!prefix) unknown.push("prefixCache");
  if (!running) unknown.push("running");
  if (!waiting) unknown.push("waiting");
  if (!preemptions) unknown.push("preemptions");
  if (capacity.source === "unknown") unknown.push("kvCapacityTokens");
  if (blockSize === 0) unknown.push("blockSize");
  if (maxNumSeqs === 0) unknown.push("maxNumSeqs");

  const signals: ScrapedSignals = {
    flavor: "vllm",
    profile: vllmProfile(byName, declared, config),
    unknown,
    kvCapacitySource: capacity.source,
    kvUsage: clamp01(mean(kv)),
    prefixQueryTokens: prefix?.queries ?? 0,
    prefixHitTokens: prefix?.hits ?? 0,
    running: sum(running),
    waiting: sum(waiting),
    preemptions: sum(preemptions),
    kvCapacityTokens: capacity.tokens,
    blockSize,
    maxNumSeqs,
    dataParallelSize: dataParallelSize(samplesOf(byName, "vllm:")),
  };
  const host = vllmHostTier(byName, config, unknown);
  if (host) Object.assign(signals, host);
  // V0's block hit-rate gauge reads -1 until the first lookup: a rate only once it is one.
  const stated = pick(byName, "vllm:gpu_prefix_cache_hit_rate")?.filter((s) => s.value >= 0);
  if (stated && stated.length > 0) signals.statedHitRate = clamp01(mean(stated));
  return signals;
}

// --- SGLang -------------------------------------------------------------------------------------

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

function sglangSignals(byName: ByName): ScrapedSignals {
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

// --- NIM -----------------------------------------------------------------------------------------

/**
 * NVIDIA NIM for LLMs on its vLLM backend publishes vLLM's series without the
 * `vllm:` prefix (`num_requests_running`, `gpu_cache_usage_perc`, …), on
 * `/v1/metrics`, plus `num_request_max`, the engine's `max_num_seqs`. The
 * names mean what vLLM's do, so the page is read as vLLM's under the prefix.
 */
function nimSignals(byName: ByName, declared: ReadonlySet<string>): ScrapedSignals {
  const prefixed: ByName = new Map();
  for (const [name, list] of byName) if (!name.includes(":")) prefixed.set(`vllm:${name}`, list);
  const signals = vllmSignals(prefixed, new Set([...declared].map((name) => `vllm:${name}`)));
  signals.profile = "nim";
  const maxRequests = largestPositive(series(byName, "num_request_max"));
  if (maxRequests !== undefined) {
    signals.maxNumSeqs = maxRequests;
    signals.unknown = signals.unknown.filter((field) => field !== "maxNumSeqs");
  }
  return signals;
}

// --- detection ----------------------------------------------------------------------------------

/**
 * A page whose engine series carry another prefix than the engine's own, renamed to the engine's:
 * - `sglang_name` for `sglang:name`: so SGLang's router re-exports its workers' series, and so
 *   some SGLang builds printed their own (sglang issue #12618, "sglang: -> sglang_"; its Grafana
 *   dashboard followed in PR #15758, and later went back);
 * - `ray_vllm:name` for `vllm:name`: vLLM served by Ray Serve, whose metrics agent prefixes every
 *   application series with `ray_` (DataDog's vLLM integration maps the same names back).
 * The names mean the same.
 */
function renamedPrefix(byName: ByName, from: string, to: string): ByName {
  const renamed: ByName = new Map();
  for (const [name, list] of byName) {
    if (name.startsWith(from)) renamed.set(`${to}${name.slice(from.length)}`, list);
  }
  return renamed;
}

/** Series that make a page an engine's: a page with only counters or histograms is not enough to act on. */
const VLLM_CORE = [
  ...VLLM_KV_USAGE,
  "vllm:num_requests_running",
  "vllm:num_requests_waiting",
  "vllm:cache_config_info",
];
const SGLANG_CORE = [
  "sglang:token_usage",
  ...SGLANG_RUNNING,
  ...SGLANG_WAITING,
  "sglang:max_total_num_tokens",
];
/** NIM's unprefixed names: a bare `num_requests_running` alone is too common a name to claim a page. */
const NIM_CORE = ["gpu_cache_usage_perc", "num_request_max"];

/**
 * Maps a parsed page to engine signals, or undefined when it neither carries
 * nor declares (`# TYPE`) the core series of vLLM, SGLang, llama.cpp or TGI,
 * nor carries NIM's (a garbage page, or another server's metrics). A forced
 * `profile` reads the page as that engine's whatever it carries (`unknown`: never).
 *
 * - Counters and request gauges are summed over label sets (several models,
 *   data-parallel ranks); KV usage, a ratio per rank, is averaged; series
 *   repeated per `tp_rank` count once.
 * - vLLM: capacity is the engine's `kv_cache_size_tokens` when stated, else
 *   `num_gpu_blocks × block_size` (marked `derived`); hit rate from the token
 *   counters `prefix_cache_{queries,hits}_total` (or their `gpu_` names).
 * - NIM for LLMs: vLLM's names without the prefix, read as vLLM's; `num_request_max` is `max_num_seqs`.
 * - SGLang: capacity is `max_total_num_tokens`; hit rate from
 *   `cached_tokens_total` over `prompt_tokens_total`, unknown while either is missing;
 *   names written `sglang_…` are read as `sglang:…`.
 * - vLLM under Ray Serve (`ray_vllm:…`): read as vLLM's, profile `ray-` + vLLM's.
 * - Every missing signal is listed in `unknown`; a missing prefix-cache pair
 *   reads as 0 queries (the meter's "not measured"), never as 0 hits.
 * - Data-parallel size = distinct `dp_rank` or `engine` label values over the engine's series (1 when absent).
 * - A second KV tier in host memory (vLLM's KV connector / CPU offloading,
 *   LMCache, SGLang HiCache) fills the `host…` fields; a page without one
 *   leaves them absent (one tier). A tier whose size is not stated reads
 *   `hostKvCapacityTokens: 0` and lists `hostKvCapacityTokens` as unknown.
 */
export function signalsFromExposition(
  page: ParsedExposition,
  profile: EngineProfileName = "auto",
): ScrapedSignals | undefined {
  const byName = groupByName(page.samples);
  const declared = new Set(page.types.keys());
  // A declared family counts: an engine whose stat logger never recorded prints its families'
  // # TYPE lines without a sample, and every signal of such a page is unknown, not the page foreign.
  const carries = (name: string) => byName.has(name) || declared.has(name);
  switch (profile) {
    case "vllm":
      return vllmSignals(byName, declared);
    case "sglang":
      return sglangSignals(byName);
    case "nim":
      return nimSignals(byName, declared);
    case "llamacpp":
      return llamacppSignals(page);
    case "tgi":
      return tgiSignals(page);
    case "unknown":
      return undefined;
    case "auto":
      break;
  }
  if (VLLM_CORE.some(carries)) return vllmSignals(byName, declared);
  if (SGLANG_CORE.some(carries)) return sglangSignals(byName);
  const sglangUnderscored = renamedPrefix(byName, "sglang_", "sglang:");
  if (SGLANG_CORE.some((n) => sglangUnderscored.has(n))) return sglangSignals(sglangUnderscored);
  const rayServed = renamedPrefix(byName, "ray_vllm:", "vllm:");
  if (VLLM_CORE.some((n) => rayServed.has(n))) {
    const signals = vllmSignals(
      rayServed,
      new Set([...declared].filter((n) => n.startsWith("ray_vllm:")).map((n) => n.slice("ray_".length))),
    );
    signals.profile = `ray-${signals.profile}`;
    return signals;
  }
  if (byName.has("num_requests_running") && NIM_CORE.some((n) => byName.has(n)))
    return nimSignals(byName, declared);
  if (LLAMACPP_CORE.some(carries)) return llamacppSignals(page);
  if (TGI_CORE.some(carries)) return tgiSignals(page);
  return undefined;
}
