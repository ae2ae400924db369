/** @module Tool-call loops over NATS with the client: many steps per session, streamed and whole, several agents at once. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { connect, type NatsConnection } from "nats";
import { runAgent } from "../../adapters/client/example-agent.js";
import { natsClient } from "../../adapters/client/index.js";
import { type ChatRequest, SluiceError } from "../../adapters/client/types.js";
import { connectNatsFrontend, type NatsFrontend } from "../../adapters/nats/frontend.js";
import { type NatsServerProcess, startNatsServer } from "../../adapters/nats/nats-server-process.js";
import type { Scheduler } from "../../src/scheduler.js";
import { fastSim, MODEL, makeScheduler } from "./nats-harness.js";

const IDLE = { permits: 0, reservations: 0, windowSlots: 0, queued: 0 };

let server: NatsServerProcess;
let frontend: NatsFrontend;
let scheduler: Scheduler;
let clientNc: NatsConnection;

before(async () => {
  server = await startNatsServer();
  frontend = await connectNatsFrontend({ servers: server.url, frontendId: "loop" });
  scheduler = makeScheduler({
    engines: [fastSim("loop-0"), fastSim("loop-1")],
    ...(frontend.windowAuthority ? { windowAuthority: frontend.windowAuthority } : {}),
    ...(frontend.sessionDirectory ? { sessionDirectory: frontend.sessionDirectory } : {}),
  }).scheduler;
  await frontend.attach(scheduler);
  clientNc = await connect({ servers: server.url });
});

after(async () => {
  await clientNc?.close();
  await frontend?.close();
  await scheduler?.stop();
  await server?.close();
});

test("one agent runs a tool-call loop of 40 steps on one session, pinned to one replica", async () => {
  const client = natsClient({ nc: clientNc });
  const replicas = new Set<string>();
  scheduler.addEvents({ route: (e) => replicas.add(e.replica) });
  const report = await runAgent({ client, steps: 40, maxTokens: 4, toolMs: 1, sessionId: "long-loop" });
  assert.equal(report.steps, 40);
  assert.equal(report.completionTokens, 160);
  const view = scheduler.getSession("long-loop");
  assert.equal(view?.state, "closed");
  assert.equal(view?.steps, 40);
  // The context grows every step (prompt + output + tool result).
  assert.ok((view?.tokens ?? 0) > 400, `context of ${view?.tokens} tokens`);
  assert.equal(replicas.size, 1, `the session stayed on one replica, saw ${[...replicas].join(", ")}`);
  assert.deepEqual(scheduler.idleCheck(), IDLE);
});

test("eight agents loop at once, streamed, through the same service", async () => {
  const client = natsClient({ nc: clientNc });
  const reports = await Promise.all(
    Array.from({ length: 8 }, (_, i) =>
      runAgent({ client, steps: 10, maxTokens: 5, toolMs: 2, stream: true, sessionId: `streamer-${i}` }),
    ),
  );
  for (const report of reports) {
    assert.equal(report.steps, 10);
    assert.equal(report.completionTokens, 50);
    assert.ok(report.chunks >= 10 * 5);
  }
  assert.deepEqual(scheduler.idleCheck(), IDLE);
});

test("the client turns service errors back into refusals and never retries a 413", async () => {
  const client = natsClient({ nc: clientNc });
  const body = {
    model: MODEL,
    messages: [{ role: "user", content: "x" }],
    max_tokens: 500_000,
  } as ChatRequest;
  const err = await client.step(undefined, body).catch((e: unknown) => e);
  assert.ok(err instanceof SluiceError);
  assert.equal(err.status, 413);
  assert.equal(err.code, "context_limit");
  assert.equal(err.attempts, 1);
  assert.equal(err.envelope?.error.code, "context_limit");
  const missing = await client.getSession("no-such-session").catch((e: unknown) => e);
  assert.ok(missing instanceof SluiceError);
  assert.equal(missing.status, 404);
  assert.equal(missing.code, "session_not_found");
});
