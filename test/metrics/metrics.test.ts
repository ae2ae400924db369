/** @module docs/metrics.md metrics: every name registered and fed, labels bounded, and the Grafana dashboard in step with them. */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { afterEach, test } from "node:test";
import { type MetricSample, parsePrometheusText } from "../../adapters/engines/openai/metrics-parser.js";
import { chat, type Harness, makeHarness } from "../http/harness.js";

/** Every metric name docs/metrics.md lists. */
const SPEC_NAMES = [
  "sluice_gate_engine_request_count",
  "sluice_gate_engine_request_waiting_count",
  "sluice_gate_request_queue_count",
  "sluice_gate_request_receive_total",
  "sluice_gate_request_admit_total",
  "sluice_gate_rejection_total",
  "sluice_gate_cancellation_total",
  "sluice_session_window",
  "sluice_sessions_active",
  "sluice_sessions_paused",
  "sluice_sessions_waiting",
  "sluice_replica_kv_usage",
  "sluice_replica_prefix_hit_rate",
  "sluice_route_decisions_total",
  "sluice_route_predicted_hit_tokens_total",
  "sluice_route_prompt_tokens_total",
  "sluice_gate_limit",
  "sluice_requests_total",
  "sluice_rejections_total",
  "sluice_input_tokens",
  "sluice_requested_output_tokens",
  "sluice_queue_wait_seconds",
  "sluice_queue_oldest_age_seconds",
  "sluice_queued_prefill_tokens",
  "sluice_time_to_first_token_seconds",
  "sluice_inter_token_seconds",
  "sluice_overload_stage",
  "sluice_session_window_tokens",
  "sluice_session_footprint_tokens",
  "sluice_sessions_dormant",
  "sluice_session_retention_seconds",
  "sluice_session_dormancies_total",
];

// Grafana's variable syntax, spelled out so it does not read as a template literal by mistake.
const DATASOURCE_VARIABLE = `$${"{datasource}"}`;

const HISTOGRAMS = [
  "sluice_input_tokens",
  "sluice_requested_output_tokens",
  "sluice_queue_wait_seconds",
  "sluice_time_to_first_token_seconds",
  "sluice_inter_token_seconds",
];

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

function find(samples: MetricSample[], name: string, labels: Record<string, string> = {}): MetricSample[] {
  return samples.filter(
    (s) => s.name === name && Object.entries(labels).every(([key, value]) => s.labels[key] === value),
  );
}

function value(samples: MetricSample[], name: string, labels: Record<string, string> = {}): number {
  return find(samples, name, labels).reduce((sum, s) => sum + s.value, 0);
}

test("/metrics exposes every docs/metrics.md name, fed by real calls and refusals", async () => {
  h = makeHarness({ config: { contextWindowTokens: 4096 } });
  const { call, scheduler } = h;
  for (let step = 0; step < 3; step++) {
    const ok = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 6, stream: step % 2 === 0 }, 40 + step * 20),
      headers: { "x-session-id": "secret-session-42", "x-request-id": `req-unique-${step}` },
    });
    assert.equal(ok.response.status, 200);
  }
  const tooBig = await call("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 5000 }) });
  assert.equal(tooBig.response.status, 413);
  const badJson = await call("/v1/chat/completions", {
    method: "POST",
    body: "{",
    headers: { "content-type": "application/json" },
  });
  assert.equal(badJson.response.status, 400);

  const scrape = await call("/metrics");
  assert.equal(scrape.response.status, 200);
  assert.match(scrape.response.headers.get("content-type") ?? "", /text\/plain/);
  const page = parsePrometheusText(scrape.text);
  assert.equal(page.invalidLines, 0);
  for (const name of SPEC_NAMES) {
    assert.ok(page.types.has(name), `${name} is not exposed`);
  }
  for (const name of HISTOGRAMS) assert.equal(page.types.get(name), "histogram", name);
  const samples = page.samples;

  assert.equal(value(samples, "sluice_requests_total", { lane: "interactive", outcome: "ok" }), 3);
  assert.equal(value(samples, "sluice_rejections_total", { reason: "context_limit" }), 1);
  assert.equal(value(samples, "sluice_rejections_total", { reason: "invalid_request", lane: "none" }), 1);
  assert.equal(value(samples, "sluice_input_tokens_count", { lane: "interactive" }), 3);
  assert.equal(value(samples, "sluice_time_to_first_token_seconds_count", { lane: "interactive" }), 3);
  assert.equal(value(samples, "sluice_queue_wait_seconds_count", { lane: "interactive" }), 3);
  assert.equal(value(samples, "sluice_inter_token_seconds_count", { lane: "interactive" }), 3);
  assert.ok(
    find(samples, "sluice_time_to_first_token_seconds_bucket", { lane: "interactive", le: "+Inf" }).length ===
      1,
  );
  assert.equal(value(samples, "sluice_route_decisions_total"), 3);
  assert.ok(value(samples, "sluice_route_prompt_tokens_total") > 0);
  assert.ok(
    value(samples, "sluice_route_predicted_hit_tokens_total") > 0,
    "steps 2 and 3 extend step 1's prefix",
  );
  assert.equal(find(samples, "sluice_replica_kv_usage").length, 2);
  assert.equal(find(samples, "sluice_session_window", { replica: "sim-0" }).length, 1);
  assert.equal(value(samples, "sluice_sessions_active"), 1);
  assert.equal(value(samples, "sluice_overload_stage"), 0);
  assert.equal(value(samples, "sluice_gate_request_receive_total"), 3);
  assert.equal(
    value(samples, "sluice_gate_request_admit_total", { source: "direct" }) +
      value(samples, "sluice_gate_request_admit_total", { source: "queue" }),
    3,
  );
  assert.equal(value(samples, "sluice_gate_engine_request_count"), 0);
  assert.ok(find(samples, "sluice_gate_limit", { kind: "engine_request" }).length >= 2);

  // Bounded labels: no session or request id ever becomes a label value.
  assert.doesNotMatch(scrape.text, /secret-session-42|req-unique-/);
  const labelNames = new Set(samples.flatMap((s) => Object.keys(s.labels)));
  for (const forbidden of ["session", "session_id", "request_id", "requestId"]) {
    assert.ok(!labelNames.has(forbidden), `label ${forbidden} is unbounded`);
  }
  scheduler.closeSession("secret-session-42");
});

test("the Grafana dashboard only queries registered metrics, with rate intervals, le buckets and units", async () => {
  h = makeHarness();
  const dashboard = JSON.parse(
    readFileSync(new URL("../../adapters/metrics/grafana-dashboard.json", import.meta.url), "utf8"),
  );
  const registry = h.registry;
  const panels = dashboard.panels.filter((p: { type: string }) => p.type !== "row");
  assert.ok(panels.length >= 10);
  const stats = panels.filter((p: { type: string }) => p.type === "stat");
  assert.ok(stats.length >= 6, "a row of stat panels at the top");
  assert.ok(stats.every((p: { gridPos: { y: number } }) => p.gridPos.y <= 1));
  assert.ok(
    dashboard.templating.list.some(
      (v: { type: string; query: string }) => v.type === "datasource" && v.query === "prometheus",
    ),
    "a datasource variable",
  );
  const units = new Set<string>();
  const queried = new Set<string>();
  for (const panel of panels) {
    assert.equal(panel.datasource.uid, DATASOURCE_VARIABLE, `${panel.title} uses the datasource variable`);
    units.add(panel.fieldConfig.defaults.unit);
    for (const target of panel.targets) {
      const expr: string = target.expr;
      for (const match of expr.matchAll(/\b(sluice_[a-z0-9_]+)/g)) queried.add(match[1]!);
      for (const range of expr.matchAll(/\[([^\]]+)\]/g)) {
        assert.equal(range[1], "$__rate_interval", `${panel.title}: ${expr}`);
      }
      if (expr.includes("histogram_quantile")) {
        assert.match(
          expr,
          /by \(le[,)]|by \([^)]*\ble\b/,
          `${panel.title}: histogram_quantile needs le: ${expr}`,
        );
        assert.match(expr, /_bucket\b/, expr);
      }
    }
  }
  assert.ok(units.has("s") && units.has("percentunit"), `units: ${[...units].join(", ")}`);
  for (const name of queried) {
    if (registry.getSingleMetric(name)) continue;
    const base = name.replace(/_(bucket|sum|count)$/, "");
    const metric = registry.getSingleMetric(base);
    assert.ok(metric, `the dashboard queries ${name}, which is not registered`);
    assert.equal((await metric.get()).type, "histogram", `${name} is a suffix of a non-histogram`);
  }
  for (const name of SPEC_NAMES)
    assert.ok(queried.has(name) || queried.has(`${name}_bucket`), `no panel shows ${name}`);
});
