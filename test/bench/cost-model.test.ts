import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  batch1DecodeMs,
  batch1PrefillMs,
  callWorkMs,
  lowerBound,
  stepModelOfPreset,
} from "../../adapters/bench/cost-model.js";
import { quantile } from "../../adapters/bench/stats.js";
import type { PlannedCall, Workload } from "../../adapters/bench/workloads/types.js";

const model = stepModelOfPreset("h100-llama3-8b");

function close(actual: number, expected: number, what: string): void {
  assert.ok(Math.abs(actual - expected) < 1e-6, `${what}: ${actual} ≠ ${expected}`);
}

function call(overrides: Partial<PlannedCall> & { index: number }): PlannedCall {
  return {
    id: `c${overrides.index}`,
    arrivalMs: 0,
    gapMs: 0,
    extendsAfter: false,
    newTokens: () => [],
    promptTokens: 1000,
    cachedAtBest: 0,
    maxTokens: 3,
    slo: { ttftS: 1, tpotS: 1 },
    retry: true,
    group: "g",
    ...overrides,
  };
}

describe("step-time model of docs/simulator.md at batch 1 (h100-llama3-8b)", () => {
  it("prefill of one chunk: c0 + linear beyond the floor credit + attention", () => {
    // 7 + (0.022·1000 − 0.022·128) + 1.3e-6·1000·500
    close(batch1PrefillMs(model, 1000, 0), 7 + 19.184 + 0.65, "1000 tokens");
  });

  it("chunked prefill over a cached prefix, 8192 tokens per step", () => {
    const first = 7 + (0.022 * 8192 - 2.816) + 1.3e-6 * 8192 * (2000 + 4096);
    const second = 7 + (0.022 * 1808 - 2.816) + 1.3e-6 * 1808 * (10192 + 904);
    close(batch1PrefillMs(model, 10_000, 2000), first + second, "10000 tokens on 2000 cached");
  });

  it("decode steps after the first token read the growing context", () => {
    // Two decode steps, contexts 1001 and 1002; c_dec is inside the floor credit.
    close(batch1DecodeMs(model, 1000, 3), 14 + 4.9e-5 * 2003, "3 output tokens");
    assert.equal(batch1DecodeMs(model, 1000, 1), 0);
  });

  it("work leaves out step overheads and counts only uncached prefill", () => {
    const c = call({ index: 0, promptTokens: 3000, cachedAtBest: 2000, maxTokens: 3 });
    const expected = 0.022 * 1000 + 1.3e-6 * 1000 * (2000 + 500) + 2 * 0.015 + 4.9e-5 * (2 * 3000 + 3);
    close(callWorkMs(model, c), expected, "work");
  });
});

describe("lower bound", () => {
  const workload = (calls: PlannedCall[], shared = 0): Workload => ({
    kind: "agents",
    name: "t",
    load: 1,
    calls,
    sharedPrefills: shared > 0 ? [{ tokens: shared }] : [],
    describe: "",
  });

  it("a chain of calls: arrival, batch-1 latencies and gaps add up on the critical path", () => {
    const a = call({ index: 0, arrivalMs: 500 });
    const b = call({ index: 1, after: 0, gapMs: 2000, promptTokens: 2003, cachedAtBest: 1003 });
    const bound = lowerBound(model, workload([a, b]), 1);
    const latency = (c: PlannedCall) =>
      batch1PrefillMs(model, c.promptTokens - c.cachedAtBest, c.cachedAtBest) +
      batch1DecodeMs(model, c.promptTokens, c.maxTokens);
    close(bound.criticalPathS * 1000, 500 + latency(a) + 2000 + latency(b), "critical path");
    assert.equal(bound.makespanS, Math.max(bound.criticalPathS, bound.workS));
    assert.equal(bound.makespanS, bound.criticalPathS);
  });

  it("many independent calls: the work spread over the replicas dominates", () => {
    const calls = Array.from({ length: 400 }, (_, index) =>
      call({ index, promptTokens: 8000, maxTokens: 200 }),
    );
    const one = lowerBound(model, workload(calls, 2000), 1);
    const four = lowerBound(model, workload(calls, 2000), 4);
    assert.ok(one.workS > one.criticalPathS);
    close(four.workS * 4, one.workS, "work divides by replicas");
    assert.equal(one.makespanS, one.workS);
    assert.equal(one.ttftMs.length, 400);
  });
});

describe("quantiles", () => {
  it("interpolate linearly between closest ranks", () => {
    assert.equal(quantile([], 0.5), 0);
    assert.equal(quantile([3, 1, 2], 0.5), 2);
    assert.equal(quantile([1, 2, 3, 4], 0.5), 2.5);
    close(quantile([0, 10], 0.99), 9.9, "p99 of two values");
    assert.equal(quantile([5, 7], 1), 7);
  });
});
