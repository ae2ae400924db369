/** @module Placement prices a prefix predicted in host memory only at its load time (docs/tiers.md). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { blockHashes } from "../../src/routing/block-hash.js";
import { FleetPrefixIndex } from "../../src/routing/fleet-prefix-index.js";
import {
  choosePlacement,
  keepPin,
  type PlacementCandidate,
  type PlacementInput,
  predictTtftMs,
} from "../../src/routing/placement.js";

const BLOCK = 16;
const PREFILL = 10_000;
const LOAD = 200_000;

function tokens(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => (Math.imul(i + salt * 100_003, 2654435761) >>> 8) % 200_000);
}

function candidate(id: string, extra: Partial<PlacementCandidate> = {}): PlacementCandidate {
  return {
    id,
    queuedPrefillTokens: 0,
    inflightPrefillTokens: 0,
    prefillTokensPerSecond: PREFILL,
    kvUsage: 0,
    busy: false,
    eligible: true,
    ...extra,
  };
}

/** r0 holds `prompt` (1,600 tokens) in host memory only: it was pushed out of GPU memory (10 blocks) by 20 other blocks. */
function fleetWithHostCopy(prompt: number[]): FleetPrefixIndex {
  const index = new FleetPrefixIndex({ capacityBlocks: () => 10, hostCapacityBlocks: () => 1000 });
  index.record("r0", blockHashes(prompt, BLOCK));
  index.record("r0", blockHashes(tokens(20 * BLOCK, 9), BLOCK));
  index.record("r1", blockHashes(prompt.slice(0, 4 * BLOCK), BLOCK));
  return index;
}

function input(
  prompt: number[],
  fleetIndex: FleetPrefixIndex,
  candidates: PlacementCandidate[],
): PlacementInput {
  return {
    promptTokens: prompt.length,
    hashes: blockHashes(prompt, BLOCK),
    candidates,
    fleetIndex,
    blockSize: BLOCK,
    usePrefix: true,
  };
}

describe("placement with a host-memory tier", () => {
  it("adds the load time of host tokens to the predicted TTFT, and needs a rate to load at", () => {
    const base = { uncachedPrefillTokens: 1000, queuedPrefillTokens: 0, inflightPrefillTokens: 0 };
    const plain = predictTtftMs({ ...base, prefillTokensPerSecond: PREFILL, kvUsage: 0 });
    assert.equal(plain, 100);
    const loaded = predictTtftMs({
      ...base,
      prefillTokensPerSecond: PREFILL,
      kvUsage: 0,
      hostLoadTokens: 30_000,
      hostLoadTokensPerSecond: LOAD,
    });
    assert.equal(loaded, 100 + 150);
    assert.throws(
      () => predictTtftMs({ ...base, prefillTokensPerSecond: PREFILL, kvUsage: 0, hostLoadTokens: 10 }),
      /hostLoadTokensPerSecond should be a positive number, got 0/,
    );
  });

  it("credits a host hit at its load cost: cheaper than a miss, dearer than a GPU hit", () => {
    const prompt = tokens(100 * BLOCK, 1);
    const index = fleetWithHostCopy(prompt);
    const placed = choosePlacement(
      input(prompt, index, [
        candidate("r0", { hostLoadTokensPerSecond: LOAD }),
        candidate("r1"),
        candidate("r2"),
      ]),
    )!;
    assert.equal(placed.replica, "r0");
    assert.equal(placed.reason, "prefix");
    assert.equal(placed.predictedHitTokens, 1600);
    assert.equal(placed.predictedHostHitTokens, 1600);
    // Nothing left to compute but the load: 1,600 tokens at 200,000 per second.
    assert.equal(placed.predictedTtftMs, 8);

    // r1 holds the prompt's first 4 blocks (64 tokens) in GPU memory and computes the other 1,536.
    const queued = choosePlacement(
      input(prompt, index, [
        candidate("r0", { hostLoadTokensPerSecond: LOAD, queuedPrefillTokens: 200 }),
        candidate("r1"),
      ]),
    )!;
    // r0: 200 queued / 10,000 = 20 ms + 8 ms load; r1: 1,536 uncached / 10,000 = 153.6 ms.
    assert.equal(queued.replica, "r0");
    assert.equal(queued.predictedTtftMs, 28);
    const slower = choosePlacement(
      input(prompt, index, [
        candidate("r0", { hostLoadTokensPerSecond: LOAD, queuedPrefillTokens: 1_500 }),
        candidate("r1"),
      ]),
    )!;
    assert.equal(
      slower.replica,
      "r1",
      "the host copy is worth its load time, not a fixed share of a GPU hit",
    );
    assert.equal(slower.predictedHitTokens, 64);
    assert.equal(slower.predictedHostHitTokens, undefined);
  });

  it("prices a host copy as a miss where the replica states no load rate", () => {
    const prompt = tokens(100 * BLOCK, 1);
    const index = fleetWithHostCopy(prompt);
    const placed = choosePlacement(input(prompt, index, [candidate("r0"), candidate("r2")]))!;
    assert.equal(placed.predictedHitTokens, 0);
    assert.equal(placed.predictedHostHitTokens, undefined);
    assert.equal(placed.predictedTtftMs, 160);
    assert.equal(placed.reason, "load");
  });

  it("keeps a pin on the host copy's replica at the load's price", () => {
    const prompt = tokens(100 * BLOCK, 1);
    const index = fleetWithHostCopy(prompt);
    const kept = keepPin({
      ...input(prompt, index, [candidate("r0", { hostLoadTokensPerSecond: LOAD })]),
      pinned: "r0",
    })!;
    assert.deepEqual(kept, {
      replica: "r0",
      reason: "pinned",
      predictedHitTokens: 1600,
      predictedHostHitTokens: 1600,
      predictedTtftMs: 8,
    });
  });
});
