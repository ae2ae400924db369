/** @module The benchmark driver: one workload, several policies, the same simulated fleet, in virtual time. */

import type { Clock } from "../../src/clock.js";
import { VirtualClock } from "../../src/clock.js";
import type { Engine } from "../../src/engine.js";
import { EngineError, Refusal } from "../../src/errors.js";
import type { AdminState, AdmittedCall, CallRequest, SchedulerEvents, SessionView } from "../../src/types.js";
import type { LowerBound, StepModel } from "./cost-model.js";
import { lowerBound } from "./cost-model.js";
import {
  type CallRecord,
  FAIRNESS_MODES,
  type FairnessMode,
  type FairnessStats,
  type TenantStats,
} from "./run-records.js";
import { type SessionInferenceScore, scoreSessionInference } from "./session-scoring.js";
import { type CapacitySearch, largestLoadMet, SLO_CAPACITY_SHARE } from "./slo-capacity.js";
import { quantile, round } from "./stats.js";
import { type TenantTracker, tenantTracker } from "./tenant-stats.js";
import type { PlannedCall, Workload, WorkloadTenant } from "./workloads/types.js";

export { type CallRecord, FAIRNESS_MODES, type FairnessMode, type FairnessStats, type TenantStats };

/** Policies whose admission has a session window, the only ones fairness can change. */
export const WINDOWED_POLICIES: readonly BenchPolicy[] = ["concur", "sluice"];

/** The policies the scheduler runs (docs/benchmarks.md): three baselines, CONCUR's session-count window, sluice. */
export const BENCH_POLICIES = ["rr", "gate", "gate-prefix", "concur", "sluice"] as const;
export type BenchPolicy = (typeof BENCH_POLICIES)[number];

/** What the driver needs from the scheduler. */
export interface BenchScheduler {
  start(): void;
  stop(): void | Promise<void>;
  submit(req: CallRequest): Promise<AdmittedCall>;
  /** Closes the session a key names for a tenant (a session is its tenant's own). */
  closeSession(id: string, tenant?: string): unknown;
  state(): AdminState;
  idleCheck(): { permits: number; reservations: number; windowSlots: number; queued: number };
  /** Where a session stands (its footprint, its phase), when the scheduler keeps sessions. */
  getSession?(id: string): SessionView | undefined;
  addEvents?(events: SchedulerEvents): void;
}

/** Builds the fleet of one policy run: fresh engines and a fresh scheduler on the run's clock. */
export interface FleetFactory {
  createEngines(clock: Clock, replicas: number): Engine[];
  createScheduler(options: {
    engines: Engine[];
    clock: Clock;
    policy: BenchPolicy;
    /** `tenants` workloads: each tenant's weight and band, for the scheduler's tenants file. */
    tenants?: Record<string, WorkloadTenant>;
    /** Set only when the run asks for a fairness mode; otherwise the scheduler's default. */
    fairness?: FairnessMode;
  }): BenchScheduler;
  /** Step-time coefficients of the engines, for the lower bound. */
  stepModel: StepModel;
  /** Name of the preset the engines run (for outputs). */
  preset: string;
}

/** One row of the documented `results`. */
export interface ResultRow {
  policy: string;
  load: number;
  makespan_s: number;
  goodput_rps: number;
  slo_attainment: number;
  throughput_tokens_per_s: number;
  prefix_hit_rate: number;
  recomputed_tokens: number;
  preemptions: number;
  ttft_p50_s: number;
  ttft_p99_s: number;
  tpot_p50_s: number;
  tpot_p99_s: number;
  /** Sessions whose every call completed: first arrival to last call's end, s. */
  session_completion_mean_s: number;
  session_completion_p99_s: number;
  /** Per session, the total time its calls waited for admission (ready → admitted, refusals and retries included), s. */
  session_wait_mean_s: number;
  session_wait_p99_s: number;
  session_wait_max_s: number;
  completed: number;
  /** Calls refused for good (after any retries) ÷ calls offered. */
  refused_share: number;
  rejected: Record<string, number>;
  /** With session keys off: inferred sessions against the workload's true sessions (docs/routing.md). */
  session_inference?: SessionInferenceScore;
  /** `tenants` workloads: each tenant's numbers (docs/benchmarks.md). */
  tenants?: Record<string, TenantStats>;
  /** `tenants` workloads: Jain's index over service ÷ weight while two or more tenants had sessions waiting. */
  fairness?: FairnessStats;
}

/** Per-group (per-lane for `mixed`) numbers of one run. */
export interface GroupStats {
  /** The group's TTFT objective, s (of its first call). */
  ttft_slo_s: number;
  offered: number;
  completed: number;
  met_slo: number;
  slo_attainment: number;
  goodput_rps: number;
  ttft_p50_s: number;
  ttft_p99_s: number;
  tpot_p99_s: number;
  output_tokens: number;
  rejected: number;
}

/** One sample of the fleet, taken every virtual second. */
export interface Sample {
  /** Virtual time, s. */
  t: number;
  /** Cumulative prefix-cache hit and query tokens over all engines since the run started. */
  hits: number;
  queries: number;
  /** Sum of the replicas' session windows; null when the policy has none. */
  window: number | null;
  activeSessions: number;
  /** Mean KV usage over the replicas, 0–1. */
  kvUsage: number;
  /** Calls waiting in gate queues, summed over the replicas. */
  queued: number;
  running: number;
  /** Overload stage (docs/how-it-works.md#token-budget-and-feasibility): 0 normal, 1 bulk_paused, 2 shedding. */
  stage: number;
}

/** Everything one policy run produced: its row, and what the report draws. */
export interface PolicyRun {
  row: ResultRow;
  groups: Record<string, GroupStats>;
  samples: Sample[];
  /** TTFT of every completed call, s, in completion order. */
  ttftS: number[];
  /** Completion time of every session whose calls all completed, s. */
  sessionCompletionS: number[];
  /** Total admission wait of every session, s. */
  sessionWaitS: number[];
  /** Counters of the scheduler once the run ended; all zero when nothing leaked. */
  idle: { permits: number; reservations: number; windowSlots: number; queued: number } | null;
  /** Calls that neither completed nor were refused for good when the run stopped. */
  unfinished: number;
  /** Share of offered calls that did not get a first token within their TTFT SLO (refused ones included). */
  ttftMiss: number;
  /** Unexpected errors (not refusals, not engine failures): each is a bug somewhere. */
  errors: string[];
  wallS: number;
}

export interface PolicyRunOptions {
  workload: Workload;
  policy: BenchPolicy;
  replicas: number;
  fleet: FleetFactory;
  /** Sampling period of `scheduler.state()` and the engines' counters, virtual ms. Default 1000. */
  sampleEveryMs?: number;
  /** Virtual time after which the run is stopped as stuck, ms. Default: 20 × the lower bound + 1 h. */
  maxVirtualMs?: number;
  /** Progress lines (to stderr in the CLI). */
  onProgress?: (line: string) => void;
  /** Stops the run (engines closed, scheduler stopped) and rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * Whether calls carry their session's key (default true). Off, they carry none (sessions must be
   * inferred), nobody closes a session (it ends at its idle timeout) and the row reports
   * `session_inference`.
   */
  sessionKeys?: boolean;
  /** Fairness mode passed to the scheduler; none: its default. */
  fairness?: FairnessMode;
}

const STAGES = ["normal", "bulk_paused", "shedding"];

/** A pause on the virtual clock. */
function sleep(clock: Clock, ms: number): Promise<void> {
  return new Promise((resolve) => clock.setTimeout(resolve, ms));
}

/** Deterministic stand-in output tokens, for engines that report counts but not ids. */
function fillerTokens(count: number, salt: number): number[] {
  const out = new Array<number>(count);
  let x = (salt * 2654435761) >>> 0;
  for (let i = 0; i < count; i++) {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x9e3779b9) >>> 0;
    out[i] = x % 128_000;
  }
  return out;
}

/**
 * Runs one workload under one policy on a fresh virtual clock, fresh engines
 * and a fresh scheduler. Calls start when ready (arrival, dependencies, tool
 * waits); refusals are retried after their Retry-After when the call allows it;
 * time advances only through the virtual clock until every call has finished.
 */
export async function runPolicy(options: PolicyRunOptions): Promise<PolicyRun> {
  const { workload, policy, fleet } = options;
  const sessionKeys = options.sessionKeys ?? true;
  options.signal?.throwIfAborted();
  const wallStart = performance.now();
  const clock = new VirtualClock();
  const engines = fleet.createEngines(clock, options.replicas);
  const scheduler = fleet.createScheduler({
    engines,
    clock,
    policy,
    ...(workload.tenants ? { tenants: workload.tenants } : {}),
    ...(options.fairness !== undefined ? { fairness: options.fairness } : {}),
  });
  const calls = workload.calls;
  const tenants: TenantTracker | undefined = workload.tenants
    ? tenantTracker(workload, scheduler, clock)
    : undefined;
  const records: CallRecord[] = calls.map(() => ({
    readyAt: 0,
    firstTokenAt: undefined,
    endAt: 0,
    tokens: 0,
    waitMs: 0,
    outcome: "pending",
  }));
  const dependents: number[][] = calls.map(() => []);
  const sessionRemaining = new Map<string, number>();
  for (const call of calls) {
    if (call.after !== undefined) dependents[call.after]!.push(call.index);
    if (call.sessionId !== undefined)
      sessionRemaining.set(call.sessionId, (sessionRemaining.get(call.sessionId) ?? 0) + 1);
  }
  /** Prompt and output of a call whose dependents extend it; dropped once they have. */
  const contexts = new Map<number, number[]>();
  /** Dependents of a call still to start that extend its context. */
  const extendersLeft = new Map<number, number>();
  const rejected: Record<string, number> = {};
  const errors: string[] = [];
  let finished = 0;
  const maxVirtualMs =
    options.maxVirtualMs ??
    20 * lowerBound(fleet.stepModel, workload, options.replicas).makespanS * 1000 + 3_600_000;

  const startSignals = engines.map((engine) => engine.signals());
  const samples: Sample[] = [];
  const sampleEveryMs = options.sampleEveryMs ?? 1000;

  const countRejection = (reason: string, call?: PlannedCall) => {
    rejected[reason] = (rejected[reason] ?? 0) + 1;
    if (call) tenants?.refused(call, reason);
  };

  /** Keys off: the session the scheduler counted each call in (its last attempt's). */
  const assigned: (string | undefined)[] = calls.map(() => undefined);
  const settleSession = (call: PlannedCall) => {
    if (call.sessionId === undefined || !sessionKeys) return;
    const left = (sessionRemaining.get(call.sessionId) ?? 1) - 1;
    sessionRemaining.set(call.sessionId, left);
    if (left === 0) {
      tenants?.closed(call.sessionId);
      try {
        scheduler.closeSession(call.sessionId, call.tenant);
      } catch (error) {
        // A policy without sessions may not know the id; anything else is a bug worth seeing.
        if (!(error instanceof Refusal && error.reason === "session_not_found")) errors.push(describe(error));
      }
    }
  };

  const finish = (call: PlannedCall, outcome: CallRecord["outcome"]) => {
    const record = records[call.index]!;
    record.outcome = outcome;
    record.endAt = clock.now();
    finished++;
    settleSession(call);
    for (const next of dependents[call.index]!) {
      const dependent = calls[next]!;
      if (dependent.extendsAfter && outcome !== "ok") {
        abandon(dependent);
        continue;
      }
      const readyAt = Math.max(dependent.arrivalMs, clock.now() + dependent.gapMs);
      clock.setTimeout(() => launch(dependent), readyAt - clock.now());
    }
    if (dependents[call.index]!.every((next) => !calls[next]!.extendsAfter)) contexts.delete(call.index);
  };

  const abandon = (call: PlannedCall) => {
    finish(call, "abandoned");
  };

  const launch = (call: PlannedCall) => {
    runCall(call).catch((error: unknown) => {
      errors.push(`${call.id}: ${describe(error)}`);
      if (records[call.index]!.outcome === "pending") finish(call, "failed");
    });
  };

  const runCall = async (call: PlannedCall): Promise<void> => {
    const record = records[call.index]!;
    record.readyAt = clock.now();
    let prompt: number[];
    if (call.extendsAfter && call.after !== undefined) {
      const base = contexts.get(call.after);
      if (!base) throw new Error(`context of ${calls[call.after]!.id} missing`);
      prompt = base.concat(call.newTokens());
      // A context two calls extend (a fork) is kept until the last of them has started.
      const left = (extendersLeft.get(call.after) ?? 1) - 1;
      extendersLeft.set(call.after, left);
      if (left <= 0) {
        contexts.delete(call.after);
        extendersLeft.delete(call.after);
      }
    } else {
      prompt = call.newTokens();
    }
    const keepsContext = dependents[call.index]!.some((next) => calls[next]!.extendsAfter);
    // Waiting for admission starts when the call is ready and again after a failed attempt.
    let waitingSince = clock.now();
    tenants?.waiting(call, prompt.length);
    for (let attempt = 0; ; attempt++) {
      const request: CallRequest = {
        requestId: `${call.id}-a${attempt}`,
        endpoint: "chat",
        input: { kind: "tokens", tokens: prompt },
        maxTokens: call.maxTokens,
        stream: true,
      };
      if (call.sessionId !== undefined && sessionKeys) request.sessionId = call.sessionId;
      if (call.declaredLane !== undefined) request.declaredLane = call.declaredLane;
      if (call.tenant !== undefined) request.tenant = call.tenant;
      let admitted: AdmittedCall;
      try {
        admitted = await scheduler.submit(request);
      } catch (error) {
        if (!(error instanceof Refusal)) throw error;
        countRejection(error.reason, call);
        if (call.retry && error.retryAfterSeconds !== undefined) {
          await sleep(clock, error.retryAfterSeconds * 1000);
          continue;
        }
        record.waitMs += clock.now() - waitingSince;
        tenants?.settled(call);
        finish(call, "refused");
        return;
      }
      record.waitMs += clock.now() - waitingSince;
      if (!sessionKeys) assigned[call.index] = admitted.sessionId;
      record.admittedAt ??= clock.now();
      tenants?.admitted(call);
      let firstTokenAt: number | undefined;
      let tokens = 0;
      const output: number[] = [];
      try {
        for await (const chunk of admitted) {
          if (chunk.tokenCount > 0 && firstTokenAt === undefined) firstTokenAt = clock.now();
          tokens += chunk.tokenCount;
          if (keepsContext) for (const token of chunk.tokens) output.push(token);
        }
        const result = await admitted.result;
        if (result.finishReason === "error" || result.finishReason === "abort") {
          throw new EngineError(`call ended with finish reason ${result.finishReason}`);
        }
        tokens = Math.max(tokens, result.completionTokens);
        if (keepsContext) {
          const generated =
            result.outputTokens && result.outputTokens.length >= output.length ? result.outputTokens : output;
          const full =
            generated.length < tokens
              ? [...generated, ...fillerTokens(tokens - generated.length, call.index)]
              : [...generated];
          contexts.set(call.index, prompt.concat(full.slice(call.dropsOutputTokens ?? 0)));
          extendersLeft.set(
            call.index,
            dependents[call.index]!.filter((next) => calls[next]!.extendsAfter).length,
          );
        }
      } catch (error) {
        if (!(error instanceof EngineError)) throw error;
        countRejection("engine_error", call);
        waitingSince = clock.now();
        if (call.retry) {
          tenants?.waiting(call, prompt.length);
          await sleep(clock, 1000);
          continue;
        }
        tenants?.settled(call);
        finish(call, "failed");
        return;
      }
      record.firstTokenAt = firstTokenAt ?? clock.now();
      record.tokens = tokens;
      tenants?.settled(call, prompt.length + tokens);
      finish(call, "ok");
      return;
    }
  };

  const sample = () => {
    let hits = 0;
    let queries = 0;
    engines.forEach((engine, i) => {
      const s = engine.signals();
      hits += s.prefixHitTokens - startSignals[i]!.prefixHitTokens;
      queries += s.prefixQueryTokens - startSignals[i]!.prefixQueryTokens;
    });
    const state = scheduler.state();
    let window: number | null = null;
    let kv = 0;
    let queued = 0;
    let running = 0;
    for (const replica of state.replicas) {
      if (replica.window.size !== null) window = (window ?? 0) + replica.window.size;
      kv += replica.signals.kvUsage ?? 0;
      queued += replica.gate.queued;
      running += replica.signals.running ?? 0;
    }
    samples.push({
      t: round(clock.now() / 1000, 3),
      hits,
      queries,
      window,
      activeSessions: state.sessions.active,
      kvUsage: round(state.replicas.length > 0 ? kv / state.replicas.length : 0, 4),
      queued,
      running,
      stage: STAGES.indexOf(state.stage),
    });
  };
  let sampling = true;
  const sampleTick = () => {
    if (!sampling) return;
    sample();
    tenants?.sample(sampleEveryMs);
    clock.setTimeout(sampleTick, sampleEveryMs);
  };

  scheduler.start();
  sampleTick();
  for (const call of calls) {
    if (call.after === undefined) clock.setTimeout(() => launch(call), call.arrivalMs);
  }
  const signal = options.signal;
  const done = () => finished === calls.length || clock.now() >= maxVirtualMs || signal?.aborted === true;
  let lastReport = performance.now();
  await clock.runAsyncUntil(() => {
    if (options.onProgress && performance.now() - lastReport > 5000) {
      lastReport = performance.now();
      options.onProgress(
        `  … ${policy}: ${finished}/${calls.length} calls done at virtual ${(clock.now() / 1000).toFixed(0)} s`,
      );
    }
    return done();
  });
  sample();
  sampling = false;
  const unfinished = calls.length - finished;
  // Keys off, no agent could close its session: they are closed here, after the last call, for the leak check.
  if (!sessionKeys) {
    const closing = new Set<string>();
    calls.forEach((call, i) => {
      const id = assigned[i];
      if (id === undefined || closing.has(`${call.tenant ?? ""} ${id}`)) return;
      closing.add(`${call.tenant ?? ""} ${id}`);
      scheduler.closeSession(id, call.tenant);
    });
  }
  await scheduler.stop();
  let idle: PolicyRun["idle"] = null;
  try {
    idle = scheduler.idleCheck();
  } catch (error) {
    errors.push(`idleCheck: ${describe(error)}`);
  }
  const endSignals = engines.map((engine) => engine.signals());
  const recomputed = engines.reduce((sum, engine) => sum + recomputedTokensOf(engine), 0);
  for (const engine of engines) await engine.close?.();
  signal?.throwIfAborted();

  const sessions = sessionTimes(calls, records);
  const summary = summarize({
    sessions,
    policy,
    workload,
    records,
    rejected,
    startSignals,
    endSignals,
    recomputed,
    endMs: clock.now(),
  });
  const row: ResultRow = tenants ? { ...summary, ...tenants.results(records, options.fairness) } : summary;
  if (!sessionKeys) {
    row.session_inference = scoreSessionInference(
      calls.map((call, i) => ({ trueSession: call.sessionId, assigned: assigned[i] })),
    );
  }
  const ttftS: number[] = [];
  let ttftMet = 0;
  records.forEach((record, i) => {
    if (record.outcome !== "ok") return;
    const ttftMs = record.firstTokenAt! - record.readyAt;
    ttftS.push(round(ttftMs / 1000));
    if (ttftMs <= calls[i]!.slo.ttftS * 1000) ttftMet++;
  });
  return {
    row,
    groups: groupStats(workload, records, row.makespan_s),
    samples,
    ttftS,
    sessionCompletionS: sessions.completionS.map((v) => round(v, 3)),
    sessionWaitS: sessions.waitS.map((v) => round(v, 3)),
    ttftMiss: round(calls.length > 0 ? 1 - ttftMet / calls.length : 0, 4),
    idle,
    unfinished,
    errors,
    wallS: round((performance.now() - wallStart) / 1000, 3),
  };
}

/** Recomputed (preempted) prompt tokens an engine reports, when it reports them. */
function recomputedTokensOf(engine: Engine): number {
  const stats = (engine as { stats?: () => { recomputedTokens?: number } }).stats?.();
  return stats?.recomputedTokens ?? 0;
}

function describe(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

interface Timing {
  ttftMs: number;
  tpotMs: number | undefined;
}

function timingOf(record: CallRecord): Timing {
  const first = record.firstTokenAt ?? record.endAt;
  return {
    ttftMs: first - record.readyAt,
    tpotMs: record.tokens >= 2 ? (record.endAt - first) / (record.tokens - 1) : undefined,
  };
}

function metSlo(call: PlannedCall, timing: Timing): boolean {
  return (
    timing.ttftMs <= call.slo.ttftS * 1000 &&
    (timing.tpotMs === undefined || timing.tpotMs <= call.slo.tpotS * 1000)
  );
}

/** the documented row from the call records and the engines' counters. */
function summarize(input: {
  policy: string;
  workload: Workload;
  records: CallRecord[];
  rejected: Record<string, number>;
  startSignals: ReturnType<Engine["signals"]>[];
  endSignals: ReturnType<Engine["signals"]>[];
  recomputed: number;
  endMs: number;
  sessions: SessionTimes;
}): ResultRow {
  const { workload, records } = input;
  let refused = 0;
  for (const record of records) if (record.outcome === "refused") refused++;
  const ttft: number[] = [];
  const tpot: number[] = [];
  let completed = 0;
  let met = 0;
  let outputTokens = 0;
  let lastEnd = 0;
  records.forEach((record, i) => {
    if (record.outcome !== "ok") return;
    completed++;
    const timing = timingOf(record);
    ttft.push(timing.ttftMs / 1000);
    if (timing.tpotMs !== undefined) tpot.push(timing.tpotMs / 1000);
    if (metSlo(workload.calls[i]!, timing)) met++;
    outputTokens += record.tokens;
    if (record.endAt > lastEnd) lastEnd = record.endAt;
  });
  const makespanS = (completed > 0 ? lastEnd : input.endMs) / 1000;
  let hits = 0;
  let queries = 0;
  let preemptions = 0;
  input.endSignals.forEach((end, i) => {
    const start = input.startSignals[i]!;
    hits += end.prefixHitTokens - start.prefixHitTokens;
    queries += end.prefixQueryTokens - start.prefixQueryTokens;
    preemptions += end.preemptions - start.preemptions;
  });
  const rejected: Record<string, number> = {};
  for (const reason of Object.keys(input.rejected).sort()) rejected[reason] = input.rejected[reason]!;
  return {
    policy: input.policy,
    load: workload.load,
    makespan_s: round(makespanS, 3),
    goodput_rps: round(makespanS > 0 ? met / makespanS : 0, 4),
    slo_attainment: round(records.length > 0 ? met / records.length : 0, 4),
    throughput_tokens_per_s: round(makespanS > 0 ? outputTokens / makespanS : 0, 1),
    prefix_hit_rate: round(queries > 0 ? hits / queries : 0, 4),
    recomputed_tokens: input.recomputed,
    preemptions,
    ttft_p50_s: round(quantile(ttft, 0.5), 4),
    ttft_p99_s: round(quantile(ttft, 0.99), 4),
    tpot_p50_s: round(quantile(tpot, 0.5), 5),
    tpot_p99_s: round(quantile(tpot, 0.99), 5),
    session_completion_mean_s: round(mean(input.sessions.completionS), 3),
    session_completion_p99_s: round(quantile(input.sessions.completionS, 0.99), 3),
    session_wait_mean_s: round(mean(input.sessions.waitS), 3),
    session_wait_p99_s: round(quantile(input.sessions.waitS, 0.99), 3),
    session_wait_max_s: round(input.sessions.waitS.length > 0 ? Math.max(...input.sessions.waitS) : 0, 3),
    completed,
    refused_share: round(records.length > 0 ? refused / records.length : 0, 4),
    rejected,
  };
}

function mean(values: readonly number[]): number {
  return values.length > 0 ? values.reduce((a, b) => a + b, 0) / values.length : 0;
}

/** Per-session numbers of a run, in seconds. */
export interface SessionTimes {
  /** First arrival to last call's end, for sessions whose every call completed. */
  completionS: number[];
  /** Total admission wait of each session (every session, finished or not). */
  waitS: number[];
}

/**
 * Groups calls into sessions (a call without a session id is a session of its
 * own) and measures each: completion from its first call's arrival to its last
 * call's end when every call completed, and the admission waits of its calls.
 */
export function sessionTimes(calls: readonly PlannedCall[], records: readonly CallRecord[]): SessionTimes {
  const sessions = new Map<string, { startMs: number; endMs: number; waitMs: number; complete: boolean }>();
  calls.forEach((call, i) => {
    const record = records[i]!;
    const key = call.sessionId ?? `call:${call.id}`;
    const session = sessions.get(key) ?? {
      startMs: Number.POSITIVE_INFINITY,
      endMs: 0,
      waitMs: 0,
      complete: true,
    };
    sessions.set(key, session);
    session.startMs = Math.min(session.startMs, call.arrivalMs);
    session.endMs = Math.max(session.endMs, record.endAt);
    session.waitMs += record.waitMs;
    if (record.outcome !== "ok") session.complete = false;
  });
  const completionS: number[] = [];
  const waitS: number[] = [];
  for (const session of sessions.values()) {
    waitS.push(session.waitMs / 1000);
    if (session.complete) completionS.push((session.endMs - session.startMs) / 1000);
  }
  return { completionS, waitS };
}

function groupStats(
  workload: Workload,
  records: CallRecord[],
  makespanS: number,
): Record<string, GroupStats> {
  const groups = new Map<string, { calls: number[] }>();
  for (const call of workload.calls) {
    const group = groups.get(call.group) ?? { calls: [] };
    groups.set(call.group, group);
    group.calls.push(call.index);
  }
  const out: Record<string, GroupStats> = {};
  for (const [name, { calls }] of groups) {
    const ttft: number[] = [];
    const tpot: number[] = [];
    let completed = 0;
    let met = 0;
    let tokens = 0;
    let refused = 0;
    for (const i of calls) {
      const record = records[i]!;
      if (record.outcome === "refused") refused++;
      if (record.outcome !== "ok") continue;
      completed++;
      const timing = timingOf(record);
      ttft.push(timing.ttftMs / 1000);
      if (timing.tpotMs !== undefined) tpot.push(timing.tpotMs / 1000);
      if (metSlo(workload.calls[i]!, timing)) met++;
      tokens += record.tokens;
    }
    out[name] = {
      ttft_slo_s: workload.calls[calls[0]!]!.slo.ttftS,
      offered: calls.length,
      completed,
      met_slo: met,
      slo_attainment: round(calls.length > 0 ? met / calls.length : 0, 4),
      goodput_rps: round(makespanS > 0 ? met / makespanS : 0, 4),
      ttft_p50_s: round(quantile(ttft, 0.5), 4),
      ttft_p99_s: round(quantile(ttft, 0.99), 4),
      tpot_p99_s: round(quantile(tpot, 0.99), 5),
      output_tokens: tokens,
      rejected: refused,
    };
  }
  return out;
}

/** The `bound` row: the documented lower bound on makespan, and what an ideal run would show. */
export function boundRow(
  model: StepModel,
  workload: Workload,
  replicas: number,
): { row: ResultRow; bound: LowerBound } {
  const bound = lowerBound(model, workload, replicas);
  let promptTokens = 0;
  let cacheable = 0;
  let outputTokens = 0;
  for (const call of workload.calls) {
    promptTokens += call.promptTokens;
    cacheable += call.cachedAtBest;
    outputTokens += call.maxTokens;
  }
  // The first call to use a shared prefix computes it.
  for (const shared of workload.sharedPrefills) cacheable -= shared.tokens;
  const makespan = bound.makespanS;
  const n = workload.calls.length;
  return {
    bound,
    row: {
      policy: "bound",
      load: workload.load,
      makespan_s: round(makespan, 3),
      goodput_rps: round(makespan > 0 ? n / makespan : 0, 4),
      slo_attainment: 1,
      throughput_tokens_per_s: round(makespan > 0 ? outputTokens / makespan : 0, 1),
      prefix_hit_rate: round(promptTokens > 0 ? cacheable / promptTokens : 0, 4),
      recomputed_tokens: 0,
      preemptions: 0,
      ttft_p50_s: round(quantile(bound.ttftMs, 0.5) / 1000, 4),
      ttft_p99_s: round(quantile(bound.ttftMs, 0.99) / 1000, 4),
      tpot_p50_s: round(quantile(bound.tpotMs, 0.5) / 1000, 5),
      tpot_p99_s: round(quantile(bound.tpotMs, 0.99) / 1000, 5),
      session_completion_mean_s: round(mean(bound.sessionCompletionS), 3),
      session_completion_p99_s: round(quantile(bound.sessionCompletionS, 0.99), 3),
      session_wait_mean_s: 0,
      session_wait_p99_s: 0,
      session_wait_max_s: 0,
      completed: n,
      refused_share: 0,
      rejected: {},
    },
  };
}

/** the documented `--json` document, plus per-run details that are not part of the contract. */
export interface BenchOutput {
  workload: string;
  replicas: number;
  preset: string;
  results: ResultRow[];
  details: RunDetails[];
  /** Trace replays: each policy's SLO capacity (docs/benchmarks.md), with the loads its search tried. */
  slo_capacity?: SloCapacityOutput;
  /** `tenants` workloads: some tenants' parts run with nobody else on the fleet, per policy and load. */
  alone?: AloneRow[];
}

/** A tenant's numbers when its parts ran alone (the reference of the tenants targets). */
export interface AloneRow {
  policy: string;
  load: number;
  tenant: string;
  stats: TenantStats;
}

/** Each policy's SLO capacity: the largest load at which `share` of calls met their TTFT SLO. */
export interface SloCapacityOutput {
  share: number;
  policies: {
    policy: BenchPolicy;
    capacity: number;
    /** Capacity ÷ rr's, when rr ran and served some load. */
    ratio_to_rr?: number;
    /** Every load the search ran, in load order, with the share of calls within their TTFT SLO. */
    tried: { load: number; ttft_slo_met: number }[];
  }[];
}

/** What a row does not say: wall time, leaks, per-lane numbers, the parts of the bound. */
export interface RunDetails {
  policy: string;
  load: number;
  describe: string;
  /** The fairness mode the scheduler was given, when the run set one. */
  fairness?: FairnessMode;
  wall_s?: number;
  unfinished?: number;
  idle_check?: PolicyRun["idle"];
  errors?: string[];
  groups?: Record<string, GroupStats>;
  critical_path_s?: number;
  work_s?: number;
}

/** Everything a benchmark produced, for the JSON file, the table and the report. */
export interface BenchReport {
  output: BenchOutput;
  /** `policy` is the row's label (`sluice (fairness off)` beside `sluice` when both modes ran). */
  runs: { policy: string; base: BenchPolicy; fairness?: FairnessMode; load: number; run: PolicyRun }[];
  bounds: { load: number; bound: LowerBound }[];
  /** Runs whose scheduler did not return to idle, did not finish, or hit unexpected errors. */
  problems: string[];
}

export interface BenchOptions {
  /** Name shown in outputs. */
  name: string;
  /** Compiles the workload at a load. */
  compile: (load: number) => Workload;
  loads: readonly number[];
  policies: readonly BenchPolicy[];
  replicas: number;
  fleet: FleetFactory;
  sampleEveryMs?: number;
  onProgress?: (line: string) => void;
  /** Aborts the benchmark between or inside policy runs. */
  signal?: AbortSignal;
  /** Also searches each policy's SLO capacity (trace replays, docs/benchmarks.md); runs at `loads` are reused. */
  sloCapacity?: CapacitySearch;
  /** Whether calls carry their session's key (default true; see `PolicyRunOptions.sessionKeys`). */
  sessionKeys?: boolean;
  /**
   * Fairness modes to run. The first applies to every policy; each later one
   * runs again the policies with a session window, labelled `<policy> (fairness
   * <mode>)`. None: the scheduler's default, set nowhere.
   */
  fairness?: readonly FairnessMode[];
  /** `tenants` workloads: tenants whose parts also run alone under every policy, compiled at a load. */
  alone?: { tenant: string; compile: (load: number) => Workload }[];
}

/** The label of a run: the policy, marked with its fairness mode when it is not the run's first. */
export function runLabel(
  policy: BenchPolicy,
  fairness: FairnessMode | undefined,
  first: FairnessMode | undefined,
): string {
  return fairness === undefined || fairness === first ? policy : `${policy} (fairness ${fairness})`;
}

/** Runs every policy at every load on the same workload and seed, plus the lower bound. */
export async function runBench(options: BenchOptions): Promise<BenchReport> {
  const { fleet, replicas } = options;
  const progress = options.onProgress ?? (() => {});
  const results: ResultRow[] = [];
  const details: RunDetails[] = [];
  const runs: BenchReport["runs"] = [];
  const bounds: BenchReport["bounds"] = [];
  const problems: string[] = [];
  const modes = options.fairness ?? [];
  const runOne = async (
    workload: Workload,
    policy: BenchPolicy,
    load: number,
    fairness: FairnessMode | undefined = modes[0],
    tag = "",
  ): Promise<PolicyRun> => {
    const label = `${runLabel(policy, fairness, modes[0])}${tag}`;
    const run = await runPolicy({
      workload,
      policy,
      replicas,
      fleet,
      ...(fairness !== undefined ? { fairness } : {}),
      ...(options.sampleEveryMs !== undefined ? { sampleEveryMs: options.sampleEveryMs } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.sessionKeys === false ? { sessionKeys: false } : {}),
      onProgress: progress,
    });
    const r = run.row;
    progress(
      `[${options.name}] ${label} load ${load}: makespan ${r.makespan_s} s, goodput ${r.goodput_rps}/s, ` +
        `hit rate ${r.prefix_hit_rate}, ${r.completed}/${workload.calls.length} completed, wall ${run.wallS} s`,
    );
    const idleDirty = run.idle === null || Object.values(run.idle).some((v) => v !== 0);
    if (idleDirty)
      problems.push(`${label} load ${load}: scheduler not idle after the run: ${JSON.stringify(run.idle)}`);
    if (run.unfinished > 0) problems.push(`${label} load ${load}: ${run.unfinished} calls unfinished`);
    for (const error of run.errors.slice(0, 5)) problems.push(`${label} load ${load}: ${error}`);
    if (run.errors.length > 5) problems.push(`${label} load ${load}: … ${run.errors.length - 5} more errors`);
    return run;
  };
  const alone: AloneRow[] = [];
  for (const load of options.loads) {
    const workload = options.compile(load);
    progress(`[${options.name}] load ${load}: ${workload.describe}`);
    const variants: { policy: BenchPolicy; fairness: FairnessMode | undefined }[] = [];
    for (const policy of options.policies) variants.push({ policy, fairness: modes[0] });
    for (const fairness of modes.slice(1))
      for (const policy of options.policies)
        if (WINDOWED_POLICIES.includes(policy)) variants.push({ policy, fairness });
    for (const { policy, fairness } of variants) {
      const run = await runOne(workload, policy, load, fairness);
      const label = runLabel(policy, fairness, modes[0]);
      const r = { ...run.row, policy: label };
      run.row = r;
      results.push(r);
      details.push({
        policy: label,
        load,
        describe: workload.describe,
        ...(fairness !== undefined ? { fairness } : {}),
        wall_s: run.wallS,
        unfinished: run.unfinished,
        idle_check: run.idle,
        errors: run.errors.slice(0, 20),
        groups: run.groups,
      });
      runs.push({ policy: label, base: policy, ...(fairness !== undefined ? { fairness } : {}), load, run });
    }
    for (const reference of options.alone ?? []) {
      const only = reference.compile(load);
      for (const policy of options.policies) {
        const run = await runOne(only, policy, load, modes[0], ` (${reference.tenant} alone)`);
        const stats = run.row.tenants?.[reference.tenant];
        if (stats) alone.push({ policy, load, tenant: reference.tenant, stats });
      }
    }
    const { row, bound } = boundRow(fleet.stepModel, workload, replicas);
    results.push(row);
    details.push({
      policy: "bound",
      load,
      describe: workload.describe,
      critical_path_s: round(bound.criticalPathS, 3),
      work_s: round(bound.workS, 3),
    });
    bounds.push({ load, bound });
  }
  let sloCapacity: SloCapacityOutput | undefined;
  if (options.sloCapacity) {
    const compiled = new Map<number, Workload>();
    const workloadAt = (load: number) => {
      let workload = compiled.get(load);
      if (!workload) {
        workload = options.compile(load);
        compiled.set(load, workload);
      }
      return workload;
    };
    const policies: SloCapacityOutput["policies"] = [];
    for (const policy of options.policies) {
      const tried: { load: number; ttft_slo_met: number }[] = [];
      const capacity = await largestLoadMet(async (load) => {
        const run =
          runs.find((r) => r.policy === policy && r.load === load)?.run ??
          (await runOne(workloadAt(load), policy, load));
        const met = round(1 - run.ttftMiss, 4);
        tried.push({ load, ttft_slo_met: met });
        progress(
          `[${options.name}] SLO capacity, ${policy} load ${load}: ${(met * 100).toFixed(1)} % within TTFT SLO`,
        );
        return met >= SLO_CAPACITY_SHARE;
      }, options.sloCapacity);
      tried.sort((a, b) => a.load - b.load);
      policies.push({ policy, capacity, tried });
    }
    const rr = policies.find((p) => p.policy === "rr")?.capacity;
    if (rr !== undefined && rr > 0) for (const p of policies) p.ratio_to_rr = round(p.capacity / rr, 3);
    sloCapacity = { share: SLO_CAPACITY_SHARE, policies };
  }
  for (const problem of problems) progress(`!!! ${problem}`);
  return {
    output: {
      workload: options.name,
      replicas,
      preset: fleet.preset,
      results,
      details,
      ...(sloCapacity ? { slo_capacity: sloCapacity } : {}),
      ...(alone.length > 0 ? { alone } : {}),
    },
    runs,
    bounds,
    problems,
  };
}
