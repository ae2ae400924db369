/** @module Prometheus metrics of the per-rank gates (docs/metrics.md), read from the gates at scrape time. */

import { Counter, Gauge, type Registry } from "prom-client";
import type { BackendGate } from "../../src/gate/backend-gate.js";

/** A gate and the replica (`worker` label) it guards. */
export interface NamedGate {
  worker: string;
  gate: BackendGate;
}

/** `dp_rank` label value of unranked calls. */
export const UNSPECIFIED_RANK = "unspecified";

/**
 * Registers the gate metrics on `registry`. Every value is read from the gates
 * in `collect()` at scrape time, so the gate needs no per-call hook and a
 * scrape always agrees with `gate.snapshot()` and `gate.counters()`.
 * Sum over `dp_rank` for a worker's totals.
 */
export function registerGateMetrics(registry: Registry, gates: () => Iterable<NamedGate>): void {
  const registers = [registry];
  const rankLabels = ["worker", "dp_rank"] as const;

  // docs/metrics.md fixes the `…_count` names, which Prometheus conventions keep for histograms and summaries
  // (`promtool check metrics` flags them); each is exposed again under a conventional name with the same labels.
  const occupancy = (
    names: { spec: string; conventional: string },
    help: string,
    read: (o: { requests: number; waiting: number; queued: number }) => number,
  ) => {
    for (const name of [names.spec, names.conventional]) {
      new Gauge({
        name,
        help: name === names.spec ? help : `${help} (the conventional name of ${names.spec}).`,
        labelNames: rankLabels,
        registers,
        collect() {
          this.reset();
          for (const { worker, gate } of gates()) {
            const s = gate.snapshot();
            for (const rank of s.ranks) this.set({ worker, dp_rank: String(rank.rank) }, read(rank));
            this.set({ worker, dp_rank: UNSPECIFIED_RANK }, read(s.unranked));
          }
        },
      });
    }
  };
  occupancy(
    { spec: "sluice_gate_engine_request_count", conventional: "sluice_gate_engine_requests" },
    "Admitted calls holding an engine request slot",
    (o) => o.requests,
  );
  occupancy(
    { spec: "sluice_gate_engine_request_waiting_count", conventional: "sluice_gate_engine_requests_waiting" },
    "Admitted calls before their first generated token",
    (o) => o.waiting,
  );
  occupancy(
    { spec: "sluice_gate_request_queue_count", conventional: "sluice_gate_requests_queued" },
    "Calls waiting in the gate queue",
    (o) => o.queued,
  );

  const rankCounters = function* () {
    for (const { worker, gate } of gates()) {
      for (const counters of gate.rankCounters()) yield { worker, dp_rank: String(counters.rank), counters };
    }
  };

  new Counter({
    name: "sluice_gate_request_receive_total",
    help: "Calls that arrived at the gate.",
    labelNames: rankLabels,
    registers,
    collect() {
      this.reset();
      for (const { worker, dp_rank, counters } of rankCounters())
        this.inc({ worker, dp_rank }, counters.received);
    },
  });

  new Counter({
    name: "sluice_gate_request_admit_total",
    help: "Calls the gate admitted, on arrival (direct) or after waiting (queue).",
    labelNames: [...rankLabels, "source"] as const,
    registers,
    collect() {
      this.reset();
      for (const { worker, dp_rank, counters } of rankCounters()) {
        this.inc({ worker, dp_rank, source: "direct" }, counters.admittedDirect);
        this.inc({ worker, dp_rank, source: "queue" }, counters.admittedQueue);
      }
    },
  });

  new Counter({
    name: "sluice_gate_rejection_total",
    help: "Calls the gate refused: scope rank or worker (worker_overloaded), or lane (queue_full, queue_timeout).",
    labelNames: [...rankLabels, "scope"] as const,
    registers,
    collect() {
      this.reset();
      for (const { worker, dp_rank, counters } of rankCounters()) {
        this.inc({ worker, dp_rank, scope: "worker" }, counters.rejected.worker);
        this.inc({ worker, dp_rank, scope: "rank" }, counters.rejected.rank);
        this.inc({ worker, dp_rank, scope: "lane" }, counters.rejected.lane);
      }
    },
  });

  new Counter({
    name: "sluice_gate_cancellation_total",
    help: "Calls cancelled before the gate admitted them.",
    labelNames: rankLabels,
    registers,
    collect() {
      this.reset();
      for (const { worker, dp_rank, counters } of rankCounters())
        this.inc({ worker, dp_rank }, counters.cancelled);
    },
  });

  new Gauge({
    name: "sluice_gate_limit",
    help: "The gate's per-rank limits, to draw beside the counts.",
    labelNames: ["worker", "kind"] as const,
    registers,
    collect() {
      this.reset();
      for (const { worker, gate } of gates()) {
        const limits = gate.limits();
        this.set({ worker, kind: "engine_request" }, limits.engineRequestLimit);
        this.set({ worker, kind: "engine_request_waiting" }, limits.engineRequestWaitingLimit);
        this.set({ worker, kind: "request_queue" }, limits.requestQueueLimit);
      }
    },
  });
}
