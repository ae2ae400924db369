/** @module The step-time model of docs/simulator.md applied to whole workloads: batch-1 latencies, total work, the lower bound. */

import type { PresetName, PresetOverrides, SimParams } from "../engines/sim/presets.js";
import { resolveSimParams } from "../engines/sim/presets.js";
import type { PlannedCall, Workload } from "./workloads/types.js";

/** Step-time coefficients of a simulated replica (docs/simulator.md), all in ms. */
export interface StepModel {
  /** Fixed cost of one engine step, ms. */
  c0: number;
  /** Linear cost per prefill token, ms. */
  cPrefill: number;
  /** Linear cost per decode sequence, ms. */
  cDec: number;
  /** Cost per context token of each decode sequence, ms. */
  cKv: number;
  /** Prefill attention cost per (new token, context token) pair, ms. */
  cPfattn: number;
  /** Linear work that costs nothing extra (~128 tokens' worth), ms. */
  floorCredit: number;
  /** Chunked-prefill budget per step, tokens. */
  maxNumBatchedTokens: number;
}

/** The step model of a simulated replica's parameters. */
export function stepModelOf(params: SimParams): StepModel {
  return {
    c0: params.c0,
    cPrefill: params.cPrefill,
    cDec: params.cDec,
    cKv: params.cKv,
    cPfattn: params.cPfattn,
    floorCredit: params.cPrefill * params.floorCreditTokens,
    maxNumBatchedTokens: params.maxNumBatchedTokens,
  };
}

/** The step model of a preset name or preset overrides. */
export function stepModelOfPreset(preset: PresetName | PresetOverrides): StepModel {
  return stepModelOf(resolveSimParams(preset));
}

/** Time of one step at batch 1, ms. */
function step(
  model: StepModel,
  prefillTokens: number,
  decodeSeqs: number,
  decodeContext: number,
  attnPairs: number,
) {
  return (
    model.c0 +
    Math.max(0, model.cPrefill * prefillTokens + model.cDec * decodeSeqs - model.floorCredit) +
    model.cKv * decodeContext +
    model.cPfattn * attnPairs
  );
}

/**
 * Time to first token of a call running alone, ms: `newTokens` prefilled on
 * top of `cachedTokens` in chunks of `maxNumBatchedTokens`, the last chunk
 * producing the first token. A fully cached prompt still computes one token.
 */
export function batch1PrefillMs(model: StepModel, newTokens: number, cachedTokens: number): number {
  let remaining = Math.max(1, newTokens);
  let context = Math.max(0, cachedTokens);
  let total = 0;
  while (remaining > 0) {
    const chunk = Math.min(remaining, model.maxNumBatchedTokens);
    total += step(model, chunk, 0, 0, chunk * (context + chunk / 2));
    context += chunk;
    remaining -= chunk;
  }
  return total;
}

/** Time of the `outputTokens − 1` decode steps after the first token, at batch 1, ms. */
export function batch1DecodeMs(model: StepModel, promptTokens: number, outputTokens: number): number {
  const steps = Math.max(0, outputTokens - 1);
  const perStepFixed = model.c0 + Math.max(0, model.cDec - model.floorCredit);
  // Context read at decode step j (1-based) is prompt + j tokens.
  const contextSum = steps * promptTokens + (steps * (steps + 1)) / 2;
  return steps * perStepFixed + model.cKv * contextSum;
}

/** Latency of a call running alone on a replica with an ideal prefix cache, ms. */
export function batch1CallMs(
  model: StepModel,
  call: PlannedCall,
): { ttftMs: number; tpotMs: number; totalMs: number } {
  const newTokens = call.promptTokens - call.cachedAtBest;
  const ttftMs = batch1PrefillMs(model, newTokens, call.cachedAtBest);
  const decodeMs = batch1DecodeMs(model, call.promptTokens, call.maxTokens);
  return {
    ttftMs,
    tpotMs: call.maxTokens > 1 ? decodeMs / (call.maxTokens - 1) : 0,
    totalMs: ttftMs + decodeMs,
  };
}

/**
 * Work a call needs however well it is batched, ms: the linear prefill and
 * decode terms, prefill attention over its uncached tokens, and the KV reads
 * of its decode steps. Step overheads (c0 beyond the floor credit) are left
 * out: every preset has c0 ≥ floor credit, so dropping them keeps this a
 * lower bound for any batching.
 */
export function callWorkMs(model: StepModel, call: PlannedCall): number {
  const newTokens = Math.max(0, call.promptTokens - call.cachedAtBest);
  return (
    prefillWorkMs(model, newTokens, call.cachedAtBest) +
    decodeWorkMs(model, call.promptTokens, call.maxTokens)
  );
}

function prefillWorkMs(model: StepModel, newTokens: number, cachedTokens: number): number {
  // Chunking does not change the sum: Σ t_i·(s_i + t_i/2) = t·(s + t/2).
  return model.cPrefill * newTokens + model.cPfattn * newTokens * (cachedTokens + newTokens / 2);
}

function decodeWorkMs(model: StepModel, promptTokens: number, outputTokens: number): number {
  const steps = Math.max(0, outputTokens - 1);
  return steps * model.cDec + model.cKv * (steps * promptTokens + (steps * (steps + 1)) / 2);
}

/** Total work of a workload's unique tokens, ms (shared prefixes counted once). */
export function workloadWorkMs(model: StepModel, workload: Workload): number {
  let total = 0;
  for (const shared of workload.sharedPrefills) total += prefillWorkMs(model, shared.tokens, 0);
  for (const call of workload.calls) total += callWorkMs(model, call);
  return total;
}

/** The `bound` row's numbers. */
export interface LowerBound {
  /** max(critical path, work ÷ replicas), s. */
  makespanS: number;
  /** Longest chain of calls at batch-1 speed with its arrival, tool and think times, s. */
  criticalPathS: number;
  /** All unique work spread perfectly over the replicas, s. */
  workS: number;
  ttftMs: number[];
  tpotMs: number[];
  /** Each session's completion alone on a replica (first arrival to last end at batch-1 speed), s. */
  sessionCompletionS: number[];
}

/**
 * the documented lower bound on makespan: the larger of (a) the longest chain of
 * dependent calls, each at batch-1 speed with an ideal prefix cache, plus its
 * arrival time and tool waits, and (b) the work of every unique token spread
 * perfectly over the replicas. No schedule on these replicas can finish
 * sooner; how far a policy lands above it is its price.
 */
export function lowerBound(model: StepModel, workload: Workload, replicas: number): LowerBound {
  const endMs = new Float64Array(workload.calls.length);
  const ttftMs: number[] = [];
  const tpotMs: number[] = [];
  let criticalMs = 0;
  const sessions = new Map<string, { startMs: number; endMs: number }>();
  for (const call of workload.calls) {
    const alone = batch1CallMs(model, call);
    const ready = Math.max(call.arrivalMs, call.after === undefined ? 0 : endMs[call.after]! + call.gapMs);
    const end = ready + alone.totalMs;
    endMs[call.index] = end;
    if (end > criticalMs) criticalMs = end;
    ttftMs.push(alone.ttftMs);
    if (call.maxTokens > 1) tpotMs.push(alone.tpotMs);
    const key = call.sessionId ?? `call:${call.id}`;
    const session = sessions.get(key) ?? { startMs: call.arrivalMs, endMs: end };
    session.startMs = Math.min(session.startMs, call.arrivalMs);
    session.endMs = Math.max(session.endMs, end);
    sessions.set(key, session);
  }
  const workMs = workloadWorkMs(model, workload) / Math.max(1, replicas);
  return {
    makespanS: Math.max(criticalMs, workMs) / 1000,
    criticalPathS: criticalMs / 1000,
    workS: workMs / 1000,
    ttftMs,
    tpotMs,
    sessionCompletionS: [...sessions.values()].map((s) => (s.endMs - s.startMs) / 1000),
  };
}

/**
 * Requests per second a fleet could sustain for a mix of calls if every
 * replica were perfectly batched (the work model of `callWorkMs`): an upper
 * estimate of sustainable load, so a multiple of it is at least that much
 * overload.
 */
export function idealCapacityRps(model: StepModel, calls: readonly PlannedCall[], replicas: number): number {
  if (calls.length === 0) return 0;
  let work = 0;
  for (const call of calls) work += callWorkMs(model, call);
  return (replicas * 1000) / (work / calls.length);
}
