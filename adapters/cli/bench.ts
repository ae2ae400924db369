/** @module `sluice bench`: side-by-side policy comparison on simulated replicas in virtual time (SPEC 10, 13). */

import { parseArgs } from "node:util";
import { renderTable } from "../../bench/report.js";
import type { BenchPolicy } from "../../bench/run.js";
import { BENCH_POLICIES } from "../../bench/run.js";
import { runWorkloadBench, writeOutputs } from "../../bench/suite.js";
import { NAMED_WORKLOADS } from "../../bench/workloads/index.js";
import { WorkloadError } from "../../bench/workloads/schema.js";
import { isPresetName, PRESETS } from "../engines/sim/presets.js";

const HELP = `usage: sluice bench [flags]

Runs one workload under each policy on fresh simulated replicas in virtual time,
with the same seed, and prints a table (progress goes to stderr).

flags:
  --workload NAME|FILE   built-in: ${Object.keys(NAMED_WORKLOADS).join(", ")}; or a workload JSON file (SPEC 13.2)
                         (default agents)
  --replicas N           simulated replicas (default: the workload's, else 1)
  --preset NAME          ${Object.keys(PRESETS).join(", ")} (default: the workload's)
  --sim-host-kv-tokens N host-memory KV tier per simulated rank, tokens (default 0: none; docs/tiers.md)
  --policies LIST        comma-separated, from ${BENCH_POLICIES.join(",")} (default: all)
  --load LIST            offered-load multipliers, e.g. 1,1.5,2 (default: the workload's, else 1): they
                         multiply Poisson arrival rates, the number of sessions of a batch agents
                         workload, and the replay speed of a trace
  --seed N               overrides the workload's seed
  --json FILE            writes SPEC 13's JSON results
  --report FILE.html     writes a self-contained HTML report with charts
  --svg FILE.svg         writes the main chart (makespan per policy) as SVG
  --quiet                no progress on stderr
  -h, --help             this text

exit status: 0 ok, 1 a run did not finish or leaked scheduler state, 2 bad flags or workload`;

class UsageError extends Error {}

function parseList<T>(flag: string, text: string, parse: (item: string) => T): T[] {
  const items = text
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
  if (items.length === 0) throw new UsageError(`--${flag} needs at least one value, got "${text}"`);
  return items.map(parse);
}

function positiveNumber(flag: string, text: string): number {
  const value = Number(text);
  if (text.trim() === "" || !Number.isFinite(value) || value <= 0) {
    throw new UsageError(`--${flag} takes numbers > 0, got "${text}"`);
  }
  return value;
}

function integer(flag: string, text: string, min: number): number {
  const value = Number(text);
  if (text.trim() === "" || !Number.isInteger(value) || value < min) {
    throw new UsageError(`--${flag} takes an integer ≥ ${min}, got "${text}"`);
  }
  return value;
}

/** `sluice bench [flags]`; returns the exit status. */
export async function run(argv: string[]): Promise<number> {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        workload: { type: "string" },
        replicas: { type: "string" },
        preset: { type: "string" },
        "sim-host-kv-tokens": { type: "string" },
        policies: { type: "string" },
        load: { type: "string" },
        seed: { type: "string" },
        json: { type: "string" },
        report: { type: "string" },
        svg: { type: "string" },
        quiet: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    }));
  } catch (error) {
    process.stderr.write(`sluice bench: ${(error as Error).message}\n\n${HELP}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${HELP}\n`);
    return 0;
  }
  const str = (name: string) => values[name] as string | undefined;
  let options: Parameters<typeof runWorkloadBench>[0];
  try {
    const preset = str("preset");
    if (preset !== undefined && !isPresetName(preset)) {
      throw new UsageError(`--preset must be one of ${Object.keys(PRESETS).join(", ")}, got "${preset}"`);
    }
    const policies = str("policies");
    const load = str("load");
    const replicas = str("replicas");
    const seed = str("seed");
    const hostKv = str("sim-host-kv-tokens");
    const hostKvTokens = hostKv !== undefined ? integer("sim-host-kv-tokens", hostKv, 0) : 0;
    options = {
      workload: str("workload") ?? "agents",
      ...(replicas !== undefined ? { replicas: integer("replicas", replicas, 1) } : {}),
      ...(hostKvTokens > 0
        ? { preset: { ...(preset !== undefined ? { base: preset } : {}), hostKvTokens } }
        : preset !== undefined
          ? { preset }
          : {}),
      ...(policies !== undefined
        ? {
            policies: parseList("policies", policies, (p): BenchPolicy => {
              if (!(BENCH_POLICIES as readonly string[]).includes(p)) {
                throw new UsageError(`--policies takes ${BENCH_POLICIES.join(", ")}, got "${p}"`);
              }
              return p as BenchPolicy;
            }),
          }
        : {}),
      ...(load !== undefined ? { loads: parseList("load", load, (l) => positiveNumber("load", l)) } : {}),
      ...(seed !== undefined ? { seed: integer("seed", seed, 0) } : {}),
      ...(values.quiet ? {} : { onProgress: (line: string) => process.stderr.write(`${line}\n`) }),
    };
  } catch (error) {
    if (error instanceof UsageError) {
      process.stderr.write(`sluice bench: ${error.message}\n`);
      return 2;
    }
    throw error;
  }
  // Ctrl-C stops the run cleanly (engines closed) instead of killing it mid-write.
  const interrupt = new AbortController();
  const onSigint = () => interrupt.abort(new Error("interrupted"));
  process.once("SIGINT", onSigint);
  let result: Awaited<ReturnType<typeof runWorkloadBench>>;
  try {
    result = await runWorkloadBench({ ...options, signal: interrupt.signal });
  } catch (error) {
    if (error instanceof WorkloadError) {
      process.stderr.write(`sluice bench: ${error.message}\n`);
      return 2;
    }
    if (interrupt.signal.aborted) {
      process.stderr.write("sluice bench: interrupted\n");
      return 130;
    }
    throw error;
  } finally {
    process.off("SIGINT", onSigint);
  }
  process.stdout.write(`${result.describe.join("\n")}\n\n${renderTable(result.report.output.results)}\n`);
  const json = str("json");
  const html = str("report");
  const svg = str("svg");
  writeOutputs(result, {
    ...(json ? { json } : {}),
    ...(html ? { html } : {}),
    ...(svg ? { svg } : {}),
    command: `sluice bench ${argv.join(" ")}`.trim(),
  });
  if (result.report.problems.length > 0) {
    process.stderr.write(`sluice bench: ${result.report.problems.length} problem(s):\n`);
    for (const problem of result.report.problems) process.stderr.write(`  ${problem}\n`);
    return 1;
  }
  return 0;
}
