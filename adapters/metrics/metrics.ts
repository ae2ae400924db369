/** @module Prometheus metrics of docs/metrics.md on an injected registry: gauges read from snapshots, counters fed by scheduler events. */

import { createRequire } from "node:module";
import { Counter, collectDefaultMetrics, Gauge, Histogram, type Registry } from "prom-client";
import { REFUSAL_STATUS } from "../../src/errors.js";
import type { AdminState, Lane, LaneClass, OverloadStage, SchedulerEvents } from "../../src/types.js";
import { registerGateMetrics } from "./gate-metrics.js";
import { registerTenantMetrics } from "./tenant-metrics.js";

/** What the metrics need from the scheduler. */
export interface MetricsScheduler {
  state(): AdminState;
  addEvents(events: SchedulerEvents): void;
  gates(): ReturnType<Parameters<typeof registerGateMetrics>[1]>;
}

/** Metrics registered on one registry, and the hooks that feed them. */
export interface SluiceMetrics {
  readonly registry: Registry;
  /** The hooks attached to the scheduler (exposed so other transports can feed the same counters). */
  readonly events: SchedulerEvents;
  /** Counts a refusal decided outside the scheduler (authentication, body, schema, rate limit). */
  recordRefusal(e: { reason: string; lane: LaneClass | undefined; status: number }): void;
  /** Records a call that ran to its end (the transport knows its result and its duration). */
  recordCompletion(e: CompletedCall): void;
}

/** A call that ended with a result, as the transport that served it saw it. */
export interface CompletedCall {
  lane: Lane;
  replica: string;
  model: string;
  /** From arrival at sluice to the last byte of the result, ms. */
  durationMs: number;
  promptTokens: number;
  /** Prompt tokens the engine served from its prefix cache. */
  cachedTokens: number;
  completionTokens: number;
}

/** Options of `createMetrics`. */
export interface MetricsOptions {
  /** Also register Node's process metrics (`process_*`, `nodejs_*`). Default true. */
  defaultMetrics?: boolean;
  /** Prefix for the default metrics. Default none. */
  defaultMetricsPrefix?: string;
  /** Version shown by `sluice_build_info`. Default: package.json's. */
  version?: string;
}

/** The package's version, read once from package.json. */
export const SLUICE_VERSION: string = (() => {
  try {
    return (
      (createRequire(import.meta.url)("../../package.json") as { version?: string }).version ?? "unknown"
    );
  } catch {
    return "unknown";
  }
})();

/**
 * prom-client's default metrics include gauges named `…_total` (the sums of
 * `nodejs_active_handles` and friends by type), which Prometheus conventions
 * reserve for counters; the per-type gauges carry the same information.
 */
const UNCONVENTIONAL_DEFAULT_METRICS = [
  "nodejs_active_handles_total",
  "nodejs_active_requests_total",
  "nodejs_active_resources_total",
];

/** Retention-time buckets in seconds, from 1 s to 30 min. */
export const RETENTION_BUCKETS: readonly number[] = [1, 2, 5, 10, 15, 30, 60, 90, 120, 180, 300, 600, 1800];
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

const STAGE_NUMBER: Record<OverloadStage, number> = { normal: 0, bulk_paused: 1, shedding: 2 };
const LANES = ["interactive", "bulk"] as const;
const OUTCOMES = ["ok", "error", "cancelled"] as const;
const ROUTE_REASONS = ["pinned", "prefix", "load", "affinity_break"] as const;
/** Every reason docs/http-api.md names, so each refusal series exists (at zero) before the first refusal. */
export const REFUSAL_REASONS = Object.keys(REFUSAL_STATUS) as readonly string[];

/** Label value for a refusal that happened before the call had a lane. */
const NO_LANE = "none";

/**
 * Registers every docs/metrics.md metric (and the gate metrics) on `registry` and
 * attaches event hooks to the scheduler. Per-replica gauges are read from one
 * `scheduler.state()` per scrape. Labels are bounded: replica ids, lanes,
 * reasons, outcomes; never a session or request id.
 */
export function createMetrics(
  registry: Registry,
  scheduler: MetricsScheduler,
  options: MetricsOptions = {},
): SluiceMetrics {
  if (options.defaultMetrics ?? true) {
    collectDefaultMetrics({
      register: registry,
      ...(options.defaultMetricsPrefix ? { prefix: options.defaultMetricsPrefix } : {}),
    });
    for (const name of UNCONVENTIONAL_DEFAULT_METRICS)
      registry.removeSingleMetric(`${options.defaultMetricsPrefix ?? ""}${name}`);
  }
  new Gauge({
    name: "sluice_build_info",
    help: "Always 1; labels say which sluice (version) runs on which Node.js.",
    labelNames: ["version", "node_version"],
    registers: [registry],
  }).set({ version: options.version ?? SLUICE_VERSION, node_version: process.version }, 1);
  registerGateMetrics(registry, () => scheduler.gates());

  // One snapshot per scrape: each gauge's collect() reads it; it is dropped once the scrape's microtasks are done.
  let cached: AdminState | undefined;
  const snapshot = (): AdminState => {
    if (!cached) {
      cached = scheduler.state();
      setImmediate(() => {
        cached = undefined;
      });
    }
    return cached;
  };

  const perReplica = (
    name: string,
    help: string,
    read: (r: AdminState["replicas"][number]) => number | null,
  ) =>
    new Gauge({
      name,
      help,
      labelNames: ["replica"],
      registers: [registry],
      collect() {
        this.reset();
        for (const replica of snapshot().replicas) {
          const value = read(replica);
          if (value !== null && Number.isFinite(value)) this.set({ replica: replica.id }, value);
        }
      },
    });

  perReplica(
    "sluice_session_window",
    "Sessions the window of a replica holds (the token window), or W of the session-count law; absent when the policy has no window.",
    (r) => r.window.size,
  );
  perReplica(
    "sluice_session_window_tokens",
    "Token window W of a replica: the KV tokens its active sessions may hold (docs/how-it-works.md#session-window-tokens-of-cache-footprint).",
    (r) => r.window.sizeTokens,
  );
  perReplica(
    "sluice_session_footprint_tokens",
    "Sum of the footprints (context plus expected next growth) of a replica's active sessions, tokens.",
    (r) => r.window.footprintTokens,
  );
  perReplica(
    "sluice_sessions_idle",
    "Active sessions between steps (running tools) on a replica; they keep their place for their retention time.",
    (r) => r.window.idle,
  );
  perReplica(
    "sluice_sessions_dormant",
    "Idle sessions that left a replica's window after their retention time; they keep their pin.",
    (r) => r.window.dormant,
  );
  perReplica(
    "sluice_sessions_active",
    "Active sessions per replica (running a step or idle between steps).",
    (r) => r.window.active,
  );
  perReplica(
    "sluice_sessions_paused",
    "Sessions paused per replica because the window shrank.",
    (r) => r.window.paused,
  );
  perReplica(
    "sluice_sessions_waiting",
    "Sessions waiting for room in a replica's window.",
    (r) => r.window.waiting,
  );
  // A signal the engine does not publish has no series (docs/engines.md): never a stand-in 0.
  const measured = (r: AdminState["replicas"][number], field: string, value: number): number | null =>
    r.engine?.unknown.includes(field) ? null : value;
  perReplica(
    "sluice_replica_kv_usage",
    "KV cache usage of a replica (0-1), excluding evictable cache; absent when the engine does not publish it.",
    (r) => measured(r, "kvUsage", r.signals.kvUsage),
  );
  perReplica(
    "sluice_replica_prefix_hit_rate",
    "Token-weighted prefix cache hit rate of a replica over the last control interval (0-1); absent when the engine does not publish its prefix-cache counters.",
    (r) => measured(r, "prefixCache", r.signals.hitRate),
  );
  perReplica(
    "sluice_replica_kv_usage_ratio",
    "KV cache usage of a replica (0-1), excluding evictable cache; the same value as sluice_replica_kv_usage.",
    (r) => measured(r, "kvUsage", r.signals.kvUsage),
  );
  perReplica(
    "sluice_replica_prefix_cache_hit_ratio",
    "Token-weighted prefix cache hit rate of a replica over the last control interval (0-1); the same value as sluice_replica_prefix_hit_rate.",
    (r) => measured(r, "prefixCache", r.signals.hitRate),
  );
  perReplica(
    "sluice_replica_engine_stated_hit_rate",
    "The prefix cache hit rate the engine states on its own gauge (0-1: SGLang's cache_hit_rate, vLLM V0's gpu_prefix_cache_hit_rate); absent when it states none.",
    (r) => r.engine?.statedHitRate ?? null,
  );
  perReplica("sluice_replica_healthy", "1 when the replica's signals are fresh and it is reachable.", (r) =>
    r.healthy ? 1 : 0,
  );
  perReplica(
    "sluice_replica_busy",
    "1 while a worker-wide gate rejection keeps new calls away (1 s).",
    (r) => (r.busy ? 1 : 0),
  );
  perReplica("sluice_replica_signal_age_seconds", "Age of the replica's latest signals, seconds.", (r) =>
    r.signals.ageMs >= 0 ? r.signals.ageMs / 1000 : null,
  );
  perReplica(
    "sluice_replica_running_requests",
    "Calls the engine reports running; absent when it does not publish them.",
    (r) => measured(r, "running", r.signals.running),
  );
  perReplica(
    "sluice_replica_waiting_requests",
    "Calls the engine reports waiting; absent when it does not publish them.",
    (r) => measured(r, "waiting", r.signals.waiting),
  );
  perReplica(
    "sluice_replica_token_ceiling",
    "Token budget ceiling of a replica, tokens; absent while the budget is off (no KV capacity known).",
    (r) => (r.engine?.tokenBudget === false ? null : r.budget.ceilingTokens),
  );
  perReplica(
    "sluice_replica_reserved_tokens",
    "Tokens reserved by active and queued calls on a replica.",
    (r) => r.budget.reservedTokens,
  );
  perReplica(
    "sluice_replica_available_tokens",
    "Tokens still reservable on a replica (ceiling - reserved - guard band); absent while the budget is off.",
    (r) => (r.engine?.tokenBudget === false ? null : r.budget.availableTokens),
  );
  perReplica(
    "sluice_budget_queue_calls",
    "Calls waiting for token budget on a replica (interactive and bulk).",
    (r) => (r.budget.queue ? r.budget.queue.interactive + r.budget.queue.bulk : null),
  );
  perReplica(
    "sluice_budget_queue_tokens",
    "Tokens the calls waiting for budget on a replica need.",
    (r) => r.budget.queue?.tokens ?? null,
  );
  perReplica(
    "sluice_budget_queue_oldest_age_seconds",
    "Wait of the oldest call waiting for token budget on a replica, seconds.",
    (r) => (r.budget.queue ? r.budget.queue.oldestWaitMs / 1000 : null),
  );
  perReplica(
    "sluice_queued_prefill_tokens",
    "Prefill tokens of calls queued for a replica.",
    (r) => r.queuedPrefillTokens,
  );
  perReplica(
    "sluice_inflight_prefill_tokens",
    "Prefill tokens of admitted calls not yet past their first token.",
    (r) => r.inflightPrefillTokens,
  );

  new Gauge({
    name: "sluice_queue_oldest_age_seconds",
    help: "Age of the oldest queued call per lane (max over replicas), seconds.",
    labelNames: ["lane"],
    registers: [registry],
    collect() {
      const state = snapshot();
      for (const lane of LANES) {
        let oldest = 0;
        for (const replica of state.replicas)
          oldest = Math.max(oldest, replica.lanes[lane]?.oldestAgeMs ?? 0);
        this.set({ lane }, oldest / 1000);
      }
    },
  });
  new Gauge({
    name: "sluice_queue_depth",
    help: "Calls queued per lane (sum over replicas).",
    labelNames: ["lane"],
    registers: [registry],
    collect() {
      const state = snapshot();
      for (const lane of LANES) {
        let queued = 0;
        for (const replica of state.replicas) queued += replica.lanes[lane]?.queued ?? 0;
        this.set({ lane }, queued);
      }
    },
  });
  new Gauge({
    name: "sluice_overload_stage",
    help: "Overload stage: 0 normal, 1 bulk_paused, 2 shedding.",
    registers: [registry],
    collect() {
      this.set(STAGE_NUMBER[snapshot().stage] ?? 0);
    },
  });
  new Gauge({
    name: "sluice_sessions",
    help: "Sessions known to the scheduler by state (fleet-wide).",
    labelNames: ["state"],
    registers: [registry],
    collect() {
      const sessions = snapshot().sessions;
      this.set({ state: "waiting" }, sessions.waiting);
      this.set({ state: "active" }, sessions.active);
      this.set({ state: "paused" }, sessions.paused);
      this.set({ state: "idle" }, sessions.idle);
      this.set({ state: "dormant" }, sessions.dormant);
    },
  });

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

  const retention = new Histogram({
    name: "sluice_session_retention_seconds",
    help: "Retention times given to idle sessions (how long one keeps its place before it may go dormant), seconds.",
    labelNames: ["replica"],
    buckets: [...RETENTION_BUCKETS],
    registers: [registry],
  });
  const dormancies = new Counter({
    name: "sluice_session_dormancies_total",
    help: "Idle sessions that went dormant (left the window, kept their pin), per replica.",
    labelNames: ["replica"],
    registers: [registry],
  });
  const windowChanges = new Counter({
    name: "sluice_session_window_changes_total",
    help: "Changes of a replica's window W by the window law, by direction.",
    labelNames: ["replica", "action"],
    registers: [registry],
  });
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
  // Per-replica series start at zero for every replica known at start-up.
  for (const replica of scheduler.state().replicas) {
    const labels = { replica: replica.id };
    retention.zero(labels);
    dormancies.inc(labels, 0);
    cacheQueries.inc(labels, 0);
    cacheHits.inc(labels, 0);
    routePredictedByReplica.inc(labels, 0);
    routePromptByReplica.inc(labels, 0);
    for (const action of ["increase", "decrease"]) windowChanges.inc({ ...labels, action }, 0);
  }

  const recordRefusal = (e: { reason: string; lane: LaneClass | undefined }) => {
    const lane = e.lane ?? NO_LANE;
    rejections.inc({ reason: e.reason, lane });
    requests.inc({ lane, outcome: "rejected" });
  };

  const recordCompletion = (e: CompletedCall) => {
    const labels = { lane: e.lane, model: e.model };
    e2e.observe(labels, Math.max(0, e.durationMs) / 1000);
    generationTokens.inc(labels, Math.max(0, e.completionTokens));
    promptTokensServed.inc(labels, Math.max(0, e.promptTokens));
    cacheQueries.inc({ replica: e.replica }, Math.max(0, e.promptTokens));
    cacheHits.inc({ replica: e.replica }, Math.max(0, Math.min(e.cachedTokens, e.promptTokens)));
  };

  // Disaggregated fleets: each replica's role, and the prefill spent on calls refused after it.
  new Gauge({
    name: "sluice_replica_role_info",
    help: "Role of a replica in a disaggregated fleet (value 1; role prefill or decode); absent for a fleet of one pool.",
    labelNames: ["replica", "role"],
    registers: [registry],
    collect() {
      this.reset();
      for (const replica of snapshot().replicas) {
        if (replica.role) this.set({ replica: replica.id, role: replica.role }, 1);
      }
    },
  });
  const wastedPrefill = new Counter({
    name: "sluice_disagg_wasted_prefill_tokens_total",
    help: "Uncached prompt tokens prefilled for calls then refused or failed before their decode started, by prefill replica.",
    labelNames: ["replica"],
    registers: [registry],
  });
  const refusedAfterPrefill = new Counter({
    name: "sluice_disagg_refused_after_prefill_total",
    help: "Calls refused or failed after their prefill ran, by reason.",
    labelNames: ["reason"],
    registers: [registry],
  });

  const inference = new Counter({
    name: "sluice_session_inference_total",
    help: "Calls seen by session inference, by outcome (on: continued, forked, new, ambiguous, keyed, unsupported; shadow: agreed, disagreed, missed, unkeyed).",
    labelNames: ["outcome"],
    registers: [registry],
  });

  const events: SchedulerEvents = {
    inference(e) {
      inference.inc({ outcome: e.outcome });
    },
    wastedPrefill(e) {
      wastedPrefill.inc({ replica: e.replica }, Math.max(0, e.tokens));
      refusedAfterPrefill.inc({ reason: e.reason });
    },
    arrival(e) {
      inputTokens.observe({ lane: e.lane }, e.inputTokens);
      outputTokens.observe({ lane: e.lane }, e.maxTokens);
    },
    refusal(e) {
      recordRefusal(e);
    },
    route(e) {
      routeDecisions.inc({ reason: e.reason });
      predictedHit.inc(Math.max(0, e.predictedHitTokens));
      promptTokens.inc(Math.max(0, e.promptTokens));
      routePredictedByReplica.inc({ replica: e.replica }, Math.max(0, e.predictedHitTokens));
      routePromptByReplica.inc({ replica: e.replica }, Math.max(0, e.promptTokens));
    },
    admitted(e) {
      queueWait.observe({ lane: e.lane }, Math.max(0, e.queueWaitMs) / 1000);
    },
    firstToken(e) {
      ttft.observe({ lane: e.lane }, Math.max(0, e.ttftMs) / 1000);
    },
    interToken(e) {
      interToken.observe({ lane: e.lane }, Math.max(0, e.meanGapMs) / 1000);
      perOutputToken.observe({ lane: e.lane }, Math.max(0, e.meanGapMs) / 1000);
    },
    finished(e) {
      requests.inc({ lane: e.lane, outcome: e.outcome });
    },
    session(e) {
      if (e.event === "dormant" && e.replica !== null) dormancies.inc({ replica: e.replica });
      tenantMetrics.onSession(e);
    },
    retention(e) {
      retention.observe({ replica: e.replica }, Math.max(0, e.retentionMs) / 1000);
    },
    window(e) {
      windowChanges.inc({ replica: e.replica, action: e.action });
    },
  };
  const tenantMetrics = registerTenantMetrics(registry, () => snapshot().tenants);
  scheduler.addEvents(events);

  return { registry, events, recordRefusal, recordCompletion };
}
