/**
 * @module Engine profiles read genuine vLLM and SGLang pages as the engines state them.
 *
 * The `.prom` files under `fixtures/` are copied from public repositories (see
 * `fixtures/README.md` for repository, path and commit of each). Cases that
 * no genuine page covers are built inline below and say so.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { parseEngineMetrics, parsePrometheusText } from "../../adapters/engines/openai/metrics-parser.js";
import { HitRateMeter } from "../../src/signals/hit-rate.js";

const fixture = (name: string) => readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8");

describe("genuine pages", () => {
  it("SGLang's documented page: what it states is read, what it lacks is unknown, not zero", () => {
    const s = parseEngineMetrics(fixture("sglang-docs-production-metrics.prom"));
    assert.ok(s);
    assert.equal(s.flavor, "sglang");
    assert.equal(s.profile, "sglang");
    assert.equal(s.running, 162);
    assert.equal(s.waiting, 2826);
    assert.equal(s.kvUsage, 0.28);
    assert.equal(s.dataParallelSize, 1);
    // The page counts prompts but carries no sglang:cached_tokens_total: the hit rate is not measured.
    assert.equal(s.prefixQueryTokens, 0, "0 queries is the meter's 'not measured'");
    assert.equal(s.prefixHitTokens, 0);
    assert.ok(Math.abs((s.statedHitRate ?? -1) - 0.007507552643049313) < 1e-12, "its own gauge, a fraction");
    // No sglang:max_total_num_tokens on this page: capacity unknown, never guessed.
    assert.equal(s.kvCapacityTokens, 0);
    assert.equal(s.kvCapacitySource, "unknown");
    assert.deepEqual(
      [...s.unknown].sort(),
      ["blockSize", "kvCapacityTokens", "maxNumSeqs", "prefixCache", "preemptions"].sort(),
    );

    const meter = new HitRateMeter();
    meter.observe({ hits: s.prefixHitTokens, queries: s.prefixQueryTokens });
    assert.equal(meter.measured, false, "a page without cached tokens never reads as a 0 % hit rate");
  });

  it("vLLM V0 (aibrix's captured page): derived capacity, no token counters for the prefix cache", () => {
    const s = parseEngineMetrics(fixture("vllm-v0-aibrix-runtime.prom"));
    assert.ok(s);
    assert.equal(s.flavor, "vllm");
    assert.equal(s.profile, "vllm-v0");
    assert.equal(s.kvUsage, 0);
    assert.equal(s.running, 0);
    assert.equal(s.waiting, 0);
    assert.equal(s.preemptions, 0);
    assert.equal(s.blockSize, 16);
    assert.equal(s.kvCapacityTokens, 81767 * 16, "num_gpu_blocks × block_size");
    assert.equal(s.kvCapacitySource, "derived", "V0 states no kv_cache_size_tokens");
    assert.equal(s.dataParallelSize, 1);
    assert.equal(s.prefixQueryTokens, 0);
    assert.equal(s.statedHitRate, undefined, "-1 means no lookup yet, not a rate");
    assert.deepEqual([...s.unknown].sort(), ["maxNumSeqs", "prefixCache"]);
    // Its KV usage gauge is present (a genuine 0), so it is not reported unknown.
    assert.ok(!s.unknown.includes("kvUsage"));
    // num_cpu_blocks="9362" beside swap_space_bytes="4294967296": V0's swap space for preempted
    // requests, which no later prompt hits, not a second prefix tier.
    assert.equal(s.hostKvCapacityTokens, undefined, "swap space is not a host tier: one tier");
    assert.equal(s.hostPrefixQueryTokens, undefined);
  });
});

describe("genuine pages across versions", () => {
  const read = (name: string) => {
    const s = parseEngineMetrics(fixture(name));
    assert.ok(s, `${name} is read as an engine page`);
    return s;
  };
  const sortedUnknown = (s: { unknown: readonly string[] }) => [...s.unknown].sort();

  it("vLLM V0, mid-2024 (DataDog's fixture): block-derived capacity, no prefix-cache counters", () => {
    const s = read("vllm-v0-2024-datadog.prom");
    assert.equal(s.profile, "vllm-v0");
    assert.equal(s.kvCapacityTokens, 7281 * 16);
    assert.equal(s.kvCapacitySource, "derived");
    assert.equal(s.blockSize, 16);
    assert.equal(s.kvUsage, 0);
    assert.equal(s.running, 0);
    assert.equal(s.waiting, 0);
    assert.equal(s.dataParallelSize, 1);
    assert.equal(s.statedHitRate, undefined, "this build has no block hit-rate gauge");
    assert.deepEqual(sortedUnknown(s), ["maxNumSeqs", "prefixCache"]);
  });

  it("vLLM V0 with --num-gpu-blocks-override (Qwen2-VL #55, August 2024): the overridden blocks are the capacity", () => {
    const s = read("vllm-v0-qwen2vl-issue55.prom");
    assert.equal(s.profile, "vllm-v0");
    assert.equal(s.kvCapacityTokens, 2048 * 16);
    assert.equal(s.kvCapacitySource, "derived");
    assert.equal(s.blockSize, 16);
    assert.equal(s.kvUsage, 0);
    assert.equal(s.running, 0);
    assert.equal(s.waiting, 0);
    assert.equal(s.dataParallelSize, 1);
    assert.equal(s.hostKvCapacityTokens, undefined, "num_cpu_blocks 0 without offloading: one tier");
    assert.deepEqual(sortedUnknown(s), ["maxNumSeqs", "preemptions", "prefixCache"]);
  });

  it("vLLM V0's families declared without a sample (functionary PR #263): a vLLM page whose every signal is unknown", () => {
    const s = read("vllm-v0-declared-only-functionary-pr263.prom");
    assert.equal(s.flavor, "vllm");
    assert.equal(s.profile, "vllm-v0", "gpu_prefix_cache_hit_rate is declared");
    assert.equal(s.kvCapacityTokens, 0);
    assert.equal(s.kvCapacitySource, "unknown");
    assert.equal(s.statedHitRate, undefined);
    assert.equal(s.prefixQueryTokens, 0, "not measured");
    assert.deepEqual(sortedUnknown(s), [
      "blockSize",
      "kvCapacityTokens",
      "kvUsage",
      "maxNumSeqs",
      "preemptions",
      "prefixCache",
      "running",
      "waiting",
    ]);
  });

  it("vLLM's first cache_config_info line (PR #3100, early 2024): capacity from blocks, the rest unknown", () => {
    const s = read("vllm-0.3-cache-config-pr3100.prom");
    assert.equal(s.profile, "vllm", "one line tells no generation apart");
    assert.equal(s.kvCapacityTokens, 24188 * 16);
    assert.equal(s.kvCapacitySource, "derived");
    assert.equal(s.blockSize, 16);
    assert.deepEqual(sortedUnknown(s), [
      "kvUsage",
      "maxNumSeqs",
      "preemptions",
      "prefixCache",
      "running",
      "waiting",
    ]);
  });

  it('vLLM 0.8.1 V1 printed num_gpu_blocks="None" (vLLM #15719): capacity unknown, never 0 tokens or a guess', () => {
    const s = read("vllm-v1-0.8.1-issue15719.prom");
    assert.equal(s.kvCapacityTokens, 0);
    assert.equal(s.kvCapacitySource, "unknown");
    assert.ok(s.unknown.includes("kvCapacityTokens"));
    assert.equal(s.blockSize, 16, "the block size it does state is read");
  });

  it("a plain transformer's cache config carries mamba_* labels (vLLM PR #29605): not a hybrid model", () => {
    const s = read("vllm-v1-cache-config-pr29605.prom");
    assert.equal(s.profile, "vllm-v1");
    assert.equal(s.kvCapacityTokens, 33676 * 16);
    assert.equal(s.kvCapacitySource, "derived");
    assert.equal(s.blockSize, 16);
    // This engine did run the offloading connector with 410 CPU blocks, but the line comes from the
    // branch of PR #29605, which was closed unmerged: released vLLM leaves num_cpu_blocks at None
    // for the connector (issue #28924), and V0 fills it with swap space (the aibrix page above).
    // num_cpu_blocks alone is therefore not read as a tier; this page states nothing else of one
    // (no kv_offloading_size, no external counters), so it reads as one tier.
    assert.equal(
      s.hostKvCapacityTokens,
      undefined,
      "num_cpu_blocks without kv_offloading_size shows no host tier",
    );
    assert.equal(s.hostPrefixQueryTokens, undefined);
    assert.ok(!s.unknown.includes("hostKvCapacityTokens"));
  });

  it("LMCache's lookup counters repeat on every worker (LMCache PR #1300); its lines alone are no engine page", () => {
    const text = fixture("lmcache-lookup-per-worker-pr1300.prom");
    // Two lookups, counted by each of the four tensor-parallel workers: the same 2.0 four times.
    const lookups = parsePrometheusText(text).samples.filter(
      (sample) => sample.name === "lmcache:num_lookup_requests_total",
    );
    assert.deepEqual(lookups.map((sample) => sample.labels.worker_id).sort(), ["0", "1", "2", "3"]);
    assert.ok(lookups.every((sample) => sample.value === 2));
    // Without vLLM's own series the page is not vLLM's: LMCache's counters ride on an engine's page.
    assert.equal(parseEngineMetrics(text), undefined);
  });

  it("vLLM 0.31 with a CPU tier and a filesystem tier below it (kvreap's capture): host counters, and a load rate that counts the reads from the tier below", () => {
    // Genuine series and values, not a page: the increases of every offload and prefix-cache
    // counter over a 1,249 s load, read from vLLM's /metrics (fixtures/README.md). Laid out here
    // as counters that started at zero, which is what a counter's increase is, under the one line
    // the capture left out that every vLLM page has: its running-requests gauge (declared only,
    // so it reads unknown).
    const increases = JSON.parse(fixture("vllm-0.31-offload-tiering-kvreap.json")) as Record<string, number>;
    const page = [
      "# TYPE vllm:num_requests_running gauge",
      ...Object.entries(increases).map(([series, value]) => `${series} ${value}`),
    ].join("\n");
    const s = parseEngineMetrics(page);
    assert.ok(s);
    assert.equal(s.flavor, "vllm");
    assert.equal(s.prefixQueryTokens, 15_910_937, "the GPU tier's lookups");
    assert.equal(s.prefixHitTokens, 4_080);
    assert.equal(
      s.hostPrefixQueryTokens,
      15_906_857,
      "each prompt less its GPU hits, asked of the connector",
    );
    assert.equal(s.hostPrefixHitTokens, 1_087_120);
    // A hit the filesystem tier holds is read into host memory first (vLLM's tiering: secondary →
    // CPU → GPU): 291.6 s of reads beside 3.4 s of host-to-GPU loads. The CPU loads alone would
    // price these hits at 323,000 tokens/s; the run's report finds a 2,048-token prefix read back
    // costs about as much as computing it on its H200.
    const seconds = 3.364970504965634 + 291.6446249486471;
    assert.ok(Math.abs(s.hostLoadTokensPerSecond! - 1_087_120 / seconds) < 1e-6);
    assert.equal(s.hostKvCapacityTokens, 0);
    assert.ok(s.unknown?.includes("hostKvCapacityTokens"), "the page states no host tier size");
  });

  it("DeepSeek-V4's cache config (vLLM #51163): the engine's kv_cache_size_tokens, not blocks × its smallest block", () => {
    const s = read("vllm-dsv4-cache-config-issue51163.prom");
    assert.equal(s.flavor, "vllm");
    assert.equal(
      s.profile,
      "vllm",
      "one line tells no generation apart, and no mamba label makes it +hybrid",
    );
    assert.equal(s.kvCapacityTokens, 1_179_770, "as stated; 20377 blocks × 4 would be 81,508");
    assert.equal(s.kvCapacitySource, "engine");
    assert.equal(s.blockSize, 4, "the smallest KV group's block, as the engine states it");
    assert.equal(s.dataParallelSize, 1);
    assert.deepEqual(sortedUnknown(s), [
      "kvUsage",
      "maxNumSeqs",
      "preemptions",
      "prefixCache",
      "running",
      "waiting",
    ]);
  });

  it("vLLM V1 as of 0.8 (production-stack #318): the generation is read from a declared V1 family", () => {
    const s = read("vllm-v1-0.8-production-stack-issue318.prom");
    // The excerpt declares vllm:gpu_prefix_cache_queries_total (V1 only) but ends before its sample.
    assert.equal(s.profile, "vllm-v1");
    assert.equal(s.kvUsage, 0);
    assert.ok(!s.unknown.includes("kvUsage"), "gpu_cache_usage_perc is a measured 0");
    assert.equal(s.running, 0);
    assert.equal(s.waiting, 0);
    assert.equal(s.dataParallelSize, 1, "no engine label before 0.9");
    assert.equal(s.prefixQueryTokens, 0);
    assert.deepEqual(sortedUnknown(s), [
      "blockSize",
      "kvCapacityTokens",
      "maxNumSeqs",
      "preemptions",
      "prefixCache",
    ]);
  });

  it("vLLM 0.10.0 (production-stack #617): renamed KV gauge, engine label, and half pairs never mixed", () => {
    const s = read("vllm-v1-0.10.0-production-stack-issue617.prom");
    assert.equal(s.profile, "vllm-v1");
    assert.equal(s.kvUsage, 9.75010481363281e-6);
    assert.equal(s.dataParallelSize, 1, 'one engine core: engine="0"');
    // The excerpt holds prefix_cache_queries_total (new name) and gpu_prefix_cache_hits_total (old
    // name) but neither pair whole: a hit rate from one generation's queries and the other's hits
    // would be invented.
    assert.equal(s.prefixQueryTokens, 0);
    assert.equal(s.prefixHitTokens, 0);
    assert.ok(s.unknown.includes("prefixCache"));
    assert.ok(s.unknown.includes("running"), "not in the excerpt: unknown, not 0");
  });

  it("vLLM with two data-parallel engine cores (gateway-api-inference-extension #2950): two ranks, requests summed", () => {
    const s = read("vllm-dp2-gaie-issue2950.prom");
    assert.equal(s.profile, "vllm-v1", "the engine label is V1's");
    assert.equal(s.dataParallelSize, 2);
    assert.equal(s.running, 0);
    assert.ok(s.unknown.includes("kvUsage"), "the issue quotes no KV gauge: unknown, not 0");
  });

  it("NIM for LLMs on vLLM (DataDog's fixture): vLLM's names without the prefix, num_request_max as max_num_seqs", () => {
    const s = read("nim-llm-vllm-datadog.prom");
    assert.equal(s.flavor, "vllm");
    assert.equal(s.profile, "nim");
    assert.equal(s.running, 1);
    assert.equal(s.waiting, 0);
    assert.equal(s.kvUsage, 0.0002848191398461977);
    assert.equal(s.maxNumSeqs, 64);
    assert.equal(s.dataParallelSize, 1);
    assert.deepEqual(sortedUnknown(s), ["blockSize", "kvCapacityTokens", "preemptions", "prefixCache"]);
  });

  it("vLLM under Ray Serve (DataDog's fixture): ray_vllm: names read as vLLM's, profile ray-", () => {
    const s = read("vllm-ray-serve-datadog.prom");
    assert.equal(s.flavor, "vllm");
    // The file joins a V0 capture and a later V1 engine's series; the V1 ones decide the generation.
    assert.equal(s.profile, "ray-vllm-v1");
    assert.equal(s.running, 0);
    assert.equal(s.waiting, 0);
    assert.equal(s.preemptions, 0);
    assert.equal(s.kvUsage, 0, "kv_cache_usage_perc, V1's gauge");
    assert.equal(s.blockSize, 16);
    assert.equal(s.kvCapacityTokens, 7281 * 16);
    assert.equal(s.kvCapacitySource, "derived");
    assert.equal(s.prefixQueryTokens, 117);
    assert.equal(s.prefixHitTokens, 64);
    assert.equal(s.dataParallelSize, 1);
    assert.equal(s.hostKvCapacityTokens, undefined, "external counters never queried: one tier");
    assert.deepEqual(sortedUnknown(s), ["maxNumSeqs"]);
  });

  it("SGLang's first collector (PR #1461): legacy names, its hit-rate gauge in percent", () => {
    const s = read("sglang-pr1461-first-collector.prom");
    assert.equal(s.profile, "sglang-legacy");
    assert.equal(s.running, 0);
    assert.equal(s.waiting, 0);
    assert.equal(s.kvUsage, 0);
    assert.ok(!s.unknown.includes("kvUsage"));
    assert.ok(!s.unknown.includes("running") && !s.unknown.includes("waiting"));
    assert.equal(s.statedHitRate, 0.8758777633289988, "87.58… percent, read as a fraction");
    // sglang:cached_token is the last batch's count, not a cumulative counter: not a hit rate.
    assert.equal(s.prefixQueryTokens, 0);
    assert.ok(s.unknown.includes("prefixCache"));
  });

  it("SGLang's first merged collector (PR #1853): the capacity and request limit it states", () => {
    const s = read("sglang-pr1853-first-merged-collector.prom");
    assert.equal(s.kvCapacityTokens, 570_979);
    assert.equal(s.kvCapacitySource, "engine");
    assert.equal(s.maxNumSeqs, 2231);
    // Prompts are counted, cached tokens are not on this page: not measured, never a 0 % hit rate.
    assert.equal(s.prefixQueryTokens, 0);
    const meter = new HitRateMeter();
    meter.observe({ hits: s.prefixHitTokens, queries: s.prefixQueryTokens });
    assert.equal(meter.measured, false);
    assert.deepEqual(sortedUnknown(s), [
      "blockSize",
      "kvUsage",
      "preemptions",
      "prefixCache",
      "running",
      "waiting",
    ]);
  });

  it("SGLang mid-2025 (PR #7944): cached tokens without prompt tokens are no hit rate", () => {
    const s = read("sglang-pr7944-cached-tokens.prom");
    assert.equal(s.profile, "sglang");
    assert.equal(s.running, 0);
    assert.equal(s.kvUsage, 0);
    assert.equal(s.prefixHitTokens, 0, "2688 cached tokens, but over no stated prompts");
    assert.equal(s.prefixQueryTokens, 0);
    assert.ok(s.unknown.includes("prefixCache"));
    assert.ok(s.unknown.includes("waiting"));
  });

  it("SGLang 0.5 (DataDog's fixture): cached over prompt tokens, stated capacity, hit-rate gauge as a fraction", () => {
    const s = read("sglang-0.5-datadog.prom");
    assert.equal(s.profile, "sglang");
    assert.equal(s.running, 0);
    assert.equal(s.waiting, 0);
    assert.equal(s.kvUsage, 0.25);
    assert.equal(s.kvCapacityTokens, 430_839);
    assert.equal(s.kvCapacitySource, "engine");
    assert.equal(s.prefixQueryTokens, 5);
    assert.equal(s.prefixHitTokens, 1);
    assert.equal(s.statedHitRate, 0.2);
    assert.equal(s.dataParallelSize, 1, "tp_rank is a replica label, not a rank of its own");
    // sglang:num_retracted_reqs counts requests retracted now, not a cumulative preemption counter.
    assert.deepEqual(sortedUnknown(s), ["blockSize", "maxNumSeqs", "preemptions"]);
  });

  it("SGLang 0.5.1 (sglang #13485): one running request, KV usage a measured 0, the cut-off queue gauge unknown", () => {
    const s = read("sglang-0.5.1-issue13485.prom");
    assert.equal(s.flavor, "sglang");
    assert.equal(s.profile, "sglang");
    assert.equal(s.running, 1);
    assert.equal(s.kvUsage, 0, "token_usage 0.0: one used token, rounded by the engine");
    assert.ok(!s.unknown.includes("kvUsage"));
    assert.equal(s.dataParallelSize, 1, "pp_rank and tp_rank are not data-parallel ranks");
    assert.equal(s.kvCapacityTokens, 0);
    assert.deepEqual(sortedUnknown(s), [
      "blockSize",
      "kvCapacityTokens",
      "maxNumSeqs",
      "preemptions",
      "prefixCache",
      "waiting",
    ]);
  });

  it("SGLang with eight data-parallel ranks (aibrix #1614): every rank counts, tp_rank and pid do not merge them", () => {
    const s = read("sglang-dp8-aibrix-issue1614.prom");
    assert.equal(s.dataParallelSize, 8, "ranks 0–7, though no single series in the excerpt shows all eight");
    assert.equal(s.waiting, 0);
    assert.ok(s.unknown.includes("running"));
    assert.ok(s.unknown.includes("kvUsage"));
  });
});

// --- constructed pages: no genuine page for these shapes was found to cite (see fixtures/README.md) ---

describe("constructed pages", () => {
  it("a hybrid model's own kv_cache_size_tokens wins over num_gpu_blocks × block_size", () => {
    // Numbers from the issue report: 196 blocks × 832 tokens = 163,072, the engine says 141,994.
    const page = [
      'vllm:cache_config_info{block_size="832",engine="0",kv_cache_size_tokens="141994",mamba_cache_mode="align",num_gpu_blocks="196"} 1.0',
      'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
      'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
      'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
    ].join("\n");
    const s = parseEngineMetrics(page);
    assert.ok(s);
    assert.equal(s.profile, "vllm-v1+hybrid");
    assert.equal(s.kvCapacityTokens, 141_994);
    assert.equal(s.kvCapacitySource, "engine");
    assert.equal(s.blockSize, 832);
  });

  it("a mamba block size marks a hybrid model, whose own kv_cache_size_tokens wins over its blocks", () => {
    // vLLM sets mamba_block_size (to max_model_len without prefix caching) only for a model with
    // mamba layers; the plain transformer's "None" is covered by vllm-v1-cache-config-pr29605.prom.
    const hybrid = parseEngineMetrics(
      'vllm:cache_config_info{block_size="2096",engine="0",enable_prefix_caching="False",kv_cache_size_tokens="1663201",mamba_block_size="1000000",mamba_cache_mode="none",num_gpu_blocks="800"} 1.0\nvllm:kv_cache_usage_perc{engine="0"} 0.0\n',
    );
    assert.equal(hybrid?.profile, "vllm-v1+hybrid");
    assert.equal(hybrid?.kvCapacityTokens, 1_663_201, "the engine's figure, not 800 × 2096");
  });

  it('a kv_cache_size_tokens of "None" falls back to the derived capacity, marked so', () => {
    const s = parseEngineMetrics(
      'vllm:cache_config_info{block_size="16",kv_cache_size_tokens="None",num_gpu_blocks="100"} 1\nvllm:num_requests_running 0\n',
    );
    assert.ok(s);
    assert.equal(s.kvCapacityTokens, 1600);
    assert.equal(s.kvCapacitySource, "derived");
  });

  it("a data-parallel engine core without a capacity leaves the whole capacity unknown, not understated", () => {
    const s = parseEngineMetrics(
      [
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1',
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="None"} 1',
        'vllm:num_requests_running{engine="0"} 1',
        'vllm:num_requests_running{engine="1"} 2',
      ].join("\n"),
    );
    assert.ok(s);
    assert.equal(s.dataParallelSize, 2);
    assert.equal(s.running, 3);
    assert.equal(s.kvCapacityTokens, 0);
    assert.ok(s.unknown.includes("kvCapacityTokens"));
  });

  it("data-parallel cores: num_gpu_blocks is the front end's total, read once; kv_cache_size_tokens is one core's, added up", () => {
    // vLLM's front end sums the cores' num_gpu_blocks at start-up and prints its one cache config on
    // every core's line (vllm/v1/engine/core_client.py, vllm/v1/metrics/loggers.py); PR #42206 keeps
    // kv_cache_size_tokens per core. Two cores of 1000 blocks of 16 tokens each:
    const derived = parseEngineMetrics(
      [
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2000"} 1.0',
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="2000"} 1.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
      ].join("\n"),
    );
    assert.equal(derived?.dataParallelSize, 2);
    assert.equal(derived?.kvCapacityTokens, 32_000, "2000 blocks × 16, not once per line");
    assert.equal(derived?.kvCapacitySource, "derived");
    const stated = parseEngineMetrics(
      [
        'vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="15984",num_gpu_blocks="2000"} 1.0',
        'vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="15984",num_gpu_blocks="2000"} 1.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
      ].join("\n"),
    );
    assert.equal(stated?.kvCapacityTokens, 2 * 15_984, "each core's own figure, over both cores");
    assert.equal(stated?.kvCapacitySource, "engine");
  });

  it("a page without a KV gauge reads KV usage as unknown", () => {
    const s = parseEngineMetrics('vllm:num_requests_running{model_name="m"} 2\n');
    assert.ok(s);
    assert.ok(s.unknown.includes("kvUsage"));
    assert.ok(s.unknown.includes("waiting"));
    assert.equal(s.running, 2);
  });

  it("the first SGLang collector's names, with its hit-rate gauge in percent", () => {
    const s = parseEngineMetrics(
      [
        'sglang:max_total_num_tokens{name="m"} 500000',
        'sglang:max_running_requests{name="m"} 128',
        'sglang:num_requests_running{name="m"} 7',
        'sglang:num_requests_waiting{name="m"} 3',
        'sglang:queue_req{name="m"} 3',
        'sglang:token_usage{name="m"} 0.42',
        'sglang:cache_hit_rate{name="m"} 62.5',
      ].join("\n"),
    );
    assert.ok(s);
    assert.equal(s.profile, "sglang-legacy");
    assert.equal(s.running, 7);
    assert.equal(s.waiting, 3);
    assert.equal(s.kvUsage, 0.42);
    assert.equal(s.kvCapacityTokens, 500_000);
    assert.equal(s.kvCapacitySource, "engine");
    assert.equal(s.maxNumSeqs, 128);
    assert.equal(s.statedHitRate, 0.625);
    assert.ok(s.unknown.includes("prefixCache"));
  });

  it("SGLang's names written sglang_… (its router's re-export; some builds, sglang #12618) read as sglang:…", () => {
    const s = parseEngineMetrics(
      [
        "# TYPE sglang_num_running_reqs gauge",
        'sglang_num_running_reqs{model_name="m",tp_rank="0"} 24.0',
        'sglang_num_queue_reqs{model_name="m",tp_rank="0"} 3.0',
        'sglang_token_usage{model_name="m",tp_rank="0"} 0.61',
        'sglang_max_total_num_tokens{model_name="m",tp_rank="0"} 401294.0',
      ].join("\n"),
    );
    assert.ok(s, "an SGLang page, not another server's");
    assert.equal(s.flavor, "sglang");
    assert.equal(s.running, 24);
    assert.equal(s.waiting, 3);
    assert.equal(s.kvUsage, 0.61);
    assert.equal(s.kvCapacityTokens, 401_294);
    assert.equal(
      parseEngineMetrics('sglang_gen_throughput{model_name="m"} 1.0\n'),
      undefined,
      "no core series",
    );
  });

  it("SGLang with priority scheduling: the empty-priority series is the total, its priority buckets are not added to it", () => {
    // The shape SGLang prints with priority scheduling, as scrapers of it describe it: one series per
    // priority and one with priority="" holding their total.
    const s = parseEngineMetrics(
      [
        'sglang:num_running_reqs{pp_rank="0",priority="",tp_rank="0"} 14.0',
        'sglang:num_running_reqs{pp_rank="0",priority="-1",tp_rank="0"} 0.0',
        'sglang:num_running_reqs{pp_rank="0",priority="0",tp_rank="0"} 14.0',
        'sglang:num_queue_reqs{pp_rank="0",priority="",tp_rank="0"} 2.0',
        'sglang:num_queue_reqs{pp_rank="0",priority="-1",tp_rank="0"} 2.0',
        'sglang:token_usage{pp_rank="0",tp_rank="0"} 0.4',
      ].join("\n"),
    );
    assert.ok(s);
    assert.equal(s.running, 14, "not 28");
    assert.equal(s.waiting, 2, "not 4");
    assert.equal(s.kvUsage, 0.4, "a family without priorities is read whole");
  });

  it("SGLang's cached tokens by cache source add up; a `total` source is taken alone", () => {
    const base = [
      'sglang:num_running_reqs{tp_rank="0"} 1',
      'sglang:prompt_tokens_total{model_name="m"} 1000',
    ];
    const split = parseEngineMetrics(
      [
        ...base,
        'sglang:cached_tokens_total{cache_source="device",model_name="m"} 300',
        'sglang:cached_tokens_total{cache_source="host",model_name="m"} 100',
      ].join("\n"),
    );
    assert.ok(split);
    assert.equal(split.prefixQueryTokens, 1000);
    assert.equal(split.prefixHitTokens, 400);
    assert.ok(!split.unknown.includes("prefixCache"));
    const withTotal = parseEngineMetrics(
      [
        ...base,
        'sglang:cached_tokens_total{cache_source="device",model_name="m"} 300',
        'sglang:cached_tokens_total{cache_source="total",model_name="m"} 350',
      ].join("\n"),
    );
    assert.equal(withTotal?.prefixHitTokens, 350);
  });

  it("a vLLM prefix-cache pair is read only whole: queries without hits are unknown", () => {
    const s = parseEngineMetrics(
      'vllm:num_requests_running 0\nvllm:prefix_cache_queries_total{engine="0"} 500\nvllm:gpu_prefix_cache_hits_total{engine="0"} 100\n',
    );
    assert.ok(s);
    assert.equal(s.prefixQueryTokens, 0);
    assert.equal(s.prefixHitTokens, 0);
    assert.ok(s.unknown.includes("prefixCache"));
  });
});

/*
 * Second KV tiers. No genuine engine page carrying these series was found with a
 * citable source (see fixtures/README.md: the one genuine text kept, LMCache PR
 * #1300's, holds LMCache lines only and gives the per-worker shape), so the pages
 * below are built here; their series names are the engines' own: vLLM's
 * `vllm:external_prefix_cache_{queries,hits}` (vllm/v1/metrics/loggers.py) and
 * `vllm:kv_offload_total_{bytes,time}` (the offloading connector's metrics.py),
 * LMCache's `lmcache:num_lookup_{tokens,hits}` (lmcache/observability.py),
 * SGLang's `sglang:hicache_host_{total,used}_tokens` and
 * `sglang:cached_tokens_total{cache_source}`.
 */
describe("host tiers (constructed pages)", () => {
  const vllmCore = [
    'vllm:num_requests_running{engine="0",model_name="m"} 1',
    'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000',
    'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300',
  ];

  it("vLLM with the CPU offloading connector: external queries and hits, size unknown, load rate measured", () => {
    const s = parseEngineMetrics(
      [
        ...vllmCore,
        'vllm:cache_config_info{block_size="16",engine="0",kv_offloading_backend="native",kv_offloading_size="64.0",num_cpu_blocks="None",num_gpu_blocks="1000"} 1.0',
        'vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 700',
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 400',
        'vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 52428800',
        'vllm:kv_offload_total_time_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 0.002',
        'vllm:kv_offload_total_time_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"} 9',
      ].join("\n"),
    );
    assert.ok(s);
    assert.equal(s.prefixHitTokens, 300, "the GPU tier's own counters are untouched");
    assert.equal(s.hostPrefixQueryTokens, 700);
    assert.equal(s.hostPrefixHitTokens, 400);
    assert.equal(s.hostKvCapacityTokens, 0, "vLLM states GiB, not blocks: the size in tokens is unknown");
    assert.ok(s.unknown.includes("hostKvCapacityTokens"));
    assert.equal(s.hostLoadTokensPerSecond, 400 / 0.002, "tokens supplied over the CPU→GPU time only");
  });

  it("vLLM's flat offload load time, where a build exports it, gives the load rate before the deprecated series", () => {
    // Names from vllm/backends/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py at
    // 055e47c28003156421365af985d676fc921cb075 (`_TransferMetricName`: counters, exported with `_total`).
    const external = [
      'vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 700',
      'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 400',
    ];
    const both = parseEngineMetrics(
      [
        ...vllmCore,
        ...external,
        'vllm:kv_offload_load_time_total{engine="0",model_name="m"} 0.004',
        'vllm:kv_offload_store_time_total{engine="0",model_name="m"} 9',
        'vllm:kv_offload_total_time_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 0.002',
      ].join("\n"),
    );
    assert.equal(both?.hostLoadTokensPerSecond, 400 / 0.004, "the flat load time, not the store time");
    const flatOnly = parseEngineMetrics(
      [...vllmCore, ...external, 'vllm:kv_offload_load_time_total{engine="0",model_name="m"} 0.008'].join(
        "\n",
      ),
    );
    assert.equal(flatOnly?.hostLoadTokensPerSecond, 400 / 0.008);
  });

  it("a stated host block count gives the tier's size; the sum runs over data-parallel engines", () => {
    const s = parseEngineMetrics(
      [
        ...vllmCore,
        'vllm:cache_config_info{block_size="16",engine="0",kv_offloading_size="8",num_cpu_blocks="1000"} 1',
        'vllm:cache_config_info{block_size="16",engine="1",kv_offloading_size="8",num_cpu_blocks="1000"} 1',
      ].join("\n"),
    );
    assert.equal(s?.hostKvCapacityTokens, 32_000);
    assert.ok(!s?.unknown.includes("hostKvCapacityTokens"));
    assert.equal(s?.hostPrefixHitTokens, undefined, "no counters yet: not measured, not zero");
  });

  it("LMCache's own lookup counters stand in when vLLM's external ones are absent", () => {
    const s = parseEngineMetrics(
      [
        ...vllmCore,
        'lmcache:num_lookup_tokens_total{model_name="m",role="worker",worker_id="0"} 900',
        'lmcache:num_lookup_hits_total{model_name="m",role="worker",worker_id="0"} 600',
      ].join("\n"),
    );
    assert.equal(s?.hostPrefixQueryTokens, 900);
    assert.equal(s?.hostPrefixHitTokens, 600);
  });

  it("LMCache's lookup counters on four workers are read once: each worker counts every lookup", () => {
    // Built here after the shape of LMCache PR #1300's genuine page (lmcache-lookup-per-worker-pr1300.prom):
    // one series per worker_id, equal because LMCache's lookup client asks every tensor-parallel worker.
    const perWorker = ["0", "1", "2", "3"].flatMap((worker) => [
      `lmcache:num_lookup_tokens_total{model_name="m",worker_id="${worker}"} 900`,
      `lmcache:num_lookup_hits_total{model_name="m",worker_id="${worker}"} 600`,
    ]);
    const s = parseEngineMetrics([...vllmCore, ...perWorker].join("\n"));
    assert.equal(s?.hostPrefixQueryTokens, 900, "not 4 × 900");
    assert.equal(s?.hostPrefixHitTokens, 600);
    assert.equal(
      s?.dataParallelSize,
      1,
      "workers are tensor-parallel ranks of one engine, not data-parallel ones",
    );
  });

  it("an engine without a second tier is one tier: no host fields at all", () => {
    const s = parseEngineMetrics(
      [
        ...vllmCore,
        'vllm:cache_config_info{block_size="16",engine="0",kv_offloading_size="None",num_cpu_blocks="0",num_gpu_blocks="1000"} 1',
      ].join("\n"),
    );
    assert.ok(s);
    for (const key of ["hostKvCapacityTokens", "hostPrefixQueryTokens", "hostPrefixHitTokens", "hostKvUsage"])
      assert.ok(!(key in s), key);
    assert.ok(!s.unknown.includes("hostKvCapacityTokens"));
    const sglang = parseEngineMetrics('sglang:num_running_reqs{tp_rank="0"} 1\nsglang:token_usage 0.2\n');
    assert.equal(sglang?.hostKvCapacityTokens, undefined);
  });

  it("vLLM's external counters never queried, with nothing else of a tier, are one tier: every V1 engine exports them", () => {
    // vllm/v1/metrics/loggers.py creates vllm:external_prefix_cache_{queries,hits} for every engine
    // core whether or not a KV connector is configured; without one they stay at 0.
    const plain = parseEngineMetrics(
      [
        ...vllmCore,
        'vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 0.0',
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 0.0',
      ].join("\n"),
    );
    assert.ok(plain);
    assert.equal(plain.hostKvCapacityTokens, undefined, "no host tier");
    assert.equal(plain.hostPrefixQueryTokens, undefined);
    assert.ok(!plain.unknown.includes("hostKvCapacityTokens"));
    const queried = parseEngineMetrics(
      [
        ...vllmCore,
        'vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 512.0',
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 0.0',
      ].join("\n"),
    );
    assert.equal(
      queried?.hostPrefixQueryTokens,
      512,
      "a connector that was asked is a tier, even at no hits",
    );
    assert.equal(queried?.hostPrefixHitTokens, 0);
    const offloading = parseEngineMetrics(
      [
        ...vllmCore,
        'vllm:cache_config_info{block_size="16",engine="0",kv_offloading_size="8",num_cpu_blocks="None",num_gpu_blocks="1000"} 1',
        'vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 0.0',
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 0.0',
      ].join("\n"),
    );
    assert.equal(
      offloading?.hostPrefixQueryTokens,
      0,
      "an offloading size shows the tier before its first query",
    );
  });

  it("SGLang HiCache: host pool size and use per tp_rank counted once, host hits over prompts less device hits", () => {
    const s = parseEngineMetrics(
      [
        'sglang:num_running_reqs{tp_rank="0"} 1',
        'sglang:num_running_reqs{tp_rank="1"} 1',
        'sglang:prompt_tokens_total{model_name="m"} 1000',
        'sglang:cached_tokens_total{cache_source="device",model_name="m"} 300',
        'sglang:cached_tokens_total{cache_source="host",model_name="m"} 100',
        'sglang:hicache_host_total_tokens{model_name="m",tp_rank="0"} 2000000',
        'sglang:hicache_host_total_tokens{model_name="m",tp_rank="1"} 2000000',
        'sglang:hicache_host_used_tokens{model_name="m",tp_rank="0"} 500000',
        'sglang:hicache_host_used_tokens{model_name="m",tp_rank="1"} 500000',
      ].join("\n"),
    );
    assert.ok(s);
    assert.equal(s.hostKvCapacityTokens, 2_000_000);
    assert.equal(s.hostKvUsage, 0.25);
    assert.equal(s.hostPrefixHitTokens, 100);
    assert.equal(s.hostPrefixQueryTokens, 700);
    assert.equal(s.prefixHitTokens, 400, "SGLang's cached tokens include its host hits, as before");
  });
});
