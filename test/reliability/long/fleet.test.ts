/**
 * @module Three `sluice serve` frontends sharing two simulated replicas over
 * one nats-server with JetStream, all real processes, tested as an operator
 * would: agents behind a round-robin balancer (every step on another
 * frontend), then a NATS restart, a SIGTERM and a SIGKILL with NATS calls in
 * flight. Client-side accounting: every call accepted ends completed or
 * with an error; none is left without an answer.
 */

import assert from "node:assert/strict";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { connect, type NatsConnection } from "nats";
import { NatsTransport } from "../../../adapters/client/nats-transport.js";
import { SluiceError } from "../../../adapters/client/types.js";
import { type NatsServerProcess, startNatsServer } from "../../../adapters/nats/nats-server-process.js";
import { SESSIONS_BUCKET } from "../../../adapters/nats/session-directory.js";
import { WINDOWS_BUCKET } from "../../../adapters/nats/window-authority.js";
import type { AdminState } from "../../../src/types.js";
import {
  freePort,
  ROOT,
  recordFigures,
  type SluiceChild,
  spawnSluice,
  startSimChild,
  stopChild,
  until,
} from "../helpers.js";

const WINDOW_PER_REPLICA = 2;
const AGENTS = 9;
const STEPS = 6;

let nats: NatsServerProcess;
const sims: SluiceChild[] = [];
const frontends: { child: SluiceChild; url: string }[] = [];
let clientNc: NatsConnection | undefined;

async function startFrontend(simUrls: string[]): Promise<{ child: SluiceChild; url: string }> {
  const child = spawnSluice([
    "serve",
    "--port",
    "0",
    "--host",
    "127.0.0.1",
    ...simUrls.flatMap((url, i) => ["--upstream", `sim-${i}=${url}`]),
    "--nats",
    nats.url,
    "--policy",
    "concur",
    "--window-initial",
    String(WINDOW_PER_REPLICA),
    "--window-min",
    String(WINDOW_PER_REPLICA),
    "--window-max",
    String(WINDOW_PER_REPLICA),
    "--drain-timeout-ms",
    "20000",
  ]);
  const match = await child.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/, 60_000);
  return { child, url: `http://127.0.0.1:${match[1]}` };
}

before(async () => {
  nats = await startNatsServer();
  const ports = [await freePort(), await freePort()];
  sims.push(...(await Promise.all(ports.map((port) => startSimChild(port)))));
  const simUrls = ports.map((port) => `http://127.0.0.1:${port}`);
  frontends.push(...(await Promise.all([0, 1, 2].map(() => startFrontend(simUrls)))));
  // Every frontend sees both replicas healthy before the agents start.
  for (const f of frontends) {
    await until(
      async () => {
        const state = (await (await fetch(`${f.url}/v1/admin/state`)).json()) as AdminState;
        return state.replicas.filter((r) => r.healthy && !r.signals.stale).length === 2;
      },
      "both replicas healthy",
      30_000,
    );
  }
});

after(async () => {
  await clientNc?.close().catch(() => {});
  await Promise.all(frontends.map((f) => stopChild(f.child)));
  await Promise.all(sims.map((sim) => stopChild(sim)));
  await nats?.close();
});

function live() {
  return frontends.filter((f) => f.child.child.exitCode === null && f.child.child.signalCode === null);
}

async function adminState(url: string): Promise<AdminState | undefined> {
  try {
    return (await (await fetch(`${url}/v1/admin/state`)).json()) as AdminState;
  } catch {
    return undefined;
  }
}

/**
 * Writes what every part of the fleet holds (shared windows, session directory, each frontend's
 * state and recent log) to test/artifacts, so a step that waits too long can be explained.
 */
async function recordFleetSnapshot(label: string): Promise<string> {
  const nc = await connect({ servers: nats.url });
  const buckets: Record<string, Record<string, unknown>> = {};
  try {
    const js = nc.jetstream();
    for (const name of [WINDOWS_BUCKET, SESSIONS_BUCKET]) {
      const kv = await js.views.kv(name);
      const entries: Record<string, unknown> = {};
      for await (const key of await kv.keys()) {
        const entry = await kv.get(key);
        if (entry?.operation === "PUT") entries[key] = { revision: entry.revision, value: entry.json() };
      }
      buckets[name] = entries;
    }
  } finally {
    await nc.close();
  }
  const states = await Promise.all(frontends.map((f) => adminState(f.url)));
  const snapshot = {
    label,
    buckets,
    frontends: frontends.map((f, i) => ({
      url: f.url,
      replicas: states[i]?.replicas.map((r) => ({ id: r.id, window: r.window, healthy: r.healthy })),
      sessions: states[i]?.sessions,
      log: f.child.output().split("\n").slice(-200),
    })),
  };
  const dir = join(ROOT, "test", "artifacts");
  await mkdir(dir, { recursive: true });
  const file = join(dir, `fleet-${label}-${Date.now()}.json`);
  await writeFile(file, JSON.stringify(snapshot, null, 2));
  return file;
}

describe("three frontends behind round robin behave like one", () => {
  test("no stall, no duplicate session, the same replica step after step, GET and DELETE from any frontend", async () => {
    /** Open sessions across frontends, and Σ active per replica. */
    const census = async () => {
      const states = await Promise.all(frontends.map((f) => adminState(f.url)));
      let open = 0;
      for (const state of states) {
        assert.ok(state, "every frontend answers");
        open +=
          state.sessions.active + state.sessions.waiting + state.sessions.paused + state.sessions.dormant;
      }
      return open;
    };

    let refusedSteps = 0;
    // Each agent takes every step on the next frontend (a round-robin balancer), then reads its session
    // from every frontend and closes it through another. 9 agents contend for 2 × 2 window places.
    const agents = Array.from({ length: AGENTS }, async (_, i) => {
      const session = `rr-agent-${i}`;
      const messages: { role: string; content: string }[] = [];
      const replicas: string[] = [];
      for (let step = 0; step < STEPS; step++) {
        const front = frontends[(i + step) % frontends.length]!;
        messages.push({ role: "user", content: `agent ${i} step ${step}: ${"w ".repeat(20)}` });
        // A step refused with 503 `unavailable` (the directory could not settle its holder in time, or a
        // step of it still ran elsewhere) is sent again after its Retry-After, as a client would.
        let response: Response | undefined;
        for (let attempt = 0; attempt < 10; attempt++) {
          try {
            response = await fetch(`${front.url}/v1/chat/completions`, {
              method: "POST",
              headers: { "content-type": "application/json", "x-session-id": session },
              body: JSON.stringify({ messages, max_tokens: 8 }),
              signal: AbortSignal.timeout(60_000),
            });
          } catch (err) {
            const file = await recordFleetSnapshot(`${session}-step-${step}`).catch((e) => String(e));
            throw new Error(
              `${session} step ${step} at ${front.url}: ${String(err)}; fleet snapshot in ${file}`,
            );
          }
          if (response.status !== 503) break;
          refusedSteps++;
          const wait = Number(response.headers.get("retry-after") ?? "1");
          await response.text();
          await new Promise((resolve) => setTimeout(resolve, wait * 1000));
        }
        assert.ok(response);
        const text = await response.text();
        assert.equal(response.status, 200, text);
        replicas.push(response.headers.get("x-sluice-replica") ?? "");
        const body = JSON.parse(text) as { choices: { message: { content: string } }[] };
        messages.push({ role: "assistant", content: body.choices[0]?.message.content ?? "" });
      }
      // Any frontend answers for the session, with its holder's view. The directory that names the
      // holder is updated after the step's answer left, so a read right after it may see the step before.
      type View = { state: string; steps: number; replica: string };
      const read = () =>
        Promise.all(
          frontends.map(async (f) => {
            const response = await fetch(`${f.url}/v1/sessions/${session}`);
            const text = await response.text();
            assert.equal(response.status, 200, text);
            return JSON.parse(text) as View;
          }),
        );
      let views: View[] = [];
      await until(async () => {
        views = await read();
        return views.every((view) => view.steps === STEPS);
      }, `every frontend's view of ${session}`).catch(async (err) => {
        const file = await recordFleetSnapshot(`${session}-views`).catch((e) => String(e));
        throw new Error(`${String(err)}: last views ${JSON.stringify(views)}; fleet snapshot in ${file}`);
      });
      for (const view of views) {
        assert.equal(view.steps, STEPS, JSON.stringify(views));
        assert.equal(view.replica, replicas.at(-1));
        assert.notEqual(view.state, "closed");
      }
      // Closed through whichever frontend the balancer picks: the holder closes it.
      const closer = frontends[(i + STEPS + 1) % frontends.length]!;
      const closed = await fetch(`${closer.url}/v1/sessions/${session}`, { method: "DELETE" });
      assert.equal(closed.status, 204, await closed.text());
      return { session, replicas };
    });
    const done = await Promise.all(agents);
    let same = 0;
    let moved = 0;
    for (const { replicas } of done) {
      for (let i = 1; i < replicas.length; i++) {
        if (replicas[i] === replicas[i - 1]) same++;
        else moved++;
      }
    }
    await recordFigures("fleet round robin", { steps: AGENTS * STEPS, refusedSteps, same, moved });
    assert.ok(same / (same + moved) >= 0.99, `${same} steps on the previous step's replica, ${moved} moved`);
    // A second copy of a session anywhere would still be open (DELETE closes the holder's only).
    for (const f of frontends) {
      await until(async () => {
        const state = await adminState(f.url);
        return state?.replicas.every((r) => r.window.active === 0) === true;
      }, "every window place given back");
    }
    assert.equal(await census(), 0, "no session left open on any frontend");
    for (const { session } of done) {
      for (const f of frontends) {
        const response = await fetch(`${f.url}/v1/sessions/${session}`);
        const text = await response.text();
        assert.ok(response.status === 404 || JSON.parse(text).state === "closed", text);
      }
    }
  });
});

describe("a session opened explicitly on one frontend", () => {
  test("steps on another, is read on a third and closed on the first: one copy throughout", async () => {
    const [a, b, c] = frontends as [(typeof frontends)[0], (typeof frontends)[0], (typeof frontends)[0]];
    const opened = await fetch(`${a.url}/v1/sessions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ id: "explicit-1", metadata: { agent: "explicit" } }),
    });
    assert.equal(opened.status, 201, await opened.text());
    const step = await fetch(`${b.url}/v1/sessions/explicit-1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hello" }], max_tokens: 4 }),
    });
    assert.equal(step.status, 200, await step.text());
    for (const f of [a, b, c]) {
      let body: { steps: number; state: string; metadata?: unknown } | undefined;
      await until(async () => {
        body = (await (await fetch(`${f.url}/v1/sessions/explicit-1`)).json()) as typeof body;
        return body?.steps === 1;
      }, `the step seen from ${f.url}`);
      assert.deepEqual(body?.metadata, { agent: "explicit" });
    }
    const closed = await fetch(`${a.url}/v1/sessions/explicit-1`, { method: "DELETE" });
    assert.equal(closed.status, 204);
    // The holder closes its copy as the DELETE is answered; other frontends' counts follow at once or
    // within a control interval, never with a second open copy.
    await until(async () => {
      let open = 0;
      for (const f of [a, b, c]) {
        const state = await adminState(f.url);
        open +=
          (state?.sessions.active ?? 0) + (state?.sessions.waiting ?? 0) + (state?.sessions.paused ?? 0);
      }
      return open === 0;
    }, "no copy left open anywhere");
  });
});

describe("a replica killed under the fleet", () => {
  test("its sessions move to the survivor (ahead of new ones there) instead of being sent to the dead one", async () => {
    const agents = Array.from({ length: 4 }, (_, i) => ({
      session: `failover-${i}`,
      messages: [] as { role: string; content: string }[],
      replicas: [] as string[],
      refused: 0,
      steps: 0,
    }));
    let turn = 0;
    /** One step through the next frontend; a 503 is waited out per its Retry-After and tried again. */
    const step = async (agent: (typeof agents)[number]) => {
      agent.messages.push({
        role: "user",
        content: `${agent.session} step ${agent.steps}: ${"w ".repeat(16)}`,
      });
      for (let attempt = 0; attempt < 20; attempt++) {
        const front = frontends[turn++ % frontends.length]!;
        const response = await fetch(`${front.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-session-id": agent.session },
          body: JSON.stringify({ messages: agent.messages, max_tokens: 8 }),
          signal: AbortSignal.timeout(60_000),
        });
        const text = await response.text();
        if (response.status === 503) {
          agent.refused++;
          const retryAfter = Number(response.headers.get("retry-after"));
          assert.ok(retryAfter >= 1, `a 503 carries Retry-After: ${text}`);
          await new Promise((resolve) => setTimeout(resolve, retryAfter * 1000));
          continue;
        }
        assert.equal(response.status, 200, text);
        agent.replicas.push(response.headers.get("x-sluice-replica") ?? "");
        agent.steps++;
        const body = JSON.parse(text) as { choices: { message: { content: string } }[] };
        agent.messages.push({ role: "assistant", content: body.choices[0]?.message.content ?? "" });
        return;
      }
      assert.fail(`${agent.session} never got its step through`);
    };
    // Two steps each: the 4 sessions fill both replicas' windows (2 + 2).
    for (let round = 0; round < 2; round++) await Promise.all(agents.map(step));
    const onDead = agents.filter((agent) => agent.replicas.at(-1) === "sim-0");
    assert.equal(onDead.length, WINDOW_PER_REPLICA, agents.map((a) => a.replicas.join(",")).join(" | "));
    const dead = sims[0]!;
    dead.child.kill("SIGKILL");
    await dead.exited;
    // Three more steps each; sessions on the survivor close after theirs, making room.
    await Promise.all(
      agents.map(async (agent) => {
        for (let i = 0; i < 3; i++) await step(agent);
        const closed = await fetch(
          `${frontends[turn++ % frontends.length]!.url}/v1/sessions/${agent.session}`,
          {
            method: "DELETE",
          },
        );
        assert.equal(closed.status, 204);
      }),
    );
    for (const agent of agents) {
      assert.deepEqual(agent.replicas.slice(2), ["sim-1", "sim-1", "sim-1"], agent.session);
    }
    // At most the first call each frontend sent before it knew: never a stream of 503s to a dead replica.
    const refused = agents.reduce((n, agent) => n + agent.refused, 0);
    assert.ok(refused <= frontends.length * onDead.length, `${refused} steps refused`);
    // Every frontend sees the dead replica unhealthy (so one-off calls go to the survivor too).
    for (const f of frontends) {
      await until(async () => {
        const state = await adminState(f.url);
        return state?.replicas.find((r) => r.id === "sim-0")?.healthy === false;
      }, "the dead replica seen unhealthy");
    }
  });
});

/** Runs NATS calls (half streamed) and accounts for each: completed, an error, or unanswered. */
/**
 * The first of `candidates` seen holding calls, however long a busy machine takes to get them
 * there. NATS spreads calls at random over the queue group, so a fixed frontend would get none of
 * ten one time in sixty (of three) or a thousand (of two).
 */
async function frontendHoldingCalls(
  candidates: readonly (typeof frontends)[number][],
  what: string,
): Promise<(typeof frontends)[number]> {
  let holder: (typeof frontends)[number] | undefined;
  await until(async () => {
    for (const candidate of candidates) {
      const state = await adminState(candidate.url);
      if (state?.replicas.some((r) => r.gate.requests > 0)) {
        holder = candidate;
        return true;
      }
    }
    return false;
  }, what);
  return holder!;
}

function natsLoad(transport: NatsTransport, count: number, tag: string, maxTokens: number) {
  const outcome = { completed: 0, errors: [] as string[], unanswered: count };
  const calls = Array.from({ length: count }, async (_, i) => {
    const call = {
      body: {
        messages: [{ role: "user", content: `${tag} ${i} ${"x ".repeat(10)}` }],
        max_tokens: maxTokens,
      },
      requestId: `${tag}-${i}`,
      timeoutMs: 120_000,
    };
    let chunks = 0;
    try {
      if (i % 2 === 0) {
        for await (const _ of transport.chatStream(call)) chunks++;
      } else {
        await transport.chat(call);
      }
      outcome.completed++;
    } catch (err) {
      assert.ok(err instanceof SluiceError, String(err));
      outcome.errors.push(`${err.status} ${err.code}`);
    } finally {
      outcome.unanswered--;
    }
    return chunks;
  });
  return { outcome, settled: Promise.all(calls) };
}

describe("NATS calls through faults", () => {
  test("a NATS restart: every call in flight ends completed or with an error, and calls resume", async () => {
    clientNc = await connect({ servers: nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const transport = new NatsTransport({ nc: clientNc, heartbeatMs: 250, deadAfterMs: 2000 });
    const { outcome, settled } = natsLoad(transport, 8, "restart", 300);
    await new Promise((resolve) => setTimeout(resolve, 500));
    await nats.stop();
    await Promise.race([
      settled,
      new Promise((_, reject) => setTimeout(() => reject(new Error("calls left unanswered")), 30_000)),
    ]);
    assert.equal(outcome.unanswered, 0);
    for (const error of outcome.errors) assert.match(error, /^503 unavailable$/);
    await nats.start();
    await until(
      async () => {
        try {
          await transport.chat({
            body: { messages: [{ role: "user", content: "back" }], max_tokens: 2 },
            requestId: "back",
            timeoutMs: 5000,
          });
          return true;
        } catch {
          return false;
        }
      },
      "NATS calls answered again",
      40_000,
    );
    // Every frontend let go of the calls the outage cut.
    for (const f of live()) {
      await until(async () => {
        const state = await adminState(f.url);
        return state?.replicas.every((r) => r.gate.requests === 0) === true;
      }, "permits released");
    }
  });

  test("SIGTERM drains NATS calls like HTTP ones: calls in flight finish, new ones go elsewhere", async () => {
    const transport = new NatsTransport({ nc: clientNc!, heartbeatMs: 250, deadAfterMs: 3000 });
    const { outcome, settled } = natsLoad(transport, 10, "drain", 200);
    const target = await frontendHoldingCalls(live(), "calls running on a frontend to stop");
    target.child.child.kill("SIGTERM");
    const late = natsLoad(transport, 4, "after-term", 4);
    await Promise.all([settled, late.settled]);
    assert.equal(outcome.unanswered + late.outcome.unanswered, 0);
    assert.deepEqual(outcome.errors, [], "a draining frontend lets its NATS calls finish");
    assert.deepEqual(late.outcome.errors, [], "new calls are served by the other frontends");
    const exit = await target.child.exited;
    assert.equal(exit.code, 0, target.child.output());
    assert.match(target.child.output(), /stopped \(permits 0, reservations 0, window slots \d+, queued 0\)/);
  });

  test("SIGKILL: calls the dead frontend held end with 503 well before their timeout; the rest complete", async () => {
    const transport = new NatsTransport({ nc: clientNc!, heartbeatMs: 250, deadAfterMs: 2000 });
    const { outcome, settled } = natsLoad(transport, 10, "kill", 400);
    const target = await frontendHoldingCalls(live(), "calls running on a frontend to kill");
    target.child.child.kill("SIGKILL");
    await settled;
    assert.equal(outcome.unanswered, 0);
    assert.ok(outcome.errors.length > 0, "the killed frontend held calls");
    // Heartbeats, not the 120 s call timeout, ended the orphaned calls: a timeout would read "… timeout".
    for (const error of outcome.errors) assert.equal(error, "503 unavailable");
    // The survivor still serves.
    await transport.chat({
      body: { messages: [{ role: "user", content: "still here" }], max_tokens: 2 },
      requestId: "alive",
      timeoutMs: 10_000,
    });
  });
});
