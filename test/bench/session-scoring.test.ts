import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { scoreSessionInference } from "../../adapters/bench/session-scoring.js";
import { runWorkloadBench } from "../../adapters/bench/suite.js";
import { benchOutputSchema } from "../../bench/output-schema.js";

const call = (trueSession: string | undefined, assigned: string | undefined) => ({ trueSession, assigned });

describe("session inference score", () => {
  it("is perfect when every call after a session's first is in its own inferred session", () => {
    const score = scoreSessionInference([
      call("a", undefined),
      call("a", "~1"),
      call("a", "~1"),
      call("b", undefined),
      call("b", "~2"),
      call(undefined, undefined),
    ]);
    assert.deepEqual(score, {
      precision: 1,
      recall: 1,
      false_merges: 0,
      inferred_sessions: 2,
      true_sessions: 2,
    });
  });

  it("counts a merge against both sessions and their minority calls against precision", () => {
    const score = scoreSessionInference([
      call("a", undefined),
      call("a", "~1"),
      call("a", "~1"),
      call("b", undefined),
      call("b", "~1"),
    ]);
    assert.equal(score.false_merges, 1);
    assert.equal(score.precision, 0.6667);
    // Neither session was recovered in an inferred session of its own.
    assert.equal(score.recall, 0);
  });

  it("lowers recall for a session split in two, without a merge", () => {
    const score = scoreSessionInference([
      call("a", undefined),
      call("a", "~1"),
      call("a", "~1"),
      call("a", "~2"),
      call("a", "~2"),
    ]);
    assert.equal(score.false_merges, 0);
    assert.equal(score.precision, 1);
    assert.equal(score.recall, 0.5);
  });
});

describe("the adversarial workload with session keys off", () => {
  it("merges no two true sessions, and its document matches the output schema", async () => {
    const { report } = await runWorkloadBench({
      workload: "adversarial",
      policies: ["sluice"],
      sessionKeys: false,
      seed: 3,
    });
    benchOutputSchema.parse(report.output);
    const row = report.output.results.find((r) => r.policy === "sluice")!;
    assert.ok(row.session_inference, "keys off: the row reports session_inference");
    assert.equal(row.session_inference.false_merges, 0);
    assert.equal(row.session_inference.precision, 1);
    assert.ok(row.session_inference.recall > 0.3, `recall ${row.session_inference.recall}`);
    const detail = report.output.details?.[0] as { idle_check?: unknown; errors?: unknown[] };
    assert.deepEqual(detail.idle_check, { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    assert.deepEqual(detail.errors, []);
  });
});
