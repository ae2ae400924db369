/**
 * @module `sluice serve` in front of an OpenAI-compatible server whose metrics it cannot read:
 * served on its health (`/health`, else `/v1/models`), every signal unknown — in the admin
 * state, on the dashboard's data, in the log and on `/metrics` (no stand-in numbers).
 */

import assert from "node:assert/strict";
import { afterEach, describe, it } from "node:test";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";
import {
  chatChunk,
  type FakeUpstream,
  type Handler,
  sse,
  startFakeUpstream,
  startSse,
  usageChunk,
} from "./fake-upstream.js";

// llama.cpp's answer to GET /health once its model is loaded (`ggml-org/llama.cpp`,
// `tools/server/README.md`, "GET /health"; the snapshot read is `unslothai/llama.cpp` at
// d32676d77426540327835040d5d3279728f0b4c8). Any server's 200 would do; this one is genuine.
const HEALTH_OK = '{"status": "ok" }';
// The same README's answer while the model loads (status 503).
const HEALTH_LOADING = '{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}';

const servers: FakeUpstream[] = [];
let running: RunningServer | undefined;

afterEach(async () => {
  await running?.close();
  running = undefined;
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

const status =
  (code: number, body: string, type = "application/json"): Handler =>
  (_req, res) => {
    res.writeHead(code, { "content-type": type });
    res.end(body);
  };

const chat: Handler = (_req, res) => {
  startSse(res);
  sse(res, chatChunk({ role: "assistant", content: "" }));
  sse(res, chatChunk({ content: "hi" }));
  sse(res, chatChunk({}, "stop"));
  sse(res, usageChunk(12, 1));
  sse(res, "[DONE]");
  res.end();
};

const MODELS = JSON.stringify({ object: "list", data: [{ id: "m", object: "model" }] });

async function upstream(routes: Record<string, Handler>): Promise<FakeUpstream> {
  const up = await startFakeUpstream(routes);
  servers.push(up);
  return up;
}

async function serve(urls: string[], extra: { kvCapacityTokens?: string[] } = {}) {
  const lines: string[] = [];
  running = await startServer({
    port: 0,
    host: "127.0.0.1",
    upstreams: urls,
    log: (line) => lines.push(line),
    ...extra,
  });
  return { server: running, lines };
}

async function call(server: RunningServer): Promise<Response> {
  return fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hello" }], max_tokens: 8 }),
  });
}

function idle(server: RunningServer): void {
  assert.deepEqual(server.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
}

describe("an engine whose metrics cannot be read", () => {
  it("is served while /health answers: calls and /readyz 200, signals unknown, a warning naming the flags that stand in", async () => {
    // No /metrics route: the fake answers 404, as a server with metrics off or none at all.
    const up = await upstream({
      "/health": status(200, HEALTH_OK),
      "/v1/models": status(200, MODELS),
      "/v1/chat/completions": chat,
    });
    const { server, lines } = await serve([`plain=${up.url}`]);

    assert.equal((await fetch(`${server.url}/readyz`)).status, 200);
    const answer = await call(server);
    assert.equal(answer.status, 200, await answer.clone().text());
    const body = (await answer.json()) as { choices: { message: { content: string } }[] };
    assert.equal(body.choices[0]?.message.content, "hi");

    const state = (await (await fetch(`${server.url}/v1/admin/state`)).json()) as {
      replicas: {
        id: string;
        healthy: boolean;
        window: { size: number | null };
        budget: { ceilingTokens: number };
        signals: Record<string, number | null>;
        engine?: {
          profile: string;
          unknown: string[];
          tokenBudget: boolean;
          warning?: string;
          kvCapacitySource: string;
        };
      }[];
    };
    const replica = state.replicas[0]!;
    assert.equal(replica.healthy, true);
    assert.equal(replica.engine?.profile, "unknown");
    for (const field of ["kvUsage", "prefixCache", "running", "waiting", "kvCapacityTokens", "maxNumSeqs"]) {
      assert.ok(replica.engine?.unknown.includes(field), field);
    }
    // The state says unknown too: null, never a stand-in 0.
    for (const signal of ["kvUsage", "hitRate", "running", "waiting", "preemptions"])
      assert.equal(replica.signals[signal], null, signal);
    assert.equal(replica.engine?.tokenBudget, false);
    assert.equal(replica.engine?.kvCapacitySource, "unknown");
    assert.match(replica.engine?.warning ?? "", /GET \/metrics answered 404/);
    assert.match(replica.engine?.warning ?? "", /--kv-capacity-tokens plain=N/);
    assert.match(replica.engine?.warning ?? "", /--engine-request-limit/);
    assert.match(replica.engine?.warning ?? "", /initial size/);

    assert.ok(
      lines.some((l) => l === `sluice: upstream plain (${up.url}): unknown; signals unknown`),
      lines.join("\n"),
    );
    assert.ok(lines.some((l) => l.startsWith("sluice: warning: upstream plain: its metrics cannot be read")));

    // Unknown is unknown on /metrics: no series for what the engine does not publish, no budget ceiling.
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    for (const name of [
      "sluice_replica_kv_usage",
      "sluice_replica_prefix_hit_rate",
      "sluice_replica_kv_usage_ratio",
      "sluice_replica_prefix_cache_hit_ratio",
      "sluice_replica_running_requests",
      "sluice_replica_waiting_requests",
      "sluice_replica_token_ceiling",
      "sluice_replica_available_tokens",
      "sluice_replica_engine_stated_hit_rate",
    ]) {
      assert.ok(!metrics.includes(`${name}{replica="plain"}`), `${name} has a series`);
    }
    assert.match(metrics, /sluice_replica_healthy\{replica="plain"\} 1/);
    idle(server);
  });

  it("without /health, /v1/models decides; --kv-capacity-tokens turns the budget on and the warning says so", async () => {
    const up = await upstream({ "/v1/models": status(200, MODELS), "/v1/chat/completions": chat });
    const { server } = await serve([`p=${up.url}`], { kvCapacityTokens: ["p=4096"] });
    const replica = server.scheduler.state().replicas[0]!;
    assert.equal(replica.healthy, true);
    assert.equal(replica.engine?.kvCapacitySource, "configured");
    assert.equal(replica.engine?.tokenBudget, true);
    assert.equal(replica.budget.ceilingTokens, 4096);
    assert.match(replica.engine?.warning ?? "", /uses --kv-capacity-tokens \(4096 tokens\)/);
    assert.equal((await call(server)).status, 200);
    idle(server);
  });

  it("a /health that answers 503 (a model still loading) is an unhealthy replica: 503 unavailable, /readyz 503", async () => {
    const up = await upstream({ "/health": status(503, HEALTH_LOADING), "/v1/models": status(200, MODELS) });
    const { server } = await serve([`l=${up.url}`]);
    assert.equal(server.scheduler.state().replicas[0]!.healthy, false);
    assert.equal((await fetch(`${server.url}/readyz`)).status, 503);
    const answer = await call(server);
    assert.equal(answer.status, 503);
    assert.equal(((await answer.json()) as { error: { code: string } }).error.code, "unavailable");
    assert.ok(answer.headers.get("retry-after"));
    idle(server);
  });
});

describe("unknown is unknown on /metrics", () => {
  it("an SGLang page stating cache_hit_rate (87.58…%) but no cached_tokens_total: no hit-rate series, the stated rate on its own gauge", async () => {
    const { readFileSync } = await import("node:fs");
    const page = readFileSync(
      new URL("./fixtures/sglang-pr1461-first-collector.prom", import.meta.url),
      "utf8",
    );
    const up = await upstream({ "/metrics": status(200, page, "text/plain; version=0.0.4") });
    const { server } = await serve([`sg=${up.url}`]);
    const replica = server.scheduler.state().replicas[0]!;
    assert.ok(replica.engine?.unknown.includes("prefixCache"));
    assert.equal(replica.signals.hitRate, null);
    assert.equal(typeof replica.signals.kvUsage, "number", "what the page states is read");
    assert.equal(replica.engine?.warning, undefined, "a page read is not an unreadable engine");
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.ok(!metrics.includes('sluice_replica_prefix_hit_rate{replica="sg"}'));
    assert.ok(!metrics.includes('sluice_replica_prefix_cache_hit_ratio{replica="sg"}'));
    const stated = /sluice_replica_engine_stated_hit_rate\{replica="sg"\} (\S+)/.exec(metrics);
    assert.ok(stated, metrics);
    assert.ok(Math.abs(Number(stated[1]) - 0.8758777633289988) < 1e-12);
    // Its KV usage and request gauges are on the page: they have series.
    assert.match(metrics, /sluice_replica_kv_usage\{replica="sg"\} /);
    assert.match(metrics, /sluice_replica_running_requests\{replica="sg"\} /);
  });
});
