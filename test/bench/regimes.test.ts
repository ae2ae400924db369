/** @module The regime workloads (burst, light, steady, long, chat, agents-mixed), size classes, trace slices. */

import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { stepModelOfPreset } from "../../adapters/bench/cost-model.js";
import type { CallRecord } from "../../adapters/bench/run.js";
import { sessionTimes } from "../../adapters/bench/run.js";
import { runWorkloadBench } from "../../adapters/bench/suite.js";
import { buildAgentsWorkload, classIndexOf } from "../../adapters/bench/workloads/agents.js";
import { compileWorkload, NAMED_WORKLOADS, withSeed } from "../../adapters/bench/workloads/index.js";
import { buildMooncakeWorkload } from "../../adapters/bench/workloads/mooncake-replay.js";
import type { AgentsSpec, MooncakeSpec } from "../../adapters/bench/workloads/schema.js";
import { parseWorkloadSpec, WorkloadError } from "../../adapters/bench/workloads/schema.js";
import type { PlannedCall, Workload } from "../../adapters/bench/workloads/types.js";

const fleet = { replicas: 1, model: stepModelOfPreset("h100-llama3-8b") };

function compileNamed(name: string, seed?: number): Workload {
  const spec = withSeed(NAMED_WORKLOADS[name]!.spec(fleet), seed);
  return compileWorkload(spec, { name, load: 1 });
}

/** What a call is, without its lazily built tokens. */
function shape(call: PlannedCall) {
  return [
    call.id,
    call.sessionId,
    call.arrivalMs,
    call.after,
    call.gapMs,
    call.promptTokens,
    call.maxTokens,
    call.group,
  ];
}

function sessionsOf(w: Workload): Map<string, PlannedCall[]> {
  const out = new Map<string, PlannedCall[]>();
  for (const call of w.calls) {
    const list = out.get(call.sessionId!) ?? [];
    list.push(call);
    out.set(call.sessionId!, list);
  }
  return out;
}

const REGIME_NAMES = ["burst", "light", "steady", "long", "chat", "agents-mixed"];

describe("regime workloads", () => {
  it("are built in, and deterministic with the seed", () => {
    for (const name of REGIME_NAMES) {
      assert.ok(NAMED_WORKLOADS[name], `${name} is built in`);
      const a = compileNamed(name);
      const b = compileNamed(name);
      assert.deepEqual(a.calls.map(shape), b.calls.map(shape), `${name}: same seed, same calls`);
      assert.deepEqual(a.calls[0]!.newTokens(), b.calls[0]!.newTokens());
      const c = compileNamed(name, 99);
      assert.notDeepEqual(c.calls.map(shape), a.calls.map(shape), `${name}: another seed, other calls`);
    }
  });

  it("burst: hundreds of one-step sessions at once, system prompt 800, output 32–128", () => {
    const w = compileNamed("burst");
    const sessions = sessionsOf(w);
    assert.equal(sessions.size, 300);
    for (const calls of sessions.values()) assert.equal(calls.length, 1);
    for (const call of w.calls) {
      assert.equal(call.arrivalMs, 0);
      assert.ok(call.maxTokens >= 32 && call.maxTokens <= 128);
      assert.ok(call.promptTokens > 800);
    }
  });

  it("light and steady arrive as Poisson processes; steady sessions have five steps", () => {
    const light = compileNamed("light");
    const firsts = light.calls.filter((c) => c.after === undefined).map((c) => c.arrivalMs);
    assert.ok(
      firsts.every((t, i) => i === 0 || t >= firsts[i - 1]!),
      "arrivals in order",
    );
    assert.ok(firsts[firsts.length - 1]! > 60_000, "light sessions spread over minutes");
    for (const call of light.calls)
      if (call.after !== undefined) assert.ok(call.gapMs >= 5000 && call.gapMs <= 30_000);
    const steady = compileNamed("steady");
    for (const calls of sessionsOf(steady).values()) assert.equal(calls.length, 5);
    assert.ok(new Set(steady.calls.map((c) => c.arrivalMs)).size > 100);
  });

  it("long: a few sessions of forty steps with large tool outputs", () => {
    const w = compileNamed("long");
    const sessions = sessionsOf(w);
    assert.ok(sessions.size <= 8);
    for (const calls of sessions.values()) {
      assert.equal(calls.length, 40);
      assert.ok(calls[39]!.promptTokens > 40_000, "contexts grow large");
    }
  });

  it("chat: Poisson 3/s, 3–6 turns, think time 10–60 s, output 100–500", () => {
    const spec = NAMED_WORKLOADS.chat!.spec(fleet) as AgentsSpec;
    assert.deepEqual(spec.arrival, { rate_per_s: 3 });
    const w = compileWorkload(spec, { name: "chat", load: 1 });
    for (const calls of sessionsOf(w).values()) assert.ok(calls.length >= 3 && calls.length <= 6);
    for (const call of w.calls) {
      assert.ok(call.maxTokens >= 100 && call.maxTokens <= 500);
      if (call.after !== undefined) assert.ok(call.gapMs >= 10_000 && call.gapMs <= 60_000);
    }
  });

  it("agents-mixed: 60 % small, 20 % medium, 20 % large sessions, each drawing from its class's range", () => {
    const w = compileNamed("agents-mixed");
    const ranges: Record<string, [number, number]> = {
      small: [50, 300],
      medium: [300, 2000],
      large: [1000, 6000],
    };
    const counts: Record<string, number> = {};
    for (const calls of sessionsOf(w).values()) {
      const group = calls[0]!.group;
      counts[group] = (counts[group] ?? 0) + 1;
      const [min, max] = ranges[group]!;
      for (const call of calls.slice(1)) {
        const tool = call.promptTokens - calls[call.index - calls[0]!.index - 1]!.promptTokens;
        // A step adds the previous output and its own tool output.
        const previousOutput = calls[call.index - calls[0]!.index - 1]!.maxTokens;
        assert.ok(tool - previousOutput >= min && tool - previousOutput <= max, `${group} tool output`);
      }
    }
    assert.deepEqual(Object.keys(counts).sort(), ["large", "medium", "small"]);
    const total = 64;
    for (const [group, share] of [
      ["small", 0.6],
      ["medium", 0.2],
      ["large", 0.2],
    ] as const)
      assert.ok(Math.abs(counts[group]! - share * total) <= 1.5, `${group}: ${counts[group]} of ${total}`);
  });
});

describe("size classes in workload files", () => {
  const base = {
    kind: "agents",
    sessions: 20,
    steps: [2, 3],
    tool_output_tokens: [500, 600],
    seed: 4,
  };

  it("parse, and override the ranges for their share of the sessions", () => {
    const spec = parseWorkloadSpec({
      ...base,
      classes: [{ share: 0.5, name: "tiny", tool_output_tokens: [10, 20], steps: 1 }],
    }) as AgentsSpec;
    assert.deepEqual(spec.classes![0]!.tool_output_tokens, [10, 20]);
    assert.deepEqual(spec.classes![0]!.steps, [1, 1]);
    const w = buildAgentsWorkload(spec);
    const groups = new Map<string, number>();
    for (const calls of sessionsOf(w).values()) {
      const group = calls[0]!.group;
      groups.set(group, (groups.get(group) ?? 0) + 1);
      if (group === "tiny") assert.equal(calls.length, 1);
      else assert.ok(calls.length >= 2);
    }
    assert.equal(groups.get("tiny"), 10, "half of 20 sessions");
    assert.equal(groups.get("agents"), 10, "the unclaimed sessions keep the spec's ranges");
  });

  it("keep each session's class whatever the number of sessions", () => {
    const spec = parseWorkloadSpec({
      ...base,
      classes: [{ share: 0.3, tool_output_tokens: [10, 20] }, { share: 0.7 }],
    }) as AgentsSpec;
    const more = { ...spec, sessions: 200 };
    for (let s = 0; s < 20; s++) assert.equal(classIndexOf(spec, s), classIndexOf(more, s));
    const w = buildAgentsWorkload(spec, { load: 1 });
    assert.ok(w.calls.every((c) => c.group === "class-0" || c.group === "class-1"));
    assert.match(w.describe, /classes: class-0 30 %/);
  });

  it("reject unknown fields naming them, and shares above 1", () => {
    const naming = (value: unknown, text: string) =>
      assert.throws(
        () => parseWorkloadSpec(value, "w.json"),
        (e: unknown) => e instanceof WorkloadError && e.message.includes(text),
      );
    naming({ ...base, classes: [{ share: 0.5, tool_wait: [1, 2] }] }, 'unknown field "classes[0].tool_wait"');
    naming({ ...base, classes: [{ share: 0.6 }, { share: 0.6 }] }, "at most 1");
    naming({ ...base, classes: [{ tool_output_tokens: [1, 2] }] }, 'field "classes[0].share"');
    naming({ ...base, classes: [{ share: 0.5, output_tokens: [9, 3] }] }, "classes[0].output_tokens");
  });
});

describe("session times", () => {
  it("group calls into sessions: completion from first arrival to last end, waits summed", () => {
    const call = (index: number, sessionId: string | undefined, arrivalMs: number): PlannedCall => ({
      index,
      id: `c${index}`,
      ...(sessionId !== undefined ? { sessionId } : {}),
      arrivalMs,
      gapMs: 0,
      extendsAfter: false,
      newTokens: () => [],
      promptTokens: 1,
      cachedAtBest: 0,
      maxTokens: 1,
      slo: { ttftS: 1, tpotS: 1 },
      retry: true,
      group: "g",
    });
    const record = (endAt: number, waitMs: number, outcome: CallRecord["outcome"] = "ok"): CallRecord => ({
      readyAt: 0,
      firstTokenAt: endAt,
      endAt,
      tokens: 1,
      waitMs,
      outcome,
    });
    const times = sessionTimes(
      [call(0, "a", 1000), call(1, "a", 1000), call(2, undefined, 2000), call(3, "b", 0)],
      [record(3000, 500), record(9000, 1500), record(2500, 0), record(4000, 4000, "refused")],
    );
    assert.deepEqual(
      times.completionS.sort(),
      [0.5, 8],
      "b never completed; the lone call is its own session",
    );
    assert.deepEqual(times.waitS.sort(), [0, 2, 4]);
  });
});

describe("trace slices", () => {
  it("a trace whose first timestamp is not 0 starts at that timestamp, not after an idle wait", async () => {
    const dir = mkdtempSync(join(tmpdir(), "sluice-slice-"));
    const trace = join(dir, "slice.jsonl");
    const lines = [
      { timestamp: 600_000, input_length: 1024, output_length: 20, hash_ids: [1, 2] },
      { timestamp: 601_000, input_length: 600, output_length: 10, hash_ids: [7, 8] },
      { timestamp: 603_500, input_length: 1536, output_length: 20, hash_ids: [1, 2, 3] },
    ];
    writeFileSync(trace, `${lines.map((l) => JSON.stringify(l)).join("\n")}\n`);
    const spec = parseWorkloadSpec({ kind: "mooncake", trace }) as MooncakeSpec;
    const w = buildMooncakeWorkload(spec);
    assert.deepEqual(
      w.calls.map((c) => c.arrivalMs),
      [0, 1000, 3500],
    );
    assert.deepEqual(
      buildMooncakeWorkload(spec, { load: 2 }).calls.map((c) => c.arrivalMs),
      [0, 500, 1750],
    );
    const file = join(dir, "slice.json");
    writeFileSync(file, JSON.stringify({ kind: "mooncake", trace }));
    const { report } = await runWorkloadBench({ workload: file, policies: ["rr"] });
    const rr = report.output.results[0]!;
    assert.equal(rr.completed, 3);
    assert.ok(rr.makespan_s < 60, `the replay ran ${rr.makespan_s} s: it waited for the first timestamp`);
  });
});
