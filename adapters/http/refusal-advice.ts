/** @module What a refusal tells its client to do: the replica and queue time, the limit that bound, and the flag that sets it. */

import type { Refusal } from "../../src/errors.js";
import type { ReplicaState } from "../../src/types.js";
import type { RateStanding } from "./api-keys.js";

/** What the HTTP layer knows about a refused call beyond the refusal itself. */
export interface RefusalFacts {
  /** The replica the call was routed to before it was refused, when it got that far. */
  replica?: string | undefined;
  /** Time the call spent in sluice before the refusal, ms. */
  queueMs?: number | undefined;
  /** The replica's state at the refusal (token budget, gate limits), when known. */
  replicaState?: ReplicaState | undefined;
  /** The caller's rate-limit standing, when its key has a rate limit. */
  rate?: RateStanding | undefined;
}

/** Extra headers and a message that says what to change. */
export interface RefusalAdvice {
  message: string;
  headers: Record<string, string>;
}

/** Reasons whose call will be refused again if sent unchanged, whatever `Retry-After` says. */
const NOT_WORTH_RETRYING_UNCHANGED = new Set(["deadline_infeasible"]);

/** OpenAI's rate-limit headers (`x-ratelimit-*-requests`), as OpenAI and LiteLLM send them. */
export function rateLimitHeaders(rate: RateStanding): Record<string, string> {
  return {
    "x-ratelimit-limit-requests": String(rate.limit),
    "x-ratelimit-remaining-requests": String(Math.max(0, rate.remaining)),
    "x-ratelimit-reset-requests": `${Math.max(0, Math.ceil(rate.resetSeconds * 1000) / 1000)}s`,
  };
}

function thousands(n: number): string {
  return Math.round(n).toLocaleString("en-US");
}

/** The sentence that says what to do, per reason; undefined when the message says enough already. */
function hintFor(refusal: Refusal, facts: RefusalFacts): string | undefined {
  const limits = refusal.limits;
  const where = facts.replica ? `replica ${facts.replica}` : "the replica";
  switch (refusal.reason) {
    case "context_limit": {
      const parts: string[] = [];
      if (limits?.max_total_tokens !== undefined)
        parts.push(`at most ${thousands(limits.max_total_tokens)} tokens of input + max_tokens`);
      if (limits?.max_input_tokens !== undefined)
        parts.push(`${thousands(limits.max_input_tokens)} input tokens with this max_tokens`);
      if (limits?.max_output_tokens !== undefined)
        parts.push(`max_tokens up to ${thousands(limits.max_output_tokens)} with this prompt`);
      const accepted = parts.length > 0 ? `accepted: ${parts.join("; ")}. ` : "";
      return `${accepted}Shorten the prompt or lower max_tokens; do not retry unchanged. The context window is the engine's (or --context-window); a replica's token ceiling comes from its KV capacity.`;
    }
    case "overflow":
      return `accepted: at most ${limits?.max_total_tokens !== undefined ? thousands(limits.max_total_tokens) : "the bulk limit of"} tokens of input + max_tokens (set by --bulk-max-total-tokens). Split the call or lower max_tokens; do not retry unchanged.`;
    case "body_too_large":
      return "Send a smaller body; the limit is set by --body-limit-bytes.";
    case "queue_full":
      return `${where}'s queue is full; retry after Retry-After, or raise --request-queue-limit (per rank).`;
    case "queue_timeout":
      return `The call waited in ${where}'s queue as long as its lane allows; retry after Retry-After, or send bulk work with x-sluice-lane: bulk (longer residence).`;
    case "token_budget_exhausted": {
      const budget = facts.replicaState?.budget;
      const state = budget
        ? ` ${where}: ${thousands(budget.reservedTokens)} tokens reserved of a ceiling of ${thousands(budget.ceilingTokens)} (guard band ${thousands(budget.guardTokens)}), ${thousands(budget.availableTokens)} available.`
        : "";
      return `${state} Retry after Retry-After, or lower max_tokens (the reservation is the uncached prompt plus max_tokens).`.trim();
    }
    case "decode_budget_exhausted":
      return "No decode replica is predicted to have KV room and a batch slot when this call's prefill and KV transfer would be done; nothing was computed. Retry after Retry-After, or lower max_tokens (the decode reservation is the prompt plus max_tokens).";
    case "deadline_infeasible":
      return "Not worth retrying unchanged: the same deadline stays out of reach while the replica is this busy. Raise x-sluice-deadline-ms, send the call as bulk (x-sluice-lane: bulk), or shorten the prompt.";
    case "session_queue_full":
      return "Too many sessions wait for a window; retry after Retry-After, or raise --session-queue-limit.";
    case "worker_overloaded": {
      const limits = facts.replicaState?.gate.limits;
      const set = limits
        ? ` (per rank: ${limits.engineRequestLimit} requests, ${limits.engineRequestWaitingLimit} waiting, ${limits.requestQueueLimit} queued)`
        : "";
      return `Retry after Retry-After; the gate's limits${set} are set by --engine-request-limit, --engine-request-waiting-limit and --request-queue-limit.`;
    }
    case "rate_limited":
      return facts.rate
        ? `This key may make ${facts.rate.limit} call(s) in a burst; see the x-ratelimit-* headers.`
        : undefined;
    default:
      return undefined;
  }
}

/**
 * The advice for one refusal: `x-sluice-replica` and `x-sluice-queue-ms`
 * when known, `x-should-retry: false` (honoured by OpenAI's SDKs) for a
 * refusal that will recur unchanged, `x-ratelimit-*` for rate limits, and a
 * message that names the replica and ends with what to do.
 */
export function adviseRefusal(refusal: Refusal, facts: RefusalFacts): RefusalAdvice {
  const headers: Record<string, string> = {};
  if (facts.replica) headers["x-sluice-replica"] = facts.replica;
  if (facts.queueMs !== undefined && Number.isFinite(facts.queueMs))
    headers["x-sluice-queue-ms"] = String(Math.max(0, Math.round(facts.queueMs)));
  if (NOT_WORTH_RETRYING_UNCHANGED.has(refusal.reason) || (refusal.status >= 400 && refusal.status < 429))
    headers["x-should-retry"] = "false";
  if (facts.rate) Object.assign(headers, rateLimitHeaders(facts.rate));

  let message = refusal.message;
  if (refusal.reason === "worker_overloaded" && facts.replica && !message.includes(facts.replica))
    message = `replica ${facts.replica}: ${message}`;
  const hint = hintFor(refusal, facts);
  if (hint) message = `${message}. ${hint}`;
  return { message, headers };
}
