/** @module The benchmark's HTML report opened in real headless Chromium: every chart draws, nothing fails. */

import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { type Browser, chromium } from "playwright-core";
import { runWorkloadBench, writeOutputs } from "../../adapters/bench/suite.js";

const CHROMIUM = "/usr/bin/chromium";
const ARTIFACTS = fileURLToPath(new URL("../artifacts/", import.meta.url));

const dir = mkdtempSync(join(tmpdir(), "sluice-bench-report-"));
const workload = join(dir, "small-agents.json");
writeFileSync(
  workload,
  JSON.stringify({
    kind: "agents",
    sessions: 6,
    steps: [3, 4],
    system_prompt_tokens: 800,
    tool_output_tokens: [300, 900],
    output_tokens: [20, 60],
    tool_wait_s: [0.5, 1.5],
    seed: 7,
  }),
);

let browser: Browser;
before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
  });
});
after(async () => {
  await browser?.close();
});

test("the report page opens in a browser and draws every chart with data", async () => {
  const result = await runWorkloadBench({
    workload,
    policies: ["rr", "gate-prefix", "sluice"],
    loads: [1, 2],
  });
  const html = join(dir, "report.html");
  writeOutputs(result, { html, command: "sluice bench --workload small-agents.json --load 1,2" });

  const page = await browser.newPage({ viewport: { width: 1280, height: 1600 } });
  const problems: string[] = [];
  page.on("pageerror", (error) => problems.push(String(error)));
  page.on("console", (message) => {
    if (message.type() === "error") problems.push(message.text());
  });
  page.on("request", (request) => {
    if (!request.url().startsWith("file:")) problems.push(`fetched ${request.url()}`);
  });
  await page.goto(pathToFileURL(html).href);

  const charts = await page.$$eval("svg", (svgs) =>
    svgs.map((svg) => {
      const box = svg.getBoundingClientRect();
      return {
        width: box.width,
        height: box.height,
        marks: svg.querySelectorAll("path, polyline, rect, circle, line").length,
        text: svg.textContent ?? "",
      };
    }),
  );
  // Makespan and goodput per policy, goodput against load, then per load: hit rate, window, TTFT.
  assert.ok(charts.length >= 6, `only ${charts.length} charts`);
  for (const [i, chart] of charts.entries()) {
    assert.ok(chart.width > 100 && chart.height > 50, `chart ${i} is not laid out: ${JSON.stringify(chart)}`);
    assert.ok(chart.marks > 3, `chart ${i} draws nothing`);
  }
  const allText = charts.map((chart) => chart.text).join(" ");
  for (const policy of ["rr", "gate-prefix", "sluice"]) assert.match(allText, new RegExp(policy));
  assert.deepEqual(problems, []);

  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, "bench-report.png"), fullPage: true });
  await page.close();
});
