/** @module vLLM-named Prometheus metrics of a simulated replica, read from the engine at scrape time. */

import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { hostLoadMsPerToken } from "./presets.js";
import type { SimEngine } from "./sim-engine.js";

/**
 * A registry exposing what vLLM V1 exposes, per data-parallel rank (label
 * `engine`, as vLLM labels each engine core) and `model_name`:
 * `vllm:kv_cache_usage_perc` (0–1), `vllm:num_requests_running`,
 * `vllm:num_requests_waiting`, `vllm:prefix_cache_queries_total`,
 * `vllm:prefix_cache_hits_total` (tokens), `vllm:num_preemptions_total`,
 * `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, and
 * `vllm:cache_config_info` (value 1, one sample per rank; labels
 * `block_size`, `num_gpu_blocks` over all ranks — vLLM's front end adds up
 * its engine cores' blocks and prints that total on every core's sample —,
 * `max_num_seqs`, `max_num_batched_tokens`, …).
 *
 * With a host tier, also what vLLM exposes with its CPU offloading
 * connector: `vllm:external_prefix_cache_queries_total` and
 * `vllm:external_prefix_cache_hits_total` (tokens the connector was asked
 * for — each prompt less its GPU hits — and tokens it supplied;
 * `vllm/v1/core/sched/scheduler.py`), `vllm:kv_offload_total_bytes_total`
 * and `vllm:kv_offload_total_time_total` (seconds) per `transfer_type`
 * (`GPU_to_CPU`, `CPU_to_GPU`; the offloading connector's `metrics.py`) and
 * their flat successors `vllm:kv_offload_{load,store}_{bytes,time}_total`, and
 * `cache_config_info` labels `kv_offloading_size` (GiB per rank),
 * `kv_offloading_backend` and `num_cpu_blocks` (host blocks per rank).
 *
 * In a disaggregated role (`prefill` or `decode`), also what vLLM's NIXL
 * connector exposes (`NixlPromMetrics` in vllm-project/vllm,
 * vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py):
 * `vllm:nixl_xfer_time_seconds` and `vllm:nixl_bytes_transferred`
 * (histograms; the decode side, which pulls, records them).
 */
export function createSimRegistry(engine: SimEngine): Registry {
  const registry = new Registry();
  const labelNames = ["model_name", "engine"] as const;
  const model = engine.model;
  const perRank = <T>(read: (s: ReturnType<SimEngine["rankSignals"]>[number]) => T) =>
    engine
      .rankSignals()
      .map((s) => ({ labels: { model_name: model, engine: String(s.rank) }, value: read(s) }));

  const gauge = (
    name: string,
    help: string,
    read: (s: ReturnType<SimEngine["rankSignals"]>[number]) => number,
  ) =>
    new Gauge({
      name,
      help,
      labelNames,
      registers: [registry],
      collect() {
        this.reset();
        for (const { labels, value } of perRank(read)) this.set(labels, value);
      },
    });
  const counter = (
    name: string,
    help: string,
    read: (s: ReturnType<SimEngine["rankSignals"]>[number]) => number,
  ) =>
    new Counter({
      name,
      help,
      labelNames,
      registers: [registry],
      collect() {
        this.reset();
        for (const { labels, value } of perRank(read)) this.inc(labels, value);
      },
    });

  gauge("vllm:num_requests_running", "Number of requests in model execution batches.", (s) => s.running);
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", (s) => s.waiting);
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", (s) => s.kvUsage);
  counter(
    "vllm:prefix_cache_queries_total",
    "Prefix cache queries, in terms of number of queried tokens.",
    (s) => s.prefixQueryTokens,
  );
  counter(
    "vllm:prefix_cache_hits_total",
    "Prefix cache hits, in terms of number of cached tokens.",
    (s) => s.prefixHitTokens,
  );
  counter(
    "vllm:num_preemptions_total",
    "Cumulative number of preemption from the engine.",
    (s) => s.preemptions,
  );
  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", (s) => s.promptTokens);
  counter(
    "vllm:generation_tokens_total",
    "Number of generation tokens processed.",
    (s) => s.generationTokens,
  );

  const p = engine.params;
  const hostBlocks = engine.hostBlocksPerRank();
  if (hostBlocks > 0) {
    counter(
      "vllm:external_prefix_cache_queries_total",
      "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
      (s) => s.hostQueryTokens,
    );
    counter(
      "vllm:external_prefix_cache_hits_total",
      "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
      (s) => s.hostHitTokens,
    );
    // Stores are modelled off the critical path (vLLM offloads asynchronously) but take the same link time.
    const secondsPerToken = hostLoadMsPerToken(p) / 1000;
    type RankTransfers = Record<"GPU_to_CPU" | "CPU_to_GPU", { tokens: number; seconds: number }>;
    const transfers = (s: ReturnType<SimEngine["rankSignals"]>[number]): RankTransfers => ({
      GPU_to_CPU: {
        tokens: s.hostStoredBlocks * p.blockSize,
        seconds: s.hostStoredBlocks * p.blockSize * secondsPerToken,
      },
      CPU_to_GPU: { tokens: s.hostLoadedTokens, seconds: s.hostLoadMs / 1000 },
    });
    const transferCounter = (
      name: string,
      help: string,
      read: (t: { tokens: number; seconds: number }) => number,
    ) =>
      new Counter({
        name,
        help,
        labelNames: ["model_name", "engine", "transfer_type"],
        registers: [registry],
        collect() {
          this.reset();
          for (const s of engine.rankSignals()) {
            for (const [type, t] of Object.entries(transfers(s))) {
              this.inc({ model_name: model, engine: String(s.rank), transfer_type: type }, read(t));
            }
          }
        },
      });
    transferCounter(
      "vllm:kv_offload_total_bytes_total",
      "Number of bytes offloaded by KV connector",
      (t) => t.tokens * p.kvBytesPerToken,
    );
    transferCounter(
      "vllm:kv_offload_total_time_total",
      "Total time measured by all KV offloading operations",
      (t) => t.seconds,
    );
    // The flat names current vLLM exports beside the labelled ones above, which it keeps for CPU
    // offloading while the names migrate.
    const flat = [
      ["load", "CPU_to_GPU", "from offload storage to GPU"],
      ["store", "GPU_to_CPU", "from GPU to offload storage"],
    ] as const;
    for (const [direction, type, path] of flat) {
      const moved = direction === "load" ? "loaded" : "stored";
      counter(
        `vllm:kv_offload_${direction}_bytes_total`,
        `Total bytes ${moved} ${path}.`,
        (s) => transfers(s)[type].tokens * p.kvBytesPerToken,
      );
      counter(
        `vllm:kv_offload_${direction}_time_total`,
        `Total ${direction} time ${path}, in seconds.`,
        (s) => transfers(s)[type].seconds,
      );
    }
  }
  if (engine.role !== "both") {
    const stats = engine.transfers;
    // Transfers are observed once each, at the first scrape after they ended.
    let observed = 0;
    const observeNew = (read: (t: { seconds: number; bytes: number }) => number, h: Histogram) => {
      const fresh = Math.min(stats.transfers - observed, stats.recent.length);
      for (const t of stats.recent.slice(stats.recent.length - fresh)) {
        h.observe({ model_name: model, engine: "0" }, read(t));
      }
    };
    const seconds: Histogram = new Histogram({
      name: "vllm:nixl_xfer_time_seconds",
      help: "Histogram of transfer duration for NIXL KV Cache transfers.",
      labelNames,
      // vLLM's buckets for this histogram.
      buckets: [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0],
      registers: [registry],
      collect() {
        observeNew((t) => t.seconds, seconds);
      },
    });
    const bytes: Histogram = new Histogram({
      name: "vllm:nixl_bytes_transferred",
      help: "Histogram of bytes transferred per NIXL KV Cache transfers.",
      labelNames,
      buckets: [2 ** 20, 2 ** 23, 2 ** 26, 2 ** 28, 2 ** 30, 2 ** 32],
      registers: [registry],
      collect() {
        observeNew((t) => t.bytes, bytes);
        observed = stats.transfers;
      },
    });
  }
  const offloadGiB = (p.hostKvTokens * p.kvBytesPerToken) / 2 ** 30;
  new Gauge({
    name: "vllm:cache_config_info",
    help: "Information of the LLMEngine CacheConfig",
    labelNames: [
      "block_size",
      "num_gpu_blocks",
      "num_cpu_blocks",
      "enable_prefix_caching",
      "cache_dtype",
      "gpu_memory_utilization",
      "max_num_seqs",
      "max_num_batched_tokens",
      "max_model_len",
      "kv_offloading_size",
      "kv_offloading_backend",
      "engine",
    ],
    registers: [registry],
    collect() {
      this.reset();
      for (let rank = 0; rank < engine.dataParallelSize; rank++) {
        this.set(
          {
            block_size: String(p.blockSize),
            num_gpu_blocks: String(engine.blocksPerRank() * engine.dataParallelSize),
            num_cpu_blocks: String(hostBlocks),
            enable_prefix_caching: "True",
            cache_dtype: "auto",
            gpu_memory_utilization: "0.9",
            max_num_seqs: String(p.maxNumSeqs),
            max_num_batched_tokens: String(p.maxNumBatchedTokens),
            max_model_len: String(p.maxModelLen),
            // vLLM prints Python's None for an unset option.
            kv_offloading_size: hostBlocks > 0 ? String(Math.round(offloadGiB * 1000) / 1000) : "None",
            kv_offloading_backend: hostBlocks > 0 ? "native" : "None",
            engine: String(rank),
          },
          1,
        );
      }
    },
  });
  return registry;
}
