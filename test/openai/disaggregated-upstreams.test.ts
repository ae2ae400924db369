/**
 * @module `sluice serve` in front of a prefill and a decode replica over HTTP
 * (`--upstream role=…`): the simulated replicas in those roles speak vLLM's
 * disaggregated request flow, so the two calls, the hand-over of
 * `kv_transfer_params`, a decode failure after the prefill and a client that
 * leaves between the two calls are all exercised end to end.
 */

import assert from "node:assert/strict";
import { afterEach, describe, it } from "node:test";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";
import { type SimServer, startSimServer } from "../../adapters/engines/sim/http-server.js";
import { type FakeUpstream, startFakeUpstream } from "./fake-upstream.js";

let running: RunningServer | undefined;
const sims: SimServer[] = [];
const fakes: FakeUpstream[] = [];

afterEach(async () => {
  await running?.close();
  running = undefined;
  await Promise.all(sims.splice(0).map((s) => s.close()));
  await Promise.all(fakes.splice(0).map((s) => s.close()));
});

async function sim(role: "prefill" | "decode", id: string): Promise<SimServer> {
  const server = await startSimServer({ role, id });
  sims.push(server);
  return server;
}

async function serve(
  upstreams: string[],
  extra: Parameters<typeof startServer>[0] = {},
): Promise<RunningServer> {
  running = await startServer({ port: 0, host: "127.0.0.1", upstreams, log: () => {}, ...extra });
  return running;
}

function chat(url: string, content: string, maxTokens: number, signal?: AbortSignal): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content }], max_tokens: maxTokens, stream: true }),
    ...(signal ? { signal } : {}),
  });
}

/** Polls `check` on the event loop until it holds (no wall-clock bound: the test runner's timeout is the bound). */
async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((resolve) => setTimeout(resolve, 10));
}

function idle(server: RunningServer): boolean {
  const check = server.scheduler.idleCheck();
  return check.permits === 0 && check.reservations === 0 && check.queued === 0;
}

describe("sluice serve with a prefill and a decode upstream", () => {
  it("streams the decode replica's answer after the prefill replica computed the prompt and handed its KV over", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    const server = await serve([
      `role=prefill,name=p0,url=${prefill.url}`,
      `role=decode,name=d0,url=${decode.url}`,
    ]);
    const response = await chat(server.url, "Plan the migration of the billing service in three steps.", 24);
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("x-sluice-replica"), "d0");
    const text = await response.text();
    assert.match(text, /data: \[DONE\]/);
    const prefillStats = prefill.engine.stats();
    assert.ok(prefillStats.prefillTokens > 10, "the prefill replica computed the prompt");
    assert.equal(prefillStats.generationTokens, 1, "and generated its one token");
    assert.equal(decode.engine.transfers.transfers, 1, "the decode replica pulled the KV once");
    assert.equal(decode.engine.stats().prefillTokens, 1, "and computed only the last prompt token");
    assert.equal(decode.engine.stats().generationTokens, 24);
    const state = server.scheduler.state();
    assert.deepEqual(
      state.replicas.map((r) => [r.id, r.role]),
      [
        ["p0", "prefill"],
        ["d0", "decode"],
      ],
    );
    await until(() => idle(server));
  });

  it("a decode replica that fails after the prefill: 503 before any byte, the prefill counted as wasted, nothing held", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    // The decode replica's metrics and models pass through; its completions fail.
    const proxy = (path: string) => async (_req: unknown, res: import("node:http").ServerResponse) => {
      const up = await fetch(`${decode.url}${path}`);
      res.writeHead(up.status, { "content-type": up.headers.get("content-type") ?? "text/plain" });
      res.end(await up.text());
    };
    const failing = await startFakeUpstream({
      "/metrics": proxy("/metrics"),
      "/v1/models": proxy("/v1/models"),
      // The connection drops before any answer: no engine's error text is imitated here.
      "/v1/chat/completions": (_req, res) => {
        res.socket?.destroy();
      },
    });
    fakes.push(failing);
    const server = await serve([
      `role=prefill,name=p0,url=${prefill.url}`,
      `role=decode,name=d0,url=${failing.url}`,
    ]);
    const response = await chat(server.url, "Summarise the incident report.", 16);
    assert.equal(response.status, 503);
    assert.ok(response.headers.get("retry-after"));
    const body = (await response.json()) as { error: { code: string } };
    assert.equal(body.error.code, "unavailable");
    assert.ok(prefill.engine.stats().prefillTokens > 0, "the prefill ran");
    const pd = server.scheduler.state().disaggregation!;
    assert.equal(pd.refusedAfterPrefill, 1);
    assert.ok(pd.wastedPrefillTokens > 0);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(metrics, /sluice_replica_role_info\{replica="p0",role="prefill"\} 1/);
    assert.match(metrics, /sluice_replica_role_info\{replica="d0",role="decode"\} 1/);
    assert.match(
      metrics,
      new RegExp(`sluice_disagg_wasted_prefill_tokens_total\\{replica="p0"\\} ${pd.wastedPrefillTokens}`),
    );
    assert.match(metrics, /sluice_disagg_refused_after_prefill_total\{reason="unavailable"\} 1/);
    await until(() => idle(server));
  });

  it("a client that leaves while queued for the decode replica's gate holds nothing afterwards and cost no prefill", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    const server = await serve(
      [`role=prefill,name=p0,url=${prefill.url}`, `role=decode,name=d0,url=${decode.url}`],
      {
        config: { gate: { engineRequestLimit: 1 } },
      },
    );
    // The first call holds the decode replica's only gate slot while it generates.
    const first = new AbortController();
    const firstResponse = await chat(server.url, "Write a long design document.", 4000, first.signal);
    assert.equal(firstResponse.status, 200);
    const second = new AbortController();
    const pending = chat(server.url, "A short question.", 8, second.signal).catch((error: Error) => error);
    const decodeGate = () => server.scheduler.state().replicas.find((r) => r.id === "d0")!.gate;
    // It takes its place at the decode replica's gate before its prefill, so it waits there first.
    await until(() => decodeGate().queued === 1);
    assert.equal(prefill.engine.stats().generationTokens, 1, "only the first call's prefill ran");
    second.abort();
    const outcome = await pending;
    assert.ok(outcome instanceof Error && outcome.name === "AbortError");
    await until(() => decodeGate().queued === 0);
    first.abort();
    await firstResponse.body?.cancel().catch(() => undefined);
    await until(() => idle(server));
    assert.equal(prefill.engine.stats().generationTokens, 1, "the second call's prefill never ran");
    assert.equal(decode.engine.transfers.transfers, 1, "the second call's KV was never pulled");
    assert.equal(
      server.scheduler.state().disaggregation?.wastedPrefillTokens,
      0,
      "a cancel is not a refusal",
    );
  });
});
