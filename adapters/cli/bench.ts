/** @module `sluice bench`: side-by-side policy comparison on simulated replicas in virtual time (docs/running.md and docs/benchmarks.md). */

import { z } from "zod";
import { ConfigError } from "../../src/config/config-error.js";
import { defineSetting, type Setting } from "../../src/config/settings.js";
import { renderSloCapacity, renderTable } from "../bench/report.js";
import type { BenchPolicy, FairnessMode } from "../bench/run.js";
import { BENCH_POLICIES, FAIRNESS_MODES } from "../bench/run.js";
import { DEFAULT_CAPACITY_BISECTIONS, DEFAULT_CAPACITY_GRID } from "../bench/slo-capacity.js";
import { runWorkloadBench, writeOutputs } from "../bench/suite.js";
import { renderTenantTable } from "../bench/tenant-report.js";
import { NAMED_WORKLOADS } from "../bench/workloads/index.js";
import { WorkloadError } from "../bench/workloads/schema.js";
import { PRESETS, type PresetName } from "../engines/sim/presets.js";
import { type CommandIo, type CommandSpec, runCommand } from "./command-line.js";

const RUN = "Run";
const OUTPUT = "Output";
const presetNames = Object.keys(PRESETS) as [PresetName, ...PresetName[]];

/** Every flag of `sluice bench` (flags only); workloads and policies are read from bench/. */
export const BENCH_SETTINGS: readonly Setting[] = [
  defineSetting({
    flag: "workload",
    path: "workload",
    topic: RUN,
    schema: z.string().default("agents"),
    env: null,
    placeholder: "<name|file>",
    expects: "a workload name or a workload JSON file",
    help: `built-in: ${Object.keys(NAMED_WORKLOADS).join(", ")}; or a workload JSON file (docs/benchmarks.md)`,
  }),
  defineSetting({
    flag: "sim-host-kv-tokens",
    path: "hostKvTokens",
    topic: RUN,
    schema: z.number().int().nonnegative(),
    env: null,
    defaultText: "0: none",
    help: "host-memory KV tier per simulated rank, tokens (docs/tiers.md)",
  }),
  defineSetting({
    flag: "replicas",
    path: "replicas",
    topic: RUN,
    schema: z.number().int().positive(),
    env: null,
    defaultText: "the workload's, else 1",
    help: "simulated replicas",
  }),
  defineSetting({
    flag: "preset",
    path: "preset",
    topic: RUN,
    schema: z.enum(presetNames),
    env: null,
    placeholder: "<preset>",
    defaultText: "the workload's",
    help: "simulated replica preset",
  }),
  defineSetting({
    flag: "policies",
    path: "policies",
    topic: RUN,
    schema: z.array(z.enum(BENCH_POLICIES as unknown as [BenchPolicy, ...BenchPolicy[]])),
    env: null,
    placeholder: "<list>",
    expects: `policies from ${BENCH_POLICIES.join(", ")}`,
    defaultText: "all",
    help: `comma-separated, from ${BENCH_POLICIES.join(",")}`,
  }),
  defineSetting({
    flag: "load",
    path: "loads",
    topic: RUN,
    schema: z.array(z.number().positive()),
    env: null,
    placeholder: "<list>",
    expects: "numbers > 0",
    defaultText: "the workload's, else 1",
    help: "offered-load multipliers, e.g. 1,1.5,2: they multiply Poisson arrival rates, the sessions of a batch workload and the replay speed of a trace",
  }),
  defineSetting({
    flag: "slo-capacity",
    path: "sloCapacity",
    topic: RUN,
    schema: z.enum(["auto", "on", "off"]).default("auto"),
    env: null,
    help: "search each policy's SLO capacity, the largest load at which 90 % of calls meet their TTFT SLO (auto: for trace replays)",
  }),
  defineSetting({
    flag: "capacity-grid",
    path: "capacityGrid",
    topic: RUN,
    schema: z.array(z.number().positive()),
    env: null,
    placeholder: "<list>",
    expects: "numbers > 0",
    defaultText: DEFAULT_CAPACITY_GRID.join(","),
    help: `loads the SLO capacity search tries in order until one misses, then bisects ${DEFAULT_CAPACITY_BISECTIONS} times below it`,
  }),
  defineSetting({
    flag: "fairness",
    path: "fairness",
    topic: RUN,
    schema: z.array(z.enum(FAIRNESS_MODES as unknown as [FairnessMode, ...FairnessMode[]])),
    env: null,
    placeholder: "<list>",
    expects: `modes from ${FAIRNESS_MODES.join(", ")}`,
    defaultText: "the scheduler's (tenants)",
    help: "how admission shares the window among tenants (tenants: by weight and band; off: arrival order); tenants,off runs the policies with a session window once more with the second mode, side by side",
  }),
  defineSetting({
    flag: "alone",
    path: "alone",
    topic: RUN,
    schema: z.array(z.string().min(1)),
    env: null,
    placeholder: "<list>",
    expects: "tenant names of the workload",
    defaultText: "the workload's",
    help: "tenants workloads: tenants whose parts also run alone under every policy, as a reference",
  }),
  defineSetting({
    flag: "seed",
    path: "seed",
    topic: RUN,
    schema: z.number().int().nonnegative(),
    env: null,
    defaultText: "the workload's",
    help: "seed of the workload",
  }),
  defineSetting({
    flag: "session-keys",
    path: "sessionKeys",
    topic: RUN,
    schema: z.enum(["on", "off"]).default("on"),
    env: null,
    help: "off: the workload's calls carry no session key, so sessions must be inferred; rows then report session_inference",
  }),
  defineSetting({
    flag: "infer-sessions",
    path: "inferSessions",
    topic: RUN,
    schema: z.enum(["on", "off"]).default("on"),
    env: null,
    help: "session inference of the scheduler under test (docs/routing.md)",
  }),
  defineSetting({
    flag: "json",
    path: "json",
    topic: OUTPUT,
    schema: z.string(),
    env: null,
    placeholder: "<file>",
    help: "writes the documented JSON results",
  }),
  defineSetting({
    flag: "report",
    path: "html",
    topic: OUTPUT,
    schema: z.string(),
    env: null,
    placeholder: "<file.html>",
    help: "writes a self-contained HTML report with charts",
  }),
  defineSetting({
    flag: "svg",
    path: "svg",
    topic: OUTPUT,
    schema: z.string(),
    env: null,
    placeholder: "<file.svg>",
    help: "writes the main chart (makespan per policy) as SVG",
  }),
  defineSetting({
    flag: "quiet",
    path: "quiet",
    topic: OUTPUT,
    schema: z.boolean().default(false),
    env: null,
    help: "no progress on stderr",
  }),
];

/** `sluice bench` for help and the parser. */
export const BENCH_COMMAND: CommandSpec = {
  name: "bench",
  usage: "sluice bench [flags]",
  summary:
    "Runs one workload under each policy on fresh simulated replicas in virtual time, with the same\n" +
    "seed, and prints a table (progress goes to stderr).",
  settings: BENCH_SETTINGS,
  footer: "exit status: 0 ok, 1 a run did not finish or leaked scheduler state, 2 bad flags or workload",
};

interface BenchFlags {
  workload?: string;
  replicas?: number;
  preset?: PresetName;
  hostKvTokens?: number;
  policies?: BenchPolicy[];
  loads?: number[];
  sloCapacity?: "auto" | "on" | "off";
  capacityGrid?: number[];
  seed?: number;
  sessionKeys?: "on" | "off";
  inferSessions?: "on" | "off";
  fairness?: FairnessMode[];
  alone?: string[];
  json?: string;
  html?: string;
  svg?: string;
  quiet?: boolean;
}

/** `sluice bench [flags]`; returns the exit status. */
export function run(argv: string[], io: CommandIo = {}): Promise<number> {
  return runCommand(BENCH_COMMAND, argv, (line) => bench(argv, line.values as BenchFlags), io);
}

async function bench(argv: string[], flags: BenchFlags): Promise<number> {
  if (flags.policies?.length === 0) throw new ConfigError("--policies needs at least one policy");
  if (flags.loads?.length === 0) throw new ConfigError("--load needs at least one multiplier");
  if (flags.capacityGrid?.length === 0) throw new ConfigError("--capacity-grid needs at least one load");
  if (flags.fairness?.length === 0) throw new ConfigError("--fairness needs at least one mode");
  if (flags.fairness && new Set(flags.fairness).size !== flags.fairness.length)
    throw new ConfigError("--fairness names a mode twice");
  const search = {
    grid: flags.capacityGrid ?? DEFAULT_CAPACITY_GRID,
    bisections: DEFAULT_CAPACITY_BISECTIONS,
  };
  const sloCapacity =
    flags.sloCapacity === "on"
      ? search
      : flags.sloCapacity === "off"
        ? false
        : flags.capacityGrid !== undefined
          ? search
          : undefined;
  const options: Parameters<typeof runWorkloadBench>[0] = {
    workload: flags.workload ?? "agents",
    ...(flags.replicas !== undefined ? { replicas: flags.replicas } : {}),
    ...(flags.hostKvTokens
      ? {
          preset: {
            ...(flags.preset !== undefined ? { base: flags.preset } : {}),
            hostKvTokens: flags.hostKvTokens,
          },
        }
      : flags.preset !== undefined
        ? { preset: flags.preset }
        : {}),
    ...(flags.policies !== undefined ? { policies: flags.policies } : {}),
    ...(flags.loads !== undefined ? { loads: flags.loads } : {}),
    ...(flags.seed !== undefined ? { seed: flags.seed } : {}),
    ...(flags.fairness !== undefined ? { fairness: flags.fairness } : {}),
    ...(flags.alone !== undefined ? { alone: flags.alone } : {}),
    ...(sloCapacity !== undefined ? { sloCapacity } : {}),
    ...(flags.sessionKeys === "off" ? { sessionKeys: false } : {}),
    ...(flags.inferSessions === "off" ? { inferSessions: "off" as const } : {}),
    ...(flags.quiet ? {} : { onProgress: (line: string) => process.stderr.write(`${line}\n`) }),
  };
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
  const tenants = renderTenantTable(result.report.output);
  if (tenants) process.stdout.write(`\n${tenants}\n`);
  const capacity = renderSloCapacity(result.report);
  if (capacity) process.stdout.write(`\n${capacity}\n`);
  const { json, html, svg } = flags;
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
