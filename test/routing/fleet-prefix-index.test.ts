/** @module Tests of the fleet-wide prefix index, against the per-replica index it replaces. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { blockHashes } from "../../src/routing/block-hash.js";
import { FleetPrefixIndex } from "../../src/routing/fleet-prefix-index.js";
import { PrefixIndex } from "../../src/routing/prefix-index.js";

function prompt(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => (Math.imul(i + salt * 100_003, 2654435761) >>> 8) % 200_000);
}

function fleet(capacity: Record<string, number>): FleetPrefixIndex {
  return new FleetPrefixIndex({ capacityBlocks: (replica) => capacity[replica] ?? 100 });
}

describe("FleetPrefixIndex", () => {
  it("gives every replica its longest unbroken prefix in one match, leaving out replicas with none", () => {
    const index = fleet({});
    const sys = prompt(64 * 4, 1);
    const a = blockHashes([...sys, ...prompt(64 * 3, 2)], 64);
    const b = blockHashes([...sys, ...prompt(64 * 5, 3)], 64);
    index.record("r0", a);
    index.record("r1", b);
    index.record("r2", a.slice(0, 2));
    index.record("r3", blockHashes(prompt(64 * 2, 9), 64));
    assert.deepEqual([...index.match(a)].sort(), [
      ["r0", 7],
      ["r1", 4],
      ["r2", 2],
    ]);
    assert.deepEqual([...index.match(b)].sort(), [
      ["r0", 4],
      ["r1", 9],
      ["r2", 2],
    ]);
    assert.equal(index.match(blockHashes(prompt(640, 4), 64)).size, 0);
    assert.equal(index.match([]).size, 0);
    assert.equal(index.matchReplica("r1", a), 4);
    assert.equal(index.matchReplica("nobody", a), 0);
    assert.deepEqual(index.stats().entries, 7 + 9 + 2 + 2);
    assert.equal(index.stats().nodes, 7 + 5 + 2);
    index.checkInvariants();
  });

  it("does not score blocks held after a gap: a chain is keyed by its whole prefix", () => {
    const index = fleet({});
    const h = blockHashes(prompt(64 * 4, 1), 64);
    index.record("gap", h.slice(1));
    index.record("full", h);
    assert.deepEqual([...index.match(h)], [["full", 4]]);
    assert.equal(index.matchReplica("gap", h), 0);
    index.checkInvariants();
  });

  it("accepts any strings as hashes, not only rendered ones", () => {
    const index = fleet({});
    index.record("r0", ["a", "b", "c"]);
    index.record("r1", ["a", "B"]);
    assert.deepEqual([...index.match(["a", "b", "x"])].sort(), [
      ["r0", 2],
      ["r1", 1],
    ]);
    assert.deepEqual([...index.match(["zz"])], []);
    index.forget("r0");
    index.forget("r1");
    assert.deepEqual(index.stats().nodes, 0);
    index.checkInvariants();
  });

  it("evicts each replica's least recently used blocks beyond its capacity, a chain's tail first", () => {
    const index = fleet({ small: 6, big: 100 });
    const a = blockHashes(prompt(64 * 4, 1), 64);
    const b = blockHashes(prompt(64 * 4, 2), 64);
    index.record("small", a);
    index.record("big", a);
    index.record("small", b);
    assert.equal(index.blocksHeld("small"), 6);
    assert.equal(index.matchReplica("small", b), 4);
    assert.equal(index.matchReplica("small", a), 2);
    assert.equal(index.matchReplica("big", a), 4);
    index.record("small", a);
    assert.equal(index.matchReplica("small", a), 4);
    assert.equal(index.matchReplica("small", b), 2);
    index.checkInvariants();
  });

  it("shrinks a replica on resize, forgets one on forget, and frees nodes nobody holds", () => {
    const index = fleet({});
    const a = blockHashes(prompt(64 * 10, 1), 64);
    index.record("r0", a);
    index.record("r1", a.slice(0, 3));
    index.resize("r0", 4);
    assert.equal(index.matchReplica("r0", a), 4);
    assert.equal(index.stats().nodes, 4);
    index.forget("r0");
    assert.deepEqual([...index.match(a)], [["r1", 3]]);
    assert.equal(index.stats().nodes, 3);
    index.forget("r1");
    assert.deepEqual(index.stats(), { ...index.stats(), nodes: 0, entries: 0, replicas: 0 });
    assert.throws(() => index.resize("r0", 0), /got 0/);
    index.checkInvariants();
  });

  it("asks capacityBlocks on each record and rejects a capacity that is not a positive integer", () => {
    let capacity = 5;
    const index = new FleetPrefixIndex({ capacityBlocks: () => capacity });
    const a = blockHashes(prompt(64 * 10, 1), 64);
    index.record("r0", a);
    assert.equal(index.blocksHeld("r0"), 5);
    capacity = 2;
    index.record("r0", a.slice(0, 1));
    assert.equal(index.blocksHeld("r0"), 2);
    capacity = 0.5;
    assert.throws(() => index.record("r0", a), /got 0.5/);
    capacity = Number.POSITIVE_INFINITY;
    index.record("r0", a);
    assert.equal(index.blocksHeld("r0"), 10);
    index.checkInvariants();
  });

  it("grows and shrinks its tables through many records, evictions and forgets", () => {
    const index = fleet({ r0: 500, r1: 300, r2: 2000 });
    const sys = prompt(64 * 8, 1);
    for (let round = 0; round < 60; round++) {
      const hashes = blockHashes([...sys, ...prompt(64 * (20 + (round % 7)), 10 + round)], 64);
      index.record(`r${round % 3}`, hashes);
      if (round % 17 === 16) index.forget("r1");
      assert.equal(
        index.matchReplica(`r${round % 3}`, hashes),
        Math.min(hashes.length, index.blocksHeld(`r${round % 3}`)),
      );
    }
    index.checkInvariants();
    const stats = index.stats();
    assert.ok(stats.entries > 1000 && stats.entries <= 2800, `${stats.entries} entries`);
    assert.ok(stats.allocatedBytes >= stats.liveBytes * 0.5);
    for (const r of ["r0", "r1", "r2"]) index.forget(r);
    assert.equal(index.stats().entries, 0);
    assert.equal(index.stats().nodes, 0);
    index.checkInvariants();
  });

  it("splits a replica's LRU into GPU memory and host memory, as a write-back host tier does", () => {
    const index = new FleetPrefixIndex({ capacityBlocks: () => 4, hostCapacityBlocks: () => 6 });
    const [a, b, c, d] = [1, 2, 3, 4].map((salt) => blockHashes(prompt(64 * (salt === 4 ? 4 : 3), salt), 64));
    index.record("r0", a!);
    index.record("r0", b!);
    index.record("r0", c!);
    // LRU: c0 c1 c2 b0 | b1 b2 a0 a1 a2 — four in GPU memory, the rest moved to host memory.
    assert.equal(index.gpuBlocksHeld("r0"), 4);
    assert.equal(index.blocksHeld("r0"), 9);
    const gpu = new Map<string, number>();
    assert.deepEqual([...index.match(a!, gpu)], [["r0", 3]]);
    assert.equal(gpu.get("r0"), 0);
    assert.deepEqual([...index.match(b!, gpu)], [["r0", 3]]);
    assert.equal(gpu.get("r0"), 1);
    const tiers = { gpuBlocks: -1 };
    assert.equal(index.matchReplica("r0", c!, tiers), 3);
    assert.equal(tiers.gpuBlocks, 3);
    assert.equal(index.tierOf("r0", b!.slice(0, 1)), "gpu");
    assert.equal(index.tierOf("r0", b!.slice(0, 2)), "host");
    index.checkInvariants();
    // Used again, a chain is loaded back into GPU memory: a0 a1 a2 c0 | c1 c2 b0 b1 b2.
    index.record("r0", a!);
    assert.equal(index.matchReplica("r0", a!, tiers), 3);
    assert.equal(tiers.gpuBlocks, 3);
    assert.equal(index.matchReplica("r0", c!, tiers), 3);
    assert.equal(tiers.gpuBlocks, 1);
    // Past the host capacity the least recently used blocks are gone: d0–d3 | a0 a1 a2 c0 c1 c2.
    index.record("r0", d!);
    assert.equal(index.matchReplica("r0", b!, tiers), 0);
    assert.equal(tiers.gpuBlocks, 0);
    assert.equal(index.blocksHeld("r0"), 10);
    index.checkInvariants();
    // Shrinking the host tier forgets at once; a replica without one holds only GPU memory.
    index.resize("r0", 4, 0);
    assert.equal(index.blocksHeld("r0"), 4);
    assert.equal(index.matchReplica("r0", a!, tiers), 0);
    index.checkInvariants();
    assert.equal(index.tierOf("r1", a!), undefined);
  });

  it("predicts each replica's tiers as a two-part LRU would, on random fleets and chains (property)", () => {
    const chainArb = fc.record({
      head: fc.integer({ min: 0, max: 3 }),
      headBlocks: fc.integer({ min: 0, max: 6 }),
      tail: fc.integer({ min: 0, max: 40 }),
      tailBlocks: fc.integer({ min: 0, max: 8 }),
    });
    const opArb = fc.oneof(
      fc.record({
        kind: fc.constant("record" as const),
        replica: fc.integer({ min: 0, max: 3 }),
        chain: chainArb,
      }),
      fc.record({ kind: fc.constant("match" as const), chain: chainArb }),
    );
    const hashesOf = (c: { head: number; headBlocks: number; tail: number; tailBlocks: number }) =>
      blockHashes([...prompt(8 * c.headBlocks, c.head), ...prompt(8 * c.tailBlocks, 1000 + c.tail)], 8);
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 20 }), { minLength: 4, maxLength: 4 }),
        fc.array(fc.integer({ min: 0, max: 40 }), { minLength: 4, maxLength: 4 }),
        fc.array(opArb, { maxLength: 80 }),
        (gpuCaps, hostCaps, ops) => {
          const index = new FleetPrefixIndex({
            capacityBlocks: (r) => gpuCaps[Number(r.slice(1))]!,
            hostCapacityBlocks: (r) => hostCaps[Number(r.slice(1))]!,
          });
          // The reference: one recency list per replica (chain keys, most recent first); the first
          // GPU-capacity positions are GPU memory, the next host-capacity ones host memory.
          const lists = new Map<number, string[]>();
          for (const op of ops) {
            const hashes = hashesOf(op.chain);
            const keys = hashes.map((_, i) => hashes.slice(0, i + 1).join("/"));
            if (op.kind === "record") {
              index.record(`r${op.replica}`, hashes);
              const list = [...keys, ...(lists.get(op.replica) ?? []).filter((k) => !keys.includes(k))];
              lists.set(op.replica, list.slice(0, gpuCaps[op.replica]! + hostCaps[op.replica]!));
              continue;
            }
            const gpu = new Map<string, number>();
            const matched = index.match(hashes, gpu);
            for (const [replica, list] of lists) {
              let blocks = 0;
              while (blocks < keys.length && list.includes(keys[blocks]!)) blocks++;
              let gpuBlocks = 0;
              while (gpuBlocks < blocks && list.indexOf(keys[gpuBlocks]!) < gpuCaps[replica]!) gpuBlocks++;
              assert.equal(matched.get(`r${replica}`) ?? 0, blocks);
              if (blocks > 0) assert.equal(gpu.get(`r${replica}`), gpuBlocks);
              const tiers = { gpuBlocks: -1 };
              assert.equal(index.matchReplica(`r${replica}`, hashes, tiers), blocks);
              assert.equal(tiers.gpuBlocks, gpuBlocks);
            }
          }
          for (const [replica, list] of lists) {
            assert.equal(index.blocksHeld(`r${replica}`), list.length);
            assert.equal(index.gpuBlocksHeld(`r${replica}`), Math.min(list.length, gpuCaps[replica]!));
          }
          index.checkInvariants();
        },
      ),
      { numRuns: 300 },
    );
  });

  it("matches what per-replica LRU indexes would, on random fleets and chains (property)", () => {
    // Chains built from a few shared heads and random tails, so prefixes overlap across replicas.
    const chainArb = fc.record({
      head: fc.integer({ min: 0, max: 3 }),
      headBlocks: fc.integer({ min: 0, max: 6 }),
      tail: fc.integer({ min: 0, max: 40 }),
      tailBlocks: fc.integer({ min: 0, max: 8 }),
    });
    const opArb = fc.oneof(
      fc.record({
        kind: fc.constant("record" as const),
        replica: fc.integer({ min: 0, max: 5 }),
        chain: chainArb,
      }),
      fc.record({ kind: fc.constant("match" as const), chain: chainArb }),
      fc.record({ kind: fc.constant("forget" as const), replica: fc.integer({ min: 0, max: 5 }) }),
      fc.record({
        kind: fc.constant("resize" as const),
        replica: fc.integer({ min: 0, max: 5 }),
        capacity: fc.integer({ min: 1, max: 60 }),
      }),
    );
    const hashesOf = (c: { head: number; headBlocks: number; tail: number; tailBlocks: number }) =>
      blockHashes([...prompt(8 * c.headBlocks, c.head), ...prompt(8 * c.tailBlocks, 1000 + c.tail)], 8);
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 60 }), { minLength: 6, maxLength: 6 }),
        fc.array(opArb, { maxLength: 80 }),
        (caps, ops) => {
          const capacity = caps.slice();
          const fleetIndex = new FleetPrefixIndex({ capacityBlocks: (r) => capacity[Number(r.slice(1))]! });
          let old = new Map<string, PrefixIndex>();
          const oldOf = (r: string) => {
            let index = old.get(r);
            if (!index) {
              index = new PrefixIndex(capacity[Number(r.slice(1))]!);
              old.set(r, index);
            }
            return index;
          };
          for (const op of ops) {
            if (op.kind === "record") {
              const hashes = hashesOf(op.chain);
              fleetIndex.record(`r${op.replica}`, hashes);
              oldOf(`r${op.replica}`).record(hashes);
            } else if (op.kind === "forget") {
              fleetIndex.forget(`r${op.replica}`);
              old.delete(`r${op.replica}`);
            } else if (op.kind === "resize") {
              capacity[op.replica] = op.capacity;
              fleetIndex.resize(`r${op.replica}`, op.capacity);
              old.get(`r${op.replica}`)?.resize(op.capacity);
            } else {
              const hashes = hashesOf(op.chain);
              const expected = new Map<string, number>();
              for (const [r, index] of old) {
                const blocks = index.matchBlocks(hashes);
                if (blocks > 0) expected.set(r, blocks);
                assert.equal(fleetIndex.matchReplica(r, hashes), blocks);
              }
              assert.deepEqual(new Map([...fleetIndex.match(hashes)].sort()), new Map([...expected].sort()));
            }
          }
          for (const [r, index] of old) assert.equal(fleetIndex.blocksHeld(r), index.size);
          fleetIndex.checkInvariants();
          old = new Map();
        },
      ),
      { numRuns: 300 },
    );
  });

  it("matches a brute-force walk on fleets holding one long prefix to staggered depths, with branches, evictions and forgets (property)", () => {
    // A 48-block spine every record starts from, cut at a random depth, with an optional tail of
    // its own: prefixes end at many depths of one path, and some holders branch off it.
    const SPINE = 48;
    const spine = prompt(8 * SPINE, 7);
    const recordArb = fc.record({
      kind: fc.constant("record" as const),
      replica: fc.integer({ min: 0, max: 11 }),
      depth: fc.integer({ min: 1, max: SPINE }),
      tail: fc.integer({ min: 0, max: 5 }),
      tailBlocks: fc.integer({ min: 0, max: 4 }),
    });
    const opArb = fc.oneof(
      { arbitrary: recordArb, weight: 6 },
      {
        arbitrary: fc.record({
          kind: fc.constant("match" as const),
          depth: fc.integer({ min: 0, max: SPINE }),
          tail: fc.integer({ min: 0, max: 5 }),
          tailBlocks: fc.integer({ min: 0, max: 4 }),
        }),
        weight: 3,
      },
      {
        arbitrary: fc.record({
          kind: fc.constant("forget" as const),
          replica: fc.integer({ min: 0, max: 11 }),
        }),
        weight: 1,
      },
      {
        arbitrary: fc.record({
          kind: fc.constant("resize" as const),
          replica: fc.integer({ min: 0, max: 11 }),
          capacity: fc.integer({ min: 1, max: 120 }),
        }),
        weight: 1,
      },
    );
    const hashesOf = (c: { depth: number; tail: number; tailBlocks: number }) =>
      blockHashes([...spine.slice(0, 8 * c.depth), ...prompt(8 * c.tailBlocks, 2000 + c.tail)], 8);
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 120 }), { minLength: 12, maxLength: 12 }),
        fc.array(opArb, { maxLength: 120 }),
        (caps, ops) => {
          const capacity = caps.slice();
          const index = new FleetPrefixIndex({ capacityBlocks: (r) => capacity[Number(r.slice(1))]! });
          // The reference: per replica, its chain keys most recent first, cut to its capacity.
          const lists = new Map<string, string[]>();
          const keysOf = (hashes: string[]) => hashes.map((_, i) => hashes.slice(0, i + 1).join("/"));
          for (const op of ops) {
            if (op.kind === "record") {
              const r = `r${op.replica}`;
              const hashes = hashesOf(op);
              index.record(r, hashes);
              const keys = keysOf(hashes);
              const list = [...keys, ...(lists.get(r) ?? []).filter((k) => !keys.includes(k))];
              lists.set(r, list.slice(0, capacity[op.replica]));
            } else if (op.kind === "forget") {
              index.forget(`r${op.replica}`);
              lists.delete(`r${op.replica}`);
            } else if (op.kind === "resize") {
              capacity[op.replica] = op.capacity;
              index.resize(`r${op.replica}`, op.capacity);
              const list = lists.get(`r${op.replica}`);
              if (list) lists.set(`r${op.replica}`, list.slice(0, op.capacity));
            } else {
              const hashes = hashesOf(op);
              const keys = keysOf(hashes);
              // The brute-force walk: block by block, per replica, until one is missing.
              const expected = new Map<string, number>();
              for (const [r, list] of lists) {
                const held = new Set(list);
                let blocks = 0;
                while (blocks < keys.length && held.has(keys[blocks]!)) blocks++;
                if (blocks > 0) expected.set(r, blocks);
                assert.equal(index.matchReplica(r, hashes), blocks);
              }
              assert.deepEqual(new Map([...index.match(hashes)].sort()), new Map([...expected].sort()));
            }
          }
          index.checkInvariants();
        },
      ),
      { numRuns: 300 },
    );
  });

  it("counts a replica's children of one block past 65,535 exactly", () => {
    const index = new FleetPrefixIndex({ capacityBlocks: () => Number.POSITIVE_INFINITY });
    const root = "0000000000000001";
    const children = 65_540;
    for (let i = 0; i < children; i++) index.record("r0", [root, `c${i}`]);
    index.record("r1", [root, "c0"]);
    index.checkInvariants();
    assert.deepEqual([...index.match([root, "c7"])].sort(), [
      ["r0", 2],
      ["r1", 1],
    ]);
    // Shrinking evicts the least recent blocks: the children recorded first, down across 65,535.
    index.resize("r0", 3);
    index.checkInvariants();
    assert.equal(index.blocksHeld("r0"), 3);
    assert.deepEqual([...index.match([root, `c${children - 1}`])].sort(), [
      ["r0", 2],
      ["r1", 1],
    ]);
    assert.deepEqual([...index.match([root, "c0"])].sort(), [
      ["r0", 1],
      ["r1", 2],
    ]);
    index.resize("r0", 1);
    assert.deepEqual([...index.match([root, `c${children - 1}`])].sort(), [
      ["r0", 1],
      ["r1", 1],
    ]);
    index.checkInvariants();
  });
});
