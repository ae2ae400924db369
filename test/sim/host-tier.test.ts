/** @module The host-memory KV tier: GPU evictions spill there (LRU), a prefix found there is loaded at PCIe speed, not recomputed. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { serveOptionsFromArgs } from "../../adapters/cli/serve.js";
import { parseEngineMetrics } from "../../adapters/engines/openai/metrics-parser.js";
import type { KvBlockEvent } from "../../adapters/engines/sim/block-pool.js";
import { HostTier } from "../../adapters/engines/sim/host-tier.js";
import { createSimRegistry } from "../../adapters/engines/sim/metrics.js";
import { hostLoadMsPerToken, resolveSimParams, stepTimeMs } from "../../adapters/engines/sim/presets.js";
import { assertIdle, harness, tokens } from "./sim-helpers.js";

/** A replica with room for 20 blocks of GPU KV (320 tokens) and, unless told, 64 blocks of host KV. */
function small(hostKvTokens = 64 * 16) {
  return harness({ kvCapacityTokens: 320, hostKvTokens, maxNumBatchedTokens: 8192 });
}

describe("host tier", () => {
  test("LRU of hashes: stores evict the least recently used, a touch renews, a stored hash is not written twice", () => {
    const tier = new HostTier(3);
    assert.equal(tier.store(1), true);
    assert.equal(tier.store(2), true);
    assert.equal(tier.store(3), true);
    tier.touch([1], 0, 1);
    assert.equal(tier.store(2), false, "already held: renewed, not written");
    assert.deepEqual(tier.lruOrder(), [3, 1, 2]);
    assert.equal(tier.store(4), true);
    assert.equal(tier.has(3), false, "the least recently used left");
    assert.deepEqual(tier.lruOrder(), [1, 2, 4]);
    assert.equal(tier.evictedBlocks(), 1);
    assert.equal(tier.storedBlocks(), 4);
    assert.equal(tier.matchFrom([1, 2, 9, 4], 0, 4), 2, "stops at the first absent hash");
    assert.equal(tier.matchFrom([1, 2, 9, 4], 3, 4), 1);
    assert.throws(() => new HostTier(0), RangeError);
  });

  test("load time per token follows the model shape, the GPUs of a rank and the link rate", () => {
    const p8 = resolveSimParams("h100-llama3-8b");
    assert.equal(p8.kvBytesPerToken, 32 * 8 * 128 * 2 * 2);
    assert.ok(Math.abs(hostLoadMsPerToken(p8) - (131072 / 25e9) * 1000) < 1e-12);
    const p70 = resolveSimParams("h100x4-llama3-70b");
    assert.equal(p70.kvBytesPerToken, 80 * 8 * 128 * 2 * 2);
    assert.ok(Math.abs(hostLoadMsPerToken(p70) - (327680 / 4 / 25e9) * 1000) < 1e-12);
    // Loading is several times cheaper than computing the same prefix, which is the point of the tier.
    assert.ok(hostLoadMsPerToken(p8) * 4 < p8.cPrefill);
    const shape = { prefillTokens: 16, decodeSeqs: 0, decodeContextTokens: 0, prefillPairs: 0 };
    assert.ok(
      Math.abs(
        stepTimeMs(p8, { ...shape, hostLoadTokens: 1000 }) -
          stepTimeMs(p8, shape) -
          1000 * hostLoadMsPerToken(p8),
      ) < 1e-9,
    );
    assert.equal(hostLoadMsPerToken(resolveSimParams("instant")), 0);
    assert.throws(() => resolveSimParams("h100-llama3-8b", { hostKvTokens: -1 }), RangeError);
    assert.throws(() => resolveSimParams("h100-llama3-8b", { hostLoadGBps: 0 }), RangeError);
  });

  test("a prefix evicted from GPU memory is loaded from host memory: counted as a host hit, not recomputed", async () => {
    const h = small();
    const prefix = tokens(160, 1); // 10 blocks
    await h.call("a", [...prefix, ...tokens(8, 2)], 1);
    await h.drain();
    // 312 other tokens push all of a's blocks out of the 20-block GPU pool.
    await h.call("b", tokens(312, 3), 1);
    await h.drain();
    const evicted = h.engine.stats().evictedBlocks;
    assert.ok(evicted >= 10, `a's blocks were evicted (${evicted})`);
    const stepsBefore = h.steps.length;
    const c = await h.call("c", [...prefix, ...tokens(8, 4)], 1);
    await h.drain();
    assert.equal(c.result!.cachedTokens, 160, "the whole prefix served from cache (host tier)");
    const admit = h.steps[stepsBefore]!;
    assert.equal(admit.hostLoadTokens, 160);
    assert.equal(admit.prefillTokens, 8, "only the new tokens are computed");
    const p = h.engine.params;
    assert.ok(
      Math.abs(
        admit.endMs -
          admit.startMs -
          stepTimeMs(p, {
            prefillTokens: 8,
            decodeSeqs: 0,
            decodeContextTokens: 0,
            prefillPairs: admit.prefillPairs,
            hostLoadTokens: 160,
          }),
      ) < 1e-9,
      "the load counts in the step time",
    );
    const s = h.engine.signals();
    assert.equal(s.prefixHitTokens, 0, "the GPU tier had none of it");
    assert.equal(s.hostPrefixHitTokens, 160);
    assert.equal(s.hostPrefixQueryTokens, 168 + 312 + 168, "each prompt less its GPU hits");
    assert.equal(s.hostKvCapacityTokens, 64 * 16);
    assert.ok((s.hostKvUsage ?? 0) > 0);
    assert.ok(
      Math.abs((s.hostLoadTokensPerSecond ?? 0) - 25e9 / 131072) < 1e-6,
      "25 GB/s over 128 KiB per token",
    );
    const stats = h.engine.stats();
    assert.equal(stats.hostLoadedTokens, 160);
    assert.ok(stats.hostStoredBlocks >= 10);
    assertIdle(h);
  });

  test("without a host tier the same sequence recomputes the prefix and reports no host signals", async () => {
    const h = small(0);
    const prefix = tokens(160, 1);
    await h.call("a", [...prefix, ...tokens(8, 2)], 1);
    await h.drain();
    await h.call("b", tokens(312, 3), 1);
    await h.drain();
    const c = await h.call("c", [...prefix, ...tokens(8, 4)], 1);
    await h.drain();
    assert.equal(c.result!.cachedTokens, 0);
    const s = h.engine.signals();
    assert.equal(s.hostKvCapacityTokens, undefined);
    assert.equal(s.hostPrefixHitTokens, undefined);
    assert.equal(h.engine.hostBlocksPerRank(), 0);
    assertIdle(h);
  });

  test("a host tier too small to keep the prefix loses its oldest blocks first, and the chain stops there", async () => {
    // 4 host blocks: of a's 10 evicted blocks only the last 4 evicted stay — its head (released last, evicted last).
    const h = small(4 * 16);
    const prefix = tokens(160, 1);
    await h.call("a", [...prefix, ...tokens(8, 2)], 1);
    await h.drain();
    await h.call("b", tokens(312, 3), 1);
    await h.drain();
    const c = await h.call("c", [...prefix, ...tokens(8, 4)], 1);
    await h.drain();
    const cached = c.result!.cachedTokens;
    assert.ok(cached <= 4 * 16, `at most the host tier's 4 blocks (${cached})`);
    assert.equal(cached % 16, 0);
    assert.ok(h.engine.stats().hostEvictedBlocks > 0);
    assertIdle(h);
  });

  test("a preempted call resumes from host memory instead of recomputing what it had computed", async () => {
    const run = async (hostKvTokens: number) => {
      // 24 GPU blocks (384 tokens), two calls that cannot both grow to their full length.
      const h = harness({ kvCapacityTokens: 384, hostKvTokens, maxNumBatchedTokens: 8192 });
      await Promise.all([h.call("x", tokens(150, 5), 100), h.call("y", tokens(150, 6), 100)]);
      await h.drain();
      const stats = h.engine.stats();
      assertIdle(h);
      return stats;
    };
    const one = await run(0);
    const two = await run(64 * 16);
    assert.ok(one.preemptions > 0, "the scenario preempts");
    assert.ok(one.recomputedTokens > 0);
    assert.ok(
      two.recomputedTokens < one.recomputedTokens,
      `recompute ${two.recomputedTokens} with the tier < ${one.recomputedTokens} without`,
    );
    assert.ok(two.hostLoadedTokens > 0);
  });

  test("/metrics: vLLM's external prefix-cache counters, offload bytes and the tier size in cache_config_info", async () => {
    const h = small();
    const prefix = tokens(160, 1);
    await h.call("a", [...prefix, ...tokens(8, 2)], 1);
    await h.drain();
    await h.call("b", tokens(312, 3), 1);
    await h.drain();
    await h.call("c", [...prefix, ...tokens(8, 4)], 1);
    await h.drain();
    const text = await createSimRegistry(h.engine).metrics();
    assert.match(text, /vllm:external_prefix_cache_queries_total\{model_name="[^"]+",engine="0"\} 648/);
    assert.match(text, /vllm:external_prefix_cache_hits_total\{model_name="[^"]+",engine="0"\} 160/);
    const bytes = 160 * h.engine.params.kvBytesPerToken;
    assert.match(
      text,
      new RegExp(`vllm:kv_offload_total_bytes_total\\{[^}]*transfer_type="CPU_to_GPU"\\} ${bytes}`),
    );
    assert.match(text, /vllm:kv_offload_total_bytes_total\{[^}]*transfer_type="GPU_to_CPU"\} \d+/);
    // Current vLLM's flat names, beside the labelled ones it keeps for CPU offloading.
    assert.match(text, new RegExp(`vllm:kv_offload_load_bytes_total\\{[^}]*engine="0"\\} ${bytes}\n`));
    assert.match(text, /vllm:kv_offload_load_time_total\{[^}]*engine="0"\} [\d.e-]+\n/);
    assert.match(text, /vllm:kv_offload_store_bytes_total\{[^}]*engine="0"\} \d+\n/);
    assert.match(text, /vllm:cache_config_info\{[^}]*num_cpu_blocks="64"[^}]*kv_offloading_backend="native"/);
    // The adapter reads the tier back from the page as it would from vLLM.
    const read = parseEngineMetrics(text);
    assert.ok(read);
    assert.equal(read.hostPrefixHitTokens, 160);
    assert.equal(read.hostPrefixQueryTokens, 648);
    assert.equal(read.hostKvCapacityTokens, 64 * 16);
    assert.ok(Math.abs((read.hostLoadTokensPerSecond ?? 0) - 1000 / hostLoadMsPerToken(h.engine.params)) < 1);
    assert.equal(read.prefixHitTokens, 0);
    // One tier: none of those series, and cache_config_info says so.
    const one = await createSimRegistry(small(0).engine).metrics();
    assert.doesNotMatch(one, /external_prefix_cache|kv_offload_/);
    assert.match(one, /num_cpu_blocks="0"[^}]*kv_offloading_size="None"/);
    assert.equal(parseEngineMetrics(one)?.hostKvCapacityTokens, undefined);
  });

  test("`sluice serve --sim-host-kv-tokens` gives the simulated replicas a host tier on the chosen preset", async () => {
    const quiet = () => {};
    const o = await serveOptionsFromArgs(
      ["--sim-preset", "h100x2-qwen3-32b", "--sim-host-kv-tokens", "1200000"],
      {},
      quiet,
    );
    assert.equal(o.simPreset, "h100x2-qwen3-32b");
    assert.equal(o.simHostKvTokens, 1_200_000);
    const env = await serveOptionsFromArgs([], { SLUICE_SIM_HOST_KV_TOKENS: "1000" }, quiet);
    assert.equal(env.simHostKvTokens, 1000);
    assert.equal((await serveOptionsFromArgs([], {}, quiet)).simHostKvTokens, undefined, "off by default");
    await assert.rejects(
      serveOptionsFromArgs(["--sim-host-kv-tokens", "lots"], {}, quiet),
      /sim-host-kv-tokens/,
    );
  });

  test("the instant preset finds prefixes in the host tier too, at no time", async () => {
    const h = harness({ preset: "instant", kvCapacityTokens: 320, hostKvTokens: 64 * 16 });
    const prefix = tokens(160, 1);
    await h.call("a", [...prefix, ...tokens(8, 2)], 1);
    await h.call("b", tokens(312, 3), 1);
    const c = await h.call("c", [...prefix, ...tokens(8, 4)], 1);
    await h.drain();
    // b's 19 blocks evicted all of a's but its first: that one is a GPU hit, the other 9 host hits.
    assert.equal(c.result!.cachedTokens, 160);
    assert.equal(h.engine.signals().prefixHitTokens, 16);
    assert.equal(h.engine.signals().hostPrefixHitTokens, 144);
    assert.equal(h.clock.now(), 0);
    assertIdle(h);
  });

  test("host-tier events (medium CPU) mirror the tier exactly, apart from the GPU events", async () => {
    const gpu: KvBlockEvent[] = [];
    const host: KvBlockEvent[] = [];
    const h = harness({
      kvCapacityTokens: 320,
      hostKvTokens: 4 * 16,
      onKvEvent: (_rank, e) => gpu.push(e),
      onHostKvEvent: (_rank, e) => host.push(e),
    });
    await h.call("a", [...tokens(160, 1), ...tokens(8, 2)], 1);
    await h.drain();
    await h.call("b", tokens(312, 3), 1);
    await h.drain();
    assert.ok(gpu.every((e) => e.medium === undefined));
    assert.ok(host.length > 0 && host.every((e) => e.medium === "CPU"));
    // Replaying the host events gives the tier's contents.
    const mirror = new Set<number>();
    for (const e of host) {
      if (e.type === "stored") mirror.add(e.hash);
      else mirror.delete(e.hash);
    }
    assert.equal(mirror.size, 4);
    for (const hash of mirror) assert.ok(h.engine.hasHostBlock(hash));
    // Every hash the host tier stored had just been removed from GPU memory.
    const removedFromGpu = new Set(gpu.filter((e) => e.type === "removed").map((e) => e.hash));
    assert.ok(host.filter((e) => e.type === "stored").every((e) => removedFromGpu.has(e.hash)));
    assertIdle(h);
  });
});

describe("host tier in the scheduler's state", () => {
  test("/v1/admin/state shows each replica's host tier, and none for an engine with one tier", async () => {
    const { VirtualClock } = await import("../../src/clock.js");
    const { Scheduler } = await import("../../src/scheduler.js");
    const { SimEngine } = await import("../../adapters/engines/sim/sim-engine.js");
    const clock = new VirtualClock();
    const engines = [
      new SimEngine({ id: "tiered", clock, preset: { base: "h100-llama3-8b", hostKvTokens: 64_000 } }),
      new SimEngine({ id: "flat", clock, preset: "h100-llama3-8b" }),
    ];
    const scheduler = new Scheduler({ engines, clock });
    const [tiered, flat] = scheduler.state().replicas;
    assert.equal(tiered!.hostTier?.capacityTokens, 64_000);
    assert.equal(tiered!.hostTier?.hitTokens, 0);
    assert.equal(tiered!.hostTier?.retainedTokens, 0);
    assert.equal(flat!.hostTier, undefined);
    for (const engine of engines) await engine.close?.();
  });
});
