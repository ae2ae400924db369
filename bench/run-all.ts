/**
 * @module `npm run bench`: the named runs of the benchmark issue (agents, agents-256, mixed, mooncake), each
 * checked against its target, plus every other `bench/*.ts` benchmark that exports a `run…Bench()` function.
 * Writes `bench/results/*.json` (and an HTML report per named run, and `agents.svg` for the README).
 */

import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { renderTable } from "./report.js";
import type { BenchReport, ResultRow } from "./run.js";
import type { WorkloadBenchResult } from "./suite.js";
import { runWorkloadBench, writeOutputs } from "./suite.js";

const HERE = dirname(fileURLToPath(import.meta.url));

/** One target of the issue, as measured. */
export interface TargetCheck {
  run: string;
  target: string;
  measured: number;
  goal: string;
  met: boolean;
}

function row(report: BenchReport, policy: string, load?: number): ResultRow {
  const found = report.output.results.find(
    (r) => r.policy === policy && (load === undefined || r.load === load),
  );
  if (!found)
    throw new Error(
      `no ${policy} row${load === undefined ? "" : ` at load ${load}`} in ${report.output.workload}`,
    );
  return found;
}

function ratio(a: number, b: number): number {
  return b > 0 ? Math.round((a / b) * 1000) / 1000 : Number.POSITIVE_INFINITY;
}

function check(run: string, target: string, measured: number, goal: string, met: boolean): TargetCheck {
  return { run, target, measured, goal, met };
}

function wallCheck(run: string, result: WorkloadBenchResult): TargetCheck {
  const slowest = Math.max(0, ...result.report.runs.map(({ run: r }) => r.wallS));
  return check(run, "slowest policy run, wall s", slowest, "≤ 60", slowest <= 60);
}

function agentsChecks(result: WorkloadBenchResult): TargetCheck[] {
  const r = result.report;
  const sluice = row(r, "sluice");
  const rr = row(r, "rr");
  const gp = row(r, "gate-prefix");
  const bound = row(r, "bound");
  return [
    check(
      "agents",
      "sluice makespan ÷ rr",
      ratio(sluice.makespan_s, rr.makespan_s),
      "≤ 0.5",
      sluice.makespan_s <= 0.5 * rr.makespan_s,
    ),
    check(
      "agents",
      "sluice makespan ÷ gate-prefix",
      ratio(sluice.makespan_s, gp.makespan_s),
      "≤ 0.6",
      sluice.makespan_s <= 0.6 * gp.makespan_s,
    ),
    check("agents", "sluice prefix hit rate", sluice.prefix_hit_rate, "≥ 0.8", sluice.prefix_hit_rate >= 0.8),
    check(
      "agents",
      "sluice makespan ÷ bound",
      ratio(sluice.makespan_s, bound.makespan_s),
      "≤ 1.5",
      sluice.makespan_s <= 1.5 * bound.makespan_s,
    ),
  ];
}

function agents256Checks(result: WorkloadBenchResult): TargetCheck[] {
  const r = result.report;
  const sluice = row(r, "sluice");
  const rr = row(r, "rr");
  const gp = row(r, "gate-prefix");
  return [
    check(
      "agents-256",
      "rr makespan ÷ sluice",
      ratio(rr.makespan_s, sluice.makespan_s),
      "≥ 2",
      rr.makespan_s >= 2 * sluice.makespan_s,
    ),
    check(
      "agents-256",
      "gate-prefix makespan ÷ sluice",
      ratio(gp.makespan_s, sluice.makespan_s),
      "≥ 1.5",
      gp.makespan_s >= 1.5 * sluice.makespan_s,
    ),
  ];
}

function mixedChecks(result: WorkloadBenchResult, load: number): TargetCheck[] {
  const r = result.report;
  const sluiceRun = r.runs.find((x) => x.policy === "sluice" && x.load === load)?.run;
  const interactive = sluiceRun?.groups.interactive;
  const bulk = sluiceRun?.groups.bulk;
  const ttftSloS = interactive?.ttft_slo_s ?? Number.NaN;
  const sluice = row(r, "sluice", load);
  const best = Math.max(...["rr", "gate", "gate-prefix"].map((p) => row(r, p, load).goodput_rps));
  return [
    check(
      "mixed",
      `sluice interactive TTFT p99 at load ${load}, s`,
      interactive?.ttft_p99_s ?? Number.NaN,
      `≤ ${ttftSloS} (SLO)`,
      interactive !== undefined && interactive.ttft_p99_s <= ttftSloS,
    ),
    check(
      "mixed",
      `sluice bulk calls completed at load ${load}`,
      bulk?.completed ?? 0,
      "> 0",
      (bulk?.completed ?? 0) > 0,
    ),
    check(
      "mixed",
      `sluice goodput ÷ best baseline at load ${load}`,
      ratio(sluice.goodput_rps, best),
      "≥ 1.5",
      sluice.goodput_rps >= 1.5 * best,
    ),
  ];
}

function mooncakeChecks(result: WorkloadBenchResult, load: number): TargetCheck[] {
  const r = result.report;
  const sluice = row(r, "sluice", load);
  const rr = row(r, "rr", load);
  return [
    check(
      "mooncake",
      `sluice goodput ÷ rr at load ${load}`,
      ratio(sluice.goodput_rps, rr.goodput_rps),
      "≥ 1.5",
      sluice.goodput_rps >= 1.5 * rr.goodput_rps,
    ),
  ];
}

/** Loads tried, in order, to find where rr first misses its TTFT SLO for more than 10 % of requests. */
export const MOONCAKE_KNEE_LOADS = [0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4] as const;

/**
 * The mooncake load of the issue: the first of `loads` at which `rr` misses
 * its TTFT SLO (no first token within it, or refused) for more than 10 % of
 * requests. Returns the last load when rr never crosses.
 */
export async function findRrKnee(
  loads: readonly number[],
  onProgress: (line: string) => void,
): Promise<{ load: number; misses: { load: number; ttftMiss: number }[] }> {
  const misses: { load: number; ttftMiss: number }[] = [];
  for (const load of loads) {
    const { report } = await runWorkloadBench({ workload: "mooncake", policies: ["rr"], loads: [load] });
    const miss = report.runs[0]!.run.ttftMiss;
    misses.push({ load, ttftMiss: miss });
    onProgress(`[mooncake knee] rr at load ${load}: ${(miss * 100).toFixed(1)} % miss the TTFT SLO`);
    if (miss > 0.1) return { load, misses };
  }
  return { load: loads[loads.length - 1]!, misses };
}

/** Makespan ratio sluice ÷ rr of one agents workload at one seed. */
export interface SeedSpread {
  workload: string;
  seeds: { seed: number; rr_makespan_s: number; sluice_makespan_s: number; sluice_over_rr: number }[];
  min: number;
  mean: number;
  max: number;
}

/**
 * The agents targets at other seeds: the window dynamics are chaotic enough
 * that one seed can land well above or below the typical ratio, so the
 * spread is reported next to the seed-1 run the targets are checked on.
 */
export async function seedSpread(
  workload: string,
  seeds: readonly number[],
  onProgress: (line: string) => void,
): Promise<SeedSpread> {
  const rows: SeedSpread["seeds"] = [];
  for (const seed of seeds) {
    const { report } = await runWorkloadBench({ workload, seed, policies: ["rr", "sluice"] });
    const rr = row(report, "rr").makespan_s;
    const sluice = row(report, "sluice").makespan_s;
    rows.push({ seed, rr_makespan_s: rr, sluice_makespan_s: sluice, sluice_over_rr: ratio(sluice, rr) });
    onProgress(`[${workload} seeds] seed ${seed}: sluice ${sluice} s, rr ${rr} s → ${ratio(sluice, rr)}`);
  }
  const ratios = rows.map((r) => r.sluice_over_rr);
  const mean = Math.round((ratios.reduce((a, b) => a + b, 0) / Math.max(1, ratios.length)) * 1000) / 1000;
  return { workload, seeds: rows, min: Math.min(...ratios), mean, max: Math.max(...ratios) };
}

function writeJson(path: string, value: unknown): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `${JSON.stringify(value, null, 2)}\n`);
}

/** Runs the named benchmarks (all by default) and the other bench modules; returns the exit status. */
export async function runAll(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      only: { type: "string" },
      out: { type: "string" },
      "skip-others": { type: "boolean" },
    },
  });
  const outDir = resolve(values.out ?? join(HERE, "results"));
  const names = new Set(
    (values.only ?? "agents,agents-256,mixed,mooncake,seeds,others").split(",").map((s) => s.trim()),
  );
  const log = (line: string) => process.stderr.write(`${line}\n`);
  const checks: TargetCheck[] = [];
  const problems: string[] = [];
  const summary: Record<string, unknown> = {};

  const finish = (name: string, result: WorkloadBenchResult) => {
    writeOutputs(result, {
      json: join(outDir, `${name}.json`),
      html: join(outDir, `${name}.html`),
      ...(name === "agents" ? { svg: join(outDir, "agents.svg") } : {}),
      command: `npm run bench -- --only ${name}`,
    });
    process.stdout.write(
      `\n== ${name}\n${result.describe.join("\n")}\n${renderTable(result.report.output.results)}\n`,
    );
    checks.push(wallCheck(name, result));
    problems.push(...result.report.problems.map((p) => `${name}: ${p}`));
  };

  if (names.has("agents")) {
    const result = await runWorkloadBench({ workload: "agents", onProgress: log });
    finish("agents", result);
    checks.push(...agentsChecks(result));
  }
  if (names.has("agents-256")) {
    const result = await runWorkloadBench({ workload: "agents-256", onProgress: log });
    finish("agents-256", result);
    checks.push(...agents256Checks(result));
  }
  if (names.has("mixed")) {
    const result = await runWorkloadBench({ workload: "mixed", loads: [1, 1.5, 2], onProgress: log });
    finish("mixed", result);
    checks.push(...mixedChecks(result, 1.5));
  }
  if (names.has("mooncake")) {
    const knee = await findRrKnee(MOONCAKE_KNEE_LOADS, log);
    summary.mooncake_knee = knee;
    const result = await runWorkloadBench({ workload: "mooncake", loads: [knee.load], onProgress: log });
    finish("mooncake", result);
    checks.push(...mooncakeChecks(result, knee.load));
  }

  if (names.has("seeds")) {
    const spreads: SeedSpread[] = [];
    for (const workload of ["agents", "agents-256"])
      spreads.push(await seedSpread(workload, [1, 2, 3, 4, 5], log));
    summary.seed_spread = spreads;
    process.stdout.write("\n== sluice makespan ÷ rr over seeds 1–5\n");
    for (const spread of spreads) {
      process.stdout.write(
        `${spread.workload}: ${spread.seeds.map((r) => r.sluice_over_rr).join(", ")} ` +
          `(min ${spread.min}, mean ${spread.mean}, max ${spread.max})\n`,
      );
    }
  }

  if (names.has("others") && !values["skip-others"]) {
    for (const file of ["gate.ts", "sim.ts", "overhead-routing.ts", "overhead.ts"]) {
      const path = join(HERE, file);
      if (!existsSync(path)) {
        log(`[others] ${file}: not present, skipped`);
        continue;
      }
      const module = (await import(pathToFileURL(path).href)) as Record<string, unknown>;
      const entry = Object.entries(module).find(
        ([key, value]) => /^run\w*Bench$/.test(key) && typeof value === "function",
      );
      if (!entry) {
        log(`[others] ${file}: exports no run…Bench() function, skipped`);
        continue;
      }
      log(`[others] ${file}: ${entry[0]}()`);
      const started = performance.now();
      try {
        const result = await (entry[1] as () => Promise<unknown>)();
        const name = file.replace(/\.ts$/, "");
        writeJson(join(outDir, `${name}.json`), result);
        process.stdout.write(
          `\n== ${name} (${((performance.now() - started) / 1000).toFixed(1)} s)\n${JSON.stringify(result, null, 2)}\n`,
        );
      } catch (error) {
        problems.push(`${file}: ${(error as Error).stack ?? String(error)}`);
      }
    }
  }

  summary.targets = checks;
  summary.problems = problems;
  writeJson(join(outDir, "summary.json"), summary);
  process.stdout.write("\n== targets (measured, not tuned)\n");
  for (const c of checks) {
    process.stdout.write(
      `${c.met ? "met   " : "MISSED"}  ${c.run}: ${c.target} = ${c.measured} (goal ${c.goal})\n`,
    );
  }
  if (problems.length > 0) {
    process.stderr.write(`\n${problems.length} problem(s):\n${problems.map((p) => `  ${p}`).join("\n")}\n`);
    return 1;
  }
  return 0;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  process.exitCode = await runAll(process.argv.slice(2));
}
