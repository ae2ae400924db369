/** @module Prometheus metrics of jobs: batch lines answered, refusals waited out, work in flight, idempotency keys. */

import { Counter, Gauge, type Registry } from "prom-client";

/** What the runner reports as it goes. */
export interface JobEvents {
  /** A batch line or asynchronous call got its answer (`completed`: 2xx; `failed`: any other). */
  answered(kind: "line" | "async", outcome: "completed" | "failed"): void;
  /** A run was refused for now (or its engine failed) and will try again; `reason` is the refusal's. */
  retried(reason: string): void;
}

/** What the gauges read at scrape time. */
export interface JobGaugeSources {
  running(): number;
  activeBatches(): number;
  idempotencyKeys(): { running: number; stored: number };
}

/** Events that record nothing (no registry). */
export const NO_JOB_EVENTS: JobEvents = { answered() {}, retried() {} };

/**
 * Registers the job metrics. Labels are bounded: a kind, an outcome, a refusal reason — never a
 * batch, line or key.
 */
export function registerJobMetrics(registry: Registry, sources: JobGaugeSources): JobEvents {
  const answered = new Counter({
    name: "sluice_job_calls_total",
    help: "Batch lines and asynchronous calls answered, by kind (line | async) and outcome (completed: 2xx; failed: other).",
    labelNames: ["kind", "outcome"],
    registers: [registry],
  });
  for (const kind of ["line", "async"]) {
    for (const outcome of ["completed", "failed"]) answered.inc({ kind, outcome }, 0);
  }
  const retried = new Counter({
    name: "sluice_job_retries_total",
    help: "Runs of batch lines and asynchronous calls refused for now (or whose engine failed) and tried again, by reason.",
    labelNames: ["reason"],
    registers: [registry],
  });
  new Gauge({
    name: "sluice_job_calls_running",
    help: "Batch lines and asynchronous calls running now (waiting out a refusal included).",
    registers: [registry],
    collect() {
      this.set(sources.running());
    },
  });
  new Gauge({
    name: "sluice_batches_active",
    help: "Batches validating, in progress, finalizing or cancelling.",
    registers: [registry],
    collect() {
      this.set(sources.activeBatches());
    },
  });
  new Gauge({
    name: "sluice_idempotency_keys",
    help: "Idempotency keys: running (first request not ended) and stored (response kept).",
    labelNames: ["state"],
    registers: [registry],
    collect() {
      const keys = sources.idempotencyKeys();
      this.set({ state: "running" }, keys.running);
      this.set({ state: "stored" }, keys.stored);
    },
  });
  return {
    answered: (kind, outcome) => answered.inc({ kind, outcome }),
    retried: (reason) => retried.inc({ reason }),
  };
}
