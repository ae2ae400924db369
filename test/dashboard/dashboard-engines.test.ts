/**
 * @module The dashboard's engines table in real headless Chromium: each replica's role, the engine
 * profile read from a genuine metrics page (`test/openai/fixtures/README.md` cites each), the signals
 * the engine does not publish, and a token budget left off for want of a capacity.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { type Browser, chromium, type Page } from "playwright-core";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";
import { type FakeUpstream, type Handler, startFakeUpstream } from "../openai/fake-upstream.js";

const CHROMIUM = "/usr/bin/chromium";

const fixture = (name: string) =>
  readFileSync(new URL(`../openai/fixtures/${name}`, import.meta.url), "utf8");

const respond =
  (contentType: string, text: string): Handler =>
  (_req, res) => {
    res.writeHead(200, { "content-type": contentType });
    res.end(text);
  };

let browser: Browser;
const servers: RunningServer[] = [];
const upstreams: FakeUpstream[] = [];

before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"],
  });
});

after(async () => {
  await browser?.close();
  await Promise.all(servers.map((s) => s.close()));
  await Promise.all(upstreams.map((u) => u.close()));
});

/** The engines table's cells, row by row, once the page has drawn at least one sample. */
async function engineRows(server: RunningServer): Promise<Record<string, string[]>> {
  const page: Page = await browser.newPage();
  try {
    await page.goto(`${server.url}/dashboard`);
    await page.waitForSelector("#engine-table tr.engine");
    const rows = await page.$$eval("#engine-table tr.engine", (trs) =>
      trs.map((tr) => Array.from(tr.querySelectorAll("td"), (td) => td.textContent ?? "")),
    );
    const kvCells = await page.$$eval("#replica-table tr.replica", (trs) =>
      trs.map((tr) => [
        tr.querySelector("td")?.textContent ?? "",
        tr.querySelectorAll("td")[2]?.textContent ?? "",
      ]),
    );
    const byId: Record<string, string[]> = {};
    for (const row of rows) byId[row[0] ?? ""] = row;
    for (const [id, kv] of kvCells) byId[`${id} kv`] = [kv ?? ""];
    return byId;
  } finally {
    await page.close();
  }
}

test("genuine engine pages: profile, unpublished signals and an unknown capacity are shown, not zeros", async () => {
  const sglang = await startFakeUpstream({
    "/metrics": respond("text/plain; version=0.0.4", fixture("sglang-docs-production-metrics.prom")),
  });
  const vllm = await startFakeUpstream({
    "/metrics": respond("text/plain; version=0.0.4", fixture("vllm-v0-aibrix-runtime.prom")),
    "/v1/models": respond("application/json", fixture("vllm-v0-aibrix-models.json")),
  });
  upstreams.push(sglang, vllm);
  const server = await startServer({
    port: 0,
    host: "127.0.0.1",
    upstreams: [`sg=${sglang.url}`, `v0=${vllm.url}`],
    dashboardPollMs: 200,
    log: () => {},
  });
  servers.push(server);

  const rows = await engineRows(server);
  // SGLang's documented page states no capacity, no block size and no cached-token counter.
  const sg = rows.sg;
  assert.ok(sg, "a row for the SGLang upstream");
  assert.equal(sg[1], "both");
  assert.equal(sg[2], "sglang");
  assert.equal(sg[3], "unknown");
  assert.equal(sg[4], "OFF: capacity unknown");
  for (const signal of ["kvCapacityTokens", "prefixCache", "blockSize"])
    assert.match(sg[5] ?? "", new RegExp(signal));
  // Its KV gauge is published (0.28), so the replica table shows the value, not "unknown".
  assert.equal(rows["sg kv"]?.[0], "28.0%");

  // vLLM V0 states num_gpu_blocks × block_size: a derived capacity, budget on.
  const v0 = rows.v0;
  assert.ok(v0, "a row for the vLLM upstream");
  assert.equal(v0[2], "vllm-v0");
  assert.equal(v0[3], `${81767 * 16} tok (derived)`);
  assert.equal(v0[4], "on");
  assert.match(v0[5] ?? "", /prefixCache/);
});

test("a disaggregated simulated fleet shows each replica's role", async () => {
  const server = await startServer({
    port: 0,
    host: "127.0.0.1",
    simPrefillReplicas: 1,
    simDecodeReplicas: 1,
    dashboardPollMs: 200,
    log: () => {},
  });
  servers.push(server);
  const rows = await engineRows(server);
  const roles = Object.entries(rows)
    .filter(([id]) => !id.endsWith(" kv"))
    .map(([, row]) => `${row[1]} ${row[2]} ${row[4]}`)
    .sort();
  assert.deepEqual(roles, ["decode simulated on", "prefill simulated on"]);
});

test("an engine whose metrics cannot be read: profile unknown, its KV shown unknown, the warning under its row", async () => {
  // No /metrics route (404); llama.cpp's genuine /health answer (`test/openai/unknown-engine.test.ts` cites it).
  const plain = await startFakeUpstream({ "/health": respond("application/json", '{"status": "ok" }') });
  upstreams.push(plain);
  const server = await startServer({
    port: 0,
    host: "127.0.0.1",
    upstreams: [`plain=${plain.url}`],
    dashboardPollMs: 200,
    log: () => {},
  });
  servers.push(server);
  const rows = await engineRows(server);
  assert.equal(rows.plain?.[2], "unknown");
  assert.equal(rows.plain?.[4], "OFF: capacity unknown");
  assert.equal(rows["plain kv"]?.[0], "unknown");
  const page: Page = await browser.newPage();
  try {
    await page.goto(`${server.url}/dashboard`);
    await page.waitForSelector('#engine-table tr.engine-warning[data-replica="plain"]');
    const warning = await page.$eval(
      '#engine-table tr.engine-warning[data-replica="plain"]',
      (tr) => tr.textContent ?? "",
    );
    assert.match(warning, /its metrics cannot be read/);
    assert.match(warning, /--kv-capacity-tokens plain=N/);
  } finally {
    await page.close();
  }
});
