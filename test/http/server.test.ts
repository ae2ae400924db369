/** @module `startServer` over a real socket with simulated replicas in real time: streaming, pinning, client aborts, shutdown. */

import assert from "node:assert/strict";
import { once } from "node:events";
import { connect } from "node:net";
import { after, afterEach, describe, test } from "node:test";
import { type RunningServer, type ServeOptions, startServer } from "../../adapters/cli/serve.js";
import { parsePrometheusText } from "../../adapters/engines/openai/metrics-parser.js";
import { startSimServer } from "../../adapters/engines/sim/http-server.js";
import { chatChunk, startFakeUpstream, startSse, vllmPage } from "../openai/fake-upstream.js";
import { assertIdle, chat, parseSse } from "./harness.js";

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

// Slow steps make a call last long enough to be observed mid-stream; a real H100 step is ~7 ms.
const SLOW = { base: "h100-llama3-8b", c0: 25 } as const;

async function start(options: ServeOptions = {}): Promise<RunningServer> {
  server = await startServer({
    port: 0,
    host: "127.0.0.1",
    simReplicas: 2,
    simPreset: SLOW,
    log: process.env.DEBUG_SERVE ? (line) => console.error(line) : () => {},
    drainTimeoutMs: 5000,
    ...options,
  });
  return server;
}

/** Waits for a condition the server reaches on its own (real time: there is no clock to advance). */
async function until(condition: () => boolean, what: string, limitMs = 10_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

function post(url: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) {
  return fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
    ...(signal ? { signal } : {}),
  });
}

const decoder = new TextDecoder();

function gateTotals(s: RunningServer) {
  const totals = { requests: 0, queued: 0, cancelled: 0 };
  for (const replica of s.scheduler.state().replicas) {
    totals.requests += replica.gate.requests;
    totals.queued += replica.gate.queued;
    totals.cancelled += replica.gate.counters.cancelled;
  }
  return totals;
}

describe("over a socket", () => {
  test("a streaming call's chunks arrive while the call is still running", async () => {
    const s = await start();
    const response = await post(`${s.url}/v1/chat/completions`, chat({ max_tokens: 40, stream: true }));
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type") ?? "", /text\/event-stream/);
    const reader = response.body!.getReader();
    const first = await reader.read();
    assert.equal(first.done, false);
    assert.match(decoder.decode(first.value), /^data: \{/);
    // The first bytes are here and the engine is still generating: nothing was buffered to the end.
    assert.equal(gateTotals(s).requests, 1, "the call is still running when its first chunk arrives");
    let text = decoder.decode(first.value);
    for (;;) {
      const next = await reader.read();
      if (next.done) break;
      text += decoder.decode(next.value);
    }
    const events = parseSse(text);
    assert.equal(events.at(-1)?.data, "[DONE]");
    assert.ok(events.length >= 3);
    await until(() => gateTotals(s).requests === 0, "the permit release");
    assertIdle(s.scheduler);
  });

  test("a session of several steps stays on one replica", async () => {
    const s = await start({ simPreset: { base: "h100-llama3-8b", c0: 2 } });
    const replicas: string[] = [];
    const messages: { role: string; content: string }[] = [
      { role: "system", content: "You are a careful agent. ".repeat(40) },
    ];
    for (let step = 0; step < 5; step++) {
      messages.push({ role: "user", content: `tool output ${step}: ${"result ".repeat(30)}` });
      const response = await post(
        `${s.url}/v1/chat/completions`,
        { model: s.scheduler.models()[0], messages, max_tokens: 6 },
        { "x-session-id": "agent-42" },
      );
      assert.equal(response.status, 200);
      const body = await response.json();
      messages.push({ role: "assistant", content: body.choices[0].message.content });
      replicas.push(response.headers.get("x-sluice-replica") ?? "");
    }
    assert.equal(new Set(replicas).size, 1, `steps moved between replicas: ${replicas.join(", ")}`);
    const view = await (await fetch(`${s.url}/v1/sessions/agent-42`)).json();
    assert.equal(view.steps, 5);
    assert.equal(view.replica, replicas[0]);
    assert.equal((await fetch(`${s.url}/v1/sessions/agent-42`, { method: "DELETE" })).status, 204);
    assertIdle(s.scheduler);
  });

  test("a client that aborts mid-stream releases permit, reservation and window slot at once", async () => {
    const s = await start();
    const cancelled = new Promise<void>((resolve) =>
      s.scheduler.addEvents({
        finished: (e) => {
          if (e.outcome === "cancelled") resolve();
        },
      }),
    );
    const abort = new AbortController();
    const response = await post(
      `${s.url}/v1/chat/completions`,
      chat({ max_tokens: 400, stream: true }),
      { "x-session-id": "leaver" },
      abort.signal,
    );
    const reader = response.body!.getReader();
    await reader.read();
    assert.equal(gateTotals(s).requests, 1);
    abort.abort();
    await cancelled;
    const check = s.scheduler.idleCheck();
    assert.equal(check.permits, 0);
    assert.equal(check.reservations, 0);
    assert.equal(check.queued, 0);
    assert.equal(check.windowSlots, 1, "the session stays active (idle) until closed");
    assert.equal((await fetch(`${s.url}/v1/sessions/leaver`, { method: "DELETE" })).status, 204);
    assertIdle(s.scheduler);
  });

  test("a client that aborts while queued leaves the queue and holds nothing", async () => {
    const s = await start({
      simReplicas: 1,
      config: { gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 4 } },
    });
    const holderAbort = new AbortController();
    const holder = await post(
      `${s.url}/v1/chat/completions`,
      chat({ max_tokens: 400, stream: true }),
      {},
      holderAbort.signal,
    );
    const holderReader = holder.body!.getReader();
    await holderReader.read();
    const queuedAbort = new AbortController();
    const queued = post(`${s.url}/v1/chat/completions`, chat({ stream: true }), {}, queuedAbort.signal);
    queued.catch(() => {});
    await until(() => gateTotals(s).queued === 1, "the second call to queue");
    queuedAbort.abort();
    await assert.rejects(queued, { name: "AbortError" });
    await until(() => gateTotals(s).cancelled === 1, "the queued call's cancellation");
    assert.equal(gateTotals(s).queued, 0);
    assert.equal(gateTotals(s).requests, 1, "the running call is untouched");
    holderAbort.abort();
    await until(() => gateTotals(s).requests === 0, "the running call's release");
    assertIdle(s.scheduler);
    const counters = s.scheduler.state().replicas[0]!.gate.counters;
    assert.equal(
      counters.received,
      counters.admittedDirect + counters.admittedQueue + counters.rejected + counters.cancelled,
    );
  });

  test("/metrics over the socket is Prometheus text with the docs/metrics.md families", async () => {
    const s = await start({ simPreset: { base: "h100-llama3-8b", c0: 2 } });
    assert.equal((await post(`${s.url}/v1/chat/completions`, chat())).status, 200);
    const response = await fetch(`${s.url}/metrics`);
    assert.equal(response.status, 200);
    const page = parsePrometheusText(await response.text());
    for (const name of [
      "sluice_requests_total",
      "sluice_time_to_first_token_seconds",
      "sluice_replica_kv_usage",
      "sluice_gate_request_admit_total",
      "sluice_overload_stage",
      "process_cpu_seconds_total",
    ]) {
      assert.ok(page.types.has(name), name);
    }
  });

  test("a streaming client that stops reading loses its call after the stall timeout; nothing stays held", async () => {
    // An upstream over HTTP that streams far more than the socket buffers between it, sluice and the
    // client hold, writing only as fast as it is read (as vLLM does): a stalled client stalls the call.
    let upstreamGone!: () => void;
    const upstreamClosed = new Promise<void>((resolve) => {
      upstreamGone = resolve;
    });
    const upstream = await startFakeUpstream({
      "/metrics": (_req, res) => {
        res.end(vllmPage({ kv: 0.1, running: 0, waiting: 0, queries: 0, hits: 0 }));
      },
      "/v1/models": (_req, res) => {
        res.end(JSON.stringify({ data: [{ id: "m", max_model_len: 8192 }] }));
      },
      "/v1/chat/completions": async (req, res) => {
        startSse(res);
        const filler = "x".repeat(64 * 1024);
        while (!req.wasAborted()) {
          const line = `data: ${JSON.stringify(chatChunk({ content: filler }))}\n\n`;
          if (!res.write(line)) await Promise.race([once(res, "drain"), req.aborted]);
        }
        upstreamGone();
      },
    });
    after(() => upstream.close());
    const s = await start({ upstreams: [upstream.url], streamStallTimeoutMs: 300 });
    await until(() => s.scheduler.readyReplicas() > 0, "the upstream's first scrape");
    const outcomes: string[] = [];
    const ended = new Promise<void>((resolve) =>
      s.scheduler.addEvents({
        finished: (e) => {
          outcomes.push(e.outcome);
          resolve();
        },
      }),
    );
    const body = JSON.stringify(chat({ model: "m", max_tokens: 64, stream: true }));
    const socket = connect(Number(new URL(s.url).port), "127.0.0.1");
    socket.pause(); // reads nothing, ever
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
    await ended;
    assert.deepEqual(outcomes, ["cancelled"], "the call was cut off, not finished");
    await upstreamClosed; // and the upstream saw it go
    assertIdle(s.scheduler);
    socket.destroy();
  });

  test("shutdown lets a running stream finish, refuses new calls, then stops", async () => {
    const s = await start({ simPreset: { base: "h100-llama3-8b", c0: 10 } });
    const response = await post(`${s.url}/v1/chat/completions`, chat({ max_tokens: 30, stream: true }));
    const reader = response.body!.getReader();
    let text = decoder.decode((await reader.read()).value);
    const closed = s.close();
    for (;;) {
      const next = await reader.read();
      if (next.done) break;
      text += decoder.decode(next.value);
    }
    const events = parseSse(text);
    assert.equal(events.at(-1)?.data, "[DONE]");
    assert.ok(!events.some((e) => e.event === "error"), "the running stream finished normally");
    await closed;
    await assert.rejects(fetch(`${s.url}/healthz`));
    assertIdle(s.scheduler);
    server = undefined;
  });

  test("shutdown cancels streams still running after the drain timeout", async () => {
    const s = await start({ drainTimeoutMs: 100 });
    const response = await post(`${s.url}/v1/chat/completions`, chat({ max_tokens: 1000, stream: true }));
    const reader = response.body!.getReader();
    await reader.read();
    await s.close();
    // The stream ends (cleanly or by a reset); either way nothing is held any more.
    try {
      while (!(await reader.read()).done) {}
    } catch {
      // a reset connection is an acceptable end after a forced shutdown
    }
    assertIdle(s.scheduler);
    server = undefined;
  });

  test("in front of an OpenAI-compatible upstream: raw SSE passes through, JSON calls and models work", async () => {
    const upstream = await startSimServer({ port: 0, preset: { base: "h100-llama3-8b", c0: 3 } });
    try {
      const s = await start({ upstreams: [upstream.url] });
      const models = await (await fetch(`${s.url}/v1/models`)).json();
      assert.deepEqual(
        models.data.map((m: { id: string }) => m.id),
        [upstream.engine.model],
      );
      assert.equal((await fetch(`${s.url}/readyz`)).status, 200);
      const streamed = await post(
        `${s.url}/v1/chat/completions`,
        chat({
          model: upstream.engine.model,
          max_tokens: 6,
          stream: true,
          stream_options: { include_usage: true },
        }),
        { "x-session-id": "upstream-agent" },
      );
      assert.equal(streamed.status, 200);
      assert.equal(streamed.headers.get("x-sluice-replica"), s.scheduler.state().replicas[0]!.id);
      const events = parseSse(await streamed.text());
      assert.equal(events.filter((e) => e.data === "[DONE]").length, 1);
      assert.equal(events.at(-1)?.data, "[DONE]");
      const chunks = events.slice(0, -1).map((e) => JSON.parse(e.data));
      assert.ok(chunks.every((c) => c.object === "chat.completion.chunk"));
      assert.equal(chunks.at(-1).usage.completion_tokens, 6, "the upstream's own usage chunk came through");
      const whole = await post(
        `${s.url}/v1/chat/completions`,
        chat({ model: upstream.engine.model, max_tokens: 5 }),
      );
      assert.equal(whole.status, 200);
      const body = await whole.json();
      assert.equal(body.usage.completion_tokens, 5);
      assert.ok(body.choices[0].message.content.length > 0);
      assert.equal((await fetch(`${s.url}/v1/sessions/upstream-agent`, { method: "DELETE" })).status, 204);
      await until(() => s.scheduler.idleCheck().permits === 0, "permits to return");
      assertIdle(s.scheduler);
      await s.close();
      server = undefined;
    } finally {
      await upstream.close();
    }
  });
});
