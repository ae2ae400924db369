/** @module Feasibility: predicted TTFT in tokens, and 429 deadline_infeasible with a whole-second Retry-After. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { checkDeadline, predictTtftMs } from "../../src/budget/index.js";
import { Refusal, renderRefusal } from "../../src/errors.js";

describe("predictTtftMs", () => {
  it("divides prefill tokens ahead plus the call's own by the rate, plus queue wait", () => {
    // 36,000 tokens ahead + 4,000 own at 10,000 tokens/s = 4 s, plus 250 ms in a queue.
    assert.equal(
      predictTtftMs({
        prefillTokensAhead: 36_000,
        ownPrefillTokens: 4000,
        prefillTokensPerSecond: 10_000,
        queueWaitMs: 250,
      }),
      4250,
    );
    assert.equal(predictTtftMs({ prefillTokensAhead: 0, ownPrefillTokens: 0, prefillTokensPerSecond: 1 }), 0);
  });

  it("counts tokens, not requests: one long prompt ahead weighs as many short ones", () => {
    const oneLong = predictTtftMs({
      prefillTokensAhead: 32_000,
      ownPrefillTokens: 100,
      prefillTokensPerSecond: 8000,
    });
    const manyShort = predictTtftMs({
      prefillTokensAhead: 320 * 100,
      ownPrefillTokens: 100,
      prefillTokensPerSecond: 8000,
    });
    assert.equal(oneLong, manyShort);
    assert.equal(oneLong, 4012.5);
  });

  it("rejects a rate that is not positive, and negative counts, naming the value", () => {
    assert.throws(
      () => predictTtftMs({ prefillTokensAhead: 1, ownPrefillTokens: 1, prefillTokensPerSecond: 0 }),
      /prefillTokensPerSecond.*0/,
    );
    assert.throws(
      () => predictTtftMs({ prefillTokensAhead: -1, ownPrefillTokens: 1, prefillTokensPerSecond: 1 }),
      /prefillTokensAhead.*-1/,
    );
    assert.throws(
      () =>
        predictTtftMs({
          prefillTokensAhead: 1,
          ownPrefillTokens: 1,
          prefillTokensPerSecond: 1,
          queueWaitMs: Number.NaN,
        }),
      /queueWaitMs.*NaN/,
    );
  });
});

describe("checkDeadline", () => {
  it("refuses a call that would wait too long for its lane, at once, with 429 deadline_infeasible", () => {
    // 100,000 tokens ahead at 8,000 tokens/s: 12.5 s + own prefill; the interactive lane allows 10 s.
    const predictedTtftMs = predictTtftMs({
      prefillTokensAhead: 100_000,
      ownPrefillTokens: 2000,
      prefillTokensPerSecond: 8000,
    });
    assert.equal(predictedTtftMs, 12_750);
    const refusal = checkDeadline({ predictedTtftMs, laneDeadlineMs: 10_000, lane: "interactive" });
    assert.ok(refusal instanceof Refusal);
    assert.equal(refusal.reason, "deadline_infeasible");
    assert.equal(refusal.status, 429);
    assert.equal(refusal.lane, "interactive");
    // 2.75 s over the deadline: Retry-After rounds up to 3.
    assert.equal(refusal.retryAfterSeconds, 3);
    assert.match(refusal.message, /12750 ms.*interactive lane's deadline of 10000 ms/);
    const rendered = renderRefusal(refusal, "req-1");
    assert.equal(rendered.status, 429);
    assert.equal(rendered.headers["retry-after"], "3");
    assert.equal(rendered.body.error.code, "deadline_infeasible");
  });

  it("admits a call whose prediction fits, including one exactly at the deadline", () => {
    const predictedTtftMs = predictTtftMs({
      prefillTokensAhead: 6000,
      ownPrefillTokens: 2000,
      prefillTokensPerSecond: 8000,
    });
    assert.equal(predictedTtftMs, 1000);
    assert.equal(checkDeadline({ predictedTtftMs, laneDeadlineMs: 10_000, lane: "interactive" }), undefined);
    assert.equal(checkDeadline({ predictedTtftMs, deadlineMs: 1000, lane: "interactive" }), undefined);
    assert.equal(checkDeadline({ predictedTtftMs, lane: "bulk" }), undefined, "no deadline at all fits");
  });

  it("uses the tighter of the call's own deadline and its lane's", () => {
    const refusal = checkDeadline({
      predictedTtftMs: 1500,
      deadlineMs: 1000,
      laneDeadlineMs: 300_000,
      lane: "bulk",
    });
    assert.ok(refusal);
    assert.match(refusal.message, /the call's deadline of 1000 ms/);
    assert.equal(refusal.lane, "bulk");
    assert.equal(
      checkDeadline({ predictedTtftMs: 1500, deadlineMs: 60_000, laneDeadlineMs: 10_000, lane: "bulk" }),
      undefined,
    );
  });

  it("rounds Retry-After up to whole seconds and never gives 0", () => {
    const justOver = checkDeadline({ predictedTtftMs: 1000.5, deadlineMs: 1000, lane: "interactive" });
    assert.equal(justOver?.retryAfterSeconds, 1);
    const overByTwoAndABit = checkDeadline({ predictedTtftMs: 3001, deadlineMs: 1000, lane: "interactive" });
    assert.equal(overByTwoAndABit?.retryAfterSeconds, 3);
    const exactSeconds = checkDeadline({ predictedTtftMs: 5000, deadlineMs: 1000, lane: "interactive" });
    assert.equal(exactSeconds?.retryAfterSeconds, 4);
    const given = checkDeadline({
      predictedTtftMs: 5000,
      deadlineMs: 0,
      lane: "bulk",
      retryAfterSeconds: 0.2,
    });
    assert.equal(given?.retryAfterSeconds, 1);
  });

  it("rejects malformed inputs, naming the value", () => {
    assert.throws(() => checkDeadline({ predictedTtftMs: Number.NaN, lane: "bulk" }), /predictedTtftMs.*NaN/);
    assert.throws(
      () => checkDeadline({ predictedTtftMs: 1, deadlineMs: -1, lane: "bulk" }),
      /deadlineMs.*-1/,
    );
  });
});
