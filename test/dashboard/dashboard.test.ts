/** @module The live dashboard in real headless Chromium: charts drawn from `/v1/admin/state` and updating under load. */

import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type Browser, chromium } from "playwright-core";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";

const CHROMIUM = "/usr/bin/chromium";
const ARTIFACTS = fileURLToPath(new URL("../artifacts/", import.meta.url));
/** Panels drawn from any live state (the token window panel needs a token window: see dashboard-history.test.ts). */
const PANELS = [
  "panel-kv",
  "panel-hit",
  "panel-sessions",
  "panel-budget",
  "panel-fleet-hit",
  "panel-latency",
  "panel-throughput",
  "panel-calls",
  "panel-routes",
  "panel-gate",
  "panel-lanes",
  "panel-refusals",
  "panel-stage",
];

let server: RunningServer;
let browser: Browser;
let loadRunning = true;
const load: Promise<void>[] = [];

async function agent(url: string, id: string, model: string): Promise<void> {
  const messages: { role: string; content: string }[] = [
    { role: "system", content: "You are a coding agent working through a repository. ".repeat(60) },
  ];
  for (let step = 0; loadRunning && step < 200; step++) {
    messages.push({ role: "user", content: `tool output ${step}: ${"line of build log ".repeat(40)}` });
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-session-id": id },
      body: JSON.stringify({ model, messages, max_tokens: 24, stream: true }),
    });
    const text = await response.text();
    if (response.ok)
      messages.push({ role: "assistant", content: `step ${step} done (${text.length} bytes)` });
  }
  await fetch(`${url}/v1/sessions/${id}`, { method: "DELETE" });
}

before(async () => {
  server = await startServer({
    port: 0,
    host: "127.0.0.1",
    simReplicas: 2,
    // A small KV cache so the agents' contexts move the KV usage line visibly.
    simPreset: { base: "h100-llama3-8b", kvCapacityTokens: 60_000, c0: 4 },
    config: { sessions: { controlIntervalMs: 250 } },
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
  loadRunning = false;
  await Promise.allSettled(load);
  await browser?.close();
  await server?.close();
});

test("the dashboard draws every chart from live state and keeps updating while load runs", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 1500 } });
  const pageErrors: string[] = [];
  const foreign: string[] = [];
  page.on("pageerror", (err) => pageErrors.push(err.message));
  page.on("request", (req) => {
    if (!req.url().startsWith(server.url)) foreign.push(req.url());
  });

  const model = server.scheduler.models()[0]!;
  for (let i = 0; i < 6; i++) load.push(agent(server.url, `dash-agent-${i}`, model));
  // A refusal the scheduler decides, so the refusal chart has a reason to draw.
  const refused = await fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 10_000_000 }),
  });
  assert.equal(refused.status, 413);

  // Opened late: the server kept the history, so the first answer already holds several samples.
  await new Promise((resolve) => setTimeout(resolve, 3500));
  const openedAt = Date.now();
  await page.goto(`${server.url}/dashboard`);
  await page.waitForFunction(() => Number(document.body.dataset.polls) >= 1, undefined, { timeout: 20_000 });
  const firstSample = Number(await page.getAttribute("body", "data-first-sample"));
  assert.ok(firstSample <= openedAt - 2000, "the page shows history from before it was opened");
  await page.waitForFunction(() => Number(document.body.dataset.samples) >= 6, undefined, {
    timeout: 20_000,
  });

  for (const id of PANELS) {
    const points = await page.getAttribute(`#${id} svg.chart`, "data-points");
    assert.ok(Number(points) > 0, `${id} drew no points`);
  }
  assert.equal(await page.locator("#panel-kv svg.chart line.threshold").count(), 2, "U_low and U_high lines");
  assert.equal(await page.locator("#panel-hit svg.chart line.threshold").count(), 1, "H_low line");
  assert.equal(await page.locator("#panel-kv svg.chart path.series").count(), 2, "one KV line per replica");
  const dashes = await page.$$eval("#panel-kv svg.chart path.series", (paths) =>
    paths.map((p) => p.getAttribute("stroke-dasharray") ?? ""),
  );
  assert.notEqual(dashes[0], dashes[1], "replicas are drawn in distinct line styles");
  assert.ok(
    (await page.locator("#panel-budget svg.chart line.threshold").count()) >= 2,
    "each replica's reservable token line is drawn",
  );
  const windowDrawn = await page.getAttribute("#panel-window svg.chart", "data-points");
  assert.ok(Number(windowDrawn) > 0, "W is drawn, in tokens or in sessions as the policy counts it");
  const tokenWindow = server.scheduler.state().replicas.some((r) => r.window.sizeTokens !== null);
  const windowNames = await page.$$eval("#panel-window path.series", (paths) =>
    paths.map((p) => p.getAttribute("data-name") ?? ""),
  );
  assert.ok(
    windowNames.some((name) => (tokenWindow ? /footprints$/ : /W \(sessions\)$/).test(name)),
    `window series: ${windowNames.join(", ")}`,
  );
  const headerWaiting = await page.getAttribute("#sessions", "data-waiting");
  const totalWaiting = await page.textContent("#replica-table tr.total td:nth-child(13)");
  assert.equal(headerWaiting, totalWaiting, "the header's waiting count is the table's");
  assert.match((await page.textContent("#panel-refusals .legend")) ?? "", /context_limit \(\d+ total\)/);
  assert.match((await page.textContent("#stage")) ?? "", /stage: normal/);
  assert.equal(await page.locator("#replica-table tr.replica").count(), 2, "one row per replica");

  const kvBefore = await page.getAttribute("#panel-kv path.series", "d");
  const samplesBefore = Number(await page.getAttribute("body", "data-samples"));
  await page.waitForFunction((n) => Number(document.body.dataset.samples) >= n + 2, samplesBefore, {
    timeout: 20_000,
  });
  const kvAfter = await page.getAttribute("#panel-kv path.series", "d");
  assert.notEqual(kvAfter, kvBefore, "the KV chart updates as samples arrive");
  const activeSeen = await page.evaluate(() =>
    Array.from(document.querySelectorAll("#replica-table tr.replica td:nth-child(9)")).some(
      (td) => Number(td.textContent) > 0,
    ),
  );
  assert.ok(activeSeen, "sessions are shown active while agents run");

  mkdirSync(ARTIFACTS, { recursive: true });
  writeFileSync(`${ARTIFACTS}.gitignore`, "*\n");
  await page.screenshot({ path: `${ARTIFACTS}dashboard.png`, fullPage: true });

  assert.deepEqual(pageErrors, [], "the page threw");
  assert.deepEqual(foreign, [], "the page fetched something from elsewhere");
  await page.close();
});
