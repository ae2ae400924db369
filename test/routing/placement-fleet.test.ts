/** @module Placement from the fleet-wide index decides exactly as placement from per-replica indexes. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { PerReplicaIndexes } from "../../bench/per-replica-index.js";
import { blockHashes } from "../../src/routing/block-hash.js";
import { FleetPrefixIndex } from "../../src/routing/fleet-prefix-index.js";
import { choosePlacement, keepPin, type PlacementCandidate } from "../../src/routing/placement.js";

const BLOCK = 16;

function tokens(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => (Math.imul(i + salt * 100_003, 2654435761) >>> 8) % 200_000);
}

const chainArb = fc.record({
  head: fc.integer({ min: 0, max: 2 }),
  headBlocks: fc.integer({ min: 0, max: 12 }),
  tail: fc.integer({ min: 0, max: 6 }),
  tailBlocks: fc.integer({ min: 0, max: 20 }),
  partial: fc.integer({ min: 0, max: BLOCK - 1 }),
});

type Chain = typeof chainArb extends fc.Arbitrary<infer T> ? T : never;

function promptOf(c: Chain): number[] {
  return [
    ...tokens(BLOCK * c.headBlocks, c.head),
    ...tokens(BLOCK * c.tailBlocks + c.partial, 1000 + c.tail),
  ];
}

const replicaArb = fc.record({
  capacity: fc.integer({ min: 1, max: 40 }),
  queuedPrefillTokens: fc.integer({ min: 0, max: 20_000 }),
  inflightPrefillTokens: fc.integer({ min: 0, max: 20_000 }),
  prefillTokensPerSecond: fc.integer({ min: 2000, max: 50_000 }),
  kvUsage: fc.oneof(fc.double({ min: 0, max: 0.6, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true })),
  busy: fc.boolean(),
  eligible: fc.integer({ min: 0, max: 4 }).map((n) => n > 0),
  records: fc.array(chainArb, { maxLength: 6 }),
});

describe("choosePlacement with a fleet index", () => {
  it("makes the same decisions as with one index per replica (property)", () => {
    fc.assert(
      fc.property(
        fc.array(replicaArb, { minLength: 1, maxLength: 10 }),
        chainArb,
        fc.option(fc.integer({ min: 0, max: 11 }), { nil: undefined }),
        fc.integer({ min: 0, max: 8000 }),
        fc.double({ min: 0.3, max: 1, noNaN: true }),
        fc.integer({ min: 0, max: 5 }).map((n) => n > 0),
        (replicas, promptChain, pinnedIndex, affinityBreakMs, affinityBreakKv, usePrefix) => {
          const fleetIndex = new FleetPrefixIndex({
            capacityBlocks: (id) => replicas[Number(id.slice(1))]!.capacity,
          });
          const perReplicaIndexes = new PerReplicaIndexes((id) => replicas[Number(id.slice(1))]!.capacity);
          const shared: PlacementCandidate[] = [];
          replicas.forEach((r, i) => {
            const id = `r${i}`;
            const index = perReplicaIndexes.of(id);
            for (const chain of r.records) {
              const hashes = blockHashes(promptOf(chain), BLOCK);
              index.record(hashes);
              fleetIndex.record(id, hashes);
            }
            const candidate = {
              id,
              queuedPrefillTokens: r.queuedPrefillTokens,
              inflightPrefillTokens: r.inflightPrefillTokens,
              prefillTokensPerSecond: r.prefillTokensPerSecond,
              kvUsage: r.kvUsage,
              busy: r.busy,
              eligible: r.eligible,
            };
            shared.push(candidate);
          });
          const prompt = promptOf(promptChain);
          const input = {
            promptTokens: prompt.length,
            hashes: blockHashes(prompt, BLOCK),
            pinned: pinnedIndex === undefined ? undefined : `r${pinnedIndex}`,
            blockSize: BLOCK,
            affinityBreakMs,
            affinityBreakKv,
            usePrefix,
          };
          const expected = choosePlacement({ ...input, candidates: shared, fleetIndex: perReplicaIndexes });
          const actual = choosePlacement({ ...input, candidates: shared, fleetIndex });
          assert.deepEqual(actual, expected);
          // The shortcut, given the pinned candidate alone, either agrees or defers to the full pass.
          const home = shared.filter((c) => c.id === input.pinned);
          const kept = keepPin({ ...input, candidates: home, fleetIndex });
          if (kept !== undefined) assert.deepEqual(kept, expected);
        },
      ),
      { numRuns: 400, endOnFailure: true },
    );
  });

  it("keeps a pinned session without matching the rest of the fleet", () => {
    const fleetIndex = new FleetPrefixIndex({ capacityBlocks: () => 1000 });
    const prompt = tokens(BLOCK * 30, 7);
    const hashes = blockHashes(prompt, BLOCK);
    fleetIndex.record("home", hashes.slice(0, 20));
    fleetIndex.record("other", hashes);
    let matched = 0;
    const original = fleetIndex.match.bind(fleetIndex);
    fleetIndex.match = (h) => {
      matched++;
      return original(h);
    };
    const candidate = (id: string): PlacementCandidate => ({
      id,
      queuedPrefillTokens: 0,
      inflightPrefillTokens: 0,
      prefillTokensPerSecond: 10_000,
      kvUsage: 0.2,
      busy: false,
      eligible: true,
    });
    const input = {
      promptTokens: prompt.length,
      hashes,
      candidates: [candidate("other"), candidate("home")],
      blockSize: BLOCK,
      usePrefix: true,
      fleetIndex,
    };
    const kept = choosePlacement({ ...input, pinned: "home" });
    assert.deepEqual(kept, {
      replica: "home",
      reason: "pinned",
      predictedHitTokens: 20 * BLOCK,
      predictedTtftMs: ((10 * BLOCK) / 10_000) * 1000 + 250 * (0.04 / 0.8),
    });
    assert.equal(matched, 0);
    // A saturated pin needs the whole fleet: the other replica holds more and takes the session.
    const saturated = choosePlacement({
      ...input,
      candidates: [candidate("other"), { ...candidate("home"), kvUsage: 0.9 }],
      pinned: "home",
    });
    assert.equal(saturated?.replica, "other");
    assert.equal(saturated?.reason, "affinity_break");
    assert.equal(matched, 1);
  });
});
