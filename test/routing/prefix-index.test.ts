/** @module Tests of the per-replica LRU prefix index. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { blockHashes } from "../../src/routing/block-hash.js";
import { PrefixIndex } from "../../src/routing/prefix-index.js";

function prompt(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => (Math.imul(i + salt * 100_003, 2654435761) >>> 8) % 200_000);
}

describe("PrefixIndex", () => {
  it("matches the longest unbroken prefix of what was recorded", () => {
    const index = new PrefixIndex(100);
    const sys = prompt(64 * 4, 1);
    const a = blockHashes([...sys, ...prompt(64 * 3, 2)], 64);
    const b = blockHashes([...sys, ...prompt(64 * 5, 3)], 64);
    index.record(a);
    assert.equal(index.size, 7);
    assert.equal(index.matchBlocks(a), 7);
    assert.equal(index.matchBlocks(b), 4);
    assert.equal(index.matchBlocks(blockHashes(prompt(640, 4), 64)), 0);
    assert.ok(index.has(a[0]!));
    assert.ok(!index.has(b[6]!));
  });

  it("does not score blocks held after a gap", () => {
    const index = new PrefixIndex(10);
    const h = blockHashes(prompt(64 * 4, 1), 64);
    index.record(h.slice(1));
    assert.equal(index.matchBlocks(h), 0);
  });

  it("evicts least recently used blocks beyond its capacity, a chain's tail first", () => {
    const index = new PrefixIndex(6);
    const a = blockHashes(prompt(64 * 4, 1), 64);
    const b = blockHashes(prompt(64 * 4, 2), 64);
    index.record(a);
    index.record(b);
    assert.equal(index.size, 6);
    // b is most recent; of a, only its head (blocks 0 and 1) survives.
    assert.equal(index.matchBlocks(b), 4);
    assert.equal(index.matchBlocks(a), 2);
    assert.ok(!index.has(a[2]!) && !index.has(a[3]!));
  });

  it("keeps the head of a chain longer than its capacity", () => {
    const index = new PrefixIndex(5);
    const h = blockHashes(prompt(64 * 12, 1), 64);
    index.record(h);
    assert.equal(index.size, 5);
    assert.equal(index.matchBlocks(h), 5);
  });

  it("refreshes recorded blocks, so a reused prefix outlives unrelated ones", () => {
    const index = new PrefixIndex(8);
    const sys = blockHashes(prompt(64 * 2, 1), 64);
    index.record(sys);
    for (let s = 2; s < 6; s++) {
      index.record(sys);
      index.record(blockHashes(prompt(64 * 3, s), 64));
      assert.equal(index.matchBlocks(sys), 2, `after session ${s}`);
    }
  });

  it("matching does not change recency", () => {
    const index = new PrefixIndex(4);
    const a = blockHashes(prompt(64 * 2, 1), 64);
    const b = blockHashes(prompt(64 * 2, 2), 64);
    const c = blockHashes(prompt(64 * 2, 3), 64);
    index.record(a);
    index.record(b);
    for (let i = 0; i < 3; i++) index.matchBlocks(a);
    index.record(c);
    assert.equal(index.matchBlocks(a), 0);
    assert.equal(index.matchBlocks(b), 2);
  });

  it("clears, deletes, and resizes keeping the most recent blocks", () => {
    const index = new PrefixIndex(10);
    const a = blockHashes(prompt(64 * 4, 1), 64);
    const b = blockHashes(prompt(64 * 4, 2), 64);
    index.record(a);
    index.record(b);
    index.resize(4);
    assert.equal(index.capacity, 4);
    assert.equal(index.size, 4);
    assert.equal(index.matchBlocks(b), 4);
    assert.equal(index.matchBlocks(a), 0);
    index.resize(20);
    index.record(a);
    assert.equal(index.size, 8);
    assert.ok(index.delete(a[1]!));
    assert.equal(index.matchBlocks(a), 1);
    index.clear();
    assert.equal(index.size, 0);
    assert.equal(index.matchBlocks(b), 0);
  });

  it("rejects a capacity that is not a positive integer, naming it", () => {
    assert.throws(() => new PrefixIndex(0), /capacityBlocks .* got 0/);
    assert.throws(() => new PrefixIndex(2.5), /got 2\.5/);
    assert.throws(() => new PrefixIndex(3).resize(-1), /got -1/);
  });
});
