/**
 * @module Failover that makes room: a session whose replica died moves to the
 * survivor even when the survivor's window is full, ahead of sessions never
 * admitted, and is never sent to the dead replica.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import type { Scheduler } from "../../src/scheduler.js";
import type { AdmittedCall } from "../../src/types.js";
import { eventually, fastSim, makeScheduler } from "./nats-harness.js";

function step(scheduler: Scheduler, sessionId: string, signal?: AbortSignal): Promise<AdmittedCall> {
  return scheduler.submit({
    requestId: `${sessionId}-${Math.random().toString(36).slice(2, 8)}`,
    endpoint: "chat",
    stream: false,
    sessionId,
    input: { kind: "chat", messages: [{ role: "user", content: `step of ${sessionId}` }] },
    maxTokens: 2,
    ...(signal ? { signal } : {}),
  });
}

async function finish(call: AdmittedCall): Promise<string> {
  for await (const _ of call) {
    // drain
  }
  await call.result;
  return call.replica;
}

test("a session whose replica died takes the survivor's next free place before a new session, never the dead replica", async () => {
  const engines = [fastSim("r0"), fastSim("r1")];
  const { scheduler } = makeScheduler({
    engines,
    config: {
      window: { unit: "sessions", initial: 1, min: 1, max: 1 },
      sessions: { controlIntervalMs: 100, idleTimeoutMs: 60_000 },
    },
  });
  // The scheduler's timers do not hold the process open; the test's wait must.
  const keepAlive = setInterval(() => {}, 1000);
  try {
    const first = await finish(await step(scheduler, "moving"));
    const survivorSession = "staying";
    const second = await finish(await step(scheduler, survivorSession));
    assert.notEqual(first, second, "one session per replica: the window holds one");
    const dead = engines.find((engine) => engine.id === first)!;
    await dead.close();
    await eventually(() => scheduler.readyReplicas() === 1, "the dead replica seen unhealthy");

    // A new session arrives first and waits: the survivor's one place is held.
    const newcomer = new AbortController();
    const fresh = step(scheduler, "newcomer", newcomer.signal);
    fresh.catch(() => {});
    await eventually(() => scheduler.getSession("newcomer")?.state === "waiting", "the newcomer waits");
    // Then the session of the dead replica: it must not be sent there.
    const moved = step(scheduler, "moving");
    await eventually(() => scheduler.getSession("moving")?.state === "waiting", "the orphan waits for room");
    // Room opens on the survivor: the orphan takes it, ahead of the newcomer.
    assert.equal(scheduler.closeSession(survivorSession), true);
    const replica = await finish(await moved);
    assert.equal(replica, second, "moved to the survivor");
    assert.equal(scheduler.getSession("newcomer")?.state, "waiting", "the newcomer still waits");
    newcomer.abort();
    await assert.rejects(fresh);
    scheduler.closeSession("moving");
    scheduler.closeSession("newcomer");
    assert.deepEqual(scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
  } finally {
    clearInterval(keepAlive);
    await scheduler.stop();
    await Promise.all(engines.map((engine) => engine.close()));
  }
});
