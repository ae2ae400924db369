/** @module Tests of the TTFT prediction and the placement rules of docs/routing.md. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { PerReplicaIndexes } from "../../bench/per-replica-index.js";
import { blockHashes } from "../../src/routing/block-hash.js";
import {
  choosePlacement,
  KV_PRESSURE_MS,
  keepPin,
  kvPressureMs,
  type PlacementCandidate,
  predictTtftMs,
} from "../../src/routing/placement.js";
import { PrefixIndex } from "../../src/routing/prefix-index.js";

const BLOCK = 64;
const PROMPT = Array.from({ length: 64 * 50 + 20 }, (_, i) => (Math.imul(i, 2654435761) >>> 8) % 200_000);
const HASHES = blockHashes(PROMPT, BLOCK);

/** A candidate with the prefix index it is scored by (one per replica, see `choose`). */
type Candidate = PlacementCandidate & { index?: PrefixIndex };

/** `choosePlacement` with each candidate's own `index` as the prefix index. */
function choose(
  input: Omit<Parameters<typeof choosePlacement>[0], "candidates"> & { candidates: readonly Candidate[] },
) {
  return choosePlacement({ ...input, fleetIndex: indexesOf(input.candidates) });
}

/** `keepPin` likewise. */
function keep(
  input: Omit<Parameters<typeof keepPin>[0], "candidates"> & { candidates: readonly Candidate[] },
) {
  return keepPin({ ...input, fleetIndex: indexesOf(input.candidates) });
}

function indexesOf(candidates: readonly Candidate[]): PerReplicaIndexes {
  const indexes = new PerReplicaIndexes();
  for (const c of candidates) if (c.index) indexes.set(c.id, c.index);
  return indexes;
}

function replica(id: string, over: Partial<Candidate> & { holds?: number } = {}): Candidate {
  const index = new PrefixIndex(10_000);
  if (over.holds) index.record(HASHES.slice(0, over.holds));
  return {
    id,
    index,
    queuedPrefillTokens: 0,
    inflightPrefillTokens: 0,
    prefillTokensPerSecond: 10_000,
    kvUsage: 0,
    busy: false,
    eligible: true,
    ...over,
  };
}

function place(
  candidates: Candidate[],
  extra: { pinned?: string; usePrefix?: boolean; maxTokens?: number } = {},
) {
  return choose({
    promptTokens: PROMPT.length,
    hashes: HASHES,
    candidates,
    blockSize: BLOCK,
    usePrefix: extra.usePrefix ?? true,
    pinned: extra.pinned,
    ...(extra.maxTokens !== undefined ? { maxTokens: extra.maxTokens } : {}),
  });
}

function placeInput(candidates: Candidate[]) {
  return {
    promptTokens: PROMPT.length,
    hashes: HASHES,
    candidates,
    blockSize: BLOCK,
    usePrefix: true,
    maxTokens: 100,
  };
}

describe("predictTtftMs", () => {
  it("is prefill work over the prefill rate plus the KV-pressure term", () => {
    const base = { uncachedPrefillTokens: 3000, queuedPrefillTokens: 1500, inflightPrefillTokens: 500 };
    assert.equal(predictTtftMs({ ...base, prefillTokensPerSecond: 10_000, kvUsage: 0 }), 500);
    assert.equal(
      predictTtftMs({ ...base, prefillTokensPerSecond: 10_000, kvUsage: 0.5 }),
      500 + KV_PRESSURE_MS * 0.5,
    );
  });

  it("has a pressure term that is small when KV is free and grows steeply towards full", () => {
    assert.equal(kvPressureMs(0), 0);
    assert.ok(kvPressureMs(0.2) < 20);
    assert.ok(kvPressureMs(0.95) > 10 * kvPressureMs(0.5));
    assert.ok(kvPressureMs(0.99) > 5 * kvPressureMs(0.95));
    assert.ok(Number.isFinite(kvPressureMs(1)) && kvPressureMs(1.2) === kvPressureMs(1));
  });

  it("rejects a rate that is not positive and negative counts, naming the value", () => {
    const c = { uncachedPrefillTokens: 1, queuedPrefillTokens: 0, inflightPrefillTokens: 0, kvUsage: 0 };
    assert.throws(() => predictTtftMs({ ...c, prefillTokensPerSecond: 0 }), /got 0/);
    assert.throws(() => predictTtftMs({ ...c, prefillTokensPerSecond: Number.NaN }), /got NaN/);
    assert.throws(() => predictTtftMs({ ...c, queuedPrefillTokens: -5, prefillTokensPerSecond: 1 }), /-5/);
  });
});

describe("choosePlacement", () => {
  it("places by prefix when a replica holds the prompt's head", () => {
    const p = place([replica("a"), replica("b", { holds: 40 }), replica("c", { holds: 10 })]);
    assert.deepEqual(p, {
      replica: "b",
      reason: "prefix",
      predictedHitTokens: 40 * BLOCK,
      predictedTtftMs: ((PROMPT.length - 40 * BLOCK) / 10_000) * 1000,
    });
  });

  it("counts only the unbroken prefix", () => {
    const gap = replica("gap");
    gap.index!.record(HASHES.slice(1, 50));
    const p = place([gap, replica("head", { holds: 2 })]);
    assert.equal(p?.replica, "head");
    assert.equal(p?.predictedHitTokens, 2 * BLOCK);
  });

  it("places by load when no replica holds the prefix, and lower predicted TTFT wins", () => {
    const p = place([
      replica("a", { queuedPrefillTokens: 20_000 }),
      replica("b", { inflightPrefillTokens: 4000 }),
      replica("c", {
        queuedPrefillTokens: 1000,
        inflightPrefillTokens: 1000,
        prefillTokensPerSecond: 50_000,
      }),
    ]);
    assert.equal(p?.replica, "c");
    assert.equal(p?.reason, "load");
    assert.equal(p?.predictedHitTokens, 0);
  });

  it("weighs a prefix hit against queued work", () => {
    // b holds 40 blocks (2560 tokens) but has 10,000 tokens queued: a is faster.
    const p = place([replica("a"), replica("b", { holds: 40, queuedPrefillTokens: 10_000 })]);
    assert.equal(p?.replica, "a");
    assert.equal(p?.reason, "load");
  });

  it("ignores prefix hits when usePrefix is false", () => {
    const p = place([replica("a", { holds: 50, queuedPrefillTokens: 100 }), replica("b")], {
      usePrefix: false,
    });
    assert.equal(p?.replica, "b");
    assert.equal(p?.reason, "load");
    assert.equal(p?.predictedTtftMs, (PROMPT.length / 10_000) * 1000);
  });

  it("never chooses an ineligible replica, and returns undefined when none is eligible", () => {
    const p = place([
      replica("a", { holds: 50, eligible: false }),
      replica("b", { queuedPrefillTokens: 99_999 }),
    ]);
    assert.equal(p?.replica, "b");
    assert.equal(
      place([replica("a", { eligible: false }), replica("b", { eligible: false, busy: true })]),
      undefined,
    );
    assert.equal(place([]), undefined);
  });

  it("skips busy replicas unless every eligible replica is busy", () => {
    const p = place([replica("a", { holds: 50, busy: true }), replica("b", { queuedPrefillTokens: 50_000 })]);
    assert.equal(p?.replica, "b");
    const all = place([
      replica("a", { holds: 50, busy: true }),
      replica("b", { busy: true }),
      replica("c", { eligible: false }),
    ]);
    assert.equal(all?.replica, "a");
    assert.equal(all?.reason, "prefix");
  });

  it("keeps a session on its pinned replica while it is healthy, even when another is faster", () => {
    const p = place(
      [replica("a", { holds: 50 }), replica("b", { queuedPrefillTokens: 30_000, kvUsage: 0.6 })],
      {
        pinned: "b",
      },
    );
    assert.equal(p?.replica, "b");
    assert.equal(p?.reason, "pinned");
    assert.equal(p?.predictedTtftMs, ((PROMPT.length + 30_000) / 10_000) * 1000 + kvPressureMs(0.6));
  });

  it("breaks affinity when the pinned replica's KV usage reaches the threshold", () => {
    const below = place([replica("a", { holds: 50, kvUsage: 0.84 }), replica("b")], { pinned: "a" });
    assert.deepEqual([below?.replica, below?.reason], ["a", "pinned"]);
    const at = place([replica("a", { holds: 50, kvUsage: 0.85 }), replica("b", { kvUsage: 0.3 })], {
      pinned: "a",
    });
    assert.deepEqual([at?.replica, at?.reason], ["b", "affinity_break"]);
    const custom = choose({
      promptTokens: PROMPT.length,
      hashes: HASHES,
      candidates: [replica("a", { holds: 50, kvUsage: 0.7 }), replica("b")],
      blockSize: BLOCK,
      usePrefix: true,
      pinned: "a",
      affinityBreakKv: 0.7,
    });
    assert.deepEqual([custom?.replica, custom?.reason], ["b", "affinity_break"]);
  });

  it("stays pinned on a saturated replica when every alternative is saturated too", () => {
    const p = place([replica("a", { holds: 50, kvUsage: 0.9 }), replica("b", { kvUsage: 0.88 })], {
      pinned: "a",
    });
    assert.deepEqual([p?.replica, p?.reason], ["a", "pinned"]);
  });

  it("breaks affinity when the pinned replica's TTFT is worse than the best alternative by more than the margin", () => {
    // Pinned "a" holds all but 20 tokens; its queue decides. Alternative "b" needs 322 ms.
    const bMs = (PROMPT.length / 10_000) * 1000;
    const within = place([replica("a", { holds: 50, queuedPrefillTokens: 53_200 }), replica("b")], {
      pinned: "a",
    });
    assert.equal(within?.reason, "pinned");
    assert.equal(within!.predictedTtftMs - bMs, 5000);
    const beyond = place([replica("a", { holds: 50, queuedPrefillTokens: 53_300 }), replica("b")], {
      pinned: "a",
    });
    assert.deepEqual([beyond?.replica, beyond?.reason], ["b", "affinity_break"]);
    assert.equal(beyond?.predictedTtftMs, bMs);
    const wider = choose({
      promptTokens: PROMPT.length,
      hashes: HASHES,
      candidates: [replica("a", { holds: 50, queuedPrefillTokens: 53_300 }), replica("b")],
      blockSize: BLOCK,
      usePrefix: true,
      pinned: "a",
      affinityBreakMs: 10_000,
    });
    assert.equal(wider?.reason, "pinned");
  });

  it("breaks affinity when the pinned replica is ineligible, busy or gone", () => {
    const cands = (over: Partial<PlacementCandidate>) => [replica("a", { holds: 50, ...over }), replica("b")];
    assert.deepEqual(place(cands({ eligible: false }), { pinned: "a" })?.reason, "affinity_break");
    assert.deepEqual(place(cands({ busy: true }), { pinned: "a" })?.replica, "b");
    assert.deepEqual(place(cands({}), { pinned: "zz" })?.reason, "affinity_break");
  });

  it("keeps the pinned replica when it is the only one left, busy or not", () => {
    const p = place([replica("a", { busy: true, kvUsage: 0.95 })], { pinned: "a" });
    assert.deepEqual([p?.replica, p?.reason], ["a", "pinned"]);
  });

  it("breaks ties by cached tokens, then KV usage, then candidate order", () => {
    const tie = place([
      replica("a", { queuedPrefillTokens: 640 }),
      replica("b", { holds: 10 }), // 640 tokens cached, same TTFT as a
    ]);
    assert.equal(tie?.replica, "b");
    // Both predict 447 ms with nothing cached: the emptier KV cache wins.
    const kv = place([replica("a", { kvUsage: 0.5 }), replica("b", { queuedPrefillTokens: 1250 })]);
    assert.equal(kv?.predictedTtftMs, 447);
    assert.equal(kv?.replica, "b");
    assert.equal(place([replica("x"), replica("y")])?.replica, "x");
  });

  it("caps the predicted hit at the prompt length", () => {
    const exact = blockHashes(PROMPT.slice(0, 64 * 3), BLOCK);
    const index = new PrefixIndex(100);
    index.record(exact);
    const p = choose({
      promptTokens: 64 * 3,
      hashes: exact,
      candidates: [{ ...replica("a"), index }],
      blockSize: BLOCK,
      usePrefix: true,
    });
    assert.equal(p?.predictedHitTokens, 64 * 3);
    assert.equal(p?.predictedTtftMs, 0);
  });

  describe("token budgets", () => {
    // PROMPT is 3,220 tokens; with max_tokens 100 a call holding 40 blocks (2,560 tokens) reserves 760.
    it("skips a replica whose budget cannot hold the call's reservation while another can", () => {
      const p = place(
        [
          replica("a", { holds: 40, budgetAvailableTokens: 759 }),
          replica("b", { budgetAvailableTokens: 3320 }),
        ],
        { maxTokens: 100 },
      );
      assert.equal(p?.replica, "b");
      assert.equal(p?.reason, "load");
    });

    it("counts the cached prefix out of the reservation, so a replica holding it fits with less room", () => {
      const p = place(
        [
          replica("a", { holds: 40, budgetAvailableTokens: 760 }),
          replica("b", { budgetAvailableTokens: 3319 }),
        ],
        { maxTokens: 100 },
      );
      assert.equal(p?.replica, "a");
    });

    it("places as if budgets did not matter when none can hold the call", () => {
      const p = place(
        [replica("a", { holds: 40, budgetAvailableTokens: 0 }), replica("b", { budgetAvailableTokens: 0 })],
        { maxTokens: 100 },
      );
      assert.equal(p?.replica, "a");
      assert.equal(p?.reason, "prefix");
    });

    it("moves a session off a pinned replica whose budget cannot hold the step, to one that can", () => {
      const candidates = [
        replica("a", { holds: 50, budgetAvailableTokens: 10 }),
        replica("b", { budgetAvailableTokens: 100_000 }),
        replica("c", { budgetAvailableTokens: 0 }),
      ];
      assert.equal(keep({ ...placeInput(candidates), pinned: "a" }), undefined);
      const p = place(candidates, { pinned: "a", maxTokens: 100 });
      assert.equal(p?.replica, "b");
      assert.equal(p?.reason, "affinity_break");
    });

    it("keeps the pin when its budget holds the step, and when no replica's does", () => {
      const fits = place(
        [replica("a", { holds: 50, budgetAvailableTokens: 200 }), replica("b", { budgetAvailableTokens: 0 })],
        { pinned: "a", maxTokens: 100 },
      );
      assert.deepEqual([fits?.replica, fits?.reason], ["a", "pinned"]);
      const full = place(
        [replica("a", { holds: 50, budgetAvailableTokens: 0 }), replica("b", { budgetAvailableTokens: 0 })],
        { pinned: "a", maxTokens: 100 },
      );
      assert.deepEqual([full?.replica, full?.reason], ["a", "pinned"]);
    });

    it("ignores replicas without a budget in the rule (no budget: always room)", () => {
      const p = place([replica("a", { holds: 40, budgetAvailableTokens: 0 }), replica("b")], {
        maxTokens: 100,
      });
      assert.equal(p?.replica, "b");
    });
  });

  it("rejects invalid options, naming the value", () => {
    const base = { promptTokens: 10, hashes: [], candidates: [replica("a")], usePrefix: true };
    assert.throws(() => choose({ ...base, blockSize: 0 }), /got 0/);
    assert.throws(() => choose({ ...base, blockSize: 16, affinityBreakKv: -1 }), /got -1/);
    assert.throws(() => choose({ ...base, blockSize: 16, promptTokens: Number.NaN }), /got NaN/);
  });
});
