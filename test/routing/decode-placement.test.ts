/** @module The decode side of a disaggregated fleet's admission: room when the call's KV arrives, as plain numbers. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  chooseDecode,
  type DecodeCandidate,
  type DecodeDemand,
  decodeRoom,
  transferMs,
} from "../../src/routing/decode-placement.js";

function candidate(overrides: Partial<DecodeCandidate> = {}): DecodeCandidate {
  return {
    id: "d0",
    eligible: true,
    busy: false,
    capacityTokens: 100_000,
    usableTokens: 90_000,
    batchSlots: 256,
    kvUsage: 0.5,
    running: 10,
    startedSinceScrapeCalls: 0,
    startedSinceScrapeTokens: 0,
    endedSinceScrapeCalls: 0,
    endedSinceScrapeTokens: 0,
    comingCalls: 0,
    comingTokens: 0,
    decodingCalls: 10,
    decodingTokens: 50_000,
    decodingGrowthTokens: 0,
    completionsPerSecond: 0,
    transferTokensPerSecond: 200_000,
    ...overrides,
  };
}

const demand: DecodeDemand = {
  tokens: 20_000,
  maxTokens: 1_000,
  transferTokens: 18_999,
  prefillDoneInMs: 500,
};

describe("decodeRoom", () => {
  it("current: the usable KV less what the last scrape measured; the arrival is prefill plus transfer", () => {
    const room = decodeRoom(candidate(), demand, "current");
    assert.equal(room.tokens, 90_000 - 50_000);
    assert.equal(room.slots, 246);
    assert.equal(room.arrivalInMs, 500 + transferMs(18_999, 200_000));
    assert.ok(Math.abs(transferMs(18_999, 200_000) - 94.995) < 1e-9);
  });

  it("predicted: calls coming and started since the scrape take room, calls ended since give it back, decoding calls may still grow", () => {
    const c = candidate({
      comingCalls: 2,
      comingTokens: 30_000,
      startedSinceScrapeCalls: 1,
      startedSinceScrapeTokens: 8_000,
      endedSinceScrapeCalls: 3,
      endedSinceScrapeTokens: 12_000,
      decodingGrowthTokens: 5_000,
    });
    const room = decodeRoom(c, demand, "predicted");
    assert.equal(room.tokens, 90_000 - (50_000 + 8_000 - 12_000 + 30_000 + 5_000));
    assert.equal(room.slots, 256 - (10 + 1 - 3 + 2));
    // On current load the same replica looks like it has room for the call; predicted, it has none.
    assert.ok(decodeRoom(c, demand, "current").tokens >= demand.tokens);
    assert.ok(room.tokens < demand.tokens);
  });

  it("predicted: completions expected before the KV arrives free their calls' mean size; none are expected without a measured rate", () => {
    const slow = decodeRoom(candidate({ completionsPerSecond: 0 }), demand, "predicted");
    // 4 completions a second over ~0.6 s: 2 whole calls of the 10 decoding (5,000 tokens each).
    const fast = decodeRoom(candidate({ completionsPerSecond: 4 }), demand, "predicted");
    assert.equal(fast.tokens - slow.tokens, 10_000);
    assert.equal(fast.slots - slow.slots, 2);
  });
});

describe("chooseDecode", () => {
  it("picks the replica with the most room that also has a slot; the unhealthy are skipped, the busy taken only when nothing else fits", () => {
    const fleet = [
      candidate({ id: "a", kvUsage: 0.6 }),
      candidate({ id: "b", kvUsage: 0.2, eligible: false }),
      candidate({ id: "c", kvUsage: 0.4 }),
      candidate({ id: "d", kvUsage: 0.1, busy: true }),
    ];
    const choice = chooseDecode(fleet, demand, "current");
    assert.equal(choice.replica, "c");
    const onlyBusy = chooseDecode([candidate({ id: "a", kvUsage: 0.9 }), fleet[3]!], demand, "current");
    assert.equal(onlyBusy.replica, "d");
    const noSlot = chooseDecode([candidate({ id: "a", kvUsage: 0, running: 256 })], demand, "current");
    assert.equal(noSlot.replica, undefined);
  });

  it("with no room anywhere, says which replica came closest and how much it had", () => {
    const choice = chooseDecode(
      [candidate({ id: "a", kvUsage: 0.8 }), candidate({ id: "b", kvUsage: 0.75 })],
      demand,
      "current",
    );
    assert.equal(choice.replica, undefined);
    if (choice.replica === undefined) {
      assert.equal(choice.bestId, "b");
      assert.equal(choice.best?.tokens, 90_000 - 75_000);
    }
  });
});
