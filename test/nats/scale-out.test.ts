/**
 * @module Scale-out against a real nats-server with JetStream: two frontends
 * share one simulated replica's window through KV compare-and-set, keep each
 * session on one frontend, hand the window law's lease over when its holder
 * stops, and ride out a NATS restart.
 */

import assert from "node:assert/strict";
import { after, afterEach, before, describe, test } from "node:test";
import { connect, type NatsConnection } from "nats";
import { runAgent } from "../../adapters/client/example-agent.js";
import { natsClient } from "../../adapters/client/index.js";
import { type ChatRequest, SluiceError } from "../../adapters/client/types.js";
import type { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { connectNatsFrontend, type NatsFrontend } from "../../adapters/nats/frontend.js";
import { type NatsServerProcess, startNatsServer } from "../../adapters/nats/nats-server-process.js";
import { kvKey } from "../../adapters/nats/protocol.js";
import { SESSIONS_BUCKET } from "../../adapters/nats/session-directory.js";
import { Refusal } from "../../src/errors.js";
import type { Scheduler } from "../../src/scheduler.js";
import { chatBody, eventually, fastSim, makeScheduler } from "./nats-harness.js";

const IDLE = { permits: 0, reservations: 0, windowSlots: 0, queued: 0 };
const REPLICA = "shared-0";

interface Frontend {
  id: string;
  frontend: NatsFrontend;
  scheduler: Scheduler;
  stopped: boolean;
}

let server: NatsServerProcess;
let frontends: Frontend[] = [];
let clientNc: NatsConnection;

before(async () => {
  server = await startNatsServer();
});

after(async () => {
  await server?.close();
});

afterEach(async () => {
  for (const f of frontends) {
    if (f.stopped) continue;
    await f.frontend.close();
    await f.scheduler.stop();
  }
  frontends = [];
  await clientNc?.close();
});

/** A frontend with a fixed window of `size` on the shared replica (min = max, so the law cannot move it). */
async function startFrontend(id: string, sim: SimEngine, size: number): Promise<Frontend> {
  const frontend = await connectNatsFrontend({
    servers: server.url,
    frontendId: id,
    window: { leaseMs: 1500, claimTtlMs: 2500, heartbeatMs: 400 },
  });
  const { scheduler } = makeScheduler({
    engines: [sim],
    config: {
      window: { unit: "sessions", initial: size, min: size, max: size },
      sessions: { controlIntervalMs: 200 },
    },
    ...(frontend.windowAuthority ? { windowAuthority: frontend.windowAuthority } : {}),
    ...(frontend.sessionDirectory ? { sessionDirectory: frontend.sessionDirectory } : {}),
  });
  await frontend.attach(scheduler);
  const entry = { id, frontend, scheduler, stopped: false };
  frontends.push(entry);
  return entry;
}

/** Σ active sessions on the shared replica across live frontends. */
function totalActive(): number {
  let total = 0;
  for (const f of frontends) if (!f.stopped) total += f.scheduler.windowCounts(REPLICA).active;
  return total;
}

/** Watches Σ active at every session event and every 2 ms; remembers the largest value seen. */
function watchWindow(size: number) {
  const watch = { max: 0, violations: [] as string[], stop: () => {} };
  const check = (where: string) => {
    const active = totalActive();
    watch.max = Math.max(watch.max, active);
    if (active > size) watch.violations.push(`${active} active > ${size} at ${where}`);
  };
  for (const f of frontends)
    f.scheduler.addEvents({
      session: (e) => check(`${f.id} ${e.event} ${e.id}`),
      finished: () => check(`${f.id} step end`),
    });
  const timer = setInterval(() => check("sample"), 2);
  watch.stop = () => clearInterval(timer);
  return watch;
}

describe("two frontends sharing one replica", () => {
  test("never hold more than N active sessions between them, and keep each session on one frontend", async () => {
    const N = 3;
    const sim = fastSim(REPLICA);
    await startFrontend("fe-a", sim, N);
    await startFrontend("fe-b", sim, N);
    const watch = watchWindow(N);
    clientNc = await connect({ servers: server.url });
    const client = natsClient({ nc: clientNc, retry: { baseDelayMs: 20 } });
    const reports = await Promise.all(
      Array.from({ length: 3 * N }, (_, i) =>
        runAgent({
          client,
          steps: 5,
          maxTokens: 6,
          toolMs: 5,
          sessionId: `agent-${i}`,
          stepWithinMs: 60_000,
        }),
      ),
    );
    watch.stop();
    assert.deepEqual(watch.violations, []);
    assert.equal(watch.max, N, "the shared window was used to the full");
    for (const report of reports) assert.equal(report.steps, 5);
    for (const report of reports) {
      // Every step of a session ran on the one frontend holding it, whichever frontend the queue group picked.
      const holders = frontends.filter((f) => f.scheduler.getSession(report.sessionId) !== undefined);
      assert.equal(
        holders.length,
        1,
        `${report.sessionId} is known to ${holders.map((h) => `${h.id} (${h.scheduler.getSession(report.sessionId)?.state})`).join(", ")}`,
      );
      const view = holders[0]!.scheduler.getSession(report.sessionId)!;
      assert.equal(view.state, "closed");
      assert.equal(view.steps, 5);
    }
    for (const f of frontends) {
      await eventually(() => f.scheduler.idleCheck().windowSlots === 0, `${f.id} idle`);
      assert.deepEqual(f.scheduler.idleCheck(), IDLE);
    }
    // The directory knows every session, closed, on the frontend that ran it.
    const kv = await clientNc.jetstream().views.kv(SESSIONS_BUCKET);
    for (const f of frontends) await f.frontend.sessionDirectory?.flush();
    for (const report of reports) {
      const record = (await kv.get(kvKey(report.sessionId)))!.json<{
        state: string;
        frontend: string;
        replica: string;
      }>();
      assert.equal(record.state, "closed");
      assert.equal(record.replica, REPLICA);
      assert.ok(frontends.some((f) => f.id === record.frontend && f.scheduler.getSession(report.sessionId)));
    }
  });

  test("a stopped frontend's lease and claims pass to the survivor, which then fills the whole window", async () => {
    const N = 4;
    const sim = fastSim(REPLICA);
    const a = await startFrontend("lease-a", sim, N);
    await eventually(() => a.frontend.windowAuthority?.view(REPLICA)?.leader === "lease-a", "lease-a leads");
    const b = await startFrontend("lease-b", sim, N);
    // Both hold sessions, so both have claims in the shared entry.
    a.scheduler.openSession({ id: "held-a" });
    const held = await a.scheduler.submit({
      requestId: "r-a",
      endpoint: "chat",
      stream: false,
      sessionId: "held-a",
      input: { kind: "chat", messages: [{ role: "user", content: "a" }] },
      maxTokens: 2,
    });
    for await (const _ of held) {
      // drain
    }
    await eventually(
      () => (b.frontend.windowAuthority?.view(REPLICA)?.claims["lease-a"]?.n ?? 0) >= 1,
      "b sees a's claim",
    );
    assert.equal(b.frontend.windowAuthority?.view(REPLICA)?.leader, "lease-a");

    // lease-a dies without a word: its connection closes, nothing is given back.
    a.stopped = true;
    await a.scheduler.stop();
    await a.frontend.nc.close();

    await eventually(
      () => b.frontend.windowAuthority?.view(REPLICA)?.leader === "lease-b",
      "lease-b takes the lease",
    );
    await eventually(
      () => b.frontend.windowAuthority?.view(REPLICA)?.claims["lease-a"] === undefined,
      "the dead frontend's claim is dropped",
    );
    // The survivor can now hold all N sessions at once.
    clientNc = await connect({ servers: server.url });
    const sessions = Array.from({ length: N }, (_, i) => `after-${i}`);
    const calls = await Promise.all(
      sessions.map((id, i) =>
        b.scheduler.submit({
          requestId: `r-${i}`,
          endpoint: "chat",
          stream: false,
          sessionId: id,
          input: { kind: "chat", messages: [{ role: "user", content: id }] },
          maxTokens: 2,
        }),
      ),
    );
    assert.equal(b.scheduler.windowCounts(REPLICA).active, N);
    for (const call of calls)
      for await (const _ of call) {
        // drain
      }
    for (const id of sessions) b.scheduler.closeSession(id);
    assert.deepEqual(b.scheduler.idleCheck(), IDLE);
  });

  test("a frontend that stops cleanly gives its lease back at once", async () => {
    const sim = fastSim(REPLICA);
    const a = await startFrontend("clean-a", sim, 2);
    await eventually(() => a.frontend.windowAuthority?.view(REPLICA)?.leader === "clean-a", "clean-a leads");
    const b = await startFrontend("clean-b", sim, 2);
    await eventually(
      () => b.frontend.windowAuthority?.view(REPLICA)?.leader === "clean-a",
      "b sees clean-a lead",
    );
    a.stopped = true;
    await a.scheduler.stop();
    await a.frontend.close();
    await eventually(() => b.frontend.windowAuthority?.view(REPLICA)?.leader === "clean-b", "clean-b leads");
  });
});

describe("a session taken over by another frontend (HTTP behind a non-sticky balancer)", () => {
  test("gets the place it left before a new session waiting at its old frontend", async () => {
    const sim = fastSim(REPLICA);
    const a = await startFrontend("back-a", sim, 2);
    const b = await startFrontend("back-b", sim, 2);
    const stepOn = async (f: Frontend, sessionId: string, signal?: AbortSignal) => {
      const call = await f.scheduler.submit({
        requestId: `${sessionId}-${Math.random().toString(36).slice(2, 8)}`,
        endpoint: "chat",
        stream: false,
        sessionId,
        input: { kind: "chat", messages: [{ role: "user", content: sessionId }] },
        maxTokens: 2,
        ...(signal ? { signal } : {}),
      });
      for await (const _ of call) {
        // drain
      }
      return call.replica;
    };
    await eventually(
      () => [a, b].every((f) => f.frontend.windowAuthority?.view(REPLICA)?.accepting === true),
      "both frontends take sessions",
    );
    await stepOn(a, "mover");
    await stepOn(b, "stayer");
    // The shared window (2) is full; a new session waits at the mover's frontend.
    const newcomer = new AbortController();
    const waiting = stepOn(a, "newcomer", newcomer.signal);
    waiting.catch(() => {});
    await eventually(() => a.scheduler.getSession("newcomer")?.state === "waiting", "the newcomer waits");
    // The mover's next step reaches b: b takes it over through the same path an HTTP step takes.
    const viaB = b.frontend.wrapFetch(
      async (_request: Request) => new Response(await stepOn(b, "mover", AbortSignal.timeout(20_000))),
      b.scheduler,
    );
    const response = await viaB(
      new Request("http://b/v1/chat/completions", {
        method: "POST",
        headers: { "x-session-id": "mover" },
        body: "{}",
      }),
    ).catch((err) => {
      // What each frontend held when the mover's step gave up: the shared window and its own counts.
      const held = [a, b].map((f) => ({
        id: f.id,
        window: f.frontend.windowAuthority?.view(REPLICA),
        counts: f.scheduler.windowCounts(REPLICA),
        sessions: ["mover", "stayer", "newcomer"].map((id) => f.scheduler.getSession(id)),
      }));
      throw new Error(`${String(err)}; ${JSON.stringify(held)}`);
    });
    assert.equal(await response.text(), REPLICA);
    assert.equal(b.scheduler.getSession("mover")?.steps, 2, "its history came along");
    assert.equal(a.scheduler.getSession("newcomer")?.state, "waiting", "the newcomer still waits");
    newcomer.abort();
    await assert.rejects(waiting);
    for (const id of ["mover", "stayer"]) b.scheduler.closeSession(id);
    a.scheduler.closeSession("newcomer");
    for (const f of [a, b]) {
      await eventually(() => f.scheduler.idleCheck().windowSlots === 0, `${f.id} idle`);
    }
  });

  test("a step whose body alone names its session (metadata.session_id) is taken over too, its body intact", async () => {
    const sim = fastSim(REPLICA);
    const a = await startFrontend("body-a", sim, 4);
    const b = await startFrontend("body-b", sim, 4);
    await eventually(
      () => [a, b].every((f) => f.frontend.windowAuthority?.view(REPLICA)?.accepting === true),
      "both frontends take sessions",
    );
    const first = await a.scheduler.submit({
      requestId: "body-key-1",
      endpoint: "chat",
      stream: false,
      sessionId: "body-keyed",
      input: { kind: "chat", messages: [{ role: "user", content: "first" }] },
      maxTokens: 2,
    });
    for await (const _ of first) {
      // drain
    }
    const sent = JSON.stringify({
      model: "m",
      messages: [{ role: "user", content: "second" }],
      metadata: { session_id: "body-keyed" },
    });
    let seenBody = "";
    const viaB = b.frontend.wrapFetch(async (request: Request, env?: { incoming?: unknown }) => {
      seenBody = await request.text();
      return new Response(
        `${b.scheduler.getSession("body-keyed")?.steps ?? "none"} ${env?.incoming === undefined}`,
      );
    }, b.scheduler);
    const response = await viaB(new Request("http://b/v1/chat/completions", { method: "POST", body: sent }), {
      incoming: "spent",
      outgoing: "kept",
    } as never);
    assert.equal(await response.text(), "1 true", "b holds the session with its history before the app runs");
    assert.equal(seenBody, sent, "the app reads the body the wrapper read");
    assert.equal(a.scheduler.getSession("body-keyed")?.state, "closed", "a let it go: one copy fleet-wide");
    b.scheduler.closeSession("body-keyed");
    for (const f of [a, b]) {
      await eventually(() => f.scheduler.idleCheck().windowSlots === 0, `${f.id} idle`);
    }
  });
});

describe("a NATS restart mid-run", () => {
  test("loses no session, duplicates none, leaks no permit, and answers calls during the outage with 503", async () => {
    const N = 3;
    const sim = fastSim(REPLICA);
    await startFrontend("rs-a", sim, N);
    await startFrontend("rs-b", sim, N);
    const watch = watchWindow(N);
    clientNc = await connect({ servers: server.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const client = natsClient({ nc: clientNc, retry: { baseDelayMs: 50, maxAttempts: 20 } });
    const agents = Promise.all(
      Array.from({ length: 2 * N }, (_, i) =>
        runAgent({ client, steps: 8, maxTokens: 6, toolMs: 40, sessionId: `rs-${i}`, stepWithinMs: 60_000 }),
      ),
    );
    // Let the run get going: some sessions admitted and stepping on both frontends.
    await eventually(() => totalActive() === N, "the window fills");

    await server.stop();
    await eventually(() => frontends.every((f) => !f.frontend.connected), "the frontends saw the outage");

    // A client call during the outage is refused at once with 503, not left to hang.
    const probe = natsClient({ nc: clientNc, retry: { maxAttempts: 1 }, attemptTimeoutMs: 60_000 });
    const refused = await probe
      .step("outage-probe", chatBody("during the outage") as unknown as ChatRequest)
      .catch((e: unknown) => e);
    assert.ok(refused instanceof SluiceError);
    assert.equal(refused.status, 503);
    assert.equal(refused.code, "unavailable");

    // A new session on a frontend directly: 503 unavailable, since no frontend can prove a slot is free.
    const a = frontends[0]!;
    const fresh = await a.scheduler
      .submit({
        requestId: "r-new",
        endpoint: "chat",
        stream: false,
        sessionId: "new-in-outage",
        input: { kind: "chat", messages: [{ role: "user", content: "new" }] },
        maxTokens: 2,
      })
      .catch((e: unknown) => e);
    assert.ok(fresh instanceof Refusal);
    assert.equal(fresh.status, 503);
    assert.equal(fresh.reason, "unavailable");
    a.scheduler.closeSession("new-in-outage");

    // An already-active session goes on stepping while NATS is away.
    const activeHere = frontends.flatMap((f) =>
      Array.from({ length: 2 * N }, (_, i) => `rs-${i}`)
        .filter((id) => f.scheduler.getSession(id)?.state === "active")
        .map((id) => ({ f, id })),
    )[0];
    assert.ok(activeHere, "some session is active during the outage");
    const step = await activeHere.f.scheduler.submit({
      requestId: "r-during",
      endpoint: "chat",
      stream: false,
      sessionId: activeHere.id,
      input: { kind: "chat", messages: [{ role: "user", content: "still here" }] },
      maxTokens: 2,
    });
    for await (const _ of step) {
      // drain
    }
    assert.equal((await step.result).completionTokens, 2);

    await server.start();
    const reports = await agents;
    watch.stop();
    assert.deepEqual(watch.violations, []);
    for (const report of reports) assert.equal(report.steps, 8);
    for (const report of reports) {
      const holders = frontends.filter((f) => f.scheduler.getSession(report.sessionId) !== undefined);
      assert.equal(
        holders.length,
        1,
        `${report.sessionId} is known to ${holders.map((h) => `${h.id} (${h.scheduler.getSession(report.sessionId)?.state})`).join(", ")}`,
      );
      assert.equal(holders[0]!.scheduler.getSession(report.sessionId)!.state, "closed");
    }
    for (const f of frontends) {
      await eventually(() => f.scheduler.idleCheck().windowSlots === 0, `${f.id} idle`);
      assert.deepEqual(f.scheduler.idleCheck(), IDLE);
    }
    for (const f of frontends) await f.frontend.sessionDirectory?.flush();
    const kv = await clientNc.jetstream().views.kv(SESSIONS_BUCKET);
    for (const report of reports) {
      const record = (await kv.get(kvKey(report.sessionId)))!.json<{ state: string }>();
      assert.equal(record.state, "closed", `${report.sessionId} is closed in the directory`);
    }
  });
});
