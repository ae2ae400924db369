import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import type { BenchReport } from "../../adapters/bench/run.js";
import { BENCH_POLICIES } from "../../adapters/bench/run.js";
import { runWorkloadBench } from "../../adapters/bench/suite.js";
import { parseWorkloadSpec } from "../../adapters/bench/workloads/schema.js";
import { benchOutputSchema } from "../../bench/output-schema.js";

const dir = mkdtempSync(join(tmpdir(), "sluice-bench-run-"));

function workloadFile(name: string, spec: Record<string, unknown>): string {
  parseWorkloadSpec(spec, name);
  const path = join(dir, `${name}.json`);
  writeFileSync(path, JSON.stringify(spec));
  return path;
}

const SMALL_AGENTS = workloadFile("small-agents", {
  kind: "agents",
  sessions: 6,
  steps: [3, 4],
  system_prompt_tokens: 800,
  tool_output_tokens: [200, 900],
  output_tokens: [20, 80],
  tool_wait_s: [0.5, 2],
  arrival: "batch",
  slo: { ttft_s: 5, tpot_s: 0.1 },
  seed: 5,
});

const SMALL_MIXED = workloadFile("small-mixed", {
  kind: "mixed",
  duration_s: 8,
  interactive: {
    rate_per_s: 3,
    input_tokens: [100, 600],
    output_tokens: [10, 60],
    slo: { ttft_s: 1, tpot_s: 0.1 },
  },
  bulk: {
    rate_per_s: 0.5,
    input_tokens: [4000, 9000],
    output_tokens: [50, 200],
    slo: { ttft_s: 30, tpot_s: 0.2 },
  },
  seed: 2,
});

const SMALL_MOONCAKE = workloadFile("small-mooncake", {
  kind: "mooncake",
  trace: "../shared/traces/mooncake-conversation.jsonl",
  time_scale: 0.05,
  limit: 40,
  slo: { ttft_s: 5, tpot_s: 0.1 },
});

/** Every policy ran to the end at every load, nothing leaked, and the document matches docs/benchmarks.md. */
function assertClean(report: BenchReport, offered: number, loads: readonly number[] = [1]): void {
  assert.deepEqual(report.problems, []);
  const parsed = benchOutputSchema.safeParse(report.output);
  assert.ok(parsed.success, parsed.success ? "" : JSON.stringify(parsed.error.issues));
  assert.deepEqual(
    report.output.results.map((r) => `${r.policy}@${r.load}`),
    loads.flatMap((load) => [...BENCH_POLICIES, "bound"].map((p) => `${p}@${load}`)),
  );
  for (const { run, policy } of report.runs) {
    assert.deepEqual(
      run.idle,
      { permits: 0, reservations: 0, windowSlots: 0, queued: 0 },
      `${policy} left state behind`,
    );
    assert.equal(run.unfinished, 0, `${policy} unfinished calls`);
    assert.deepEqual(run.errors, []);
    assert.ok(run.samples.length > 0);
  }
  for (const row of report.output.results) {
    assert.ok(row.makespan_s > 0, `${row.policy} makespan`);
    assert.ok(row.completed <= offered);
    if (row.policy !== "bound") assert.ok(row.ttft_p50_s <= row.ttft_p99_s);
  }
}

describe("benchmark runs: every workload under every policy", () => {
  it("agents: calls retried until done, every counter back to zero, bound below every policy", async () => {
    const { report } = await runWorkloadBench({ workload: SMALL_AGENTS, replicas: 1 });
    const offered = report.runs[0]!.run.groups.agents!.offered;
    assertClean(report, offered);
    const bound = report.output.results.find((r) => r.policy === "bound")!;
    for (const row of report.output.results) {
      assert.equal(row.completed, offered, `${row.policy}: every agents step completes eventually`);
      assert.ok(row.makespan_s >= bound.makespan_s, `${row.policy} beat the lower bound`);
      assert.ok(row.prefix_hit_rate > 0, `${row.policy}: later steps reuse their own context`);
    }
  });

  it("mixed: per-lane numbers, refused calls are not retried", async () => {
    const { report } = await runWorkloadBench({ workload: SMALL_MIXED, replicas: 1, loads: [1, 3] });
    const offeredAt = (load: number) => {
      const groups = report.runs.find((r) => r.load === load)!.run.groups;
      return groups.interactive!.offered + groups.bulk!.offered;
    };
    assertClean(report, offeredAt(3), [1, 3]);
    assert.ok(offeredAt(3) > 2 * offeredAt(1), "load 3 offers about three times the calls");
    for (const load of [1, 3]) {
      const total = offeredAt(load);
      for (const { run } of report.runs.filter((r) => r.load === load)) {
        const refused = run.groups.interactive!.rejected + run.groups.bulk!.rejected;
        assert.equal(run.row.completed + refused, total, "each call completes or is refused once");
      }
    }
  });

  it("mooncake: follow-up turns run after their parents on 2 replicas", async () => {
    const { report } = await runWorkloadBench({ workload: SMALL_MOONCAKE, replicas: 2 });
    assertClean(report, 40);
    for (const row of report.output.results) assert.equal(row.completed, 40);
  });

  it("the lower bound is tight for one session alone on a replica", async () => {
    const alone = workloadFile("alone", {
      kind: "agents",
      sessions: 1,
      steps: [3, 3],
      system_prompt_tokens: 0,
      tool_output_tokens: [9000, 9000],
      output_tokens: [50, 50],
      tool_wait_s: [1, 1],
      seed: 1,
    });
    const { report } = await runWorkloadBench({ workload: alone, replicas: 1, policies: ["rr"] });
    const [rr, bound] = report.output.results;
    assert.equal(bound!.policy, "bound");
    assert.ok(rr!.makespan_s >= bound!.makespan_s);
    // Only the partial last block of each prompt is recomputed beyond the ideal cache.
    assert.ok(
      rr!.makespan_s <= bound!.makespan_s * 1.01,
      `rr ${rr!.makespan_s} s vs bound ${bound!.makespan_s} s`,
    );
  });

  it("an aborted signal stops the benchmark with its reason", async () => {
    const controller = new AbortController();
    const reason = new Error("stop");
    controller.abort(reason);
    await assert.rejects(runWorkloadBench({ workload: SMALL_AGENTS, signal: controller.signal }), reason);
    const midway = new AbortController();
    let runs = 0;
    await assert.rejects(
      runWorkloadBench({
        workload: SMALL_AGENTS,
        signal: midway.signal,
        onProgress: (line) => {
          // Abort once the first policy has finished: the next one must not start.
          if (line.includes("rr load 1:")) runs++;
          if (runs === 1) midway.abort(reason);
        },
      }),
      reason,
    );
  });

  it("is deterministic: the same seed gives the same numbers", async () => {
    const first = await runWorkloadBench({ workload: SMALL_AGENTS, replicas: 1, policies: ["rr", "sluice"] });
    const second = await runWorkloadBench({
      workload: SMALL_AGENTS,
      replicas: 1,
      policies: ["rr", "sluice"],
    });
    assert.deepEqual(second.report.output.results, first.report.output.results);
    const reseeded = await runWorkloadBench({
      workload: SMALL_AGENTS,
      replicas: 1,
      policies: ["rr"],
      seed: 6,
    });
    assert.notDeepEqual(reseeded.report.output.results[0], first.report.output.results[0]);
  });
});

describe("sluice against round robin on a thrashing agents case", () => {
  it("finishes sooner with a higher prefix-cache hit rate when sessions overflow the KV cache", async () => {
    // The issue's agents workload at half scale: 32 sessions on half an 8B replica's cache. Their contexts
    // grow to ~40k tokens, ~6× what the cache holds: round robin runs them all and recomputes evicted
    // prefixes; sluice's window keeps the active sessions' contexts resident.
    const thrash = workloadFile("thrash", {
      kind: "agents",
      sessions: 32,
      steps: [20, 20],
      system_prompt_tokens: 2000,
      tool_output_tokens: [500, 3000],
      output_tokens: [100, 400],
      tool_wait_s: [1, 5],
      arrival: "batch",
      slo: { ttft_s: 5, tpot_s: 0.1 },
      seed: 1,
    });
    const { report } = await runWorkloadBench({
      workload: thrash,
      replicas: 1,
      preset: { base: "h100-llama3-8b", kvCapacityTokens: 219_500 },
      policies: ["rr", "sluice"],
    });
    assert.deepEqual(report.problems, []);
    const rr = report.output.results.find((r) => r.policy === "rr")!;
    const sluice = report.output.results.find((r) => r.policy === "sluice")!;
    assert.ok(rr.preemptions > 0 && rr.prefix_hit_rate < 0.5, "the case must actually thrash under rr");
    assert.ok(
      sluice.makespan_s < rr.makespan_s,
      `makespan: sluice ${sluice.makespan_s} s vs rr ${rr.makespan_s} s`,
    );
    assert.ok(
      sluice.prefix_hit_rate > rr.prefix_hit_rate,
      `hit rate: sluice ${sluice.prefix_hit_rate} vs rr ${rr.prefix_hit_rate}`,
    );
  });
});
