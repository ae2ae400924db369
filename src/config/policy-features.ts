/**
 * @module A policy resolved once into the features it enables. Every step of
 * the request path asks its feature, never the policy's name, so a new policy
 * is one row here.
 */

import type { Policy, WindowUnit } from "./scheduler-config.js";

/** What one policy switches on. */
export interface PolicyFeatures {
  /** How a call without a session pin is placed. */
  readonly placement: "round-robin" | "least-loaded" | "prefix";
  /** The per-rank backend gate (docs/how-it-works.md#per-rank-gate). */
  readonly gate: boolean;
  /** Interactive and bulk lanes inside the gate (docs/how-it-works.md#token-budget-and-feasibility). */
  readonly lanes: boolean;
  /** Per-replica token budget (docs/how-it-works.md#token-budget-and-feasibility). */
  readonly budget: boolean;
  /** Refusal of calls whose predicted TTFT misses their deadline (docs/how-it-works.md#token-budget-and-feasibility). */
  readonly feasibility: boolean;
  /** Overload stages: bulk paused, then shedding (docs/how-it-works.md#token-budget-and-feasibility). */
  readonly overload: boolean;
  /** Session admission through a per-replica window, counted in this unit; null: none (docs/how-it-works.md#session-window-tokens-of-cache-footprint). */
  readonly window: WindowUnit | null;
  /**
   * Host-memory KV tiers seen by placement and the window (docs/tiers.md): the prefix index
   * predicts which blocks a replica holds only in host memory, placement prices them at their load
   * time, and the window counts a dormant session's cache retained there. Off for the baselines,
   * which stand for prefix routing that knows GPU memory alone.
   */
  readonly tiers: boolean;
}

const BASELINE = {
  lanes: false,
  budget: false,
  feasibility: false,
  overload: false,
  window: null,
  tiers: false,
} as const;

/**
 * The features of `policy`. `windowUnit` is the configured unit of sluice's
 * own window; `concur` is CONCUR's session-count law whatever it says.
 */
export function policyFeatures(policy: Policy, windowUnit: WindowUnit): PolicyFeatures {
  switch (policy) {
    case "rr":
      return { ...BASELINE, placement: "round-robin", gate: false };
    case "gate":
      return { ...BASELINE, placement: "least-loaded", gate: true };
    case "gate-prefix":
      return { ...BASELINE, placement: "prefix", gate: true };
    case "concur":
    case "sluice":
      return {
        placement: "prefix",
        gate: true,
        lanes: true,
        budget: true,
        feasibility: true,
        overload: true,
        window: policy === "concur" ? "sessions" : windowUnit,
        tiers: true,
      };
  }
}
