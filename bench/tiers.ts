/**
 * @module Two KV tiers against one: the simulated replicas with and without a host-memory tier, under
 * the benchmark's policies, on `agents-256` and the Mooncake conversation trace; plus the simulator's
 * own speed with both tiers and, with `--capacity`, each policy's SLO capacity on the trace.
 *
 * Run: `npx tsx bench/tiers.ts [--only speed,agents-256,mooncake,capacity,pooled] [--host-kv-tokens N]
 * [--mooncake-load X] [--policies rr,sluice] [--tiers 1,2] [--capacity-grid 0.75,1,1.5,2,3] [--bisections N]
 * [--out FILE]`;
 * writes `bench/results/tiers.json`. Numbers are measured, never tuned:
 * every target is reported as met or missed. See docs/tiers.md.
 */

import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { simFleet } from "../adapters/bench/fleet.js";
import type { BenchPolicy, FleetFactory, PolicyRun } from "../adapters/bench/run.js";
import { runPolicy } from "../adapters/bench/run.js";
import {
  DEFAULT_CAPACITY_BISECTIONS,
  DEFAULT_CAPACITY_GRID,
  largestLoadMet,
  SLO_CAPACITY_SHARE,
} from "../adapters/bench/slo-capacity.js";
import { compileWorkload, NAMED_WORKLOADS } from "../adapters/bench/workloads/index.js";
import { loadMooncakeTrace, mooncakeTracePath } from "../adapters/bench/workloads/mooncake.js";
import type { PresetOverrides } from "../adapters/engines/sim/presets.js";
import { resolveSimParams } from "../adapters/engines/sim/presets.js";
import type { SimEngine } from "../adapters/engines/sim/sim-engine.js";
import type { Clock } from "../src/clock.js";
import { Refusal } from "../src/errors.js";
import { Scheduler } from "../src/scheduler.js";
import type { AdmittedCall, CallRequest } from "../src/types.js";
import { mooncakeOnSim } from "./sim.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const PRESET = "h100-llama3-8b" as const;
const REPLICAS = 4;
/**
 * The policies compared (docs/benchmarks.md): no admission, the gate with least-loaded routing, the gate with
 * request-level prefix routing, CONCUR's window, sluice.
 */
export const TIER_POLICIES: readonly BenchPolicy[] = ["rr", "gate", "gate-prefix", "concur", "sluice"];

/**
 * Host tier per rank: 4 × the GPU tier. On `h100-llama3-8b` that is 1.756 M
 * tokens × 128 KiB ≈ 214 GiB of pinned host memory per H100 — what an
 * 8-GPU node with 2 TiB of RAM can give each GPU.
 */
export const DEFAULT_HOST_KV_TOKENS = 4 * resolveSimParams(PRESET).kvCapacityTokens;

/** One policy run, as this benchmark reports it. */
export interface TierRow {
  workload: string;
  tiers: 1 | 2;
  policy: BenchPolicy;
  load: number;
  makespan_s: number;
  slo_attainment: number;
  ttft_p50_s: number;
  ttft_p99_s: number;
  /** Prompt tokens served from the GPU tier ÷ prompt tokens. */
  gpu_hit_rate: number;
  /** Prompt tokens loaded from the host tier ÷ prompt tokens. */
  host_hit_rate: number;
  /** Both tiers: prompt tokens not computed ÷ prompt tokens. */
  hit_rate: number;
  /** Tokens computed a second time after a preemption (the benchmark's `recomputed_tokens`). */
  recomputed_tokens: number;
  /**
   * Prompt tokens an ideal prefix cache would have held (the workload's
   * `cachedAtBest`, summed) that neither tier had: prefixes evicted and
   * computed again.
   */
  evicted_prefix_tokens: number;
  /** Everything computed again: `recomputed_tokens + evicted_prefix_tokens`. */
  recomputed_tokens_total: number;
  /** Prompt tokens neither tier held at a call's first scheduling (computed from scratch, or again). */
  uncached_prompt_tokens: number;
  /** Tokens loaded from the host tier (resumed preempted calls included) and the time it took, s. */
  host_loaded_tokens: number;
  host_load_s: number;
  preemptions: number;
  completed: number;
  unfinished: number;
  /**
   * Why calls missed the TTFT SLO, each share of all calls (`MissCause`): the longest part of a
   * missed call's time to first token.
   */
  miss_causes: Partial<Record<MissCause, number>>;
  /**
   * The same misses by the call's prompt length (`PROMPT_BANDS`), each a share of all calls: which
   * calls a policy loses, e.g. prompts whose prefill alone outlasts the SLO at any load.
   */
  miss_by_prompt: Record<string, number>;
  /** Times a token window was cut (thrash read) during the run. */
  window_cuts: number;
  wall_s: number;
}

/**
 * The longest part of a missed call's time to first token: waiting to retry after refusals
 * (`retry:` and their reasons), waiting for admission once accepted (a session's window place and
 * the gate's queue), or the engine (its queue and the prefill); `refused` when it never got one.
 */
export type MissCause = `retry:${string}` | "admission" | "engine" | "refused";

/** One call as the scheduler saw it: every attempt, for `MissCause`. */
interface CallTimes {
  readyAt: number;
  lastAttemptAt: number;
  refusals: Set<string>;
  admittedAt?: number;
  queueMs?: number;
  firstTokenAt?: number;
}

/**
 * The benchmark's fleet (`simFleet`), keeping the engines it made to read their counters after the
 * run, and watching the scheduler: each call's attempts, admission and first token (`calls`, by the
 * call id `runPolicy` puts before `-a<attempt>` in request ids), and the window's cuts.
 */
function tierFleet(preset: PresetOverrides): FleetFactory & {
  engines: SimEngine[];
  calls: Map<string, CallTimes>;
  windowCuts: number;
} {
  const base = simFleet(preset, `${PRESET}${preset.hostKvTokens ? ` + host ${preset.hostKvTokens}` : ""}`);
  let clock: Clock | undefined;
  const fleet = {
    ...base,
    engines: [] as SimEngine[],
    calls: new Map<string, CallTimes>(),
    windowCuts: 0,
    createEngines(runClock: Clock, replicas: number) {
      clock = runClock;
      fleet.engines = base.createEngines(runClock, replicas) as SimEngine[];
      return fleet.engines;
    },
    createScheduler(options: Parameters<FleetFactory["createScheduler"]>[0]) {
      const scheduler = base.createScheduler(options);
      if (scheduler instanceof Scheduler) {
        scheduler.addEvents({
          window: (e) => {
            if (e.action === "decrease") fleet.windowCuts++;
          },
        });
      }
      const submit = scheduler.submit.bind(scheduler);
      scheduler.submit = async (req: CallRequest) => {
        const now = clock!.now();
        const id = req.requestId.replace(/-a\d+$/, "");
        let times = fleet.calls.get(id);
        if (!times) {
          times = { readyAt: now, lastAttemptAt: now, refusals: new Set() };
          fleet.calls.set(id, times);
        }
        times.lastAttemptAt = now;
        let admitted: AdmittedCall;
        try {
          admitted = await submit(req);
        } catch (error) {
          if (error instanceof Refusal) times.refusals.add(error.reason);
          throw error;
        }
        const call = times;
        call.admittedAt = clock!.now();
        call.queueMs = admitted.queueMs;
        const chunks = admitted[Symbol.asyncIterator].bind(admitted);
        return Object.assign(admitted, {
          [Symbol.asyncIterator]: () => {
            const inner = chunks();
            return {
              next: async () => {
                const step = await inner.next();
                // As `runPolicy` times it: the first chunk with tokens, else the stream's end.
                if (step.done || step.value.tokenCount > 0) call.firstTokenAt ??= clock!.now();
                return step;
              },
              return: async () => (await inner.return?.()) ?? { done: true as const, value: undefined },
            };
          },
        });
      };
      return scheduler;
    },
  };
  return fleet;
}

/** Whether a call missed its TTFT SLO: no first token at all, or a later one. */
function missedSlo(call: CallTimes, sloMs: number | undefined): boolean {
  return (
    call.firstTokenAt === undefined || call.firstTokenAt - call.readyAt > (sloMs ?? Number.POSITIVE_INFINITY)
  );
}

/** Shares of all calls by why they missed their TTFT SLO (`MissCause`). */
function missCauses(
  calls: ReadonlyMap<string, CallTimes>,
  sloMsOf: ReadonlyMap<string, number>,
  offered: number,
): Partial<Record<MissCause, number>> {
  const counts: Partial<Record<MissCause, number>> = {};
  const count = (cause: MissCause) => {
    counts[cause] = (counts[cause] ?? 0) + 1;
  };
  for (const [id, call] of calls) {
    if (!missedSlo(call, sloMsOf.get(id))) continue;
    if (call.firstTokenAt === undefined) {
      count("refused");
      continue;
    }
    const retry = call.lastAttemptAt - call.readyAt;
    const admission = call.queueMs ?? 0;
    const engine = call.firstTokenAt - (call.admittedAt ?? call.firstTokenAt);
    if (retry >= admission && retry >= engine) count(`retry:${[...call.refusals].sort().join("+")}`);
    else count(admission >= engine ? "admission" : "engine");
  }
  const shares: Partial<Record<MissCause, number>> = {};
  for (const [cause, n] of Object.entries(counts))
    shares[cause as MissCause] = round((n ?? 0) / Math.max(1, offered));
  return shares;
}

/** Prompt-length bands, tokens (lower bound inclusive, upper exclusive), for `miss_by_prompt`. */
export const PROMPT_BANDS: readonly { label: string; below: number }[] = [
  { label: "<8k", below: 8_000 },
  { label: "8k-16k", below: 16_000 },
  { label: "16k-32k", below: 32_000 },
  { label: "32k-64k", below: 64_000 },
  { label: ">=64k", below: Number.POSITIVE_INFINITY },
];

export function promptBand(promptTokens: number): string {
  return PROMPT_BANDS.find((band) => promptTokens < band.below)!.label;
}

/** The calls `counted` by prompt band, each band a share of all `calls`. */
export function sharesByPrompt(
  calls: readonly { id: string; promptTokens: number }[],
  counted: (id: string) => boolean,
): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const band of PROMPT_BANDS) counts[band.label] = 0;
  for (const call of calls) if (counted(call.id)) counts[promptBand(call.promptTokens)]!++;
  for (const band of PROMPT_BANDS)
    counts[band.label] = round(counts[band.label]! / Math.max(1, calls.length));
  return counts;
}

function round(x: number, digits = 4): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** A named workload compiled for this benchmark's fleet at `load`. */
function tierWorkload(name: "agents-256" | "mooncake", fleet: FleetFactory, load: number) {
  const spec = NAMED_WORKLOADS[name]!.spec({ replicas: REPLICAS, model: fleet.stepModel });
  return compileWorkload(spec, { name, load });
}

/** Runs one workload under one policy, with or without the host tier, and reads both tiers' counters. */
export async function runTier(options: {
  workload: "agents-256" | "mooncake";
  policy: BenchPolicy;
  hostKvTokens: number;
  load?: number;
  onProgress?: (line: string) => void;
}): Promise<{ row: TierRow; run: PolicyRun }> {
  const load = options.load ?? 1;
  const preset: PresetOverrides = { base: PRESET, hostKvTokens: options.hostKvTokens };
  const fleet = tierFleet(preset);
  const workload = tierWorkload(options.workload, fleet, load);
  const run = await runPolicy({
    workload,
    policy: options.policy,
    replicas: REPLICAS,
    fleet,
    ...(options.onProgress ? { onProgress: options.onProgress } : {}),
  });
  let queries = 0;
  let gpuHits = 0;
  let hostHits = 0;
  let hostLoaded = 0;
  let hostLoadMs = 0;
  for (const engine of fleet.engines) {
    const s = engine.stats();
    queries += s.prefixQueryTokens;
    gpuHits += s.prefixHitTokens;
    hostHits += s.hostHitTokens;
    hostLoaded += s.hostLoadedTokens;
    hostLoadMs += s.hostLoadMs;
  }
  const rate = (x: number) => (queries > 0 ? round(x / queries) : 0);
  let cachedAtBest = 0;
  for (const call of workload.calls) cachedAtBest += call.cachedAtBest;
  const evictedPrefix = Math.max(0, cachedAtBest - gpuHits - hostHits);
  const sloMsOf = new Map(workload.calls.map((call) => [call.id, call.slo.ttftS * 1000]));
  const row: TierRow = {
    workload: options.workload,
    tiers: options.hostKvTokens > 0 ? 2 : 1,
    policy: options.policy,
    load,
    makespan_s: run.row.makespan_s,
    slo_attainment: run.row.slo_attainment,
    ttft_p50_s: run.row.ttft_p50_s,
    ttft_p99_s: run.row.ttft_p99_s,
    gpu_hit_rate: rate(gpuHits),
    host_hit_rate: rate(hostHits),
    hit_rate: rate(gpuHits + hostHits),
    recomputed_tokens: run.row.recomputed_tokens,
    evicted_prefix_tokens: evictedPrefix,
    recomputed_tokens_total: run.row.recomputed_tokens + evictedPrefix,
    uncached_prompt_tokens: queries - gpuHits - hostHits,
    host_loaded_tokens: hostLoaded,
    host_load_s: round(hostLoadMs / 1000, 3),
    preemptions: run.row.preemptions,
    completed: run.row.completed,
    unfinished: run.unfinished,
    miss_causes: missCauses(fleet.calls, sloMsOf, workload.calls.length),
    miss_by_prompt: sharesByPrompt(workload.calls, (id) => {
      const call = fleet.calls.get(id);
      return call !== undefined && missedSlo(call, sloMsOf.get(id));
    }),
    window_cuts: fleet.windowCuts,
    wall_s: run.wallS,
  };
  return { row, run };
}

/**
 * The simulator alone, as `bench/sim.ts` measures it: the one-hour Mooncake
 * conversation trace on 4 replicas, conversations placed by key hash, no
 * scheduler in front — here with both tiers. Goal: ≤ 60 s of wall time.
 */
export async function simSpeed(hostKvTokens: number): Promise<Record<string, number>> {
  const m = await mooncakeOnSim({ base: PRESET, hostKvTokens });
  return {
    host_kv_tokens_per_rank: hostKvTokens,
    requests: m.mooncake_requests!,
    sim_s: round(m.mooncake_sim_s!, 1),
    wall_s: round(m.mooncake_wall_s!, 2),
    gpu_hit_rate: round(m.mooncake_gpu_hit_rate!),
    host_hit_rate: round(m.mooncake_host_hit_rate!),
  };
}

/** One load tried by the capacity search. */
interface CapacityTry {
  load: number;
  ttft_miss: number;
  miss_causes: TierRow["miss_causes"];
  miss_by_prompt: TierRow["miss_by_prompt"];
  window_cuts: number;
  wall_s: number;
}

/** Largest load at which ≥ 90 % of calls get a first token within the 5 s SLO: a grid, then bisection. */
export async function sloCapacity(
  policy: BenchPolicy,
  hostKvTokens: number,
  onProgress: (line: string) => void,
  grid: readonly number[] = DEFAULT_CAPACITY_GRID,
  bisections = DEFAULT_CAPACITY_BISECTIONS,
): Promise<{ capacity: number; tried: CapacityTry[] }> {
  const tried: CapacityTry[] = [];
  const meets = async (load: number): Promise<boolean> => {
    const { row, run } = await runTier({ workload: "mooncake", policy, hostKvTokens, load });
    tried.push({
      load,
      ttft_miss: run.ttftMiss,
      miss_causes: row.miss_causes,
      miss_by_prompt: row.miss_by_prompt,
      window_cuts: row.window_cuts,
      wall_s: run.wallS,
    });
    onProgress(
      `[capacity] ${policy} ${hostKvTokens > 0 ? "2 tiers" : "1 tier"} load ${load}: ` +
        `${(run.ttftMiss * 100).toFixed(1)} % miss the TTFT SLO (${run.wallS} s wall)`,
    );
    return 1 - run.ttftMiss >= SLO_CAPACITY_SHARE;
  };
  const capacity = await largestLoadMet(meets, { grid, bisections });
  return { capacity, tried };
}

/** Tokens per block of the Mooncake trace's hash ids. */
const TRACE_BLOCK_TOKENS = 512;

/**
 * The hit rate of a perfect pooled LRU on the conversation trace: one LRU of `capacityTokens` over
 * the trace's 512-token blocks, as if the whole fleet's memory were one cache and every request
 * went where its prefix is. A request hits its longest run of leading blocks held (never its last
 * token), then all its blocks become the most recent. Token-weighted over prompt tokens. The
 * simulated replicas cache 16-token blocks, so they can also reuse part of a partial 512-token
 * block; this bound does not count that.
 */
export function pooledLruHitRate(capacityTokens: number): number {
  const capacity = Math.floor(capacityTokens / TRACE_BLOCK_TOKENS);
  const lru = new Map<number, true>();
  let hits = 0;
  let prompts = 0;
  for (const request of loadMooncakeTrace(mooncakeTracePath("conversation"))) {
    let held = 0;
    while (held < request.hashIds.length && lru.has(request.hashIds[held]!)) held++;
    hits += Math.min(held * TRACE_BLOCK_TOKENS, Math.max(0, request.inputLength - 1));
    prompts += request.inputLength;
    for (const id of request.hashIds) {
      lru.delete(id);
      lru.set(id, true);
    }
    for (const id of lru.keys()) {
      if (lru.size <= capacity) break;
      lru.delete(id);
    }
  }
  return prompts > 0 ? hits / prompts : 0;
}

/** One target of the issue, as measured. */
interface Target {
  target: string;
  measured: number;
  goal: string;
  met: boolean;
}

function find(rows: readonly TierRow[], workload: string, tiers: 1 | 2, policy: string): TierRow | undefined {
  return rows.find((r) => r.workload === workload && r.tiers === tiers && r.policy === policy);
}

/** Runs what `--only` names (default: speed, agents-256, mooncake) and returns the document written. */
export async function runTiersBench(
  options: {
    only?: readonly string[];
    hostKvTokens?: number;
    mooncakeLoad?: number;
    policies?: readonly BenchPolicy[];
    capacityGrid?: readonly number[];
    bisections?: number;
    /** Which fleets the replays and the capacity search run on: one tier, two, or both (default). */
    tiers?: readonly (1 | 2)[];
    onProgress?: (line: string) => void;
  } = {},
): Promise<Record<string, unknown>> {
  const policies = options.policies ?? TIER_POLICIES;
  const tierChoices = options.tiers ?? ([1, 2] as const);
  const only = new Set(options.only ?? ["speed", "agents-256", "mooncake"]);
  const hostKvTokens = options.hostKvTokens ?? DEFAULT_HOST_KV_TOKENS;
  const log = options.onProgress ?? (() => {});
  const out: Record<string, unknown> = {
    preset: PRESET,
    replicas: REPLICAS,
    gpu_kv_tokens_per_rank: resolveSimParams(PRESET).kvCapacityTokens,
    host_kv_tokens_per_rank: hostKvTokens,
    host_load_gb_per_s: resolveSimParams(PRESET).hostLoadGBps,
  };
  const rows: TierRow[] = [];
  const targets: Target[] = [];
  if (only.has("speed")) {
    const oneTier = await simSpeed(0);
    log(`[speed] one tier ${JSON.stringify(oneTier)}`);
    const speed = await simSpeed(hostKvTokens);
    log(`[speed] two tiers ${JSON.stringify(speed)}`);
    out.sim_speed = { one_tier: oneTier, two_tiers: speed };
    targets.push({
      target: "simulator alone, Mooncake conversation (1 h) on 4 replicas with both tiers, wall s",
      measured: speed.wall_s!,
      goal: "≤ 60",
      met: speed.wall_s! <= 60,
    });
  }
  const replay = async (workload: "agents-256" | "mooncake", load: number) => {
    for (const tiers of tierChoices) {
      for (const policy of policies) {
        const { row } = await runTier({
          workload,
          policy,
          hostKvTokens: tiers === 2 ? hostKvTokens : 0,
          load,
          onProgress: log,
        });
        log(`[${workload}] ${JSON.stringify(row)}`);
        rows.push(row);
      }
    }
  };
  if (only.has("pooled")) {
    const gpuTokens = REPLICAS * resolveSimParams(PRESET).kvCapacityTokens;
    const pooled = {
      gpu_only: round(pooledLruHitRate(gpuTokens)),
      both_tiers: round(pooledLruHitRate(gpuTokens + REPLICAS * hostKvTokens)),
    };
    log(`[pooled] perfect pooled LRU hit rate ${JSON.stringify(pooled)}`);
    out.pooled_lru_hit_rate = pooled;
  }
  if (only.has("agents-256")) {
    await replay("agents-256", 1);
    const sluice2 = find(rows, "agents-256", 2, "sluice")!;
    const rr2 = find(rows, "agents-256", 2, "rr")!;
    const sluice1 = find(rows, "agents-256", 1, "sluice")!;
    targets.push({
      target: "agents-256, two tiers: rr makespan ÷ sluice",
      measured: round(rr2.makespan_s / sluice2.makespan_s, 3),
      goal: "≥ 2",
      met: rr2.makespan_s >= 2 * sluice2.makespan_s,
    });
    // Preemption recompute alone is zero for sluice (its window keeps the batch in KV), so the
    // target is read on everything computed again: preempted work plus evicted prefixes.
    targets.push({
      target:
        "agents-256, sluice: recomputed tokens (preempted + evicted prefixes) with the host tier ÷ without",
      measured: round(sluice2.recomputed_tokens_total / Math.max(1, sluice1.recomputed_tokens_total), 3),
      goal: "≤ 0.5",
      met: sluice2.recomputed_tokens_total <= 0.5 * sluice1.recomputed_tokens_total,
    });
  }
  if (only.has("mooncake") || only.has("capacity")) {
    // The trace's calls by prompt band (the same at every load), beside which `miss_by_prompt` reads.
    const workload = tierWorkload("mooncake", tierFleet({ base: PRESET }), 1);
    out.mooncake_calls_by_prompt = sharesByPrompt(workload.calls, () => true);
  }
  if (only.has("mooncake")) await replay("mooncake", options.mooncakeLoad ?? 1);
  if (only.has("capacity")) {
    const capacity: Record<string, unknown>[] = [];
    for (const policy of policies) {
      for (const tiers of tierChoices) {
        const found = await sloCapacity(
          policy,
          tiers === 2 ? hostKvTokens : 0,
          log,
          options.capacityGrid,
          options.bisections,
        );
        capacity.push({ policy, tiers, capacity: found.capacity, tried: found.tried });
      }
    }
    // docs/benchmarks.md: per policy, and the ratio to rr with the same tiers.
    for (const entry of capacity) {
      const rr = capacity.find((c) => c.policy === "rr" && c.tiers === entry.tiers)?.capacity as number;
      entry.ratio_to_rr = rr > 0 ? round((entry.capacity as number) / rr, 3) : null;
    }
    out.slo_capacity = capacity;
    const of = (policy: string, tiers: 1 | 2) =>
      capacity.find((c) => c.policy === policy && c.tiers === tiers)?.capacity as number | undefined;
    for (const [tiers, overRr, overPrefix] of [
      [2, 1.5, 1.1],
      [1, 1.2, 1],
    ] as const) {
      const sluice = of("sluice", tiers);
      const rr = of("rr", tiers);
      const prefix = of("gate-prefix", tiers);
      if (sluice === undefined) continue;
      const label = tiers === 2 ? "with the host tier" : "one tier";
      if (rr)
        targets.push({
          target: `SLO capacity, Mooncake conversation, ${label}: sluice ÷ rr`,
          measured: round(sluice / rr, 3),
          goal: `≥ ${overRr}`,
          met: sluice >= overRr * rr,
        });
      if (prefix)
        targets.push({
          target: `SLO capacity, Mooncake conversation, ${label}: sluice ÷ gate-prefix`,
          measured: round(sluice / prefix, 3),
          goal: `≥ ${overPrefix}`,
          met: sluice >= overPrefix * prefix,
        });
    }
  }
  const pooled = out.pooled_lru_hit_rate as { both_tiers: number } | undefined;
  const sluiceMooncake = find(rows, "mooncake", 2, "sluice");
  if (pooled && sluiceMooncake) {
    targets.push({
      target: "Mooncake conversation with the host tier: perfect pooled LRU hit rate − sluice's (both tiers)",
      measured: round(pooled.both_tiers - sluiceMooncake.hit_rate),
      goal: "≤ 0.05",
      met: pooled.both_tiers - sluiceMooncake.hit_rate <= 0.05,
    });
  }
  out.results = rows;
  out.targets = targets;
  return out;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const { values } = parseArgs({
    options: {
      only: { type: "string" },
      "host-kv-tokens": { type: "string" },
      "mooncake-load": { type: "string" },
      policies: { type: "string" },
      "capacity-grid": { type: "string" },
      bisections: { type: "string" },
      tiers: { type: "string" },
      out: { type: "string" },
    },
  });
  const log = (line: string) => process.stderr.write(`${line}\n`);
  const result = await runTiersBench({
    ...(values.only ? { only: values.only.split(",").map((s) => s.trim()) } : {}),
    ...(values["host-kv-tokens"] ? { hostKvTokens: Number(values["host-kv-tokens"]) } : {}),
    ...(values["mooncake-load"] ? { mooncakeLoad: Number(values["mooncake-load"]) } : {}),
    ...(values.policies ? { policies: values.policies.split(",").map((s) => s.trim() as BenchPolicy) } : {}),
    ...(values["capacity-grid"] ? { capacityGrid: values["capacity-grid"].split(",").map(Number) } : {}),
    ...(values.bisections ? { bisections: Number(values.bisections) } : {}),
    ...(values.tiers
      ? { tiers: values.tiers.split(",").map((s) => (s.trim() === "1" ? 1 : 2) as 1 | 2) }
      : {}),
    onProgress: log,
  });
  const path = values.out ?? join(HERE, "results", "tiers.json");
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `${JSON.stringify(result, null, 2)}\n`);
  for (const t of result.targets as Target[])
    process.stdout.write(`${t.met ? "met   " : "MISSED"}  ${t.target} = ${t.measured} (goal ${t.goal})\n`);
  process.stdout.write(`wrote ${path}\n`);
}
