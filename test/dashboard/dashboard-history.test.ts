/** @module The dashboard explains a wait, in real headless Chromium: W against footprints on their own axis, sessions by state, the binding budget, and the events that changed them. */

import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { serve } from "@hono/node-server";
import { type Browser, chromium } from "playwright-core";
import { Registry } from "prom-client";
import { StateHistory } from "../../adapters/dashboard/history.js";
import { createApp } from "../../adapters/http/app.js";
import { createMetrics } from "../../adapters/metrics/metrics.js";
import { realClock } from "../../src/clock.js";
import { replicaState, StubScheduler } from "../http/stub-scheduler.js";

const CHROMIUM = "/usr/bin/chromium";

let browser: Browser;
let server: ReturnType<typeof serve>;
let url: string;
let history: StateHistory;
const scheduler = new StubScheduler([
  replicaState("gpu-a"),
  // A system prompt two of its sessions share: 8,000 of the footprints' tokens are counted twice.
  replicaState("gpu-b", {
    sizeTokens: 48_000,
    footprintTokens: 47_500,
    sharedPrefixTokens: 8_000,
    waiting: 3,
    dormant: 0,
  }),
]);
// One session waits before any replica was chosen for it: the header and the table must still agree.
scheduler.current.sessions = StubScheduler.totals(scheduler.current.replicas, 1);

before(async () => {
  history = new StateHistory({ scheduler, clock: realClock, sampleMs: 100 });
  const registry = new Registry();
  const app = createApp({
    scheduler,
    metrics: createMetrics(registry, scheduler, { defaultMetrics: false }),
    history,
    dashboardPollMs: 200,
  });
  server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" });
  await new Promise<void>((resolve) => (server.listening ? resolve() : server.once("listening", resolve)));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--no-first-run",
    ],
  });
});

after(async () => {
  history.stop();
  await browser?.close();
  await new Promise((resolve) => server.close(resolve));
});

test("W and footprints on a token axis, sessions by state on a count axis, and why W changed", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 2400 } });
  const pageErrors: string[] = [];
  page.on("pageerror", (err) => pageErrors.push(err.message));
  await page.goto(`${url}/dashboard`);
  await page.waitForFunction(() => Number(document.body.dataset.samples) >= 3, undefined, {
    timeout: 20_000,
  });

  // The window law cuts W on gpu-b, a session goes dormant, the stage moves: the scheduler's events.
  scheduler.emit("window", {
    replica: "gpu-b",
    unit: "tokens",
    from: 48_000,
    to: 24_000,
    action: "decrease",
    cause: "thrash: KV usage 0.93 > U_high 0.5 and hit rate 0.12 < H_low 0.2",
  });
  scheduler.current.replicas[1]!.window.sizeTokens = 24_000;
  scheduler.emit("session", { id: "agent-7", event: "dormant", replica: "gpu-a" });
  scheduler.emit("stage", {
    from: "normal",
    to: "bulk_paused",
    cause: "p95 interactive queue age 12 s > 5 s for 3 windows",
  });
  scheduler.current.stage = "bulk_paused";

  await page.waitForFunction(() => document.querySelectorAll("#event-list tr.event").length >= 3, undefined, {
    timeout: 20_000,
  });
  const eventsText = (await page.textContent("#event-list")) ?? "";
  assert.match(eventsText, /gpu-b W 48000 → 24000 tokens \(decrease\)/);
  assert.match(eventsText, /thrash: KV usage 0\.93 > U_high/);
  assert.match(eventsText, /session agent-7 dormant on gpu-a/);
  assert.match(eventsText, /overload stage normal → bulk_paused/);
  assert.match(eventsText, /p95 interactive queue age 12 s/);

  // Separate axes: the token chart's scale is in tokens, the session chart's in sessions.
  const windowMax = Number(await page.getAttribute("#panel-window svg.chart", "data-ymax"));
  const sessionsMax = Number(await page.getAttribute("#panel-sessions svg.chart", "data-ymax"));
  assert.ok(windowMax >= 64_000, `W axis ${windowMax}`);
  assert.ok(sessionsMax <= 10, `sessions axis ${sessionsMax}`);
  assert.equal(
    await page.locator("#panel-window svg.chart path.series").count(),
    4,
    "W and footprints per replica",
  );
  const names = await page.$$eval("#panel-sessions svg.chart path.series", (paths) =>
    paths.map((p) => p.getAttribute("data-name")),
  );
  for (const state of ["active", "idle", "dormant", "paused", "waiting"])
    assert.ok(names.includes(`gpu-a ${state}`), `gpu-a ${state} drawn`);
  const dashA = await page.getAttribute(
    '#panel-sessions path[data-name="gpu-a waiting"]',
    "stroke-dasharray",
  );
  const dashB = await page.getAttribute(
    '#panel-sessions path[data-name="gpu-b waiting"]',
    "stroke-dasharray",
  );
  assert.notEqual(dashA ?? "", dashB ?? "", "replicas differ in line style");
  const wPath = await page.getAttribute('#panel-window path[data-name="gpu-b W"]', "d");
  assert.ok(wPath && /V/.test(wPath), "W is drawn as steps");
  // The table keeps the documented plain sum and shows the shared part beside it.
  const gpuB = await page.$$eval("#replica-table tr.replica", (rows) =>
    rows.map((row) => Array.from(row.querySelectorAll("td"), (td) => td.textContent)),
  );
  const rowB = gpuB.find((cells) => cells[0] === "gpu-b")!;
  assert.deepEqual(rowB.slice(4, 7), ["24000", "47500", "8000"]);

  // The binding limit: reserved tokens against what may be reserved.
  const limits = await page.$$eval("#panel-budget line.threshold", (lines) =>
    lines.map((l) => l.getAttribute("data-name")),
  );
  assert.deepEqual(limits.sort(), [
    "gpu-a reservable (ceiling − guard)",
    "gpu-b reservable (ceiling − guard)",
  ]);

  // One set of totals: the header's waiting count is the table's total, unplaced sessions included.
  await page.waitForFunction(() => /bulk paused/.test(document.getElementById("stage")?.textContent ?? ""));
  const headerWaiting = await page.getAttribute("#sessions", "data-waiting");
  assert.equal(headerWaiting, "6");
  assert.equal(await page.textContent("#replica-table tr.total td:nth-child(13)"), "6");
  assert.equal(await page.textContent("#replica-table tr.unplaced td:nth-child(13)"), "1");
  assert.match((await page.textContent("#sessions")) ?? "", /6 waiting/);
  assert.deepEqual(pageErrors, []);
  await page.close();
});

test("the history endpoint answers with samples, events after a sequence number, and the state", async () => {
  const all = (await (await fetch(`${url}/v1/admin/history`)).json()) as {
    samples: {
      t: number;
      replicas: { id: string; footprintTokens: number | null; heldTokens: number | null }[];
    }[];
    events: { seq: number; kind: string }[];
    state: { policy: string };
  };
  assert.ok(all.samples.length >= 3);
  // The chart's blue line is what the window compares with W: the footprints, a shared prefix once.
  const sampledB = all.samples.at(-1)!.replicas.find((r) => r.id === "gpu-b")!;
  assert.equal(sampledB.footprintTokens, 47_500);
  assert.equal(sampledB.heldTokens, 39_500);
  assert.equal(all.state.policy, "sluice");
  assert.ok(all.events.length >= 3);
  const lastSeq = all.events.at(-1)!.seq;
  const lastT = all.samples.at(-1)!.t;
  const newer = (await (
    await fetch(`${url}/v1/admin/history?since=${lastT}&events_after=${lastSeq}`)
  ).json()) as { samples: { t: number }[]; events: unknown[] };
  assert.equal(newer.events.length, 0, "events already read are not sent again");
  assert.ok(newer.samples.every((s) => s.t > lastT));
});
