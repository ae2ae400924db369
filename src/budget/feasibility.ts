/** @module Feasibility: predicted time to first token against the call's and its lane's deadline (docs/how-it-works.md#token-budget-and-feasibility). */

import { Refusal } from "../errors.js";
import { predictTtftMs as placementTtftMs } from "../routing/placement.js";
import type { Lane } from "../types.js";

/** What a time-to-first-token prediction needs. Token counts, not request counts: one long prompt ahead weighs as much as many short ones. */
export interface TtftInput {
  /** Queued and in-flight prefill tokens ahead of this call on the replica, tokens. */
  prefillTokensAhead: number;
  /** This call's own uncached prefill, tokens. */
  ownPrefillTokens: number;
  /** The replica's measured prefill rate, tokens per second (> 0). */
  prefillTokensPerSecond: number;
  /** The replica's KV usage 0–1, for the placement model's KV-pressure term. Default 0. */
  kvUsage?: number;
  /** Expected wait before the call reaches the engine (session window, gate queue), ms. Default 0. */
  queueWaitMs?: number;
}

function checkNonNegative(name: string, value: number): void {
  if (!(typeof value === "number" && Number.isFinite(value) && value >= 0)) {
    throw new RangeError(`${name} should be a non-negative finite number, got ${value}`);
  }
}

/**
 * Predicted time to first token, ms: the one model placement scores replicas
 * by (`routing/placement.ts`: prefill ahead and own over the measured rate,
 * plus KV pressure), plus any queue wait expected before the engine.
 */
export function predictTtftMs(input: TtftInput): number {
  checkNonNegative("prefillTokensAhead", input.prefillTokensAhead);
  checkNonNegative("ownPrefillTokens", input.ownPrefillTokens);
  const queueWaitMs = input.queueWaitMs ?? 0;
  checkNonNegative("queueWaitMs", queueWaitMs);
  return (
    placementTtftMs({
      uncachedPrefillTokens: input.ownPrefillTokens,
      queuedPrefillTokens: input.prefillTokensAhead,
      inflightPrefillTokens: 0,
      prefillTokensPerSecond: input.prefillTokensPerSecond,
      kvUsage: input.kvUsage ?? 0,
    }) + queueWaitMs
  );
}

/** What `checkDeadline` compares. */
export interface DeadlineCheck {
  /** From `predictTtftMs`, ms. */
  predictedTtftMs: number;
  /** The client's own deadline (`x-sluice-deadline-ms`), ms; undefined for none. */
  deadlineMs?: number | undefined;
  /** The lane's deadline, ms; undefined for none. */
  laneDeadlineMs?: number | undefined;
  lane: Lane;
  /**
   * Retry-After, seconds. Default: the excess of the prediction over the
   * deadline, which is how much backlog must drain before the call could fit.
   * Rounded up, never below 1.
   */
  retryAfterSeconds?: number;
}

function checkDeadlineValue(name: string, value: number | undefined): void {
  if (value === undefined) return;
  if (!(typeof value === "number" && !Number.isNaN(value) && value >= 0)) {
    throw new RangeError(`${name} should be a non-negative number of ms, got ${value}`);
  }
}

/**
 * A 429 `deadline_infeasible` refusal when the predicted time to first token
 * exceeds the tighter of the call's and its lane's deadline; undefined when it
 * fits (a prediction equal to the deadline fits).
 */
export function checkDeadline(check: DeadlineCheck): Refusal | undefined {
  const predicted = check.predictedTtftMs;
  if (!(typeof predicted === "number" && !Number.isNaN(predicted) && predicted >= 0)) {
    throw new RangeError(`predictedTtftMs should be a non-negative number, got ${predicted}`);
  }
  checkDeadlineValue("deadlineMs", check.deadlineMs);
  checkDeadlineValue("laneDeadlineMs", check.laneDeadlineMs);
  const own = check.deadlineMs ?? Number.POSITIVE_INFINITY;
  const lane = check.laneDeadlineMs ?? Number.POSITIVE_INFINITY;
  const deadline = Math.min(own, lane);
  if (predicted <= deadline) return undefined;
  const which = own <= lane ? "the call's deadline" : `the ${check.lane} lane's deadline`;
  return new Refusal(
    "deadline_infeasible",
    `predicted time to first token ${Math.ceil(predicted)} ms exceeds ${which} of ${deadline} ms`,
    {
      status: 429,
      scope: "request",
      lane: check.lane,
      retryAfterSeconds: check.retryAfterSeconds ?? (predicted - deadline) / 1000,
    },
  );
}
