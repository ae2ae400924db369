/** @module Lane classification by declared intent and tokenized size (docs/library.md and docs/how-it-works.md#token-budget-and-feasibility). */

import type { Lane, LaneClass } from "../types.js";

/** Size limits that decide a call's lane, in tokens. */
export interface LaneLimits {
  /** Largest prompt an interactive call may have, tokens. */
  interactiveMaxInputTokens: number;
  /** Largest `max_tokens` an interactive call may ask for, tokens. */
  interactiveMaxOutputTokens: number;
  /** Largest `input + max_tokens` any call may have before it is `overflow`, tokens (the server passes the context window). */
  bulkMaxTotalTokens: number;
}

/** docs/how-it-works.md#token-budget-and-feasibility defaults: interactive up to 4096 input and 1024 output tokens; no bulk limit. */
export const DEFAULT_LANE_LIMITS: Readonly<LaneLimits> = Object.freeze({
  interactiveMaxInputTokens: 4096,
  interactiveMaxOutputTokens: 1024,
  bulkMaxTotalTokens: Number.POSITIVE_INFINITY,
});

/** What classification needs to know about a call. */
export interface LaneRequest {
  /** Prompt tokens as sluice's tokenizer counted them. */
  inputTokens: number;
  /** Requested output tokens (`max_tokens`, or the route's default when absent). */
  maxOutputTokens: number;
  /** The client's declared intent (`x-sluice-lane`); it can only make a call bulk, never interactive. */
  declared?: Lane;
}

function checkLimit(name: keyof LaneLimits, value: number, allowInfinity: boolean): void {
  const ok =
    typeof value === "number" && value >= 0 && (Number.isFinite(value) || (allowInfinity && value > 0));
  if (!ok) throw new RangeError(`lane limit ${name} should be a non-negative number of tokens, got ${value}`);
}

/** Fills in defaults and checks every limit once; throws `RangeError` naming the bad value. */
export function resolveLaneLimits(limits: Partial<LaneLimits> = {}): LaneLimits {
  const resolved: LaneLimits = {
    interactiveMaxInputTokens:
      limits.interactiveMaxInputTokens ?? DEFAULT_LANE_LIMITS.interactiveMaxInputTokens,
    interactiveMaxOutputTokens:
      limits.interactiveMaxOutputTokens ?? DEFAULT_LANE_LIMITS.interactiveMaxOutputTokens,
    bulkMaxTotalTokens: limits.bulkMaxTotalTokens ?? DEFAULT_LANE_LIMITS.bulkMaxTotalTokens,
  };
  checkLimit("interactiveMaxInputTokens", resolved.interactiveMaxInputTokens, false);
  checkLimit("interactiveMaxOutputTokens", resolved.interactiveMaxOutputTokens, false);
  checkLimit("bulkMaxTotalTokens", resolved.bulkMaxTotalTokens, true);
  return resolved;
}

function checkCount(name: string, value: number): void {
  if (!(typeof value === "number" && Number.isFinite(value) && value >= 0)) {
    throw new RangeError(`${name} should be a non-negative number of tokens, got ${value}`);
  }
}

function classifyResolved(req: LaneRequest, limits: LaneLimits): LaneClass {
  checkCount("inputTokens", req.inputTokens);
  checkCount("maxOutputTokens", req.maxOutputTokens);
  if (req.declared !== undefined && req.declared !== "interactive" && req.declared !== "bulk") {
    throw new RangeError(`declared lane should be "interactive" or "bulk", got ${String(req.declared)}`);
  }
  // Overflow is decided first: no declaration can rescue a call no replica could hold.
  if (req.inputTokens + req.maxOutputTokens > limits.bulkMaxTotalTokens) return "overflow";
  // Size decides, never the client's wish alone: declaring "interactive" cannot promote a large call.
  const small =
    req.inputTokens <= limits.interactiveMaxInputTokens &&
    req.maxOutputTokens <= limits.interactiveMaxOutputTokens;
  return small && req.declared !== "bulk" ? "interactive" : "bulk";
}

/**
 * The lane of a call: `interactive` when its input and `max_tokens` are within
 * the interactive limits and it does not declare `bulk`; `overflow` when
 * `input + max_tokens` exceeds `bulkMaxTotalTokens` (refused with 413); `bulk`
 * otherwise. Limits are validated on every call; hot paths use `createLaneClassifier`.
 */
export function classifyLane(req: LaneRequest, limits?: Partial<LaneLimits>): LaneClass {
  return classifyResolved(req, limits === undefined ? DEFAULT_LANE_LIMITS : resolveLaneLimits(limits));
}

/** `classifyLane` with its limits validated once, for the request path. */
export function createLaneClassifier(limits?: Partial<LaneLimits>): (req: LaneRequest) => LaneClass {
  const resolved = resolveLaneLimits(limits);
  return function classify(req: LaneRequest): LaneClass {
    return classifyResolved(req, resolved);
  };
}
