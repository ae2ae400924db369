/** @module One benchmark from a workload name or file: fleet defaults, the run, and the files it writes. */

import { mkdirSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import type { PresetName, PresetOverrides } from "../engines/sim/presets.js";
import { isPresetName } from "../engines/sim/presets.js";
import { stepModelOfPreset } from "./cost-model.js";
import { simFleet } from "./fleet.js";
import { mainChartSvg, renderHtml } from "./report.js";
import type { BenchPolicy, BenchReport, FairnessMode } from "./run.js";
import { BENCH_POLICIES, runBench } from "./run.js";
import {
  type CapacitySearch,
  DEFAULT_CAPACITY_BISECTIONS,
  DEFAULT_CAPACITY_GRID,
  SLO_CAPACITY_SHARE,
} from "./slo-capacity.js";
import { compileWorkload, NAMED_WORKLOADS, resolveWorkload, withSeed } from "./workloads/index.js";
import type { TenantsSpec } from "./workloads/schema.js";
import { WorkloadError } from "./workloads/schema.js";
import { onlyTenants } from "./workloads/tenants.js";

export interface WorkloadBenchOptions {
  /** A built-in name (`agents`, `agents-256`, `mixed`, `mooncake`) or a workload JSON file. */
  workload: string;
  /** Default: the built-in workload's, else 1. */
  replicas?: number;
  /** A preset name or overrides; default: the built-in workload's, else `h100-llama3-8b`. */
  preset?: PresetName | PresetOverrides;
  policies?: readonly BenchPolicy[];
  /** Offered-load multipliers; default: the built-in workload's, else [1]. */
  loads?: readonly number[];
  /** Overrides the workload's seed. */
  seed?: number;
  sampleEveryMs?: number;
  onProgress?: (line: string) => void;
  /** Aborts the benchmark (rejects with the signal's reason). */
  signal?: AbortSignal;
  /**
   * Each policy's SLO capacity (docs/benchmarks.md): a search, or false for none. Default: searched with the
   * default grid for trace replays, none for other workloads.
   */
  sloCapacity?: CapacitySearch | false;
  /** Whether calls carry their session's key (`--session-keys`, default on). */
  sessionKeys?: boolean;
  /** Session inference of the scheduler under test (`--infer-sessions`, default on). */
  inferSessions?: "on" | "off";
  /**
   * Fairness modes (`tenants`, `off`): the first for every policy, each later
   * one again for the policies with a session window. Default: none set.
   */
  fairness?: readonly FairnessMode[];
  /**
   * `tenants` workloads: tenants also run alone, as their targets' reference.
   * Default: the built-in workload's.
   */
  alone?: readonly string[];
}

/** A finished benchmark and the lines that describe what ran. */
export interface WorkloadBenchResult {
  report: BenchReport;
  describe: string[];
}

function presetLabel(preset: PresetName | PresetOverrides): string {
  if (typeof preset === "string") return preset;
  const { base, ...rest } = preset;
  return `${base ?? "h100-llama3-8b"}+${JSON.stringify(rest)}`;
}

/** Resolves defaults, then runs every policy at every load on simulated replicas in virtual time. */
export async function runWorkloadBench(options: WorkloadBenchOptions): Promise<WorkloadBenchResult> {
  // Built-in workloads may size themselves to the fleet, so the fleet is settled first.
  const named = Object.hasOwn(NAMED_WORKLOADS, options.workload)
    ? NAMED_WORKLOADS[options.workload]
    : undefined;
  const replicas = options.replicas ?? named?.replicas ?? 1;
  const preset = options.preset ?? (named?.preset as PresetName | undefined) ?? "h100-llama3-8b";
  if (typeof preset === "string" && !isPresetName(preset))
    throw new WorkloadError(`unknown preset ${JSON.stringify(preset)}`);
  if (!(Number.isInteger(replicas) && replicas >= 1))
    throw new WorkloadError(`replicas must be an integer ≥ 1, got ${replicas}`);
  const model = stepModelOfPreset(preset);
  const resolved = resolveWorkload(options.workload, { replicas, model });
  const spec = withSeed(resolved.spec, options.seed);
  const loads = options.loads ?? resolved.named?.loads ?? [1];
  for (const load of loads) if (!(load > 0)) throw new WorkloadError(`loads must be > 0, got ${load}`);
  const policies = options.policies ?? BENCH_POLICIES;
  // docs/benchmarks.md: a trace replay's headline is each policy's SLO capacity.
  const sloCapacity =
    options.sloCapacity ??
    (spec.kind === "mooncake"
      ? { grid: DEFAULT_CAPACITY_GRID, bisections: DEFAULT_CAPACITY_BISECTIONS }
      : false);
  const describe = [
    `workload ${resolved.name}: ${resolved.named?.summary ?? "from file"}`,
    `fleet: ${replicas} × ${presetLabel(preset)}; policies ${policies.join(", ")}; loads ${loads.join(", ")}` +
      (options.fairness && options.fairness.length > 0 ? `; fairness ${options.fairness.join(", ")}` : ""),
  ];
  if (options.sessionKeys === false || options.inferSessions === "off") {
    describe.push(
      `session keys ${options.sessionKeys === false ? "off" : "on"}, session inference ${options.inferSessions ?? "on"}`,
    );
  }
  const compileAt = (workloadSpec: typeof spec) => (load: number) =>
    resolved.named?.build
      ? resolved.named.build(workloadSpec, { name: resolved.name, load })
      : compileWorkload(workloadSpec, {
          name: resolved.name,
          load,
          ...(resolved.baseDir !== undefined ? { baseDir: resolved.baseDir } : {}),
        });
  const aloneTenants = options.alone ?? resolved.named?.alone ?? [];
  if (aloneTenants.length > 0 && spec.kind !== "tenants")
    throw new WorkloadError(`workload ${resolved.name} has no tenants to run alone`);
  const alone = aloneTenants.map((tenant) => {
    const tenantsSpec = spec as TenantsSpec;
    if (!Object.hasOwn(tenantsSpec.tenants, tenant))
      throw new WorkloadError(`workload ${resolved.name} has no tenant ${JSON.stringify(tenant)}`);
    return { tenant, compile: compileAt(onlyTenants(tenantsSpec, [tenant])) };
  });
  const report = await runBench({
    name: resolved.name,
    compile: compileAt(spec),
    loads,
    policies,
    replicas,
    fleet: simFleet(
      preset,
      presetLabel(preset),
      options.inferSessions === "off" ? { sessions: { infer: "off" } } : {},
    ),
    ...(options.sessionKeys === false ? { sessionKeys: false } : {}),
    ...(options.sampleEveryMs !== undefined ? { sampleEveryMs: options.sampleEveryMs } : {}),
    ...(options.onProgress ? { onProgress: options.onProgress } : {}),
    ...(options.signal ? { signal: options.signal } : {}),
    ...(sloCapacity ? { sloCapacity } : {}),
    ...(options.fairness && options.fairness.length > 0 ? { fairness: options.fairness } : {}),
    ...(alone.length > 0 ? { alone } : {}),
  });
  if (sloCapacity) {
    describe.push(
      `SLO capacity: the largest load at which ≥ ${SLO_CAPACITY_SHARE * 100} % of calls meet their TTFT SLO; ` +
        `grid ${sloCapacity.grid.join(", ")}, then ${sloCapacity.bisections} bisection(s)`,
    );
  }
  const seen = new Set<string>();
  for (const detail of report.output.details) {
    const line = `load ${detail.load}: ${detail.describe}`;
    if (!seen.has(line)) describe.push(line);
    seen.add(line);
  }
  return { report, describe };
}

function writeText(path: string, text: string): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
}

/** Writes whichever of the JSON document, the HTML report and the main chart's SVG were asked for. */
export function writeOutputs(
  result: WorkloadBenchResult,
  paths: { json?: string; html?: string; svg?: string; command?: string },
): void {
  if (paths.json) writeText(paths.json, `${JSON.stringify(result.report.output, null, 2)}\n`);
  if (paths.html) {
    writeText(
      paths.html,
      renderHtml(result.report, {
        describe: result.describe,
        ...(paths.command ? { command: paths.command } : {}),
      }),
    );
  }
  if (paths.svg) writeText(paths.svg, `${mainChartSvg(result.report)}\n`);
}
