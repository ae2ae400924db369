/** @module Tests of the gate metrics exposition, read as Prometheus text. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { Registry } from "prom-client";
import { registerGateMetrics } from "../../adapters/metrics/gate-metrics.js";
import { VirtualClock } from "../../src/clock.js";
import { BackendGate, type Permit } from "../../src/gate/backend-gate.js";

/** Parses exposition text into `name{labels} → value`, labels sorted so lookups do not depend on order. */
function parse(text: string): Map<string, number> {
  const samples = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const match = /^([a-z_:]+)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(match, `unparseable line: ${line}`);
    const labels = (match[2] ?? "").split(",").filter(Boolean).sort().join(",");
    samples.set(`${match[1]}{${labels}}`, Number(match[3]));
  }
  return samples;
}

function sample(
  samples: Map<string, number>,
  name: string,
  labels: Record<string, string>,
): number | undefined {
  const key = Object.entries(labels)
    .map(([k, v]) => `${k}="${v}"`)
    .sort()
    .join(",");
  return samples.get(`${name}{${key}}`);
}

test("gate metrics expose occupancy per rank, counters per rank, and limits", async () => {
  const clock = new VirtualClock();
  const ranked = new BackendGate({
    engineRequestLimit: 1,
    engineRequestWaitingLimit: 1,
    requestQueueLimit: 1,
    ranks: 2,
    clock,
  });
  const single = new BackendGate({
    engineRequestLimit: 3,
    engineRequestWaitingLimit: 2,
    requestQueueLimit: 0,
    clock,
  });
  const registry = new Registry();
  registerGateMetrics(registry, () => [
    { worker: "w1", gate: ranked },
    { worker: "w2", gate: single },
  ]);

  const held: Permit[] = [];
  held.push(await ranked.acquire({ rank: 0 }));
  const queued = ranked.acquire({ rank: 0 });
  await assert.rejects(ranked.acquire({ rank: 0 })); // rank 0's queue is full, rank 1 is idle: scope rank
  held.push(await ranked.acquire({ rank: 1 }));
  const controller = new AbortController();
  const cancelled = ranked.acquire({ signal: controller.signal }).catch((e: unknown) => e);
  controller.abort();
  await cancelled;
  const queuedOnRank1 = ranked.acquire({ rank: 1 });
  await assert.rejects(ranked.acquire({ rank: 1 })); // every queue place is taken now: scope worker
  held.push(await single.acquire());
  held[2]!.firstToken();

  const first = parse(await registry.metrics());
  const w1 = (dp_rank: string) => ({ worker: "w1", dp_rank });
  assert.equal(sample(first, "sluice_gate_engine_request_count", w1("0")), 1);
  assert.equal(sample(first, "sluice_gate_engine_request_count", w1("1")), 1);
  assert.equal(sample(first, "sluice_gate_engine_request_count", w1("unspecified")), 0);
  assert.equal(sample(first, "sluice_gate_request_queue_count", w1("0")), 1);
  assert.equal(
    sample(first, "sluice_gate_engine_request_waiting_count", { worker: "w2", dp_rank: "unspecified" }),
    0,
  );
  assert.equal(
    sample(first, "sluice_gate_engine_request_count", { worker: "w2", dp_rank: "unspecified" }),
    1,
  );
  assert.equal(sample(first, "sluice_gate_request_receive_total", w1("0")), 3);
  assert.equal(sample(first, "sluice_gate_request_receive_total", w1("1")), 3);
  assert.equal(sample(first, "sluice_gate_request_receive_total", w1("unspecified")), 1);
  assert.equal(sample(first, "sluice_gate_request_admit_total", { ...w1("0"), source: "direct" }), 1);
  assert.equal(sample(first, "sluice_gate_request_admit_total", { ...w1("0"), source: "queue" }), 0);
  assert.equal(sample(first, "sluice_gate_rejection_total", { ...w1("0"), scope: "rank" }), 1);
  assert.equal(sample(first, "sluice_gate_rejection_total", { ...w1("1"), scope: "worker" }), 1);
  assert.equal(sample(first, "sluice_gate_rejection_total", { ...w1("1"), scope: "rank" }), 0);
  assert.equal(sample(first, "sluice_gate_cancellation_total", w1("unspecified")), 1);
  assert.equal(sample(first, "sluice_gate_limit", { worker: "w1", kind: "engine_request" }), 1);
  assert.equal(sample(first, "sluice_gate_limit", { worker: "w2", kind: "engine_request_waiting" }), 2);
  assert.equal(sample(first, "sluice_gate_limit", { worker: "w2", kind: "request_queue" }), 0);
  const text = await registry.metrics();
  assert.match(text, /# TYPE sluice_gate_request_receive_total counter/);
  assert.match(text, /# TYPE sluice_gate_engine_request_count gauge/);

  // A later scrape reflects what changed, with no hook on the call path.
  held[0]!.release();
  const admitted = await queued;
  ranked.setLimits({ requestQueueLimit: 5 });
  const second = parse(await registry.metrics());
  assert.equal(sample(second, "sluice_gate_request_admit_total", { ...w1("0"), source: "queue" }), 1);
  assert.equal(sample(second, "sluice_gate_request_queue_count", w1("0")), 0);
  assert.equal(sample(second, "sluice_gate_limit", { worker: "w1", kind: "request_queue" }), 5);
  // Sums over dp_rank equal the gate's totals.
  let received = 0;
  for (const [key, value] of second) {
    if (key.startsWith("sluice_gate_request_receive_total{") && key.includes('worker="w1"'))
      received += value;
  }
  assert.equal(received, ranked.counters().received);
  held[1]!.release();
  const admittedOnRank1 = await queuedOnRank1;
  for (const p of [admitted, admittedOnRank1, held[2]!]) p.release();
  assert.deepEqual(ranked.snapshot().requests + single.snapshot().requests, 0);
});
