/** @module Automatic prefix caching: chained block hashes, hits on full shared blocks only, LRU eviction of unreferenced blocks. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { BlockPool, HashIndex, type KvBlockEvent } from "../../adapters/engines/sim/block-pool.js";
import { assertIdle, harness, tokens } from "./sim-helpers.js";

describe("prefix cache", () => {
  test("a second call with the same prefix hits exactly the full shared blocks", async () => {
    const h = harness();
    const shared = tokens(100, 1); // 6 full blocks + 4 tokens
    const a = await h.call("a", [...shared, ...tokens(50, 2)], 4);
    await h.drain();
    const b = await h.call("b", [...shared, ...tokens(70, 3)], 4);
    await h.drain();
    assert.equal(a.result!.cachedTokens, 0);
    // Tokens 96..99 are shared too, but their block (96..111) differs after them: not reusable.
    assert.equal(b.result!.cachedTokens, 96);
    const s = h.engine.signals();
    assert.equal(s.prefixQueryTokens, 150 + 170);
    assert.equal(s.prefixHitTokens, 96);
    assertIdle(h);
  });

  test("a diverging block breaks the chain: later equal blocks do not count", async () => {
    const h = harness();
    const head = tokens(32, 1);
    const tail = tokens(64, 2);
    await h.call("a", [...head, ...tokens(16, 3), ...tail, 1], 2);
    await h.drain();
    // Same blocks 0, 1, 3, 4, 5 as "a", but block 2 differs: only blocks 0 and 1 may be reused.
    const b = await h.call("b", [...head, ...tokens(16, 4), ...tail, 1], 2);
    await h.drain();
    assert.equal(b.result!.cachedTokens, 32);
    assertIdle(h);
  });

  test("an identical prompt reuses every full block but recomputes at least its last token", async () => {
    const h = harness();
    const prompt = tokens(64, 9); // exactly 4 blocks
    await h.call("a", prompt, 1);
    await h.drain();
    const b = await h.call("b", prompt, 1);
    await h.drain();
    assert.equal(b.result!.cachedTokens, 48, "the last block is recomputed so the last token has a logit");
    assert.deepEqual(
      b.result!.outputTokens,
      await h.engine
        .generate({
          requestId: "c",
          model: h.engine.model,
          promptTokens: prompt,
          maxTokens: 1,
          endpoint: "completions",
          stream: false,
          signal: new AbortController().signal,
        })
        .then(async (s) => {
          await h.drain();
          return (await s.result).outputTokens;
        }),
      "same prompt, same output",
    );
    assertIdle(h);
  });

  test("generated tokens are cached too: a follow-up that extends prompt + output hits them", async () => {
    const h = harness();
    const prompt = tokens(40, 5);
    const a = await h.call("a", prompt, 40); // 80 tokens of context: 5 full blocks
    await h.drain();
    const next = [...prompt, ...a.result!.outputTokens!, ...tokens(30, 6)];
    const b = await h.call("b", next, 2);
    await h.drain();
    // a computed KV for 79 tokens (its last sampled token never went through the model): 4 full blocks.
    assert.equal(b.result!.cachedTokens, 64);
    assertIdle(h);
  });

  test("LRU eviction: least recently freed blocks go first, a call's tail before its head", async () => {
    // 10 blocks of 16 tokens, allocated from a queue that starts 0, 1, …, 9.
    const h = harness({ kvCapacityTokens: 160 });
    const A = tokens(64, 1);
    const B = tokens(64, 2);
    await h.call("A", A, 1); // computes 64 tokens in blocks 0–3, freed tail-first
    await h.drain();
    await h.call("B", B, 1); // blocks 4–7
    await h.drain();
    // Free queue: 8, 9, A3, A2, A1, A0, B3, B2, B1, B0.
    await h.call("C", tokens(70, 3), 1); // 5 blocks: 8, 9, A3, A2, A1 → evicts A's tail, keeps A0
    await h.drain();
    // Free queue: A0, B3, B2, B1, B0, then C's blocks.
    const a = await h.call("A again", A, 1); // hits A0, then takes 3 blocks: B3, B2, B1 (evicted)
    await h.drain();
    assert.equal(a.result!.cachedTokens, 16, "A's head survived its tail");
    const b = await h.call("B again", B, 1);
    await h.drain();
    assert.equal(b.result!.cachedTokens, 16, "B's blocks 1–3 were the least recently freed after A0");
    // 3 (A's tail) + 3 (B's tail) + 2 of C's cached blocks taken by "B again" (C's partial block had no hash).
    assert.equal(h.engine.stats().evictedBlocks, 8);
    assertIdle(h);
  });

  test("blocks of a running call are never evicted: a newcomer waits instead", async () => {
    const h = harness({ kvCapacityTokens: 160 });
    const long = await h.call("long", tokens(100, 1), 40); // 7 blocks now, 9 at the end
    const other = await h.call("other", tokens(60, 2), 1); // 4 blocks: cannot fit next to it
    await h.clock.advanceAsync(1);
    assert.equal(h.engine.signals().running, 1);
    assert.equal(h.engine.signals().waiting, 1);
    await h.drain();
    assert.ok(other.firstTokenMs! >= long.endMs!, "other started only once long had finished");
    assert.equal(long.result!.completionTokens, 40);
    assert.equal(h.engine.stats().preemptions, 0);
    assertIdle(h);
  });
});

describe("BlockPool", () => {
  test("allocation takes the free queue's head; release appends tail-first; only unreferenced blocks are evicted", () => {
    const events: KvBlockEvent[] = [];
    const pool = new BlockPool(6, (e) => events.push(e));
    const a = [pool.allocate(), pool.allocate(), pool.allocate()];
    assert.deepEqual(a, [0, 1, 2]);
    for (const [i, b] of a.entries()) pool.register(b, 100 + i);
    const held = [pool.allocate()]; // block 3, referenced throughout
    pool.register(held[0]!, 900);
    pool.release(a);
    assert.deepEqual(pool.freeQueue(), [4, 5, 2, 1, 0]);
    assert.equal(pool.usedBlocks(), 1);
    // A hit on 100,101 takes blocks 0 and 1 out of the queue.
    const hit = pool.lookup([100, 101, 102, 999], 10);
    assert.deepEqual(hit, [0, 1, 2]);
    assert.deepEqual(pool.lookup([100, 999, 102], 10), [0], "the chain stops at the first miss");
    assert.deepEqual(pool.lookup([100, 101, 102], 2), [0, 1], "capped");
    pool.touch([0, 1]);
    assert.deepEqual(pool.freeQueue(), [4, 5, 2]);
    // Allocating everything free evicts block 2 (hash 102) but never touches 0, 1 (hit) or 3 (held).
    const taken = [pool.allocate(), pool.allocate(), pool.allocate()];
    assert.deepEqual(taken, [4, 5, 2]);
    assert.equal(pool.has(102), false);
    assert.equal(pool.has(100) && pool.has(101) && pool.has(900), true);
    assert.equal(pool.freeBlocks(), 0);
    assert.throws(() => pool.allocate(), /no free block/);
    assert.deepEqual(
      events.filter((e) => e.type === "removed").map((e) => e.hash),
      [102],
    );
    pool.release([0, 1]);
    pool.release(taken);
    pool.release(held);
    assert.equal(pool.usedBlocks(), 0);
    assert.equal(pool.freeQueue().length, 6);
    assert.throws(() => pool.release([0]), /was not referenced/);
  });

  test("a shared block stays used until its last reference is released", () => {
    const pool = new BlockPool(2);
    const b = pool.allocate();
    pool.touch([b]);
    assert.equal(pool.refCount(b), 2);
    pool.release([b]);
    assert.equal(pool.usedBlocks(), 1);
    pool.release([b]);
    assert.equal(pool.usedBlocks(), 0);
  });
});

describe("HashIndex", () => {
  test("behaves like a Map under heavy collisions, inserts and deletes", () => {
    const index = new HashIndex(64);
    const model = new Map<number, number>();
    let s = 12345;
    const rand = (n: number) => {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0;
      return s % n;
    };
    for (let op = 0; op < 200_000; op++) {
      // High bits vary, low bits collide a lot: many keys share a home slot.
      const key = rand(50) * 4294967296 + rand(8) * 17;
      const roll = rand(3);
      if (roll === 0 && model.size < 64 && !model.has(key)) {
        index.set(key, op % 1000);
        model.set(key, op % 1000);
      } else if (roll === 1) {
        index.delete(key);
        model.delete(key);
      } else {
        assert.equal(index.get(key), model.get(key) ?? -1, `op ${op}`);
      }
      assert.equal(index.size, model.size);
    }
    for (const [key, value] of model) assert.equal(index.get(key), value);
  });
});
