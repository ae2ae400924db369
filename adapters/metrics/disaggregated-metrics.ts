/** @module The metrics of disaggregated fleets (docs/metrics.md): each replica's role, and the prefill spent on calls refused after it. */

import { Counter, Gauge, type Registry } from "prom-client";
import type { ScrapeSnapshot } from "./replica-gauges.js";

/** Registers the role gauge (read at each scrape) and the wasted-prefill counters. */
export function registerDisaggregatedMetrics(registry: Registry, snapshot: ScrapeSnapshot) {
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
  return { wastedPrefill, refusedAfterPrefill };
}
