/** @module The plan every workload compiles to: calls with arrival times, dependencies and lazily built prompts. */

import type { Lane } from "../../../src/types.js";

/** A latency objective, in seconds. */
export interface Slo {
  /** Time to first token, s (measured from when the call became ready, retries included). */
  ttftS: number;
  /** Mean time per output token after the first, s. */
  tpotS: number;
}

/**
 * One call the benchmark makes. A call becomes ready at `arrivalMs`, and, when
 * it follows another call (`after`), not before `gapMs` after that call
 * completed — the agent's tool time or the user's think time.
 */
export interface PlannedCall {
  /** Position in `Workload.calls`; calls are listed so that `after` always points backwards. */
  index: number;
  /** Stable id; attempts append `-a<n>`. */
  id: string;
  sessionId?: string;
  declaredLane?: Lane;
  /** Earliest start, ms from the start of the run. */
  arrivalMs: number;
  /** Index of the call that must complete first. */
  after?: number;
  /** Wait after `after` completed, ms. */
  gapMs: number;
  /**
   * When true the prompt is the context of `after` (its prompt and the tokens
   * the engine generated for it) followed by `newTokens()`; otherwise the
   * prompt is `newTokens()` alone.
   */
  extendsAfter: boolean;
  /** The tokens this call adds (or its whole prompt); built only when the call starts. */
  newTokens(): number[];
  /** Expected prompt length, tokens (assuming earlier calls generated their full `maxTokens`). */
  promptTokens: number;
  /** Prompt tokens an ideal prefix cache could already hold when this call starts (for the lower bound). */
  cachedAtBest: number;
  /**
   * The client sends this call's output back without its first n generated tokens (reasoning it
   * drops from the history). Default 0.
   */
  dropsOutputTokens?: number;
  /** Requested (and, in the simulator, generated) output tokens. */
  maxTokens: number;
  slo: Slo;
  /** Whether a refusal with Retry-After is retried after that delay (agents, mooncake) or final (mixed). */
  retry: boolean;
  /** A label to group results by (the lane for `mixed`). */
  group: string;
  /** The tenant the call is made for (`tenants` workloads); none: the fleet's `default` tenant. */
  tenant?: string;
}

/** A prefill computed once for many calls, counted once in the lower bound (e.g. a shared system prompt). */
export interface SharedPrefill {
  tokens: number;
}

/** A workload compiled for one offered load. */
export interface Workload {
  kind: "agents" | "mooncake" | "mixed" | "tenants";
  /** Name shown in outputs: a built-in name or the file it was read from. */
  name: string;
  /** Offered-load multiplier it was compiled at. */
  load: number;
  calls: PlannedCall[];
  sharedPrefills: SharedPrefill[];
  /** Human-readable parameters, for reports. */
  describe: string;
  /** `tenants` workloads: each tenant's weight and band, by name (the scheduler's tenants file). */
  tenants?: Record<string, WorkloadTenant>;
}

/** A tenant of a `tenants` workload. */
export interface WorkloadTenant {
  weight: number;
  band: "protected" | "standard" | "sheddable";
  max_share?: number;
}
