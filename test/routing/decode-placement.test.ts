/** @module The decode side of a disaggregated fleet's admission: room when the call's KV arrives, as plain numbers. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import {
  chooseDecode,
  type DecodeCandidate,
  type DecodeDemand,
  type DecodingCall,
  decodeRoom,
  peakKvTokens,
  transferMs,
} from "../../src/routing/decode-placement.js";

/** Ten calls of 5,000 tokens decoding, each with `remaining` tokens still to generate. */
function decodingCalls(remaining = 0): DecodingCall[] {
  return Array.from({ length: 10 }, () => ({ kvTokens: 5_000, remainingTokens: remaining }));
}

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
    shownTokens: 50_000,
    coming: [],
    decoding: decodingCalls(),
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

  it("predicted: the call fits when the replica's peak with it stays within the usable KV; calls on their way count, and KV the scrape shows beyond the known calls stays", () => {
    // The decoding calls have nothing left to generate: the peak is now, with the call's prompt (19,000) there too.
    const roomWith = (heldNow: number) => 90_000 - (heldNow + 19_000) + demand.tokens;
    assert.equal(decodeRoom(candidate(), demand, "predicted").tokens, roomWith(50_000));
    const coming = candidate({ coming: [{ promptTokens: 10_000, maxTokens: 1_000 }] });
    assert.equal(decodeRoom(coming, demand, "predicted").tokens, roomWith(60_000));
    assert.equal(decodeRoom(coming, demand, "predicted").slots, 256 - 10 - 1);
    // Another client's 8,000 tokens on the replica: measured, not known.
    const foreign = candidate({ kvUsage: 0.58 });
    assert.equal(Math.round(decodeRoom(foreign, demand, "predicted").tokens), roomWith(58_000));
    // Prompt blocks shared between the known calls: the scrape shows 6,000 fewer tokens than they count.
    const shared = candidate({ kvUsage: 0.44 });
    assert.equal(Math.round(decodeRoom(shared, demand, "predicted").tokens), roomWith(44_000));
    // A call started since the scrape is known but not shown: it counts in full.
    const started = candidate({ decoding: [...decodingCalls(), { kvTokens: 8_000, remainingTokens: 0 }] });
    assert.equal(decodeRoom(started, demand, "predicted").tokens, roomWith(58_000));
    // On current load that replica looks as it did before the call started.
    assert.equal(decodeRoom(started, demand, "current").tokens, 90_000 - 50_000);
  });

  it("predicted: decoding calls grow until their remaining output is out, then free their KV", () => {
    // Ten calls with 2,100 tokens still to come hold 70,990 at their last step, the call's prompt and 1,000 of its output beside them.
    const growing = candidate({ decoding: decodingCalls(2_100) });
    const room = decodeRoom(growing, demand, "predicted");
    assert.equal(room.tokens, 90_000 - (10 * (5_000 + 2_099) + 20_000) + demand.tokens);
    assert.ok(room.tokens < demand.tokens);
    // The same calls at their last 100 tokens end before the call has grown much: it fits.
    const ending = candidate({ decoding: decodingCalls(100) });
    assert.ok(decodeRoom(ending, demand, "predicted").tokens >= demand.tokens);
  });
});

describe("peakKvTokens", () => {
  it("is the most the replica holds at any step, each call growing one token a step until its end", () => {
    assert.equal(peakKvTokens([], []), 0);
    // One call of 100 with 10 to go: 109 at its last step.
    assert.equal(peakKvTokens([{ kvTokens: 100, remainingTokens: 10 }], []), 109);
    // A short call ends before a long one has grown past what they held together.
    const calls = [
      { kvTokens: 1_000, remainingTokens: 5 },
      { kvTokens: 100, remainingTokens: 2_000 },
    ];
    assert.equal(peakKvTokens(calls, []), Math.max(1_000 + 4 + 100 + 4, 100 + 1_999));
    // A joining call is there from now, and stays at its input + max_tokens.
    assert.equal(
      peakKvTokens(calls, [{ promptTokens: 500, maxTokens: 50 }]),
      Math.max(1_104 + 504, 2_099 + 550),
    );
    assert.equal(peakKvTokens([], [{ promptTokens: 500, maxTokens: 50 }]), 550);
  });

  it("counts calls that end together once, and a call with nothing left to generate only now", () => {
    const tied = [
      { kvTokens: 10, remainingTokens: 3 },
      { kvTokens: 20, remainingTokens: 3 },
      { kvTokens: 5, remainingTokens: 0 },
    ];
    // Now (35, the ending call included) is more than just before the two end together (12 + 22).
    assert.equal(peakKvTokens(tied, []), 35);
    assert.equal(peakKvTokens(tied.slice(0, 2), []), 10 + 2 + 20 + 2);
    assert.equal(peakKvTokens([{ kvTokens: 50, remainingTokens: 0 }], []), 50);
  });

  it("equals the largest total over every step, counted step by step", () => {
    // Step k: a decoding call holds kvTokens + k while k < remainingTokens (its KV now at k = 0),
    // a joining one promptTokens + min(k, maxTokens).
    const stepByStep = (decoding: DecodingCall[], joining: { promptTokens: number; maxTokens: number }[]) => {
      const last = Math.max(0, ...decoding.map((c) => c.remainingTokens), ...joining.map((j) => j.maxTokens));
      let peak = 0;
      for (let k = 0; k <= last; k++) {
        let total = 0;
        for (const c of decoding) if (k === 0 || k < c.remainingTokens) total += c.kvTokens + k;
        for (const j of joining) total += j.promptTokens + Math.min(k, j.maxTokens);
        peak = Math.max(peak, total);
      }
      return peak;
    };
    const decodingCall = fc.record({ kvTokens: fc.nat(5_000), remainingTokens: fc.nat(60) });
    const joiningCall = fc.record({ promptTokens: fc.nat(5_000), maxTokens: fc.nat(60) });
    fc.assert(
      fc.property(
        fc.array(decodingCall, { maxLength: 12 }),
        fc.array(joiningCall, { maxLength: 12 }),
        (d, j) => {
          assert.equal(peakKvTokens(d, j), stepByStep(d, j));
        },
      ),
      { numRuns: 300 },
    );
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
