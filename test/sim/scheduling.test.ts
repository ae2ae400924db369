/** @module Continuous batching: chunked prefill, batch bounds, preemption by recompute, abort, data-parallel ranks. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Refusal } from "../../src/errors.js";
import { assertIdle, harness, type Tracked, tokens } from "./sim-helpers.js";

/** Every token the calls needed computed once: prompt + output − 1 (the last sample is never fed back) − cached. */
function workOnce(calls: Tracked[]): number {
  let sum = 0;
  for (const c of calls)
    sum += c.result!.promptTokens + c.result!.completionTokens - 1 - c.result!.cachedTokens;
  return sum;
}

describe("chunked prefill and batch bounds", () => {
  test("no step computes more than max_num_batched_tokens; long prompts are split into chunks", async () => {
    const h = harness({ maxNumBatchedTokens: 512 });
    const calls = [
      await h.call("a", tokens(2000, 1), 30),
      await h.call("b", tokens(1300, 2), 30),
      await h.call("c", tokens(100, 3), 30),
    ];
    await h.drain();
    for (const step of h.steps) {
      assert.ok(
        step.prefillTokens + step.decodeSeqs <= 512,
        `step at ${step.startMs} computed ${step.prefillTokens} + ${step.decodeSeqs}`,
      );
    }
    // "a" alone needs ⌈2000 / 512⌉ = 4 prefill steps before its first token.
    const before = h.steps.filter((s) => s.endMs <= calls[0]!.firstTokenMs!);
    assert.equal(before.length, 4);
    assert.deepEqual(
      before.map((s) => s.prefillTokens),
      [512, 512, 512, 512],
      "a's first three chunks and a's last 464 tokens + 48 of b",
    );
    const s = h.engine.stats();
    assert.equal(s.prefillTokens + s.decodeTokens, workOnce(calls));
    assertIdle(h);
  });

  test("running decodes keep their slot while a long prefill is chunked behind them", async () => {
    const h = harness({ maxNumBatchedTokens: 256 });
    const short = await h.call("short", tokens(50, 1), 20);
    await h.clock.advanceAsync(50); // short is decoding now
    await h.call("long", tokens(3000, 2), 5);
    await h.drain();
    // Every step while both ran carried short's decode plus a 255-token chunk of long.
    const mixed = h.steps.filter((s) => s.decodeSeqs === 1 && s.prefillTokens > 0);
    assert.ok(mixed.length >= 5);
    // Full steps except long's last chunk (3000 − 255·k tokens left over).
    for (const s of mixed.slice(0, -1)) assert.equal(s.prefillTokens + s.decodeSeqs, 256);
    assert.ok(mixed.at(-1)!.prefillTokens + mixed.at(-1)!.decodeSeqs <= 256);
    assert.equal(short.result!.completionTokens, 20);
    assertIdle(h);
  });

  test("at most max_num_seqs calls run at once; the rest wait in arrival order", async () => {
    const h = harness({ maxNumSeqs: 3 });
    const calls: Tracked[] = [];
    for (let i = 0; i < 8; i++) calls.push(await h.call(`c${i}`, tokens(40, i), 10 + i));
    await h.drain();
    for (const s of h.steps) assert.ok(s.running <= 3, `running ${s.running}`);
    const scheduled = h.calls.filter((e) => e.type === "scheduled").map((e) => e.requestId);
    assert.deepEqual(
      scheduled,
      calls.map((c) => c.id),
    );
    assertIdle(h);
  });
});

describe("preemption by recompute", () => {
  test("when blocks run out the youngest running call is preempted and its tokens recomputed", async () => {
    // 40 blocks (640 tokens); three calls that grow to 150 + 200 = 350 tokens (22 blocks) each.
    const h = harness({ kvCapacityTokens: 640 });
    const calls = [
      await h.call("old", tokens(150, 1), 200),
      await h.call("mid", tokens(150, 2), 200),
      await h.call("young", tokens(150, 3), 200),
    ];
    await h.drain();
    const preempted = h.calls.filter((e) => e.type === "preempted").map((e) => e.requestId);
    assert.ok(preempted.length >= 1);
    assert.equal(preempted[0], "young", "the youngest running call goes first");
    assert.ok(!preempted.includes("old"), "the oldest call is never the victim while younger ones run");
    const s = h.engine.stats();
    assert.equal(s.preemptions, preempted.length);
    assert.equal(h.engine.signals().preemptions, preempted.length);
    assert.ok(s.recomputedTokens > 0);
    // All work = each token once + what was recomputed after preemptions.
    assert.equal(s.prefillTokens + s.decodeTokens, workOnce(calls) + s.recomputedTokens);
    for (const c of calls) {
      assert.equal(c.result!.completionTokens, 200);
      assert.equal(c.result!.finishReason, "length");
    }
    assertIdle(h);
  });

  test("a preempted call resumes with its output intact and the same tokens as without preemption", async () => {
    const solo = harness();
    const ref = await solo.call("young", tokens(150, 3), 200);
    await solo.drain();
    const h = harness({ kvCapacityTokens: 640 });
    await h.call("old", tokens(150, 1), 200);
    await h.call("mid", tokens(150, 2), 200);
    const young = await h.call("young", tokens(150, 3), 200);
    await h.drain();
    assert.deepEqual(young.result!.outputTokens, ref.result!.outputTokens);
  });
});

describe("abort", () => {
  test("aborting a running call frees its blocks at once and ends its stream with abort", async () => {
    const h = harness();
    const controller = new AbortController();
    const call = await h.call("a", tokens(1000, 1), 500, { signal: controller.signal });
    const other = await h.call("b", tokens(300, 2), 50);
    await h.clock.advanceAsync(100);
    assert.ok(h.engine.signals().kvUsage > 0);
    const chunks: number[] = [];
    const reading = (async () => {
      for await (const chunk of call.stream) chunks.push(chunk.tokenCount);
    })();
    await h.clock.advanceAsync(30);
    const usedBefore = h.engine.poolOf(0).usedBlocks();
    controller.abort();
    const usedAfter = h.engine.poolOf(0).usedBlocks();
    // The call held at least its prompt's 63 blocks (plus its output's); all were freed synchronously.
    assert.ok(usedBefore - usedAfter >= Math.ceil(1000 / 16), `${usedBefore} → ${usedAfter}`);
    await reading;
    const result = await call.stream.result;
    assert.equal(result.finishReason, "abort");
    assert.ok(result.completionTokens > 0 && result.completionTokens < 500);
    assert.equal(
      chunks.reduce((a, b) => a + b, 0),
      result.completionTokens,
    );
    await h.drain();
    assert.equal(other.result!.finishReason, "length");
    assert.equal(h.engine.stats().aborted, 1);
    assertIdle(h);
  });

  test("aborting a waiting call removes it; breaking out of iteration cancels too", async () => {
    const h = harness({ maxNumSeqs: 1 });
    const controller = new AbortController();
    const first = await h.call("first", tokens(100, 1), 100);
    const queued = await h.call("queued", tokens(100, 2), 10, { signal: controller.signal });
    await h.clock.advanceAsync(20);
    assert.equal(h.engine.signals().waiting, 1);
    controller.abort();
    assert.equal(h.engine.signals().waiting, 0);
    assert.equal((await queued.stream.result).finishReason, "abort");
    assert.equal((await queued.stream.result).completionTokens, 0);
    for await (const _ of first.stream) break;
    assert.equal((await first.stream.result).finishReason, "abort");
    assert.equal(h.engine.signals().running, 0);
    await h.drain();
    assertIdle(h);
  });

  test("a call whose signal is already aborted never runs", async () => {
    const h = harness();
    const call = await h.call("x", tokens(10, 1), 5, { signal: AbortSignal.abort() });
    assert.equal((await call.stream.result).finishReason, "abort");
    await h.drain();
    assert.equal(h.engine.stats().steps, 0);
    assertIdle(h);
  });

  test("close() aborts everything and refuses later calls", async () => {
    const h = harness();
    const a = await h.call("a", tokens(100, 1), 100);
    await h.clock.advanceAsync(40);
    await h.engine.close();
    assert.equal((await a.stream.result).finishReason, "abort");
    assert.equal(h.engine.signals().healthy, false);
    await assert.rejects(
      h.call("b", tokens(10, 2), 1),
      (e: unknown) => e instanceof Refusal && e.reason === "unavailable",
    );
    assertIdle(h);
  });
});

describe("validation", () => {
  test("empty prompts, bad max_tokens and over-long calls are refused before queueing", async () => {
    const h = harness({ kvCapacityTokens: 1600 });
    await assert.rejects(
      h.call("e", [], 5),
      (e: unknown) => e instanceof Refusal && e.reason === "invalid_request",
    );
    await assert.rejects(h.call("m", [1], 0), /max_tokens must be an integer ≥ 1, got 0/);
    await assert.rejects(
      h.call("l", tokens(1500, 1), 101),
      (e: unknown) => e instanceof Refusal && e.reason === "context_limit" && /1601 tokens/.test(e.message),
    );
    assert.equal(h.engine.signals().waiting, 0);
    assertIdle(h);
  });

  test("constructor options are checked with the value named", () => {
    assert.throws(
      () => harness({ dataParallelSize: 0 }),
      /dataParallelSize should be an integer in \[1, 1024\], got 0/,
    );
    assert.throws(() => harness({ id: "" }), /id should be a non-empty string, got ""/);
    assert.throws(() => harness({ preset: "nope" as "instant" }), /got "nope"/);
  });
});

describe("data-parallel ranks", () => {
  test("each rank has its own KV and batch; rank is honoured; no rank goes to the least loaded", async () => {
    const h = harness({ dataParallelSize: 2, kvCapacityTokens: 3200 });
    const prompt = tokens(200, 1);
    const r0 = await h.call("r0", prompt, 5, { rank: 0 });
    await h.drain();
    const r1 = await h.call("r1", prompt, 5, { rank: 1 });
    await h.drain();
    const r1again = await h.call("r1again", prompt, 5, { rank: 1 });
    await h.drain();
    assert.equal(r0.result!.cachedTokens, 0);
    assert.equal(r1.result!.cachedTokens, 0, "rank 1 does not see rank 0's cache");
    assert.equal(r1again.result!.cachedTokens, 192);
    // Two calls without a rank, and one for an unknown rank: spread by load.
    await h.call("u1", tokens(100, 2), 50);
    await h.call("u2", tokens(100, 3), 50);
    await h.call("u3", tokens(100, 4), 50, { rank: 7 });
    const ranks = new Map(h.calls.filter((e) => e.type === "arrival").map((e) => [e.requestId, e.rank]));
    assert.equal(ranks.get("r1"), 1);
    assert.equal(ranks.get("u1"), 0);
    assert.equal(ranks.get("u2"), 1);
    assert.equal(ranks.get("u3"), 0);
    await h.clock.advanceAsync(20);
    const per = h.engine.rankSignals();
    assert.deepEqual(
      per.map((r) => r.running),
      [2, 1],
    );
    const s = h.engine.signals();
    assert.equal(s.running, 3);
    assert.equal(s.dataParallelSize, 2);
    assert.equal(s.kvCapacityTokens, 2 * 3200);
    assert.ok(Math.abs(s.kvUsage - (per[0]!.kvUsage + per[1]!.kvUsage) / 2) < 1e-12);
    await h.drain();
    // Ranks run side by side: two equal calls on two ranks end together.
    const a = await h.call("a", tokens(500, 8), 20, { rank: 0 });
    const b = await h.call("b", tokens(500, 9), 20, { rank: 1 });
    await h.drain();
    assert.equal(a.endMs, b.endMs);
    assertIdle(h);
  });
});

describe("instant preset", () => {
  test("completes inside generate, counts tokens and caches prefixes", async () => {
    const h = harness({ preset: "instant" });
    const prompt = tokens(100, 1);
    const a = await h.call("a", prompt, 7);
    assert.equal((await a.stream.result).completionTokens, 7);
    const b = await h.call("b", prompt, 7);
    const result = await b.stream.result;
    assert.equal(result.cachedTokens, 96);
    assert.deepEqual(result.outputTokens, (await a.stream.result).outputTokens);
    let text = "";
    for await (const chunk of b.stream) text += chunk.text;
    assert.equal(text.trim().split(" ").length, 7);
    assert.equal(h.clock.now(), 0);
    const s = h.engine.signals();
    assert.equal(s.prefixQueryTokens, 200);
    assert.equal(s.prefixHitTokens, 96);
    assertIdle(h);
  });
});
