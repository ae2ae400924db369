/**
 * @module vLLM's series across its versions (V0, V1, the 0.10 renames), its second KV tier, and
 * NVIDIA NIM's pages, which carry vLLM's names without the prefix. See docs/engines.md.
 */

import type { MetricSample } from "./exposition.js";
import type { CapacitySource, HostTierSignals, ScrapedSignals, SignalField } from "./profile-types.js";
import {
  type ByName,
  clamp01,
  counterPair,
  dataParallelSize,
  intLabel,
  largestPositive,
  mean,
  pick,
  samplesOf,
  series,
  sum,
} from "./series-lookup.js";

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

export function vllmSignals(byName: ByName, declared: ReadonlySet<string>): ScrapedSignals {
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

/** Series that make a page vLLM's: a page with only counters or histograms is not enough to act on. */
export const VLLM_CORE = [
  ...VLLM_KV_USAGE,
  "vllm:num_requests_running",
  "vllm:num_requests_waiting",
  "vllm:cache_config_info",
];

/**
 * NVIDIA NIM for LLMs on its vLLM backend publishes vLLM's series without the
 * `vllm:` prefix (`num_requests_running`, `gpu_cache_usage_perc`, …), on
 * `/v1/metrics`, plus `num_request_max`, the engine's `max_num_seqs`. The
 * names mean what vLLM's do, so the page is read as vLLM's under the prefix.
 */
export function nimSignals(byName: ByName, declared: ReadonlySet<string>): ScrapedSignals {
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

/** NIM's unprefixed names: a bare `num_requests_running` alone is too common a name to claim a page. */
export const NIM_CORE = ["gpu_cache_usage_perc", "num_request_max"];
