/** @module The dashboard's tenants panel in real headless Chromium: usage against entitlement, sessions, pauses per tenant. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { type Browser, chromium } from "playwright-core";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";

const CHROMIUM = "/usr/bin/chromium";
let server: RunningServer;
let browser: Browser;

before(async () => {
  server = await startServer({
    port: 0,
    host: "127.0.0.1",
    simReplicas: 1,
    config: {
      sessions: { controlIntervalMs: 250 },
      tenants: { batch: { band: "sheddable" }, ops: { band: "protected", weight: 2 } },
    },
    tenantHeader: "x-gateway-tenant",
    dashboardPollMs: 250,
    log: () => {},
  });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--no-first-run",
      "--disable-sync",
    ],
  });
});

after(async () => {
  await browser?.close();
  await server?.close();
});

test("the tenants panel shows each tenant's band, usage against entitlement and sessions", async () => {
  const model = server.scheduler.models()[0]!;
  const sessions: [string, string][] = [
    ["batch", "b-1"],
    ["batch", "b-2"],
    ["ops", "o-1"],
  ];
  for (const [tenant, id] of sessions) {
    const response = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-tenant": tenant, "x-session-id": id },
      body: JSON.stringify({ model, messages: [{ role: "user", content: "list the files" }], max_tokens: 8 }),
    });
    assert.equal(response.status, 200, await response.text());
    assert.equal(response.headers.get("x-sluice-tenant"), tenant);
  }
  const page = await browser.newPage({ viewport: { width: 1280, height: 1500 } });
  const pageErrors: string[] = [];
  page.on("pageerror", (err) => pageErrors.push(err.message));
  await page.goto(`${server.url}/dashboard`);
  await page.waitForFunction(
    () => document.querySelectorAll("#tenant-table tr.tenant").length >= 2,
    undefined,
    {
      timeout: 20_000,
    },
  );
  const row = (tenant: string) => `#tenant-table tr.tenant[data-tenant="${tenant}"]`;
  assert.equal(await page.textContent(`${row("batch")} td:nth-child(2)`), "sheddable");
  assert.equal(await page.textContent(`${row("ops")} td:nth-child(2)`), "protected");
  assert.equal(await page.textContent(`${row("ops")} td:nth-child(3)`), "2");
  // Idle between steps, the sessions hold their place: usage and entitlement are drawn for both tenants.
  const usage = Number(await page.textContent(`${row("batch")} td:nth-child(4)`));
  const entitlement = Number(await page.textContent(`${row("batch")} td:nth-child(5)`));
  assert.ok(usage > 0 && entitlement >= usage, `batch usage ${usage}, entitlement ${entitlement}`);
  assert.equal(await page.textContent(`${row("batch")} td:nth-child(8)`), "2", "two idle batch sessions");
  assert.equal(await page.locator(`${row("batch")} .meter`).count(), 1);
  assert.match(
    (await page.textContent("#tenant-fairness")) ?? "",
    /Jain's index of usage ÷ entitlement: \d\.\d{3}/,
  );
  for (const [tenant, id] of sessions) {
    const closed = await fetch(`${server.url}/v1/sessions/${id}`, {
      method: "DELETE",
      headers: { "x-gateway-tenant": tenant },
    });
    assert.equal(closed.status, 204);
  }
  await page.waitForFunction(
    (selector) => document.querySelector(selector)?.textContent === "0",
    `${row("batch")} td:nth-child(8)`,
    { timeout: 20_000 },
  );
  assert.deepEqual(server.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
  assert.deepEqual(pageErrors, [], "the page threw");
  await page.close();
});
