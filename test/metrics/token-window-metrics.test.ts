/** @module the documented token-window metrics per replica, fed by the scheduler's state and its `retention`, `session` and `window` events. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { Registry } from "prom-client";
import { parsePrometheusText } from "../../adapters/engines/openai/metrics-parser.js";
import { createMetrics } from "../../adapters/metrics/metrics.js";
import { replicaState, StubScheduler } from "../http/stub-scheduler.js";

async function scrape(registry: Registry) {
  const page = parsePrometheusText(await registry.metrics());
  assert.equal(page.invalidLines, 0);
  const value = (name: string, labels: Record<string, string> = {}) =>
    page.samples
      .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
      .reduce((sum, s) => sum + s.value, 0);
  const has = (name: string, labels: Record<string, string> = {}) =>
    page.samples.some((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  return { page, value, has };
}

test("W, the sum of footprints, dormant sessions, retention times and dormancies per replica", async () => {
  const scheduler = new StubScheduler([
    replicaState("gpu-a", { size: 5, sizeTokens: 64_000, footprintTokens: 52_000, dormant: 2 }),
    replicaState("gpu-b", { size: 2, sizeTokens: 30_000, footprintTokens: 29_000, dormant: 0 }),
  ]);
  const registry = new Registry();
  createMetrics(registry, scheduler, { defaultMetrics: false });

  const before = await scrape(registry);
  assert.equal(before.page.types.get("sluice_session_retention_seconds"), "histogram");
  assert.equal(before.page.types.get("sluice_session_dormancies_total"), "counter");
  // Series exist before the first event, so rate() and increase() see the start.
  assert.equal(before.value("sluice_session_dormancies_total", { replica: "gpu-b" }), 0);
  assert.ok(before.has("sluice_session_retention_seconds_count", { replica: "gpu-a" }));

  scheduler.emit("retention", { replica: "gpu-a", retentionMs: 12_000, source: "own" });
  scheduler.emit("retention", { replica: "gpu-a", retentionMs: 90_000, source: "hint" });
  scheduler.emit("session", { id: "s-1", event: "dormant", replica: "gpu-a" });
  scheduler.emit("session", { id: "s-2", event: "paused", replica: "gpu-b" });
  scheduler.emit("window", {
    replica: "gpu-b",
    unit: "tokens",
    from: 60_000,
    to: 30_000,
    action: "decrease",
    cause: "thrash",
  });

  const { value, page } = await scrape(registry);
  assert.equal(value("sluice_session_window_tokens", { replica: "gpu-a" }), 64_000);
  assert.equal(value("sluice_session_window_tokens", { replica: "gpu-b" }), 30_000);
  assert.equal(value("sluice_session_footprint_tokens", { replica: "gpu-a" }), 52_000);
  assert.equal(
    value("sluice_session_window", { replica: "gpu-a" }),
    5,
    "the count of sessions the window holds",
  );
  assert.equal(value("sluice_sessions_dormant", { replica: "gpu-a" }), 2);
  assert.equal(value("sluice_sessions_idle", { replica: "gpu-a" }), 1);
  assert.equal(value("sluice_session_retention_seconds_count", { replica: "gpu-a" }), 2);
  assert.equal(value("sluice_session_retention_seconds_sum", { replica: "gpu-a" }), 102);
  assert.equal(value("sluice_session_retention_seconds_bucket", { replica: "gpu-a", le: "15" }), 1);
  assert.equal(value("sluice_session_dormancies_total", { replica: "gpu-a" }), 1);
  assert.equal(value("sluice_session_dormancies_total", { replica: "gpu-b" }), 0);
  assert.equal(value("sluice_session_window_changes_total", { replica: "gpu-b", action: "decrease" }), 1);
  assert.equal(value("sluice_sessions", { state: "dormant" }), 2);
  for (const name of [
    "sluice_session_window_tokens",
    "sluice_session_footprint_tokens",
    "sluice_sessions_dormant",
    "sluice_session_retention_seconds",
    "sluice_session_dormancies_total",
  ]) {
    const labels = page.samples.filter((s) => s.name.startsWith(name)).flatMap((s) => Object.keys(s.labels));
    assert.ok(labels.includes("replica"), `${name} is labelled by replica`);
  }
});

test("the session-count law has no token window: the token gauges are absent rather than zero", async () => {
  const scheduler = new StubScheduler([
    replicaState("gpu-a", { unit: "sessions", size: 8, sizeTokens: null, footprintTokens: null }),
  ]);
  const registry = new Registry();
  createMetrics(registry, scheduler, { defaultMetrics: false });
  const { has, value } = await scrape(registry);
  assert.equal(value("sluice_session_window", { replica: "gpu-a" }), 8);
  assert.ok(!has("sluice_session_window_tokens"));
  assert.ok(!has("sluice_session_footprint_tokens"));
});
