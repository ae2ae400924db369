/** @module vLLM-named Prometheus metrics of a simulated replica, read from the engine at scrape time. */

import { Counter, Gauge, Registry } from "prom-client";
import type { SimEngine } from "./sim-engine.js";

/**
 * A registry exposing what vLLM V1 exposes, per data-parallel rank (label
 * `engine`, as vLLM labels each engine core) and `model_name`:
 * `vllm:kv_cache_usage_perc` (0–1), `vllm:num_requests_running`,
 * `vllm:num_requests_waiting`, `vllm:prefix_cache_queries_total`,
 * `vllm:prefix_cache_hits_total` (tokens), `vllm:num_preemptions_total`,
 * `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, and
 * `vllm:cache_config_info` (value 1; labels `block_size`, `num_gpu_blocks`
 * per rank, `max_num_seqs`, `max_num_batched_tokens`, …).
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
      "engine",
    ],
    registers: [registry],
    collect() {
      this.reset();
      for (let rank = 0; rank < engine.dataParallelSize; rank++) {
        this.set(
          {
            block_size: String(p.blockSize),
            num_gpu_blocks: String(engine.blocksPerRank()),
            num_cpu_blocks: "0",
            enable_prefix_caching: "True",
            cache_dtype: "auto",
            gpu_memory_utilization: "0.9",
            max_num_seqs: String(p.maxNumSeqs),
            max_num_batched_tokens: String(p.maxNumBatchedTokens),
            max_model_len: String(p.maxModelLen),
            engine: String(rank),
          },
          1,
        );
      }
    },
  });
  return registry;
}
