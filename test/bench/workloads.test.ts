import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { callWorkMs, stepModelOfPreset } from "../../adapters/bench/cost-model.js";
import { buildAgentsWorkload } from "../../adapters/bench/workloads/agents.js";
import {
  compileWorkload,
  mixedAtCapacity,
  NAMED_WORKLOADS,
  resolveWorkload,
  withSeed,
} from "../../adapters/bench/workloads/index.js";
import { buildMixedWorkload } from "../../adapters/bench/workloads/mixed.js";
import { buildMooncakeWorkload } from "../../adapters/bench/workloads/mooncake-replay.js";
import {
  mulberry32,
  stream,
  tokenIds,
  uniformInt,
  uniformReal,
} from "../../adapters/bench/workloads/prng.js";
import type { AgentsSpec, MixedSpec, MooncakeSpec } from "../../adapters/bench/workloads/schema.js";
import { parseWorkloadSpec, readWorkloadFile, WorkloadError } from "../../adapters/bench/workloads/schema.js";

const SPEC_EXAMPLE = {
  kind: "agents",
  sessions: 64,
  steps: [20, 20],
  system_prompt_tokens: 2000,
  tool_output_tokens: [500, 3000],
  output_tokens: [100, 400],
  tool_wait_s: [1, 5],
  arrival: "batch",
  slo: { ttft_s: 5, tpot_s: 0.1 },
  seed: 1,
};

const MIXED = {
  kind: "mixed",
  duration_s: 30,
  interactive: {
    rate_per_s: 4,
    input_tokens: [100, 400],
    output_tokens: [20, 60],
    slo: { ttft_s: 1, tpot_s: 0.1 },
  },
  bulk: {
    rate_per_s: 0.5,
    input_tokens: [5000, 9000],
    output_tokens: [100, 300],
    slo: { ttft_s: 30, tpot_s: 0.2 },
  },
  seed: 3,
};

function agents(overrides: Record<string, unknown> = {}): AgentsSpec {
  return parseWorkloadSpec({ ...SPEC_EXAMPLE, ...overrides }) as AgentsSpec;
}

function throwsNaming(value: unknown, field: string): void {
  assert.throws(
    () => parseWorkloadSpec(value, "w.json"),
    (error: unknown) =>
      error instanceof WorkloadError && error.message.includes(field) && error.message.includes("w.json"),
  );
}

describe("workload files (docs/benchmarks.md)", () => {
  it("accepts the documented example exactly as written", () => {
    const spec = agents();
    assert.equal(spec.sessions, 64);
    assert.deepEqual(spec.steps, [20, 20]);
    assert.deepEqual(spec.tool_wait_s, [1, 5]);
    assert.equal(spec.arrival, "batch");
  });

  it("rejects unknown fields, naming them, at any depth", () => {
    throwsNaming({ ...SPEC_EXAMPLE, session: 3 }, 'unknown field "session"');
    throwsNaming({ ...SPEC_EXAMPLE, slo: { ttft_s: 1, tpot_s: 1, p99: true } }, 'unknown field "slo.p99"');
    throwsNaming({ ...MIXED, bulk: { ...MIXED.bulk, burst: 2 } }, 'unknown field "bulk.burst"');
    throwsNaming({ kind: "mooncake", trace: "x.jsonl", seed: 1 }, 'unknown field "seed"');
  });

  it("names bad values and kinds", () => {
    throwsNaming({ ...SPEC_EXAMPLE, tool_output_tokens: [3000, 500] }, "tool_output_tokens");
    throwsNaming({ ...SPEC_EXAMPLE, sessions: 0 }, '"sessions"');
    throwsNaming({ ...SPEC_EXAMPLE, arrival: { rate_per_s: -1 } }, "arrival.rate_per_s");
    throwsNaming({ ...SPEC_EXAMPLE, kind: "chat" }, '"kind"');
    throwsNaming([1, 2], "JSON object");
  });

  it("reads a file, and a bad file names the path", () => {
    const dir = mkdtempSync(join(tmpdir(), "sluice-workload-"));
    const good = join(dir, "good.json");
    writeFileSync(good, JSON.stringify(MIXED));
    assert.equal(readWorkloadFile(good).kind, "mixed");
    const bad = join(dir, "bad.json");
    writeFileSync(bad, "{ not json");
    assert.throws(
      () => readWorkloadFile(bad),
      (e: unknown) => e instanceof WorkloadError && e.message.includes(bad),
    );
    const resolved = resolveWorkload(good, { replicas: 1, model: stepModelOfPreset("h100-llama3-8b") });
    assert.equal(resolved.name, "good");
    assert.equal(resolved.baseDir, dir);
    assert.throws(
      () => resolveWorkload("no-such-workload", { replicas: 1, model: stepModelOfPreset("instant") }),
      WorkloadError,
    );
  });
});

describe("seeded draws", () => {
  it("mulberry32 and streams are deterministic and keyed by label", () => {
    const a = mulberry32(42);
    const b = mulberry32(42);
    for (let i = 0; i < 100; i++) assert.equal(a(), b());
    assert.notEqual(stream(1, "session", 1)(), stream(1, "session", 2)());
    assert.deepEqual(tokenIds(50, 7, "x"), tokenIds(50, 7, "x"));
    assert.notDeepEqual(tokenIds(50, 7, "x"), tokenIds(50, 8, "x"));
  });

  it("uniform draws stay inside their closed ranges and reach both ends", () => {
    const random = mulberry32(9);
    const seen = new Set<number>();
    for (let i = 0; i < 2000; i++) {
      const n = uniformInt(random, [3, 6]);
      assert.ok(n >= 3 && n <= 6);
      seen.add(n);
      const x = uniformReal(random, [1, 5]);
      assert.ok(x >= 1 && x <= 5);
    }
    assert.deepEqual([...seen].sort(), [3, 4, 5, 6]);
  });
});

describe("agents workload", () => {
  it("compiles sessions × steps calls whose contexts grow step by step", () => {
    const w = buildAgentsWorkload(agents({ sessions: 3, steps: [4, 4] }));
    assert.equal(w.calls.length, 12);
    for (const call of w.calls) {
      const k = Number(call.id.split("-k")[1]);
      if (k === 0) {
        assert.equal(call.after, undefined);
        assert.equal(call.extendsAfter, false);
        assert.equal(call.cachedAtBest, 2000);
        continue;
      }
      const previous = w.calls[call.after!]!;
      assert.equal(previous.sessionId, call.sessionId);
      assert.ok(call.extendsAfter);
      const tool = call.newTokens().length;
      assert.ok(tool >= 500 && tool <= 3000, `tool output ${tool}`);
      assert.equal(call.promptTokens, previous.promptTokens + previous.maxTokens + tool);
      assert.equal(call.cachedAtBest, previous.promptTokens + previous.maxTokens);
      assert.ok(call.gapMs >= 1000 && call.gapMs <= 5000);
      assert.ok(call.maxTokens >= 100 && call.maxTokens <= 400);
    }
  });

  it("shares the system prompt between sessions and nothing else", () => {
    const w = buildAgentsWorkload(agents({ sessions: 2, steps: [1, 1], system_prompt_tokens: 300 }));
    const [a, b] = w.calls.map((c) => c.newTokens());
    assert.deepEqual(a!.slice(0, 300), b!.slice(0, 300));
    assert.notDeepEqual(a!.slice(300, 400), b!.slice(300, 400));
    assert.deepEqual(w.sharedPrefills, [{ tokens: 300 }]);
  });

  it("is deterministic per seed, and a session is the same session at every load", () => {
    const one = buildAgentsWorkload(agents({ sessions: 4 }), { load: 1 });
    const again = buildAgentsWorkload(agents({ sessions: 4 }), { load: 1 });
    const double = buildAgentsWorkload(agents({ sessions: 4 }), { load: 2 });
    const other = buildAgentsWorkload(agents({ sessions: 4, seed: 2 }), { load: 1 });
    const shape = (w: typeof one) =>
      w.calls.map((c) => [c.id, c.promptTokens, c.maxTokens, c.gapMs, c.newTokens()[2100]]);
    assert.deepEqual(shape(one), shape(again));
    assert.notDeepEqual(shape(one), shape(other));
    assert.equal(double.calls.length, 2 * one.calls.length);
    assert.deepEqual(shape(double).slice(0, one.calls.length), shape(one));
  });

  it("Poisson arrivals: rate scaled by load, sessions in arrival order", () => {
    const spec = agents({ sessions: 200, steps: [1, 1], arrival: { rate_per_s: 2 } });
    const slow = buildAgentsWorkload(spec, { load: 1 });
    const fast = buildAgentsWorkload(spec, { load: 4 });
    const arrivals = slow.calls.map((c) => c.arrivalMs);
    assert.deepEqual(
      arrivals,
      [...arrivals].sort((a, b) => a - b),
    );
    const last = arrivals[arrivals.length - 1]!;
    // 200 arrivals at 2/s span about 100 s.
    assert.ok(last > 70_000 && last < 130_000, `last arrival ${last} ms`);
    assert.ok(Math.abs(fast.calls[199]!.arrivalMs * 4 - last) < 1e-6);
  });

  it("withSeed replaces the seed of seeded kinds only", () => {
    assert.equal((withSeed(agents(), 9) as AgentsSpec).seed, 9);
    const mooncake = parseWorkloadSpec({ kind: "mooncake", trace: "t.jsonl" });
    assert.equal(withSeed(mooncake, 9), mooncake);
  });
});

describe("mixed workload", () => {
  it("declares lanes, respects ranges and keeps arrivals inside the duration", () => {
    const spec = parseWorkloadSpec(MIXED) as MixedSpec;
    const w = buildMixedWorkload(spec);
    const interactive = w.calls.filter((c) => c.declaredLane === "interactive");
    const bulk = w.calls.filter((c) => c.declaredLane === "bulk");
    assert.ok(interactive.length > 60 && interactive.length < 180, `${interactive.length} interactive calls`);
    assert.ok(bulk.length > 3 && bulk.length < 35, `${bulk.length} bulk calls`);
    for (const call of w.calls) {
      assert.ok(call.arrivalMs >= 0 && call.arrivalMs < 30_000);
      assert.equal(call.retry, false);
      assert.equal(call.sessionId, undefined);
      assert.equal(call.newTokens().length, call.promptTokens);
      const lane = spec[call.declaredLane!];
      assert.ok(call.promptTokens >= lane.input_tokens[0] && call.promptTokens <= lane.input_tokens[1]);
      assert.ok(call.maxTokens >= lane.output_tokens[0] && call.maxTokens <= lane.output_tokens[1]);
    }
    assert.deepEqual(
      w.calls.map((c) => c.arrivalMs),
      w.calls.map((c) => c.arrivalMs).sort((a, b) => a - b),
    );
    const doubled = buildMixedWorkload(spec, { load: 2 });
    assert.ok(doubled.calls.length > 1.5 * w.calls.length);
  });

  it("the built-in mixed offers exactly the fleet's ideal capacity at load 1", () => {
    const model = stepModelOfPreset("h100-llama3-8b");
    for (const replicas of [1, 2, 4]) {
      const spec = mixedAtCapacity({ replicas, model });
      const w = buildMixedWorkload(spec);
      let work = 0;
      for (const call of w.calls) work += callWorkMs(model, call);
      const offered = work / (spec.duration_s * 1000 * replicas);
      // Poisson draws at the scaled rates differ from the probe's, so only roughly 1.
      assert.ok(offered > 0.8 && offered < 1.25, `offered ${offered} of capacity on ${replicas} replicas`);
    }
  });
});

describe("mooncake workload", () => {
  const spec = parseWorkloadSpec({
    kind: "mooncake",
    trace: "../shared/traces/mooncake-conversation.jsonl",
    limit: 400,
  }) as MooncakeSpec;

  it("replays the trace: follow-up turns wait for their parent, prompts expand the hash blocks", () => {
    const w = buildMooncakeWorkload(spec);
    assert.equal(w.calls.length, 400);
    const followUps = w.calls.filter((c) => c.after !== undefined);
    assert.ok(followUps.length > 0, "the conversation trace has follow-up turns");
    for (const call of followUps) {
      const parent = w.calls[call.after!]!;
      assert.ok(parent.index < call.index);
      assert.equal(parent.sessionId, call.sessionId);
      assert.ok(call.cachedAtBest >= 512, "a follow-up can reuse at least its parent's first block");
    }
    for (const call of w.calls) assert.ok(call.cachedAtBest <= call.promptTokens);
    const first = w.calls[0]!;
    assert.equal(first.newTokens().length, first.promptTokens);
    const a = w.calls[1]!.newTokens();
    assert.deepEqual(a.slice(0, 512), first.newTokens().slice(0, 512), "every request shares block 0");
    const compressed = buildMooncakeWorkload(spec, { load: 2 });
    assert.ok(Math.abs(compressed.calls[399]!.arrivalMs * 2 - w.calls[399]!.arrivalMs) < 1e-6);
  });

  it("a missing trace is a WorkloadError naming where it looked", () => {
    assert.throws(
      () => buildMooncakeWorkload({ ...spec, trace: "no/such/trace.jsonl" }),
      (e: unknown) => e instanceof WorkloadError && e.message.includes("no/such/trace.jsonl"),
    );
  });
});

describe("built-in workloads", () => {
  it("carry the issue's parameters", () => {
    const fleet = { replicas: 1, model: stepModelOfPreset("h100-llama3-8b") };
    const a = NAMED_WORKLOADS.agents!.spec(fleet) as AgentsSpec;
    assert.equal(a.sessions, 64);
    assert.deepEqual(
      [a.steps, a.tool_output_tokens, a.output_tokens, a.tool_wait_s],
      [
        [20, 20],
        [500, 3000],
        [100, 400],
        [1, 5],
      ],
    );
    assert.equal(a.system_prompt_tokens, 2000);
    assert.equal(NAMED_WORKLOADS.agents!.replicas, 1);
    assert.equal((NAMED_WORKLOADS["agents-256"]!.spec(fleet) as AgentsSpec).sessions, 256);
    assert.equal(NAMED_WORKLOADS["agents-256"]!.replicas, 4);
    assert.equal(NAMED_WORKLOADS.mooncake!.replicas, 4);
    const w = compileWorkload(a, { name: "agents", load: 1 });
    assert.equal(w.calls.length, 64 * 20);
  });
});
