/**
 * @module Faults, each as a test against real parts in real time: a replica process killed
 * mid-stream and restarted, a replica whose `/metrics` hangs or talks garbage, a thousand clients
 * leaving at every stage at once, a client that reads its stream very slowly, and SIGTERM to a
 * served process under load. After each: what the client saw, and that nothing stayed held.
 */

import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import net from "node:net";
import { after, describe, test } from "node:test";
import { getRequestListener, serve } from "@hono/node-server";
import { Hono } from "hono";
import { connect, headers as createHeaders, createInbox, type NatsConnection } from "nats";
import { Registry } from "prom-client";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { createSimApp } from "../../adapters/engines/sim/http-server.js";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { createApp } from "../../adapters/http/app.js";
import { type NatsServerProcess, startNatsServer } from "../../adapters/nats/nats-server-process.js";
import { HEADERS, SUBJECTS } from "../../adapters/nats/protocol.js";
import { createTokenizer } from "../../adapters/tokenizers/index.js";
import { realClock } from "../../src/clock.js";
import { Scheduler } from "../../src/scheduler.js";
import type { AdminState } from "../../src/types.js";
import {
  assertQuiescent,
  checkRefusal,
  freePort,
  holdings,
  recordFigures,
  type SluiceChild,
  spawnSluice,
  sseEvents,
  startSimChild,
  stopChild,
  until,
} from "./helpers.js";

const figures: Record<string, unknown> = {};
after(async () => {
  await recordFigures("faults", figures);
});

const quiet = () => {};

function chatBody(extra: Record<string, unknown> = {}, words = 8, salt = ""): Record<string, unknown> {
  return {
    messages: [
      { role: "user", content: `${salt} ${Array.from({ length: words }, (_, i) => `w${i % 61}`).join(" ")}` },
    ],
    max_tokens: 16,
    ...extra,
  };
}

function post(url: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) {
  return fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
    ...(signal ? { signal } : {}),
  });
}

const decoder = new TextDecoder();

/** Reads a stream to its end (or its failure), returning the text. */
async function drain(reader: ReadableStreamDefaultReader<Uint8Array>, start = ""): Promise<string> {
  let text = start;
  for (;;) {
    const next = await reader.read();
    if (next.done) return text;
    text += decoder.decode(next.value, { stream: true });
  }
}

// --- a replica process killed mid-stream ---------------------------------------------------------

describe("a replica process killed mid-stream, then restarted on its port", () => {
  const children: (SluiceChild | undefined)[] = [];
  let server: RunningServer | undefined;
  after(async () => {
    await server?.close();
    for (const child of children) await stopChild(child);
  });

  test("its streams end with an SSE error event, holds are released, its sessions move, and it is used again once back", async () => {
    const ports = [await freePort(), await freePort()];
    const [a, b] = await Promise.all(ports.map((port) => startSimChild(port)));
    children.push(a, b);
    server = await startServer({
      port: 0,
      host: "127.0.0.1",
      upstreams: ports.map((port) => `http://127.0.0.1:${port}`),
      log: quiet,
      drainTimeoutMs: 2000,
    });
    const s = server;
    await until(() => s.scheduler.readyReplicas() === 2, "both replicas healthy");
    const ids = s.scheduler.state().replicas.map((r) => r.id);

    // Sessions with distinct prompts, long enough to be mid-stream when the replica dies.
    const streams = await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        const session = `killed-${i}`;
        const response = await post(
          s.url,
          chatBody({ stream: true, max_tokens: 600 }, 30, `session ${i} topic ${i * 7919}`),
          { "x-session-id": session },
        );
        assert.equal(response.status, 200);
        const reader = response.body!.getReader();
        const first = await reader.read();
        assert.equal(first.done, false);
        return {
          session,
          replica: response.headers.get("x-sluice-replica")!,
          reader,
          head: decoder.decode(first.value),
        };
      }),
    );
    const byReplica = new Map<string, number>();
    for (const stream of streams) byReplica.set(stream.replica, (byReplica.get(stream.replica) ?? 0) + 1);
    // Kill the replica holding the most sessions (placement spreads them, but need not split them evenly).
    const victim = [...byReplica.entries()].sort((x, y) => y[1] - x[1])[0]![0];
    const survivor = ids.find((id) => id !== victim)!;
    const victimChild = (ids.indexOf(victim) === 0 ? a : b)!;
    const victimPort = ports[ids.indexOf(victim)]!;
    victimChild.child.kill("SIGKILL");
    await victimChild.exited;

    const endings = await Promise.all(
      streams.map(async (stream) => ({ ...stream, text: await drain(stream.reader, stream.head) })),
    );
    let errored = 0;
    for (const ending of endings) {
      const events = sseEvents(ending.text);
      assert.equal(events.at(-1)?.data, "[DONE]", "every stream ends with one [DONE]");
      const error = events.find((e) => e.event === "error");
      if (ending.replica === victim) {
        assert.ok(
          error,
          `a stream on the killed replica ends with an SSE error event: ${ending.text.slice(-300)}`,
        );
        const envelope = JSON.parse(error.data) as { error: { code: string; type: string } };
        assert.equal(envelope.error.code, "unavailable");
        errored++;
      } else {
        assert.equal(error, undefined, "streams on the surviving replica are untouched");
      }
    }
    assert.ok(errored >= 1);
    await until(() => s.scheduler.idleCheck().permits === 0, "permits released");
    assertQuiescent(s.scheduler);

    await until(
      () => s.scheduler.state().replicas.find((r) => r.id === victim)?.healthy === false,
      "the killed replica marked unhealthy",
    );

    // Its sessions' next steps run on the survivor, and the session table says so.
    for (const stream of endings.filter((e) => e.replica === victim)) {
      const step = await post(s.url, chatBody({ max_tokens: 4 }, 30, `session ${stream.session}`), {
        "x-session-id": stream.session,
      });
      const text = await step.text();
      assert.equal(step.status, 200, text);
      assert.equal(step.headers.get("x-sluice-replica"), survivor);
      assert.equal(s.scheduler.getSession(stream.session)?.replica, survivor);
    }

    // Back on the same port: healthy again, and new work lands there.
    children.push(await startSimChild(victimPort));
    await until(
      () => s.scheduler.state().replicas.find((r) => r.id === victim)?.healthy === true,
      "the restarted replica healthy again",
    );
    let usedAgain = false;
    for (let i = 0; i < 40 && !usedAgain; i++) {
      const response = await post(s.url, chatBody({ max_tokens: 4 }, 30, `fresh ${i}`), {
        "x-session-id": `fresh-${i}`,
      });
      const text = await response.text();
      assert.equal(response.status, 200, text);
      usedAgain = response.headers.get("x-sluice-replica") === victim;
    }
    assert.ok(usedAgain, "the restarted replica takes new sessions again");
    for (const id of [
      ...endings.map((e) => e.session),
      ...Array.from({ length: 40 }, (_, i) => `fresh-${i}`),
    ])
      s.scheduler.closeSession(id);
    assertQuiescent(s.scheduler, { sessionsClosed: true });
    figures.killedReplica = { streams: streams.length, endedWithErrorEvent: errored, survivor, victim };
  });
});

// --- a replica whose /metrics hangs or talks garbage ----------------------------------------------

/** A simulated replica over HTTP whose `/metrics` can be switched to hang or to answer garbage. */
async function flakyReplica() {
  const engine = new SimEngine({ id: "flaky", clock: realClock });
  const sim = createSimApp(engine);
  const state = { mode: "ok" as "ok" | "hang" | "garbage", hung: [] as (() => void)[] };
  const front = new Hono();
  front.get("/metrics", async (c) => {
    if (state.mode === "hang") await new Promise<void>((resolve) => state.hung.push(resolve));
    if (state.mode === "garbage")
      return c.text("<html>502 Bad Gateway</html>\nvllm:kv_cache_usage_perc{oops NaN\n\u0000\u0001");
    return sim.fetch(c.req.raw);
  });
  front.all("*", (c) => sim.fetch(c.req.raw));
  const server = serve({ fetch: front.fetch, port: 0, hostname: "127.0.0.1" }) as Server;
  await new Promise<void>((resolve) =>
    server.listening ? resolve() : server.once("listening", () => resolve()),
  );
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    set(mode: "ok" | "hang" | "garbage") {
      state.mode = mode;
      if (mode !== "hang") for (const release of state.hung.splice(0)) release();
    },
    async close() {
      this.set("ok");
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      await engine.close();
    },
  };
}

describe("a replica whose /metrics hangs or answers garbage", () => {
  let replica: Awaited<ReturnType<typeof flakyReplica>> | undefined;
  const servers: RunningServer[] = [];
  after(async () => {
    for (const s of servers) await s.close();
    await replica?.close();
  });

  async function frontOf(staleSignals: "closed" | "open"): Promise<RunningServer> {
    const s = await startServer({
      port: 0,
      host: "127.0.0.1",
      upstreams: [replica!.url],
      log: quiet,
      drainTimeoutMs: 2000,
      config: { sessions: { staleSignals, staleAfterMs: 3000, controlIntervalMs: 500 } },
    });
    servers.push(s);
    await until(() => s.scheduler.readyReplicas() === 1, "the replica healthy");
    return s;
  }

  const step = async (s: RunningServer, session?: string) => {
    const response = await post(
      s.url,
      chatBody({ max_tokens: 4 }),
      session ? { "x-session-id": session } : {},
    );
    const text = await response.text();
    return { status: response.status, headers: response.headers, text };
  };

  test("signals go stale: with --stale-signals closed a new session is refused 503 unavailable with Retry-After; fresh signals admit again", async () => {
    replica = await flakyReplica();
    const closed = await frontOf("closed");
    const seen: Record<string, string> = {};
    for (const mode of ["hang", "garbage"] as const) {
      replica.set(mode);
      // Stale for longer than a control interval: the admission layer has seen it by then.
      await until(
        () => closed.scheduler.state().replicas[0]!.signals.ageMs > 3600,
        `signals stale (${mode})`,
      );
      const refused = await step(closed, `new-${mode}`);
      assert.equal(refused.status, 503, refused.text);
      assert.equal(checkRefusal(503, refused.headers, refused.text), "unavailable");
      seen[mode] = `new session ${refused.status}`;
      replica.set("ok");
      await until(
        () => !closed.scheduler.state().replicas[0]!.signals.stale && closed.scheduler.readyReplicas() === 1,
        "fresh signals",
      );
      const admitted = await step(closed, `new-${mode}`);
      assert.equal(admitted.status, 200, admitted.text);
      closed.scheduler.closeSession(`new-${mode}`);
    }
    assertQuiescent(closed.scheduler, { sessionsClosed: true });
    figures.staleMetrics = seen;
  });

  test("stale but reachable: active sessions and one-off calls go on (closed), and --stale-signals open admits new sessions", async () => {
    replica ??= await flakyReplica();
    replica.set("ok");
    const closed = servers[0] ?? (await frontOf("closed"));
    const open = await frontOf("open");
    assert.equal((await step(closed, "active-1")).status, 200, "the session is active before the fault");
    replica.set("hang");
    try {
      await until(
        () =>
          closed.scheduler.state().replicas[0]!.signals.ageMs > 3600 &&
          open.scheduler.state().replicas[0]!.signals.ageMs > 3600,
        "signals stale",
      );
      const active = await step(closed, "active-1");
      assert.equal(active.status, 200, `an active session continues: ${active.text}`);
      const oneOff = await step(closed);
      assert.equal(oneOff.status, 200, `a one-off call is no new session: ${oneOff.text}`);
      const admitted = await step(open, "open-new-1");
      assert.equal(admitted.status, 200, `--stale-signals open admits a new session: ${admitted.text}`);
    } finally {
      replica.set("ok");
      closed.scheduler.closeSession("active-1");
      open.scheduler.closeSession("open-new-1");
    }
  });
});

// --- a thousand clients leaving at every stage at once --------------------------------------------

describe("clients that disconnect while queued, while waiting for the first token, and mid-stream", () => {
  let server: RunningServer | undefined;
  after(async () => {
    await server?.close();
  });

  test("a thousand at once: every queue place, permit and reservation comes back; the gate counts them as cancelled", async () => {
    server = await startServer({
      port: 0,
      host: "127.0.0.1",
      simReplicas: 2,
      log: quiet,
      drainTimeoutMs: 2000,
      config: {
        gate: { engineRequestLimit: 10, engineRequestWaitingLimit: 10, requestQueueLimit: 1000 },
        // Room for a thousand queued calls: no lane deadline, residence or token budget refuses them first.
        lanes: {
          interactive: { maxResidenceMs: 600_000, deadlineMs: 3_600_000 },
          bulk: { maxResidenceMs: 600_000, deadlineMs: 3_600_000 },
        },
        budget: { ceilingTokens: 1_000_000_000 },
      },
    });
    const s = server;
    const controllers: AbortController[] = [];
    type Outcome = { status: number; reader?: ReadableStreamDefaultReader<Uint8Array>; failure?: string };
    // Settles to an outcome, never a rejection: hundreds of these wait while the test does other
    // things, and a failure must reach the assertions below, not escape as an unhandled rejection.
    const open = async (body: unknown): Promise<Outcome> => {
      const controller = new AbortController();
      controllers.push(controller);
      try {
        const response = await post(s.url, body, {}, controller.signal);
        if (response.status !== 200) {
          checkRefusal(response.status, response.headers, await response.text());
          return { status: response.status };
        }
        return { status: 200, reader: response.body!.getReader() };
      } catch (error) {
        if ((error as Error).name === "AbortError") return { status: 0 };
        return { status: 0, failure: String(error) };
      }
    };
    // Mid-stream: twelve long generations, each past its first chunks.
    const streaming = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        open(chatBody({ stream: true, max_tokens: 4000 }, 10, `stream ${i}`)),
      ),
    );
    for (const call of streaming) {
      assert.equal(call.status, 200, call.failure);
      await call.reader!.read();
      await call.reader!.read();
    }
    // Waiting for the first token: eight 80k-token prompts, seconds of prefill each, none sharing a prefix.
    const prefilling = Array.from({ length: 8 }, (_, i) =>
      open(chatBody({ stream: true, max_tokens: 8 }, 40_000, `long ${i}`)),
    );
    // Queued: the rest of a thousand, behind full per-rank limits.
    const queued = Array.from({ length: 980 }, (_, i) =>
      open(chatBody({ stream: true, max_tokens: 8 }, 10, `queued ${i}`)),
    );
    await until(
      () => holdings(s.scheduler.state()).gateQueued >= 950,
      "the calls queued at the gates",
      60_000,
    );
    const before = holdings(s.scheduler.state());
    assert.equal(before.gateRequests, 20, "every permit is taken");
    assert.ok(before.gateWaiting >= 1, "some admitted calls have no first token yet");
    // A thousand clients leave at once.
    for (const controller of controllers) controller.abort();
    const outcomes = await Promise.all([...prefilling, ...queued]);
    for (const call of [...streaming, ...outcomes]) await call.reader?.cancel().catch(() => {});
    assert.deepEqual(
      outcomes.flatMap((o) => (o.failure ? [o.failure] : [])),
      [],
      "every call ended in a response or in its client leaving",
    );
    assert.ok(!outcomes.some((o) => o.status >= 500), "no 5xx");
    await until(
      () => {
        const check = s.scheduler.idleCheck();
        return check.permits === 0 && check.queued === 0 && check.reservations === 0;
      },
      "every hold released",
      30_000,
    );
    assertQuiescent(s.scheduler);
    const counters = s.scheduler.state().replicas.map((r) => r.gate.counters);
    const cancelled = counters.reduce((n, c) => n + c.cancelled, 0);
    assert.ok(
      // A permit freed by a leaving stream may admit a queued call a moment before that call's own client leaves.
      cancelled >= before.gateQueued - before.gateRequests,
      `queued calls that left count as cancelled (${cancelled} of ${before.gateQueued})`,
    );
    // Still serving.
    const after = await post(s.url, chatBody({ max_tokens: 4 }));
    assert.equal(after.status, 200, await after.text());
    figures.clientDisconnects = {
      total: controllers.length,
      queuedAtOnce: before.gateQueued,
      admittedWithoutFirstToken: before.gateWaiting,
      admittedStreaming: before.gateRequests - before.gateWaiting,
      gateCancelled: cancelled,
    };
  });
});

// --- a client that reads very slowly ----------------------------------------------------------------

/** An OpenAI-compatible upstream that streams `totalBytes` of SSE as fast as its socket takes them. */
async function firehoseUpstream(totalBytes: number) {
  const engine = new SimEngine({ id: "firehose", clock: realClock });
  // Models and /metrics come from a simulated replica; completions are the firehose.
  const simulated = getRequestListener(createSimApp(engine).fetch);
  const stats = { written: 0 };
  const content = "x".repeat(4000);
  const chunk = (delta: Record<string, unknown>, finish: string | null) =>
    Buffer.from(
      `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`,
    );
  const event = chunk({ content }, null);
  const server = createServer((req, res) => {
    if (req.method !== "POST" || !req.url?.startsWith("/v1/chat/completions")) {
      void simulated(req, res);
      return;
    }
    req.resume();
    res.writeHead(200, { "content-type": "text/event-stream" });
    let sent = 0;
    // Counted when the socket accepts them: a stalled reader stops this loop at the first full buffer.
    const pump = () => {
      while (sent < totalBytes) {
        sent += event.length;
        stats.written += event.length;
        if (!res.write(event)) {
          res.once("drain", pump);
          return;
        }
      }
      res.write(chunk({}, "stop"));
      res.end("data: [DONE]\n\n");
    };
    res.on("close", () => res.off("drain", pump));
    pump();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    stats,
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      await engine.close();
    },
  };
}

/** Real time passing, for faults that need it (never used to assert a duration). */
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("a client that reads its stream very slowly", () => {
  test("back-pressure reaches the upstream: sluice buffers a bounded amount, then the stream completes intact", async () => {
    const totalBytes = 96 * 1024 * 1024;
    const upstream = await firehoseUpstream(totalBytes);
    const engine = new OpenAIUpstreamEngine({ baseUrl: upstream.url, id: "firehose" });
    await engine.start();
    const scheduler = new Scheduler({ engines: [engine], clock: realClock, tokenizer: createTokenizer() });
    scheduler.start();
    const app = createApp({ scheduler, registry: new Registry() });
    // The same composition as `sluice serve`, with the listening server at hand to watch its sockets.
    const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as Server;
    await new Promise<void>((resolve) =>
      server.listening ? resolve() : server.once("listening", () => resolve()),
    );
    const sockets = new Set<Socket>();
    server.on("connection", (socket) => sockets.add(socket));
    const port = (server.address() as AddressInfo).port;
    try {
      await until(() => scheduler.readyReplicas() === 1, "upstream healthy");
      const client = net.connect(port, "127.0.0.1");
      await new Promise((resolve) => client.once("connect", resolve));
      let received = 0;
      let tail = "";
      client.on("data", (chunk: Buffer) => {
        received += chunk.length;
        tail = (tail + chunk.toString("latin1")).slice(-200);
      });
      const ended = new Promise<void>((resolve) => client.once("end", () => resolve()));
      const body = JSON.stringify({
        messages: [{ role: "user", content: "stream a lot" }],
        max_tokens: 100_000,
        stream: true,
      });
      client.write(
        `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`,
      );
      await until(() => received > 0, "the first bytes");
      client.pause();
      // The client reads nothing for a while; then only a trickle.
      let maxBuffered = 0;
      const heapBefore = process.memoryUsage().heapUsed;
      const watch = setInterval(() => {
        for (const socket of sockets) maxBuffered = Math.max(maxBuffered, socket.writableLength);
      }, 5);
      await pause(1500);
      const writtenWhilePaused = upstream.stats.written;
      for (let i = 0; i < 10; i++) {
        client.resume();
        await new Promise((resolve) => setImmediate(resolve));
        client.pause();
        await pause(50);
      }
      const writtenWhileTrickling = upstream.stats.written;
      const heapPaused = process.memoryUsage().heapUsed;
      clearInterval(watch);
      // Nothing between the upstream and the slow client may hold more than socket buffers' worth.
      assert.ok(
        writtenWhileTrickling < 48 * 1024 * 1024,
        `the upstream pushed ${writtenWhileTrickling} bytes into a stalled stream`,
      );
      assert.ok(
        maxBuffered <= 1024 * 1024,
        `sluice buffered ${maxBuffered} bytes in user space for one socket`,
      );
      assert.ok(heapPaused - heapBefore < 64 * 1024 * 1024, `the heap grew ${heapPaused - heapBefore} bytes`);
      assert.equal(
        scheduler.idleCheck().permits > 0,
        true,
        "the call is still running while the client stalls",
      );
      client.resume();
      await ended;
      assert.ok(received >= totalBytes, `the whole stream arrived (${received} of ${totalBytes})`);
      assert.match(tail, /data: \[DONE\]\s*(0\r\n\r\n)?$/);
      await until(() => scheduler.idleCheck().permits === 0, "the permit released");
      assertQuiescent(scheduler);
      figures.slowClient = {
        streamBytes: totalBytes,
        upstreamBytesWhileStalled: writtenWhilePaused,
        upstreamBytesAfterTrickle: writtenWhileTrickling,
        maxSocketBufferedBytes: maxBuffered,
        heapGrowthWhileStalledBytes: heapPaused - heapBefore,
      };
      client.destroy();
    } finally {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      await scheduler.stop();
      await engine.close();
      await upstream.close();
    }
  });
});

// --- SIGTERM under load -----------------------------------------------------------------------------

describe("SIGTERM to a served process under load", () => {
  let serve: SluiceChild | undefined;
  after(async () => {
    await stopChild(serve);
  });

  test("running and queued calls finish, new ones are refused or turned away, and it exits 0 holding nothing", async () => {
    serve = spawnSluice([
      "serve",
      "--port",
      "0",
      "--host",
      "127.0.0.1",
      "--sim-replicas",
      "2",
      "--engine-request-limit",
      "4",
      "--drain-timeout-ms",
      "20000",
    ]);
    const match = await serve.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    const url = `http://127.0.0.1:${match[1]}`;
    // Each call settles to a result, never a rejection: one that failed early must not go unhandled
    // while the test is still waiting for the others to reach the server.
    const inFlight = Array.from({ length: 24 }, (_, i) =>
      (async () => {
        const response = await post(
          url,
          chatBody({ stream: true, max_tokens: 120 }, 20, `drain ${i}`),
          i % 3 === 0 ? { "x-session-id": `drain-${i}` } : {},
        );
        return { status: response.status, text: await response.text() };
      })().catch((error: unknown) => ({ status: 0, text: `failed: ${String(error)}` })),
    );
    // Signal only once every call reached a gate (some streaming, the rest queued at the per-rank
    // limits), however long a busy machine takes to get them there.
    await until(async () => {
      const state = (await (await fetch(`${url}/v1/admin/state`)).json()) as AdminState;
      return state.replicas.reduce((n, r) => n + r.gate.counters.received, 0) >= inFlight.length;
    }, "every call received by a gate");
    serve.child.kill("SIGTERM");
    await serve.waitFor(/SIGTERM, shutting down/);
    // New calls: the listener is closed (connection refused) or a kept-alive connection gets 503 unavailable.
    const late: string[] = [];
    for (let i = 0; i < 5; i++) {
      try {
        const response = await post(url, chatBody({ max_tokens: 2 }));
        const text = await response.text();
        assert.equal(response.status, 503, text);
        checkRefusal(503, response.headers, text);
        late.push("503");
      } catch (error) {
        assert.match(
          String((error as Error).cause ?? error),
          /ECONNREFUSED|ECONNRESET|other side closed|SocketError/,
        );
        late.push("refused");
      }
    }
    const results = await Promise.all(inFlight);
    for (const result of results) {
      assert.equal(result.status, 200, result.text.slice(0, 200));
      const events = sseEvents(result.text);
      assert.equal(events.at(-1)?.data, "[DONE]");
      assert.ok(!events.some((e) => e.event === "error"), "a draining server lets calls finish cleanly");
    }
    const exit = await serve.exited;
    assert.equal(exit.code, 0, serve.output());
    const log = serve.output();
    assert.match(log, /draining \d+ call\(s\)/);
    assert.match(log, /stopped \(permits 0, reservations 0, window slots \d+, queued 0\)/, log);
    figures.sigterm = { inFlightAtSignal: results.length, completed: results.length, late };
    serve = undefined;
  });
});

// --- the NATS server restarted under a served process -----------------------------------------------

describe("the NATS server restarted under `sluice serve --nats`", () => {
  let nats: NatsServerProcess | undefined;
  let server: RunningServer | undefined;
  let client: NatsConnection | undefined;
  after(async () => {
    await client?.close();
    await server?.close();
    await nats?.close();
  });

  test("HTTP keeps serving through the outage, the stream cut by it releases its permit, and NATS calls resume", async () => {
    nats = await startNatsServer();
    server = await startServer({
      port: 0,
      host: "127.0.0.1",
      simReplicas: 1,
      nats: nats.url,
      log: quiet,
      drainTimeoutMs: 2000,
    });
    const s = server;
    client = await connect({ servers: nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const nc = client;
    const natsChat = async (content: string) => {
      const reply = await nc.request(
        SUBJECTS.chat,
        new TextEncoder().encode(JSON.stringify(chatBody({ max_tokens: 4 }, 4, content))),
        {
          timeout: 5000,
        },
      );
      return {
        error: reply.headers?.get(HEADERS.serviceErrorCode) || undefined,
        text: decoder.decode(reply.data),
      };
    };
    const before = await natsChat("before the outage");
    assert.equal(before.error, undefined, before.text);

    // A streamed call in flight when NATS goes away.
    const inbox = createInbox();
    const sub = nc.subscribe(inbox, { timeout: 30_000 });
    const streamHeaders = createHeaders();
    streamHeaders.set(HEADERS.stream, "true");
    nc.publish(
      SUBJECTS.chat,
      new TextEncoder().encode(JSON.stringify(chatBody({ max_tokens: 400 }, 4, "long stream"))),
      {
        reply: inbox,
        headers: streamHeaders,
      },
    );
    const iterator = sub[Symbol.asyncIterator]();
    await iterator.next();
    assert.equal(s.scheduler.idleCheck().permits > 0, true, "the stream holds a permit");

    await nats.stop();
    // HTTP is NATS-free: one-off calls go on.
    for (let i = 0; i < 3; i++) {
      const response = await post(s.url, chatBody({ max_tokens: 4 }, 4, `during ${i}`));
      const text = await response.text();
      assert.equal(response.status, 200, text);
    }
    // The cut stream's call ends (its requester cannot be reached) and lets go of its permit.
    await until(() => s.scheduler.idleCheck().permits === 0, "the cut stream's permit released", 30_000);

    await nats.start();
    let resumed = false;
    for (let attempt = 0; attempt < 100 && !resumed; attempt++) {
      try {
        const after = await natsChat(`after ${attempt}`);
        resumed = after.error === undefined;
      } catch {
        // Not reconnected yet.
      }
      if (!resumed) await pause(200);
    }
    assert.ok(resumed, "NATS calls are answered again after the restart");
    sub.unsubscribe();
    assertQuiescent(s.scheduler);
    figures.natsRestart = { httpDuringOutage: "200 ×3", cutStreamReleased: true, natsResumed: resumed };
  });
});
