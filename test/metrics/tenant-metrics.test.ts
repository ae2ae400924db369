import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Registry } from "prom-client";
import { registerTenantMetrics } from "../../adapters/metrics/tenant-metrics.js";
import type { AdminState } from "../../src/types.js";

describe("tenant metrics", () => {
  it("exposes usage, entitlement, sessions, service, pauses by reason, waits and Jain's index", async () => {
    const registry = new Registry();
    const tenants: AdminState["tenants"] = {
      fairness: "tenants",
      jainIndex: 0.8,
      list: [
        {
          tenant: "batch",
          band: "sheddable",
          weight: 1,
          usageTokens: 30_000,
          entitlementTokens: 20_000,
          sessions: { active: 3, idle: 1, waiting: 0, paused: 2, dormant: 0 },
          serviceTokenSeconds: 1_500,
          pauses: { fairness: 1, priority: 1, window: 0 },
        },
      ],
    };
    const metrics = registerTenantMetrics(registry, () => tenants);
    metrics.onSession({
      id: "s1",
      event: "paused",
      replica: "r1",
      tenant: "batch",
      band: "sheddable",
      reason: "fairness",
    });
    metrics.onSession({
      id: "s2",
      event: "paused",
      replica: "r1",
      tenant: "batch",
      band: "sheddable",
      reason: "priority",
    });
    metrics.onSession({
      id: "s3",
      event: "admitted",
      replica: "r1",
      tenant: "ops",
      band: "protected",
      waitedMs: 2_000,
    });
    const text = await registry.metrics();
    const has = (line: string) => assert.ok(text.includes(line), `${line}\n${text}`);
    has('sluice_tenant_footprint_tokens{tenant="batch",band="sheddable"} 30000');
    has('sluice_tenant_entitlement_tokens{tenant="batch",band="sheddable"} 20000');
    has('sluice_tenant_sessions{tenant="batch",band="sheddable",state="paused"} 2');
    has('sluice_tenant_service_token_seconds_total{tenant="batch",band="sheddable"} 1500');
    has('sluice_session_pauses_total{tenant="batch",band="sheddable",reason="fairness"} 1');
    has('sluice_session_pauses_total{tenant="batch",band="sheddable",reason="priority"} 1');
    has('sluice_tenant_admission_wait_seconds_bucket{le="2.5",tenant="ops",band="protected"} 1');
    has("sluice_fairness_jain_index 0.8");
  });
});
