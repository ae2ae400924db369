/**
 * @module The `pd` benchmark: interactive chat and agent sessions on a
 * disaggregated fleet (2 prefill + 2 decode simulated replicas), run three
 * times with the same admission except for the decode check before prefill —
 * on the decode load *predicted* for when the call's KV arrives (sluice), on
 * the *current* (last scraped) decode load, and with none. Reports goodput,
 * SLO attainment, prefill tokens wasted on calls refused after their prefill,
 * and the coefficient of variation of decode KV usage over the steady part of
 * the run, with a chart of decode KV usage over time.
 *
 *   npx tsx bench/pd.ts [--json FILE] [--report FILE.html] [--seed N]
 *                       [--sessions N] [--agent-rate PER_S] [--chat-rate PER_S]   (default 200, 0.8, 3)
 *
 * `npm run bench` (`--only pd`) runs it at the default load and checks its targets (`pdTargets`).
 */

import { mkdirSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { parseArgs } from "node:util";
import { stepModelOfPreset } from "../adapters/bench/cost-model.js";
import { renderTable } from "../adapters/bench/report.js";
import type {
  BenchScheduler,
  FleetFactory,
  GroupStats,
  PolicyRun,
  ResultRow,
} from "../adapters/bench/run.js";
import { runPolicy } from "../adapters/bench/run.js";
import { round } from "../adapters/bench/stats.js";
import { escapeXml, lineChart } from "../adapters/bench/svg.js";
import { buildAgentsWorkload } from "../adapters/bench/workloads/agents.js";
import { buildMixedWorkload } from "../adapters/bench/workloads/mixed.js";
import type { AgentsSpec, MixedSpec } from "../adapters/bench/workloads/schema.js";
import { parseWorkloadSpec } from "../adapters/bench/workloads/schema.js";
import type { PlannedCall, Workload } from "../adapters/bench/workloads/types.js";
import { simPdFleet } from "../adapters/engines/sim/pd-fleet.js";
import { SimEngine } from "../adapters/engines/sim/sim-engine.js";
import type { Clock } from "../src/clock.js";
import type { DecodeCheck } from "../src/config/scheduler-config.js";
import { Scheduler } from "../src/scheduler.js";
import type { TargetCheck } from "./regret.js";

const PRESET = "h100-llama3-8b";
const PREFILL_REPLICAS = 2;
const DECODE_REPLICAS = 2;
/** Seconds of arrivals; the steady part the CV is taken over is from a quarter of it to its end. */
const ARRIVALS_S = 240;

/**
 * Agent sessions (0.8/s, 3–6 steps, contexts growing to ~30k tokens, 400–1,200 output tokens) whose
 * decode legs hold their KV for tens of seconds: with the chat beside them they offer the decode pool
 * somewhat more than its KV holds at once, while the prefill pool has room to spare.
 */
/** The offered load: agent sessions and their arrival rate, and the chat rate. */
export interface PdLoad {
  sessions: number;
  agentRatePerS: number;
  chatRatePerS: number;
}

/** The recorded run's load (bench/results/pd.json). */
export const PD_DEFAULT_LOAD: PdLoad = { sessions: 200, agentRatePerS: 0.8, chatRatePerS: 3 };

function agentsSpec(seed: number, load: PdLoad): AgentsSpec {
  return parseWorkloadSpec(
    {
      kind: "agents",
      sessions: load.sessions,
      steps: [3, 6],
      system_prompt_tokens: 2000,
      tool_output_tokens: [2000, 6000],
      output_tokens: [400, 1200],
      tool_wait_s: [1, 5],
      arrival: { rate_per_s: load.agentRatePerS },
      slo: { ttft_s: 5, tpot_s: 0.1 },
      seed,
    },
    "pd agents",
  ) as AgentsSpec;
}

/** Interactive chat beside them (one-off calls, not retried when refused). */
function chatSpec(seed: number, load: PdLoad): MixedSpec {
  return parseWorkloadSpec(
    {
      kind: "mixed",
      duration_s: ARRIVALS_S,
      interactive: {
        rate_per_s: load.chatRatePerS,
        input_tokens: [500, 3000],
        output_tokens: [100, 400],
        slo: { ttft_s: 2, tpot_s: 0.1 },
      },
      bulk: { rate_per_s: 0, input_tokens: [1, 1], output_tokens: [1, 1], slo: { ttft_s: 60, tpot_s: 1 } },
      seed,
    },
    "pd chat",
  ) as MixedSpec;
}

/** Two workloads as one: the second's calls follow the first's, their `after` links shifted with them. */
export function mergeWorkloads(name: string, a: Workload, b: Workload): Workload {
  const shift = a.calls.length;
  const calls: PlannedCall[] = [
    ...a.calls,
    ...b.calls.map((call) => ({
      ...call,
      index: call.index + shift,
      ...(call.after !== undefined ? { after: call.after + shift } : {}),
    })),
  ];
  return {
    kind: a.kind,
    name,
    load: a.load,
    calls,
    sharedPrefills: [...a.sharedPrefills, ...b.sharedPrefills],
    describe: `${a.describe}; ${b.describe}`,
  };
}

export function pdWorkload(seed = 1, load: PdLoad = PD_DEFAULT_LOAD): Workload {
  const agents = buildAgentsWorkload(agentsSpec(seed, load), { name: "pd-agents" });
  const chat = buildMixedWorkload(chatSpec(seed, load), { name: "pd-chat" });
  return mergeWorkloads("pd", agents, chat);
}

/** The admission variants compared: the same scheduler, only its decode check differs. */
export const PD_VARIANTS: readonly { name: string; decodeCheck: DecodeCheck }[] = [
  { name: "sluice", decodeCheck: "predicted" },
  { name: "current-load", decodeCheck: "current" },
  { name: "no-decode-check", decodeCheck: "none" },
];

/** Decode KV usage (mean over the decode replicas) sampled every virtual second, and what the scheduler counted. */
interface PdProbe {
  decodeKv: [number, number][];
  wastedPrefillTokens: number;
  refusedAfterPrefill: number;
}

function pdFleetFactory(decodeCheck: DecodeCheck, probe: PdProbe): FleetFactory {
  let decodes: SimEngine[] = [];
  let sampling = false;
  return {
    preset: PRESET,
    stepModel: stepModelOfPreset(PRESET),
    createEngines: (clock: Clock) => {
      const engines = simPdFleet(
        PREFILL_REPLICAS,
        DECODE_REPLICAS,
        (spec) => new SimEngine({ ...spec, clock, preset: PRESET }),
      );
      decodes = engines.filter((engine) => engine.role === "decode");
      sampling = true;
      const sample = () => {
        if (!sampling) return;
        let kv = 0;
        for (const engine of decodes) kv += engine.signals().kvUsage;
        probe.decodeKv.push([round(clock.now() / 1000, 3), round(kv / decodes.length, 4)]);
        clock.setTimeout(sample, 1000);
      };
      sample();
      return engines;
    },
    createScheduler: ({ engines, clock, policy }): BenchScheduler => {
      const scheduler = new Scheduler({
        engines,
        clock,
        policy,
        config: { disaggregation: { decodeCheck } },
      });
      return {
        start: () => scheduler.start(),
        stop: async () => {
          sampling = false;
          const pd = scheduler.state().disaggregation;
          probe.wastedPrefillTokens = pd?.wastedPrefillTokens ?? 0;
          probe.refusedAfterPrefill = pd?.refusedAfterPrefill ?? 0;
          await scheduler.stop();
        },
        submit: (req) => scheduler.submit(req),
        closeSession: (id) => scheduler.closeSession(id),
        state: () => scheduler.state(),
        idleCheck: () => scheduler.idleCheck(),
      };
    },
  };
}

/** Coefficient of variation (σ / μ) of the samples taken in [fromS, toS]. */
export function coefficientOfVariation(
  points: readonly [number, number][],
  fromS: number,
  toS: number,
): number {
  const values = points.filter(([t]) => t >= fromS && t <= toS).map(([, v]) => v);
  if (values.length < 2) return 0;
  const mean = values.reduce((a, b) => a + b, 0) / values.length;
  if (mean <= 0) return 0;
  const variance = values.reduce((a, v) => a + (v - mean) ** 2, 0) / values.length;
  return Math.sqrt(variance) / mean;
}

/** One variant's figures. */
export interface PdRow extends ResultRow {
  wasted_prefill_tokens: number;
  refused_after_prefill: number;
  decode_kv_mean: number;
  decode_kv_cv: number;
  groups: Record<string, GroupStats>;
}

export interface PdResult {
  workload: string;
  fleet: string;
  steady_s: [number, number];
  rows: PdRow[];
  decodeKv: Record<string, [number, number][]>;
  /** Scheduler counters left over (all zero when nothing leaked) and unexpected errors, per variant. */
  checks: Record<string, { idle: PolicyRun["idle"]; unfinished: number; errors: string[] }>;
}

export async function runPd(
  options: { seed?: number; load?: PdLoad; onProgress?: (line: string) => void } = {},
): Promise<PdResult> {
  const workload = pdWorkload(options.seed ?? 1, options.load ?? PD_DEFAULT_LOAD);
  const steady: [number, number] = [ARRIVALS_S / 4, ARRIVALS_S];
  const rows: PdRow[] = [];
  const decodeKv: Record<string, [number, number][]> = {};
  const checks: PdResult["checks"] = {};
  for (const variant of PD_VARIANTS) {
    options.onProgress?.(`pd: ${variant.name} (decode check ${variant.decodeCheck}) …`);
    const probe: PdProbe = { decodeKv: [], wastedPrefillTokens: 0, refusedAfterPrefill: 0 };
    const run = await runPolicy({
      workload,
      policy: "sluice",
      replicas: PREFILL_REPLICAS + DECODE_REPLICAS,
      fleet: pdFleetFactory(variant.decodeCheck, probe),
      ...(options.onProgress ? { onProgress: options.onProgress } : {}),
    });
    const kvSteady = probe.decodeKv.filter(([t]) => t >= steady[0] && t <= steady[1]).map(([, v]) => v);
    rows.push({
      ...run.row,
      policy: variant.name,
      wasted_prefill_tokens: probe.wastedPrefillTokens,
      refused_after_prefill: probe.refusedAfterPrefill,
      decode_kv_mean: round(kvSteady.reduce((a, b) => a + b, 0) / Math.max(1, kvSteady.length), 4),
      decode_kv_cv: round(coefficientOfVariation(probe.decodeKv, steady[0], steady[1]), 4),
      groups: run.groups,
    });
    decodeKv[variant.name] = probe.decodeKv;
    checks[variant.name] = { idle: run.idle, unfinished: run.unfinished, errors: run.errors };
    options.onProgress?.(`  done in ${run.wallS} s wall`);
  }
  return {
    workload: workload.describe,
    fleet: `${PREFILL_REPLICAS} prefill + ${DECODE_REPLICAS} decode × ${PRESET}`,
    steady_s: steady,
    rows,
    decodeKv,
    checks,
  };
}

/** The figures side by side, with the targets as ratios to current-load admission. */
export function pdTable(result: Pick<PdResult, "rows">): string {
  const head =
    "| admission | goodput rps | SLO attainment | completed | wasted prefill tokens | refused after prefill | decode KV mean | decode KV CV | preemptions | TTFT p99 s |";
  const lines = [head, "|---|---|---|---|---|---|---|---|---|---|"];
  for (const r of result.rows) {
    lines.push(
      `| ${r.policy} | ${r.goodput_rps} | ${r.slo_attainment} | ${r.completed} | ${r.wasted_prefill_tokens} | ${r.refused_after_prefill} | ${r.decode_kv_mean} | ${r.decode_kv_cv} | ${r.preemptions} | ${r.ttft_p99_s} |`,
    );
  }
  const targets = pdTargets(result);
  if (targets.length > 0) {
    lines.push(
      "",
      targets
        .map((t) => `${t.target}: ${t.measured} (target ${t.goal}, ${t.met ? "met" : "missed"})`)
        .join("; "),
    );
  }
  return lines.join("\n");
}

/** The targets, as `npm run bench` checks them: sluice against current-load admission, in one run. */
export function pdTargets(result: Pick<PdResult, "rows">): TargetCheck[] {
  const sluice = result.rows.find((r) => r.policy === "sluice");
  const current = result.rows.find((r) => r.policy === "current-load");
  if (!sluice || !current) return [];
  const goodput = current.goodput_rps > 0 ? round(sluice.goodput_rps / current.goodput_rps, 3) : Number.NaN;
  const cv = current.decode_kv_cv > 0 ? round(sluice.decode_kv_cv / current.decode_kv_cv, 3) : Number.NaN;
  return [
    {
      run: "pd",
      target: "prefill tokens sluice wasted on calls refused after their prefill",
      measured: sluice.wasted_prefill_tokens,
      goal: "= 0",
      met: sluice.wasted_prefill_tokens === 0,
    },
    {
      run: "pd",
      target: "sluice goodput ÷ current-load admission's",
      measured: goodput,
      goal: "≥ 1.3",
      met: goodput >= 1.3,
    },
    {
      run: "pd",
      target: "sluice decode KV usage CV ÷ current-load admission's",
      measured: cv,
      goal: "≤ 0.5",
      met: cv <= 0.5,
    },
  ];
}

/** What went wrong in a run, one line each (`pd: …`): counters left held, calls unfinished, unexpected errors. */
export function pdProblems(result: Pick<PdResult, "checks">): string[] {
  const problems: string[] = [];
  for (const [name, check] of Object.entries(result.checks)) {
    const leaked = check.idle && Object.values(check.idle).some((v) => v !== 0);
    if (leaked || check.unfinished > 0 || check.errors.length > 0) {
      problems.push(
        `pd: ${name} left ${JSON.stringify(check.idle)}, ${check.unfinished} unfinished, errors: ${check.errors.slice(0, 3).join("; ")}`,
      );
    }
  }
  return problems;
}

export function pdHtml(result: PdResult): string {
  const chart = lineChart({
    title: "Decode KV usage over time (mean of the decode replicas)",
    xLabel: "virtual time, s",
    yLabel: "KV usage",
    yMax: 1,
    series: Object.entries(result.decodeKv).map(([name, points]) => ({ name, points })),
    width: 900,
    height: 360,
  });
  const table = renderTable(result.rows);
  return `<!doctype html><html><head><meta charset="utf-8"><title>sluice pd benchmark</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1000px}pre{background:#f6f6f6;padding:1em;overflow:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>
<h1>Disaggregated prefill and decode (pd)</h1>
<p>${escapeXml(result.fleet)}. ${escapeXml(result.workload)}. Steady part for the CV: ${result.steady_s[0]}–${result.steady_s[1]} s.</p>
<pre>${escapeXml(pdTable(result))}</pre>
${chart}
<h2>All figures</h2>
${table}
</body></html>
`;
}

function write(path: string, text: string): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      json: { type: "string" },
      report: { type: "string" },
      seed: { type: "string" },
      sessions: { type: "string" },
      "agent-rate": { type: "string" },
      "chat-rate": { type: "string" },
    },
  });
  const number = (name: string, text: string | undefined, fallback: number): number => {
    if (text === undefined) return fallback;
    const value = Number(text);
    if (!(Number.isFinite(value) && value > 0))
      throw new RangeError(`--${name} takes a positive number, got ${text}`);
    return value;
  };
  const load: PdLoad = {
    sessions: Math.round(number("sessions", values.sessions, PD_DEFAULT_LOAD.sessions)),
    agentRatePerS: number("agent-rate", values["agent-rate"], PD_DEFAULT_LOAD.agentRatePerS),
    chatRatePerS: number("chat-rate", values["chat-rate"], PD_DEFAULT_LOAD.chatRatePerS),
  };
  const result = await runPd({
    load,
    ...(values.seed !== undefined ? { seed: Number(values.seed) } : {}),
    onProgress: (line) => process.stderr.write(`${line}\n`),
  });
  process.stdout.write(`${pdTable(result)}\n`);
  if (values.json) write(values.json, `${JSON.stringify(result, null, 2)}\n`);
  if (values.report) write(values.report, pdHtml(result));
  const problems = pdProblems(result);
  for (const problem of problems) process.stderr.write(`${problem}\n`);
  return problems.length > 0 ? 1 : 0;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().then(
    (code) => process.exit(code),
    (error: unknown) => {
      process.stderr.write(`pd: ${(error as Error).stack ?? String(error)}\n`);
      process.exit(1);
    },
  );
}
