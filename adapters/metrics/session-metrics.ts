/**
 * @module The session metrics fed by the scheduler's events (docs/metrics.md): retention times,
 * dormancies and window changes per replica, and session inference's outcomes.
 */

import { Counter, Histogram, type Registry } from "prom-client";

/** Retention-time buckets in seconds, from 1 s to 30 min. */
export const RETENTION_BUCKETS: readonly number[] = [1, 2, 5, 10, 15, 30, 60, 90, 120, 180, 300, 600, 1800];

/** Registers the per-replica session metrics; `replicas` start at zero. */
export function registerSessionMetrics(registry: Registry, replicas: readonly string[]) {
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
  for (const replica of replicas) {
    const labels = { replica };
    retention.zero(labels);
    dormancies.inc(labels, 0);
    for (const action of ["increase", "decrease"]) windowChanges.inc({ ...labels, action }, 0);
  }
  return { retention, dormancies, windowChanges };
}

/** Registers the counter of session inference's outcomes. */
export function registerInferenceMetric(registry: Registry): Counter {
  const inference = new Counter({
    name: "sluice_session_inference_total",
    help: "Calls seen by session inference, by outcome (on: continued, forked, new, ambiguous, keyed, unsupported; shadow: agreed, disagreed, missed, unkeyed).",
    labelNames: ["outcome"],
    registers: [registry],
  });
  return inference;
}
