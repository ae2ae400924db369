/**
 * @module Prometheus metrics of docs/metrics.md on an injected registry: gauges read from snapshots,
 * counters fed by scheduler events. The series are defined by concern (`replica-gauges.ts`,
 * `call-metrics.ts`, `session-metrics.ts`, `disaggregated-metrics.ts`, `gate-metrics.ts`,
 * `tenant-metrics.ts`); this file registers them in one order and wires the events.
 */

import { createRequire } from "node:module";
import { collectDefaultMetrics, Gauge, type Registry } from "prom-client";
import type { AdminState, Lane, LaneClass, SchedulerEvents } from "../../src/types.js";
import { NO_LANE, registerCallMetrics, registerCompletionMetrics } from "./call-metrics.js";
import { registerDisaggregatedMetrics } from "./disaggregated-metrics.js";
import { registerGateMetrics } from "./gate-metrics.js";
import { registerFleetGauges, registerReplicaGauges } from "./replica-gauges.js";
import { registerInferenceMetric, registerSessionMetrics } from "./session-metrics.js";
import { registerTenantMetrics } from "./tenant-metrics.js";

export {
  E2E_BUCKETS,
  INTER_TOKEN_BUCKETS,
  REFUSAL_REASONS,
  SECONDS_BUCKETS,
  TOKEN_BUCKETS,
} from "./call-metrics.js";
export { RETENTION_BUCKETS } from "./session-metrics.js";

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

  // Registration order is exposition order: the groups below keep the page's order stable.
  registerReplicaGauges(registry, snapshot);
  registerFleetGauges(registry, snapshot);
  const calls = registerCallMetrics(registry);
  // Per-replica series start at zero for every replica known at start-up.
  const replicas = scheduler.state().replicas.map((replica) => replica.id);
  const sessions = registerSessionMetrics(registry, replicas);
  const served = registerCompletionMetrics(registry, replicas);
  const disaggregated = registerDisaggregatedMetrics(registry, snapshot);
  const inference = registerInferenceMetric(registry);

  const recordRefusal = (e: { reason: string; lane: LaneClass | undefined }) => {
    const lane = e.lane ?? NO_LANE;
    calls.rejections.inc({ reason: e.reason, lane });
    calls.requests.inc({ lane, outcome: "rejected" });
  };

  const recordCompletion = (e: CompletedCall) => {
    const labels = { lane: e.lane, model: e.model };
    served.e2e.observe(labels, Math.max(0, e.durationMs) / 1000);
    served.generationTokens.inc(labels, Math.max(0, e.completionTokens));
    served.promptTokensServed.inc(labels, Math.max(0, e.promptTokens));
    served.cacheQueries.inc({ replica: e.replica }, Math.max(0, e.promptTokens));
    served.cacheHits.inc({ replica: e.replica }, Math.max(0, Math.min(e.cachedTokens, e.promptTokens)));
  };

  const events: SchedulerEvents = {
    inference(e) {
      inference.inc({ outcome: e.outcome });
    },
    wastedPrefill(e) {
      disaggregated.wastedPrefill.inc({ replica: e.replica }, Math.max(0, e.tokens));
      disaggregated.refusedAfterPrefill.inc({ reason: e.reason });
    },
    arrival(e) {
      calls.inputTokens.observe({ lane: e.lane }, e.inputTokens);
      calls.outputTokens.observe({ lane: e.lane }, e.maxTokens);
    },
    refusal(e) {
      recordRefusal(e);
    },
    route(e) {
      calls.routeDecisions.inc({ reason: e.reason });
      calls.predictedHit.inc(Math.max(0, e.predictedHitTokens));
      calls.promptTokens.inc(Math.max(0, e.promptTokens));
      served.routePredictedByReplica.inc({ replica: e.replica }, Math.max(0, e.predictedHitTokens));
      served.routePromptByReplica.inc({ replica: e.replica }, Math.max(0, e.promptTokens));
    },
    admitted(e) {
      calls.queueWait.observe({ lane: e.lane }, Math.max(0, e.queueWaitMs) / 1000);
    },
    firstToken(e) {
      calls.ttft.observe({ lane: e.lane }, Math.max(0, e.ttftMs) / 1000);
    },
    interToken(e) {
      calls.interToken.observe({ lane: e.lane }, Math.max(0, e.meanGapMs) / 1000);
      served.perOutputToken.observe({ lane: e.lane }, Math.max(0, e.meanGapMs) / 1000);
    },
    finished(e) {
      calls.requests.inc({ lane: e.lane, outcome: e.outcome });
    },
    session(e) {
      if (e.event === "dormant" && e.replica !== null) sessions.dormancies.inc({ replica: e.replica });
      tenantMetrics.onSession(e);
    },
    retention(e) {
      sessions.retention.observe({ replica: e.replica }, Math.max(0, e.retentionMs) / 1000);
    },
    window(e) {
      sessions.windowChanges.inc({ replica: e.replica, action: e.action });
    },
  };
  const tenantMetrics = registerTenantMetrics(registry, () => snapshot().tenants);
  scheduler.addEvents(events);

  return { registry, events, recordRefusal, recordCompletion };
}
