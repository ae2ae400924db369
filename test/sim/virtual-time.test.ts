/** @module Virtual time: determinism of the event trace, and decode runs (event skipping) changing nothing but speed. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { SimEngineOptions } from "../../adapters/engines/sim/sim-engine.js";
import { assertIdle, harness, type Tracked, tokens } from "./sim-helpers.js";

/**
 * A mixed workload on two ranks with a small KV pool: 40 calls arriving over
 * 3 s, a third extending a shared 300-token prefix, outputs of 1–300 tokens,
 * two of them aborted mid-way. Enough to preempt, chunk and interrupt runs.
 */
async function workload(options: Partial<SimEngineOptions>) {
  const h = harness({ dataParallelSize: 2, kvCapacityTokens: 4000, maxNumBatchedTokens: 1024, ...options });
  const shared = tokens(300, 99);
  const tracked: Tracked[] = [];
  const aborts: AbortController[] = [];
  for (let i = 0; i < 40; i++) {
    const at = (i * 7919) % 3000;
    const prompt = i % 3 === 0 ? [...shared, ...tokens(50 + i * 10, i)] : tokens(100 + ((i * 37) % 600), i);
    const maxTokens = 1 + ((i * 53) % 300);
    const controller = new AbortController();
    aborts.push(controller);
    h.clock.setTimeout(() => {
      void h.call(`c${i}`, prompt, maxTokens, { signal: controller.signal }).then((t) => tracked.push(t));
    }, at);
    if (i % 17 === 5) h.clock.setTimeout(() => controller.abort(), at + 400);
  }
  await h.drain();
  tracked.sort((a, b) => a.id.localeCompare(b.id));
  return { h, tracked };
}

describe("virtual time", () => {
  test("the same seed gives the same event trace, step by step", async () => {
    const one = await workload({ seed: 7 });
    const two = await workload({ seed: 7 });
    assert.ok(one.h.steps.length > 50);
    assert.deepEqual(two.h.steps, one.h.steps);
    assert.deepEqual(two.h.calls, one.h.calls);
    assert.deepEqual(
      two.tracked.map((t) => t.result),
      one.tracked.map((t) => t.result),
    );
    assert.ok(one.h.engine.stats().preemptions > 0, "the workload should exercise preemption");
    assertIdle(one.h);
    assertIdle(two.h);
  });

  test("another seed changes the generated tokens but not the timing", async () => {
    const one = await workload({ seed: 7 });
    const two = await workload({ seed: 8 });
    assert.deepEqual(two.h.steps, one.h.steps);
    const tokensOf = (r: { tracked: Tracked[] }) => r.tracked.map((t) => t.result!.outputTokens);
    assert.notDeepEqual(tokensOf(two), tokensOf(one));
  });

  test("decode runs give the same completions, tokens, first-token times and counters as stepping one by one", async () => {
    const fast = await workload({ skipDecodeSteps: true });
    const slow = await workload({ skipDecodeSteps: false });
    const f = fast.h.engine.stats();
    const s = slow.h.engine.stats();
    assert.ok(f.timers * 3 < s.timers, `runs should save timers: ${f.timers} vs ${s.timers}`);
    assert.equal(f.steps, s.steps);
    assert.equal(f.preemptions, s.preemptions);
    assert.equal(f.recomputedTokens, s.recomputedTokens);
    assert.equal(f.prefillTokens, s.prefillTokens);
    assert.equal(f.decodeTokens, s.decodeTokens);
    assert.ok(Math.abs(f.busyMs - s.busyMs) < 1e-6);
    assert.equal(fast.tracked.length, 40);
    for (let i = 0; i < fast.tracked.length; i++) {
      const a = fast.tracked[i]!;
      const b = slow.tracked[i]!;
      assert.equal(a.id, b.id);
      assert.deepEqual(a.result, b.result, a.id);
      assert.ok(Math.abs(a.firstTokenMs! - b.firstTokenMs!) < 1e-6, `${a.id} first token`);
      assert.ok(Math.abs(a.endMs! - b.endMs!) < 1e-6, `${a.id} completion`);
    }
    const aborted = fast.tracked.filter((t) => t.result!.finishReason === "abort");
    assert.ok(aborted.length >= 1);
    assertIdle(fast.h);
    assertIdle(slow.h);
  });

  test("signals read in the middle of a decode run see the steps already past", async () => {
    const h = harness();
    await h.call("a", tokens(16 * 10, 1), 400); // 160-token prompt: a new block every 16 decode steps
    await h.clock.advanceAsync(30);
    const early = h.engine.poolOf(0).usedBlocks();
    await h.clock.advanceAsync(16 * 8); // about 18 decode steps later
    h.engine.signals();
    const later = h.engine.poolOf(0).usedBlocks();
    assert.ok(later > early, `blocks grew with decoding: ${early} → ${later}`);
    await h.drain();
    assertIdle(h);
  });

  test("time per output token follows from first-token and completion times", async () => {
    const h = harness();
    const call = await h.call("a", tokens(64, 1), 101);
    await h.drain();
    const p = h.engine.params;
    // 100 decode steps on contexts 65 … 164: each c0 + c_kv·context (decode linear cost is under the floor).
    let expected = 0;
    for (let k = 65; k < 165; k++) expected += p.c0 + p.cKv * k;
    const tpot = (call.endMs! - call.firstTokenMs!) / (call.result!.completionTokens - 1);
    assert.ok(Math.abs(tpot - expected / 100) < 1e-9);
    assert.ok(h.engine.stats().timers <= 3, "one timer for the start, the prefill, and the decode run");
  });
});
