/**
 * @module Tenant metrics (docs/tenants.md): usage against entitlement, sessions by state and
 * service per tenant and band read from the scheduler's snapshot at each scrape; pauses by
 * reason and admission waits fed by its session events. Tenants come from the tenants file,
 * the API keys or a trusted gateway, so the label set is the operator's.
 */

import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import type { AdminState, SchedulerEvents } from "../../src/types.js";

/** Admission-wait buckets in seconds, from 10 ms to 10 min (the session wait limit's default). */
export const ADMISSION_WAIT_BUCKETS: readonly number[] = [
  0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
];

const SESSION_STATES = ["active", "idle", "waiting", "paused", "dormant"] as const;
const PAUSE_REASONS = ["fairness", "priority", "window"] as const;

type SessionEvent = Parameters<NonNullable<SchedulerEvents["session"]>>[0];

/** Registers the tenant metrics; feed `onSession` every session event. */
export function registerTenantMetrics(
  registry: Registry,
  read: () => AdminState["tenants"],
): { onSession(e: SessionEvent): void } {
  const perTenant = (name: string, help: string, value: (t: TenantRow) => number) =>
    new Gauge({
      name,
      help,
      labelNames: ["tenant", "band"],
      registers: [registry],
      collect() {
        this.reset();
        for (const tenant of read()?.list ?? [])
          this.set({ tenant: tenant.tenant, band: tenant.band }, value(tenant));
      },
    });
  perTenant(
    "sluice_tenant_footprint_tokens",
    "What a tenant's active sessions hold in the windows (usage), tokens of footprint.",
    (t) => t.usageTokens,
  );
  perTenant(
    "sluice_tenant_entitlement_tokens",
    "A tenant's weighted max-min share of the fleet's windows now (0 without demand), tokens.",
    (t) => t.entitlementTokens,
  );
  new Gauge({
    name: "sluice_tenant_sessions",
    help: "A tenant's open sessions by state (active runs a step, idle holds its place between steps).",
    labelNames: ["tenant", "band", "state"],
    registers: [registry],
    collect() {
      this.reset();
      for (const tenant of read()?.list ?? []) {
        for (const state of SESSION_STATES)
          this.set({ tenant: tenant.tenant, band: tenant.band, state }, tenant.sessions[state]);
      }
    },
  });
  new Counter({
    name: "sluice_tenant_service_token_seconds_total",
    help: "Service a tenant received: its usage integrated over time, token-seconds.",
    labelNames: ["tenant", "band"],
    registers: [registry],
    collect() {
      this.reset();
      for (const tenant of read()?.list ?? [])
        this.inc({ tenant: tenant.tenant, band: tenant.band }, tenant.serviceTokenSeconds);
    },
  });
  new Gauge({
    name: "sluice_fairness_jain_index",
    help: "Jain's index of usage / entitlement over tenants with demand (1: every share met evenly).",
    registers: [registry],
    collect() {
      const tenants = read();
      this.set(tenants?.jainIndex ?? 1);
    },
  });
  const pauses = new Counter({
    name: "sluice_session_pauses_total",
    help: "Sessions paused at a step boundary, by why: fairness (tenant over its share), priority (a higher band waited), window (it shrank).",
    labelNames: ["tenant", "band", "reason"],
    registers: [registry],
  });
  for (const reason of PAUSE_REASONS) pauses.inc({ tenant: "default", band: "standard", reason }, 0);
  const waits = new Histogram({
    name: "sluice_tenant_admission_wait_seconds",
    help: "How long a session's step waited for room in a window before it was admitted or resumed.",
    labelNames: ["tenant", "band"],
    buckets: [...ADMISSION_WAIT_BUCKETS],
    registers: [registry],
  });
  return {
    onSession(e) {
      const labels = { tenant: e.tenant ?? "default", band: e.band ?? "standard" };
      // Leaving an unhealthy replica is a move, not a pause for sharing: not counted here.
      if (e.event === "paused" && e.reason && e.reason !== "unhealthy")
        pauses.inc({ ...labels, reason: e.reason });
      if ((e.event === "admitted" || e.event === "resumed") && e.waitedMs !== undefined)
        waits.observe(labels, Math.max(0, e.waitedMs) / 1000);
    },
  };
}

type TenantRow = NonNullable<AdminState["tenants"]>["list"][number];
