/** @module Lane classification edges (docs/library.md and docs/how-it-works.md#token-budget-and-feasibility). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  classifyLane,
  createLaneClassifier,
  DEFAULT_LANE_LIMITS,
  resolveLaneLimits,
} from "../../src/budget/index.js";

describe("classifyLane", () => {
  it("has the SPEC defaults", () => {
    assert.deepEqual(
      { ...DEFAULT_LANE_LIMITS },
      {
        interactiveMaxInputTokens: 4096,
        interactiveMaxOutputTokens: 1024,
        bulkMaxTotalTokens: Number.POSITIVE_INFINITY,
      },
    );
    assert.ok(Object.isFrozen(DEFAULT_LANE_LIMITS));
  });

  it("keeps a call of exactly 4096 input and 1024 output interactive", () => {
    assert.equal(classifyLane({ inputTokens: 4096, maxOutputTokens: 1024 }), "interactive");
    assert.equal(classifyLane({ inputTokens: 1, maxOutputTokens: 1 }), "interactive");
  });

  it("makes a call one token over either limit bulk", () => {
    assert.equal(classifyLane({ inputTokens: 4097, maxOutputTokens: 1024 }), "bulk");
    assert.equal(classifyLane({ inputTokens: 4096, maxOutputTokens: 1025 }), "bulk");
  });

  it("honours a bulk declaration on a small call", () => {
    assert.equal(classifyLane({ inputTokens: 10, maxOutputTokens: 10, declared: "bulk" }), "bulk");
  });

  it("never makes a large call interactive because it declares so", () => {
    assert.equal(classifyLane({ inputTokens: 4097, maxOutputTokens: 10, declared: "interactive" }), "bulk");
    assert.equal(classifyLane({ inputTokens: 10, maxOutputTokens: 2048, declared: "interactive" }), "bulk");
    assert.equal(
      classifyLane({ inputTokens: 10, maxOutputTokens: 10, declared: "interactive" }),
      "interactive",
    );
  });

  it("classifies input + max_tokens beyond the bulk limit as overflow, whatever is declared", () => {
    const limits = { bulkMaxTotalTokens: 32_768 };
    assert.equal(classifyLane({ inputTokens: 30_000, maxOutputTokens: 2768 }, limits), "bulk");
    assert.equal(classifyLane({ inputTokens: 30_000, maxOutputTokens: 2769 }, limits), "overflow");
    assert.equal(
      classifyLane({ inputTokens: 30_000, maxOutputTokens: 2769, declared: "bulk" }, limits),
      "overflow",
    );
    // A small-limit deployment: even an "interactive-sized" call overflows a tiny context.
    assert.equal(
      classifyLane({ inputTokens: 100, maxOutputTokens: 100 }, { bulkMaxTotalTokens: 150 }),
      "overflow",
    );
  });

  it("never overflows with the default (infinite) bulk limit", () => {
    assert.equal(classifyLane({ inputTokens: 10_000_000, maxOutputTokens: 100_000 }), "bulk");
  });

  it("takes partial limits and ignores undefined fields", () => {
    assert.equal(
      classifyLane({ inputTokens: 200, maxOutputTokens: 10 }, { interactiveMaxInputTokens: 100 }),
      "bulk",
    );
    assert.equal(
      classifyLane({ inputTokens: 4096, maxOutputTokens: 1024 }, { interactiveMaxInputTokens: undefined }),
      "interactive",
    );
  });

  it("rejects bad limits and counts with errors naming the value", () => {
    assert.throws(
      () => resolveLaneLimits({ interactiveMaxInputTokens: -1 }),
      /interactiveMaxInputTokens.*-1/,
    );
    assert.throws(() => resolveLaneLimits({ bulkMaxTotalTokens: Number.NaN }), /bulkMaxTotalTokens.*NaN/);
    assert.throws(() => classifyLane({ inputTokens: Number.NaN, maxOutputTokens: 1 }), /inputTokens.*NaN/);
    assert.throws(() => classifyLane({ inputTokens: 1, maxOutputTokens: -5 }), /maxOutputTokens.*-5/);
    assert.throws(
      () => classifyLane({ inputTokens: 1, maxOutputTokens: 1, declared: "urgent" as "bulk" }),
      /declared.*urgent/,
    );
  });

  it("gives the same answers through a classifier with pre-validated limits", () => {
    const classify = createLaneClassifier({ bulkMaxTotalTokens: 8192 });
    assert.equal(classify({ inputTokens: 4096, maxOutputTokens: 1024 }), "interactive");
    assert.equal(classify({ inputTokens: 5000, maxOutputTokens: 1024 }), "bulk");
    assert.equal(classify({ inputTokens: 8000, maxOutputTokens: 193 }), "overflow");
    assert.throws(() => createLaneClassifier({ interactiveMaxOutputTokens: -2 }), /-2/);
  });
});
