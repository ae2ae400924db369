/**
 * @module SLO capacity (docs/benchmarks.md): the search for the largest load at which 90 % of calls meet their
 * TTFT SLO, and `sluice bench` reporting it per policy on a slice of the Mooncake conversation trace.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import type { BenchOutput } from "../../adapters/bench/run.js";
import { largestLoadMet } from "../../adapters/bench/slo-capacity.js";

const SLUICE = fileURLToPath(new URL("../../adapters/cli/sluice.js", import.meta.url));

/** `sluice bench` as a user runs it: its own process, stdout captured. */
async function sluiceBench(args: string[]): Promise<{ code: number; stdout: string }> {
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [SLUICE, "bench", ...args], {
      maxBuffer: 16 << 20,
    });
    return { code: 0, stdout };
  } catch (error) {
    const failed = error as { code?: number; stdout?: string; stderr?: string };
    return { code: failed.code ?? -1, stdout: `${failed.stdout ?? ""}${failed.stderr ?? ""}` };
  }
}

describe("the capacity search", () => {
  it("walks the grid until a load misses, then bisects between the last met and the first missed", async () => {
    const asked: number[] = [];
    const capacity = await largestLoadMet(
      async (load) => {
        asked.push(load);
        return load <= 1.3;
      },
      { grid: [0.5, 1, 2, 4], bisections: 3 },
    );
    assert.deepEqual(asked, [0.5, 1, 2, 1.5, 1.25, 1.375]);
    assert.equal(capacity, 1.25);
  });

  it("is 0 when the first load already misses, and the last grid load when none does", async () => {
    assert.equal(await largestLoadMet(async () => false, { grid: [1, 2], bisections: 0 }), 0);
    assert.equal(await largestLoadMet(async () => true, { grid: [2, 1], bisections: 3 }), 2);
  });

  it("refuses an empty grid, a load ≤ 0 and a fractional bisection count", async () => {
    await assert.rejects(
      largestLoadMet(async () => true, { grid: [], bisections: 1 }),
      RangeError,
    );
    await assert.rejects(
      largestLoadMet(async () => true, { grid: [0, 1], bisections: 1 }),
      RangeError,
    );
    await assert.rejects(
      largestLoadMet(async () => true, { grid: [1], bisections: 0.5 }),
      RangeError,
    );
  });
});

describe("sluice bench on a trace replay", () => {
  it("reports each policy's SLO capacity, the loads tried and the ratio to rr, in JSON, text and the report", async () => {
    const dir = mkdtempSync(join(tmpdir(), "sluice-capacity-"));
    const workload = join(dir, "slice.json");
    const trace = fileURLToPath(
      new URL("../../../shared/traces/mooncake-conversation.jsonl", import.meta.url),
    );
    writeFileSync(
      workload,
      JSON.stringify({ kind: "mooncake", trace, limit: 150, slo: { ttft_s: 5, tpot_s: 0.1 } }),
    );
    const json = join(dir, "out.json");
    const html = join(dir, "report.html");
    const { code, stdout } = await sluiceBench([
      "--workload",
      workload,
      "--replicas",
      "2",
      "--policies",
      "rr,sluice",
      "--capacity-grid",
      "0.5,1,2",
      "--json",
      json,
      "--report",
      html,
      "--quiet",
    ]);
    assert.equal(code, 0, stdout);
    const output = JSON.parse(readFileSync(json, "utf8")) as BenchOutput;
    const capacity = output.slo_capacity;
    assert.ok(capacity, "a trace replay reports SLO capacity");
    assert.equal(capacity.share, 0.9);
    assert.deepEqual(
      capacity.policies.map((p) => p.policy),
      ["rr", "sluice"],
    );
    for (const p of capacity.policies) {
      const loads = p.tried.map((t) => t.load);
      assert.deepEqual(
        loads,
        [...loads].sort((a, b) => a - b),
        "tried loads in load order",
      );
      assert.equal(new Set(loads).size, loads.length, "each load run once");
      for (const t of p.tried) assert.ok(t.ttft_slo_met >= 0 && t.ttft_slo_met <= 1);
      // The capacity is a load that met the share, and no load tried above it did.
      if (p.capacity > 0) assert.ok(p.tried.find((t) => t.load === p.capacity)!.ttft_slo_met >= 0.9);
      for (const t of p.tried)
        if (t.load > p.capacity) assert.ok(t.ttft_slo_met < 0.9, `${p.policy} ${t.load}`);
      // The run at the asked load (1) is the same run the table shows, not a second one.
      const row = output.results.find((r) => r.policy === p.policy && r.load === 1)!;
      assert.ok(p.tried.some((t) => t.load === 1) || p.capacity < 1);
      assert.ok(row);
    }
    const rr = capacity.policies[0]!;
    const sluice = capacity.policies[1]!;
    if (rr.capacity > 0)
      assert.equal(sluice.ratio_to_rr, Math.round((sluice.capacity / rr.capacity) * 1000) / 1000);
    assert.match(stdout, /sluice: SLO capacity /);
    assert.match(readFileSync(html, "utf8"), /SLO attainment against offered load/);
  });

  it("searches nothing for other workloads unless asked", async () => {
    const dir = mkdtempSync(join(tmpdir(), "sluice-capacity-"));
    const workload = join(dir, "tiny.json");
    writeFileSync(
      workload,
      JSON.stringify({
        kind: "agents",
        sessions: 2,
        steps: [2, 2],
        system_prompt_tokens: 200,
        tool_output_tokens: [100, 200],
        output_tokens: [10, 20],
        tool_wait_s: [0.1, 0.2],
        seed: 1,
      }),
    );
    const json = join(dir, "out.json");
    const { code, stdout } = await sluiceBench([
      "--workload",
      workload,
      "--policies",
      "rr",
      "--json",
      json,
      "--quiet",
    ]);
    assert.equal(code, 0, stdout);
    assert.equal((JSON.parse(readFileSync(json, "utf8")) as BenchOutput).slo_capacity, undefined);
  });
});
