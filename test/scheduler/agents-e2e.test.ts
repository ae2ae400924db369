import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { runWorkloadBench } from "../../adapters/bench/suite.js";

/**
 * 48 ReAct-style agents on one h100-llama3-8b replica, all at once: the
 * issue's agents workload with fewer steps, driven through the real Scheduler
 * and simulated replica in virtual time by the benchmark's driver.
 */
const workload = (() => {
  const path = join(mkdtempSync(join(tmpdir(), "sluice-e2e-")), "agents-48.json");
  writeFileSync(
    path,
    JSON.stringify({
      kind: "agents",
      sessions: 48,
      steps: [8, 8],
      system_prompt_tokens: 2000,
      tool_output_tokens: [500, 3000],
      output_tokens: [100, 400],
      tool_wait_s: [1, 5],
      arrival: "batch",
      slo: { ttft_s: 5, tpot_s: 0.1 },
      seed: 7,
    }),
  );
  return path;
})();

describe("scheduler end to end on a simulated replica", () => {
  it("48 agents on one h100-llama3-8b replica: sluice beats rr on hit rate and makespan, and nothing leaks", async () => {
    const { report } = await runWorkloadBench({
      workload,
      replicas: 1,
      preset: "h100-llama3-8b",
      policies: ["rr", "sluice"],
    });
    assert.deepEqual(report.problems, []);
    const row = (policy: string) => report.output.results.find((result) => result.policy === policy)!;
    const rr = row("rr");
    const sluice = row("sluice");
    for (const result of [rr, sluice]) assert.equal(result.completed, 48 * 8);
    for (const run of report.runs) {
      assert.deepEqual(run.run.idle, { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    }
    assert.ok(
      sluice.prefix_hit_rate > rr.prefix_hit_rate,
      `sluice hit rate ${sluice.prefix_hit_rate} should beat rr's ${rr.prefix_hit_rate}`,
    );
    assert.ok(
      sluice.makespan_s < rr.makespan_s,
      `sluice makespan ${sluice.makespan_s} s should beat rr's ${rr.makespan_s} s`,
    );
  });
});
