/** @module Metrics by Prometheus conventions beside the documented names: build info, ratios, hit and query counters, end-to-end and per-token histograms, series at zero, and `promtool check metrics` when it is installed. */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { afterEach, test } from "node:test";
import { fileURLToPath } from "node:url";
import { parsePrometheusText } from "../../adapters/engines/openai/metrics-parser.js";
import { REFUSAL_REASONS, SLUICE_VERSION } from "../../adapters/metrics/metrics.js";
import { chat, type Harness, MODEL, makeHarness } from "../http/harness.js";

const PROMTOOL = "/usr/bin/promtool";

/** docs/metrics.md fixes these names; promtool flags them (gauges named `…_count`), so each has a conventional twin. */
const SPEC_FIXED_FLAGGED = new Map([
  ["sluice_gate_engine_request_count", "sluice_gate_engine_requests"],
  ["sluice_gate_engine_request_waiting_count", "sluice_gate_engine_requests_waiting"],
  ["sluice_gate_request_queue_count", "sluice_gate_requests_queued"],
]);

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

async function scrape(harness: Harness) {
  const { text } = await harness.call("/metrics");
  const page = parsePrometheusText(text);
  assert.equal(page.invalidLines, 0);
  const find = (name: string, labels: Record<string, string> = {}) =>
    page.samples.filter(
      (s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v),
    );
  const value = (name: string, labels: Record<string, string> = {}) =>
    find(name, labels).reduce((sum, s) => sum + s.value, 0);
  return { text, page, find, value };
}

test("every refusal reason and lane is a series at zero before the first refusal", async () => {
  h = makeHarness();
  const { find } = await scrape(h);
  for (const reason of REFUSAL_REASONS) {
    const lanes = reason === "overflow" ? ["overflow"] : ["interactive", "bulk", "none"];
    for (const lane of lanes) {
      const series = find("sluice_rejections_total", { reason, lane });
      assert.equal(series.length, 1, `sluice_rejections_total{reason="${reason}",lane="${lane}"}`);
      assert.equal(series[0]!.value, 0);
    }
  }
  assert.equal(find("sluice_requests_total", { lane: "interactive", outcome: "rejected" }).length, 1);
});

test("build info, ratios, hit and query counters, end-to-end and per-token histograms, generated tokens", async () => {
  const harness = makeHarness();
  h = harness;
  for (let step = 0; step < 3; step++) {
    const ok = await harness.call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 8, stream: step === 1 }, 400 + step * 10),
      headers: { "x-session-id": "conventions" },
    });
    assert.equal(ok.response.status, 200);
  }
  const { find, value, page } = await scrape(harness);
  const info = find("sluice_build_info");
  assert.equal(info.length, 1);
  assert.equal(info[0]!.value, 1);
  assert.equal(info[0]!.labels.version, SLUICE_VERSION);
  assert.equal(info[0]!.labels.node_version, process.version);

  for (const replica of ["sim-0", "sim-1"]) {
    assert.equal(
      value("sluice_replica_kv_usage_ratio", { replica }),
      value("sluice_replica_kv_usage", { replica }),
    );
    assert.equal(
      value("sluice_replica_prefix_cache_hit_ratio", { replica }),
      value("sluice_replica_prefix_hit_rate", { replica }),
    );
  }
  const queries = value("sluice_replica_prefix_cache_queries_tokens_total");
  const hits = value("sluice_replica_prefix_cache_hits_tokens_total");
  assert.ok(queries > 1000, `queries ${queries}`);
  assert.ok(hits > 0 && hits <= queries, "steps 2 and 3 reuse step 1's prefix");
  assert.equal(page.types.get("sluice_replica_prefix_cache_hits_tokens_total"), "counter");

  assert.equal(page.types.get("sluice_e2e_request_latency_seconds"), "histogram");
  assert.equal(value("sluice_e2e_request_latency_seconds_count", { lane: "interactive", model: MODEL }), 3);
  assert.ok(
    value("sluice_e2e_request_latency_seconds_sum") > 0,
    "durations are measured on the scheduler's clock",
  );
  assert.equal(value("sluice_time_per_output_token_seconds_count", { lane: "interactive" }), 3);
  assert.equal(value("sluice_generation_tokens_total", { lane: "interactive", model: MODEL }), 24);
  assert.ok(value("sluice_prompt_tokens_total", { model: MODEL }) >= queries);
  assert.ok(value("sluice_route_replica_prompt_tokens_total") === value("sluice_route_prompt_tokens_total"));

  // Conventional twins of the documented `…_count` gauges carry the same labels and values.
  for (const [spec, conventional] of SPEC_FIXED_FLAGGED) {
    const a = find(spec).map((s) => JSON.stringify([s.labels, s.value]));
    const b = find(conventional).map((s) => JSON.stringify([s.labels, s.value]));
    assert.deepEqual(b, a, `${conventional} mirrors ${spec}`);
  }
  // prom-client's gauges named `…_total` are left out; their per-type gauges remain.
  assert.ok(!page.types.has("nodejs_active_handles_total"));
  assert.ok(page.types.has("nodejs_active_handles"));
  harness.scheduler.closeSession("conventions");
});

test("promtool check metrics: nothing flagged but the names docs/metrics.md fixes", async (t) => {
  if (!existsSync(PROMTOOL)) {
    t.skip(`${PROMTOOL} is not installed (apt-get install prometheus)`);
    return;
  }
  h = makeHarness();
  await h.call("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 4 }) });
  await h.call("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 100_000 }) });
  const { text } = await scrape(h);
  const run = spawnSync(PROMTOOL, ["check", "metrics"], { input: text, encoding: "utf8" });
  const problems = `${run.stdout}\n${run.stderr}`
    .split("\n")
    .map((line) => line.trim())
    .filter(Boolean);
  const flagged = new Set<string>();
  for (const line of problems) {
    const name = line.split(/\s+/)[0]!;
    assert.ok(SPEC_FIXED_FLAGGED.has(name), `promtool flags a name of our own: ${line}`);
    flagged.add(name);
  }
  t.diagnostic(`promtool flags only fixed names: ${[...flagged].join(", ") || "none"}`);
});

test("the example alert rules query registered metrics and pass promtool check rules", async (t) => {
  const harness = makeHarness();
  h = harness;
  const rulesPath = fileURLToPath(new URL("../../adapters/metrics/alert-rules.yml", import.meta.url));
  const rules = readFileSync(rulesPath, "utf8");
  const names = new Set([...rules.matchAll(/\b(sluice_[a-z0-9_]+)/g)].map((m) => m[1]!));
  assert.ok(names.size >= 8);
  for (const name of names) {
    const base = name.replace(/_(bucket|sum|count)$/, "");
    assert.ok(
      harness.registry.getSingleMetric(name) ?? harness.registry.getSingleMetric(base),
      `the rules use ${name}, which is not registered`,
    );
  }
  if (!existsSync(PROMTOOL)) {
    t.skip(`${PROMTOOL} is not installed`);
    return;
  }
  const run = spawnSync(PROMTOOL, ["check", "rules", rulesPath], { encoding: "utf8" });
  assert.equal(run.status, 0, `${run.stdout}${run.stderr}`);
});
