import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { assertRefusal, chat, makeHarness } from "./harness.js";

const TENANTS = {
  batch: { band: "sheddable" as const },
  ops: { band: "protected" as const, weight: 4 },
};
const KEYS = {
  "key-batch-0001": { tenant: "batch" },
  "key-ops-000001": { tenant: "ops" },
  "key-admin-0001": { tenant: "admins", admin: true },
};
/** Every header a client might try to raise its tenant, band or weight with. */
const FORGED = {
  "x-sluice-tenant": "ops",
  "x-tenant-id": "ops",
  "x-sluice-band": "protected",
  "x-sluice-priority": "100",
  "x-sluice-weight": "1000",
  "x-priority": "high",
};

describe("tenants over HTTP", () => {
  it("never lets a client header raise its tenant, band or weight (attack)", async () => {
    const h = makeHarness({ config: { tenants: TENANTS }, keys: KEYS });
    try {
      const step = await h.call("/v1/chat/completions", {
        method: "POST",
        headers: { authorization: "Bearer key-batch-0001", "x-session-id": "s1", ...FORGED },
        json: chat(),
      });
      assert.equal(step.response.status, 200, step.text);
      assert.equal(step.response.headers.get("x-sluice-tenant"), "batch");
      const own = await h.call("/v1/sessions/s1", {
        headers: { authorization: "Bearer key-batch-0001", ...FORGED },
      });
      assert.equal(own.response.status, 200);
      const view = own.json();
      assert.equal(view.tenant, "batch");
      assert.equal(view.band, "sheddable");
      assert.equal(own.response.headers.get("x-sluice-tenant"), "batch");
      const listed = h.scheduler
        .tenants()
        .tenants.map((tenant) => [tenant.tenant, tenant.band, tenant.weight]);
      assert.deepEqual(listed, [["batch", "sheddable", 1]], "no session ever counted for ops");

      // Another tenant neither sees the session nor steps into it (so it cannot borrow its place either
      // way): the same key sent by another tenant names that tenant's own session.
      const other = await h.call("/v1/sessions/s1", { headers: { authorization: "Bearer key-ops-000001" } });
      assertRefusal(other.response, other.text, 404, "session_not_found");
      const stepsBefore = view.steps;
      const intrude = await h.call("/v1/chat/completions", {
        method: "POST",
        headers: { authorization: "Bearer key-ops-000001", "x-session-id": "s1" },
        json: chat(),
      });
      assert.equal(intrude.response.status, 200, intrude.text);
      assert.equal(intrude.response.headers.get("x-sluice-tenant"), "ops");
      const batchAfter = await h.call("/v1/sessions/s1", {
        headers: { authorization: "Bearer key-batch-0001" },
      });
      assert.equal(batchAfter.json().steps, stepsBefore, "the batch tenant's session took no step of ops");
      const opsOwn = await h.call("/v1/sessions/s1", { headers: { authorization: "Bearer key-ops-000001" } });
      assert.equal(opsOwn.json().tenant, "ops");
      assert.equal(opsOwn.json().steps, 1);
      // Its DELETE closes its own session of that key, never the batch tenant's.
      const remove = await h.call("/v1/sessions/s1", {
        method: "DELETE",
        headers: { authorization: "Bearer key-ops-000001" },
      });
      assert.equal(remove.response.status, 204);
      // An admin names the tenant when two tenants have held that key.
      const admin = await h.call("/v1/sessions/s1?tenant=batch", {
        headers: { authorization: "Bearer key-admin-0001" },
      });
      assert.equal(admin.response.status, 200);
      assert.equal(admin.json().tenant, "batch");
      const closed = await h.call("/v1/sessions/s1", {
        method: "DELETE",
        headers: { authorization: "Bearer key-batch-0001" },
      });
      assert.equal(closed.response.status, 204);
      assert.deepEqual(h.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    } finally {
      await h.close();
    }
  });

  it("puts unkeyed calls in tenant default whatever they send, without a trusted tenant header", async () => {
    const h = makeHarness({ config: { tenants: TENANTS } });
    try {
      const opened = await h.call("/v1/sessions", { method: "POST", headers: FORGED, json: { id: "s2" } });
      assert.equal(opened.response.status, 201);
      const step = await h.call("/v1/sessions/s2/chat/completions", {
        method: "POST",
        headers: FORGED,
        json: chat(),
      });
      assert.equal(step.response.status, 200, step.text);
      assert.equal(step.response.headers.get("x-sluice-tenant"), "default");
      const view = (await h.call("/v1/sessions/s2")).json();
      assert.equal(view.tenant, "default");
      assert.equal(view.band, "standard");
      await h.call("/v1/sessions/s2", { method: "DELETE" });
      assert.deepEqual(h.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    } finally {
      await h.close();
    }
  });

  it("takes the tenant from --tenant-header behind a trusted gateway, and only from that header", async () => {
    const h = makeHarness({ config: { tenants: TENANTS }, tenantHeader: "X-Gateway-Tenant" });
    try {
      const step = await h.call("/v1/chat/completions", {
        method: "POST",
        headers: { "x-gateway-tenant": "ops", "x-session-id": "g1", "x-sluice-band": "sheddable" },
        json: chat(),
      });
      assert.equal(step.response.status, 200, step.text);
      assert.equal(step.response.headers.get("x-sluice-tenant"), "ops");
      const view = (await h.call("/v1/sessions/g1", { headers: { "x-gateway-tenant": "ops" } })).json();
      assert.equal(view.band, "protected");
      const forged = await h.call("/v1/chat/completions", {
        method: "POST",
        headers: { "x-sluice-tenant": "ops" },
        json: chat(),
      });
      assert.equal(forged.response.headers.get("x-sluice-tenant"), "default");
      const bad = await h.call("/v1/chat/completions", {
        method: "POST",
        headers: { "x-gateway-tenant": "a b\tc" },
        json: chat(),
      });
      assertRefusal(bad.response, bad.text, 400, "invalid_request");
      await h.call("/v1/sessions/g1", { method: "DELETE", headers: { "x-gateway-tenant": "ops" } });
      assert.deepEqual(h.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    } finally {
      await h.close();
    }
  });
});
