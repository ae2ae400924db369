/** @module Prometheus text parsing and the vLLM / SGLang mapping to engine signals. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  parseEngineMetrics,
  parsePrometheusText,
  signalsFromExposition,
} from "../../adapters/engines/openai/metrics-parser.js";

describe("parsePrometheusText", () => {
  it("reads comments, types, help, labels with escapes, special values and timestamps", () => {
    const page = [
      "# HELP a_total Requests\\nserved, with a \\\\ backslash",
      "# TYPE a_total counter",
      "# just a comment",
      'a_total{path="/x",msg="say \\"hi\\"\\nthen \\\\ go"} 12 1700000000000',
      "b NaN",
      "c +Inf",
      "d -Inf",
      "e\t1.5e+06",
      'f{le="+Inf",} 7',
      "g{} 3",
      '  h { a = "1" , b="2" }   4  ',
      "",
      "\r",
    ].join("\r\n");
    const parsed = parsePrometheusText(page);
    assert.equal(parsed.invalidLines, 0);
    assert.equal(parsed.types.get("a_total"), "counter");
    assert.equal(parsed.help.get("a_total"), "Requests\nserved, with a \\ backslash");
    const byName = new Map(parsed.samples.map((s) => [s.name, s]));
    const a = byName.get("a_total")!;
    assert.deepEqual(a.labels, { path: "/x", msg: 'say "hi"\nthen \\ go' });
    assert.equal(a.value, 12);
    assert.equal(a.timestampMs, 1_700_000_000_000);
    assert.ok(Number.isNaN(byName.get("b")!.value));
    assert.equal(byName.get("c")!.value, Number.POSITIVE_INFINITY);
    assert.equal(byName.get("d")!.value, Number.NEGATIVE_INFINITY);
    assert.equal(byName.get("e")!.value, 1_500_000);
    assert.deepEqual(byName.get("f")!.labels, { le: "+Inf" });
    assert.deepEqual(byName.get("g")!.labels, {});
    assert.deepEqual(byName.get("h")!.labels, { a: "1", b: "2" });
    assert.equal(byName.get("h")!.value, 4);
  });

  it("skips malformed lines without losing the good ones", () => {
    const page = [
      "good 1",
      "no_value",
      'unterminated{a="1} 2',
      "bad_value abc",
      "9starts_with_digit 1",
      'missing_eq{a"1"} 1',
      "trailing 1 2 3",
      "<html><body>oops</body></html>",
      "also_good 2",
    ].join("\n");
    const parsed = parsePrometheusText(page);
    assert.deepEqual(
      parsed.samples.map((s) => [s.name, s.value]),
      [
        ["good", 1],
        ["also_good", 2],
      ],
    );
    assert.equal(parsed.invalidLines, 7);
  });

  it("reads OpenMetrics extras: exemplars, # EOF, quoted names, fractional-second timestamps", () => {
    const page = [
      'req_bucket{le="0.5"} 3 # {trace_id="abc"} 0.3 1.7e9',
      '{"my.dotted.metric", code="200"} 5',
      "ts_metric 1 1700000000.5",
      "# EOF",
    ].join("\n");
    const parsed = parsePrometheusText(page);
    assert.equal(parsed.invalidLines, 0);
    assert.deepEqual(parsed.samples[0], { name: "req_bucket", labels: { le: "0.5" }, value: 3 });
    assert.deepEqual(parsed.samples[1], { name: "my.dotted.metric", labels: { code: "200" }, value: 5 });
    assert.equal(parsed.samples[2]!.timestampMs, 1_700_000_000_500);
  });
});

/**
 * vLLM V1 (0.8+), two data-parallel engines of 27,400 blocks each, one model. Each engine's
 * `cache_config_info` line states the front end's total of both (vllm/v1/engine/core_client.py).
 */
const VLLM_V1_DP2 = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10000.0
vllm:prefix_cache_queries_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 6000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4000.0
vllm:prefix_cache_hits_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2000.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:num_preemptions_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="54800",max_num_seqs="256"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="54800",max_num_seqs="256"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123456.0
`;

/** vLLM V0 (≤ 0.7) names: gpu_ prefixes, no engine label, no max_num_seqs. */
const VLLM_V0 = `# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama"} 0.75
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 12.0
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="llama"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 4.0
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="llama"} 800.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="llama"} 200.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="llama"} 2.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",num_gpu_blocks="5000",num_cpu_blocks="2048"} 1.0
`;

/** SGLang with dp_size 2 and tp_size 2: scheduler gauges repeat per tp_rank. */
const SGLANG_DP2_TP2 = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 6.0
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="1"} 6.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 4.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="1"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.3
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.5
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{dp_rank="0",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.9
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 150000.0
sglang:max_total_num_tokens{dp_rank="1",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 150000.0
# TYPE sglang:page_size gauge
sglang:page_size{dp_rank="0",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 1.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen"} 9000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="qwen"} 6000.0
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{dp_rank="0",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 5.0
`;

describe("signalsFromExposition", () => {
  it("maps vLLM V1 names, summing counters over engines and averaging KV usage", () => {
    const s = parseEngineMetrics(VLLM_V1_DP2);
    assert.ok(s);
    assert.equal(s.flavor, "vllm");
    assert.equal(s.running, 8);
    assert.equal(s.waiting, 2);
    assert.equal(s.kvUsage, 0.375);
    assert.equal(s.prefixQueryTokens, 16_000);
    assert.equal(s.prefixHitTokens, 6_000);
    assert.equal(s.preemptions, 8);
    assert.equal(s.blockSize, 16);
    assert.equal(s.kvCapacityTokens, 2 * 27_400 * 16, "the stated total, once");
    assert.equal(s.maxNumSeqs, 256, "a per-rank limit: not summed over ranks");
    assert.equal(s.dataParallelSize, 2);
  });

  it("maps vLLM V0 names (gpu_ prefixes)", () => {
    const s = parseEngineMetrics(VLLM_V0);
    assert.ok(s);
    assert.equal(s.flavor, "vllm");
    assert.equal(s.kvUsage, 0.75);
    assert.equal(s.running, 12);
    assert.equal(s.waiting, 4);
    assert.equal(s.prefixQueryTokens, 800);
    assert.equal(s.prefixHitTokens, 200);
    assert.equal(s.preemptions, 2);
    assert.equal(s.kvCapacityTokens, 5000 * 32);
    assert.equal(s.blockSize, 32);
    assert.equal(s.maxNumSeqs, 0, "unknown when the labels do not say");
    assert.equal(s.dataParallelSize, 1);
  });

  it("prefers the new vLLM names when a page carries both generations", () => {
    const both = `${VLLM_V0}vllm:kv_cache_usage_perc{model_name="llama"} 0.1\nvllm:prefix_cache_queries_total{model_name="llama"} 50\nvllm:prefix_cache_hits_total{model_name="llama"} 5\n`;
    const s = parseEngineMetrics(both);
    assert.ok(s);
    assert.equal(s.kvUsage, 0.1);
    assert.equal(s.prefixQueryTokens, 50);
    assert.equal(s.prefixHitTokens, 5);
  });

  it("maps SGLang names, counting series repeated per tp_rank once", () => {
    const s = parseEngineMetrics(SGLANG_DP2_TP2);
    assert.ok(s);
    assert.equal(s.flavor, "sglang");
    assert.equal(s.running, 10, "6 on dp 0 and 4 on dp 1, not doubled by the two TP workers");
    assert.equal(s.waiting, 3);
    assert.equal(s.kvUsage, 0.4);
    assert.equal(s.prefixQueryTokens, 9000);
    assert.equal(s.prefixHitTokens, 6000);
    assert.equal(s.kvCapacityTokens, 300_000);
    assert.equal(s.blockSize, 1);
    assert.equal(s.preemptions, 5);
    assert.equal(s.dataParallelSize, 2);
  });

  it("sums several models served by one replica", () => {
    const page = [
      'vllm:num_requests_running{model_name="a"} 2',
      'vllm:num_requests_running{model_name="b"} 3',
      'vllm:kv_cache_usage_perc{model_name="a"} 0.2',
      'vllm:kv_cache_usage_perc{model_name="b"} 0.2',
    ].join("\n");
    const s = parseEngineMetrics(page);
    assert.ok(s);
    assert.equal(s.running, 5);
    assert.ok(Math.abs(s.kvUsage - 0.2) < 1e-12);
  });

  it("treats NaN gauges as absent and clamps KV usage to 0–1", () => {
    const page = [
      'vllm:kv_cache_usage_perc{engine="0"} NaN',
      'vllm:kv_cache_usage_perc{engine="1"} 1.5',
      'vllm:num_requests_running{engine="0"} NaN',
      'vllm:num_requests_running{engine="1"} 2',
    ].join("\n");
    const s = parseEngineMetrics(page);
    assert.ok(s);
    assert.equal(s.kvUsage, 1);
    assert.equal(s.running, 2);
  });

  it("returns undefined for pages that are not an engine's", () => {
    assert.equal(parseEngineMetrics(""), undefined);
    assert.equal(parseEngineMetrics("<!doctype html><html><body>502 Bad Gateway</body></html>"), undefined);
    assert.equal(parseEngineMetrics("process_cpu_seconds_total 12\npython_info 1\n"), undefined);
    assert.equal(parseEngineMetrics("\u0000\u0001\u0002 garbage {{{ ]]]"), undefined);
    assert.equal(signalsFromExposition(parsePrometheusText("vllm:prompt_tokens_total 5")), undefined);
  });

  it("never throws on arbitrary input", () => {
    // A deterministic byte soup built from the characters the grammar cares about.
    const alphabet = 'ab_:{}=",\\\n #\t0.9e+-InfNaN';
    let seed = 12345;
    for (let round = 0; round < 500; round++) {
      let text = "";
      for (let i = 0; i < 200; i++) {
        seed = (seed * 1103515245 + 12345) % 2 ** 31;
        text += alphabet[seed % alphabet.length];
      }
      const parsed = parsePrometheusText(text);
      assert.ok(parsed.invalidLines >= 0);
      parseEngineMetrics(text);
    }
  });
});
