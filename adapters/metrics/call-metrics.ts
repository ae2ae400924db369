/**
 * @module The per-call metrics (docs/metrics.md): routing decisions, calls by outcome, refusals by
 * reason, the size and latency histograms, and what calls that ran to their end served. Fed by
 * the scheduler's events and the transports; every lane and reason series exists from the start.
 */

import { Counter, Histogram, type Registry } from "prom-client";
import { REFUSAL_STATUS } from "../../src/errors.js";

/** End-to-end request latency buckets in seconds (vLLM's `e2e_request_latency_seconds` range). */
export const E2E_BUCKETS: readonly number[] = [
  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680,
];
/** Token-count buckets: powers of two from 64 to 256k tokens. */
export const TOKEN_BUCKETS: readonly number[] = Array.from({ length: 13 }, (_, i) => 64 * 2 ** i);
/** Latency buckets in seconds, from 5 ms to 10 min. */
export const SECONDS_BUCKETS: readonly number[] = [
  0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
];
/** Inter-token gap buckets in seconds, from 1 ms to 2 s. */
export const INTER_TOKEN_BUCKETS: readonly number[] = [
  0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2,
];

export const LANES = ["interactive", "bulk"] as const;
const OUTCOMES = ["ok", "error", "cancelled"] as const;
const ROUTE_REASONS = ["pinned", "prefix", "load", "affinity_break"] as const;
/** Every reason docs/http-api.md names, so each refusal series exists (at zero) before the first refusal. */
export const REFUSAL_REASONS = Object.keys(REFUSAL_STATUS) as readonly string[];

/** Label value for a refusal that happened before the call had a lane. */
export const NO_LANE = "none";

/** Registers the routing, outcome, refusal and per-call histogram metrics, every lane and reason at zero. */
export function registerCallMetrics(registry: Registry) {
  const routeDecisions = new Counter({
    name: "sluice_route_decisions_total",
    help: "Routing decisions by reason.",
    labelNames: ["reason"],
    registers: [registry],
  });
  for (const reason of ROUTE_REASONS) routeDecisions.inc({ reason }, 0);
  const predictedHit = new Counter({
    name: "sluice_route_predicted_hit_tokens_total",
    help: "Prompt tokens the router predicted to be cached on the chosen replica.",
    registers: [registry],
  });
  const promptTokens = new Counter({
    name: "sluice_route_prompt_tokens_total",
    help: "Prompt tokens of routed calls.",
    registers: [registry],
  });
  const requests = new Counter({
    name: "sluice_requests_total",
    help: "Calls by lane and outcome (ok, error, cancelled, rejected).",
    labelNames: ["lane", "outcome"],
    registers: [registry],
  });
  for (const lane of LANES) for (const outcome of OUTCOMES) requests.inc({ lane, outcome }, 0);
  const rejections = new Counter({
    name: "sluice_rejections_total",
    help: "Refusals by reason and lane (lane 'none' when refused before classification).",
    labelNames: ["reason", "lane"],
    registers: [registry],
  });
  for (const reason of REFUSAL_REASONS) {
    for (const lane of reason === "overflow" ? ["overflow"] : [...LANES, NO_LANE])
      rejections.inc({ reason, lane }, 0);
  }
  for (const lane of [...LANES, NO_LANE, "overflow"]) requests.inc({ lane, outcome: "rejected" }, 0);
  const inputTokens = new Histogram({
    name: "sluice_input_tokens",
    help: "Input tokens per call, by lane.",
    labelNames: ["lane"],
    buckets: [...TOKEN_BUCKETS],
    registers: [registry],
  });
  const outputTokens = new Histogram({
    name: "sluice_requested_output_tokens",
    help: "Requested output tokens (max_tokens, or the default) per call, by lane.",
    labelNames: ["lane"],
    buckets: [...TOKEN_BUCKETS],
    registers: [registry],
  });
  const queueWait = new Histogram({
    name: "sluice_queue_wait_seconds",
    help: "Time an admitted call waited for admission (session window and gate queue), seconds.",
    labelNames: ["lane"],
    buckets: [...SECONDS_BUCKETS],
    registers: [registry],
  });
  const ttft = new Histogram({
    name: "sluice_time_to_first_token_seconds",
    help: "Time to first token from arrival at sluice, seconds.",
    labelNames: ["lane"],
    buckets: [...SECONDS_BUCKETS],
    registers: [registry],
  });
  const interToken = new Histogram({
    name: "sluice_inter_token_seconds",
    help: "Mean gap between generated tokens of a finished call (one observation per call), seconds.",
    labelNames: ["lane"],
    buckets: [...INTER_TOKEN_BUCKETS],
    registers: [registry],
  });
  for (const lane of LANES) {
    for (const histogram of [inputTokens, outputTokens, queueWait, ttft, interToken])
      histogram.zero({ lane });
  }
  return {
    routeDecisions,
    predictedHit,
    promptTokens,
    requests,
    rejections,
    inputTokens,
    outputTokens,
    queueWait,
    ttft,
    interToken,
  };
}

/** Registers what calls that ran to their end served, and routing per replica; `replicas` start at zero. */
export function registerCompletionMetrics(registry: Registry, replicas: readonly string[]) {
  const e2e = new Histogram({
    name: "sluice_e2e_request_latency_seconds",
    help: "Duration of a call that ran to its end, from arrival at sluice to its last byte, seconds.",
    labelNames: ["lane", "model"],
    buckets: [...E2E_BUCKETS],
    registers: [registry],
  });
  const perOutputToken = new Histogram({
    name: "sluice_time_per_output_token_seconds",
    help: "Mean time per generated token after the first, one observation per call, seconds.",
    labelNames: ["lane"],
    buckets: [...INTER_TOKEN_BUCKETS],
    registers: [registry],
  });
  const generationTokens = new Counter({
    name: "sluice_generation_tokens_total",
    help: "Tokens generated by calls that ran to their end.",
    labelNames: ["lane", "model"],
    registers: [registry],
  });
  const promptTokensServed = new Counter({
    name: "sluice_prompt_tokens_total",
    help: "Prompt tokens of calls that ran to their end.",
    labelNames: ["lane", "model"],
    registers: [registry],
  });
  const cacheQueries = new Counter({
    name: "sluice_replica_prefix_cache_queries_tokens_total",
    help: "Prompt tokens looked up in a replica's prefix cache (calls that ran to their end).",
    labelNames: ["replica"],
    registers: [registry],
  });
  const cacheHits = new Counter({
    name: "sluice_replica_prefix_cache_hits_tokens_total",
    help: "Prompt tokens a replica served from its prefix cache (calls that ran to their end).",
    labelNames: ["replica"],
    registers: [registry],
  });
  const routePredictedByReplica = new Counter({
    name: "sluice_route_replica_predicted_hit_tokens_total",
    help: "Prompt tokens the router predicted cached, per chosen replica.",
    labelNames: ["replica"],
    registers: [registry],
  });
  const routePromptByReplica = new Counter({
    name: "sluice_route_replica_prompt_tokens_total",
    help: "Prompt tokens of routed calls, per chosen replica.",
    labelNames: ["replica"],
    registers: [registry],
  });
  for (const lane of LANES) perOutputToken.zero({ lane });
  for (const replica of replicas) {
    const labels = { replica };
    cacheQueries.inc(labels, 0);
    cacheHits.inc(labels, 0);
    routePredictedByReplica.inc(labels, 0);
    routePromptByReplica.inc(labels, 0);
  }
  return {
    e2e,
    perOutputToken,
    generationTokens,
    promptTokensServed,
    cacheQueries,
    cacheHits,
    routePredictedByReplica,
    routePromptByReplica,
  };
}
