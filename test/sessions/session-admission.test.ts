import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { VirtualClock } from "../../src/clock.js";
import { Refusal } from "../../src/errors.js";
import { SessionAdmission, type SessionAdmissionOptions } from "../../src/sessions/session-admission.js";

function setup(
  overrides: Partial<SessionAdmissionOptions> = {},
  windows: Record<string, number | null> = { r1: 2 },
) {
  const clock = new VirtualClock();
  const events: string[] = [];
  const admission = new SessionAdmission({
    clock,
    queueLimit: 8,
    waitLimitMs: 60_000,
    idleTimeoutMs: 120_000,
    onEvent: (id, event) => events.push(`${id}:${event}`),
    ...overrides,
  });
  for (const [id, size] of Object.entries(windows)) admission.addReplica(id, size);
  const first = (candidates: readonly string[]) => candidates[0];
  return { clock, admission, events, first };
}

/** Lets promise continuations run. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

describe("session admission", () => {
  it("admits up to the window and queues the rest in arrival order", async () => {
    const { admission, first } = setup();
    const a = admission.open("a");
    const b = admission.open("b");
    const c = admission.open("c");
    const d = admission.open("d");
    assert.equal(await admission.acquireStep(a, first), "r1");
    assert.equal(await admission.acquireStep(b, first), "r1");
    const order: string[] = [];
    const stepC = admission.acquireStep(c, first).then(() => order.push("c"));
    const stepD = admission.acquireStep(d, first).then(() => order.push("d"));
    await settle();
    assert.deepEqual(order, []);
    assert.equal(c.state, "waiting");
    assert.equal(admission.queuedSessions, 2);
    admission.endStep(a, { completed: true, contextTokens: 100 });
    // An idle active session still holds its slot.
    await settle();
    assert.deepEqual(order, []);
    assert.ok(admission.close("a"));
    await stepC;
    assert.deepEqual(order, ["c"]);
    assert.ok(admission.close("b"));
    await stepD;
    assert.deepEqual(order, ["c", "d"]);
    assert.equal(admission.replicaCounts("r1").active, 2);
  });

  it("says a session leaving an unhealthy replica left for that reason, not that the window shrank", async () => {
    const reasons: (string | undefined)[] = [];
    const { admission, first } = setup(
      { onEvent: (_id, event, _replica, detail) => event === "paused" && reasons.push(detail.reason) },
      { r1: 2, r2: 2 },
    );
    const a = admission.open("a");
    assert.equal(await admission.acquireStep(a, first), "r1");
    admission.endStep(a, { completed: true, contextTokens: 100 });
    admission.evacuate(a);
    assert.deepEqual(reasons, ["unhealthy"]);
    assert.equal(admission.replicaCounts("r1").active, 0);
    assert.ok(admission.close("a"));
  });

  it("pauses the youngest sessions only at a step boundary when the window shrinks", async () => {
    const { admission, events, first } = setup({}, { r1: 3 });
    const a = admission.open("a");
    const b = admission.open("b");
    const c = admission.open("c");
    await admission.acquireStep(a, first);
    await admission.acquireStep(b, first);
    await admission.acquireStep(c, first);
    admission.endStep(c, { completed: true }); // c is idle between steps
    admission.setWindow("r1", 1, true);
    // c was idle: it pauses now. b is running a step: it finishes that step first.
    assert.equal(c.state, "paused");
    assert.equal(b.state, "active");
    assert.equal(b.pauseRequested, true);
    assert.equal(a.state, "active");
    assert.equal(a.pauseRequested, false);
    admission.endStep(b, { completed: true, contextTokens: 500 });
    assert.equal(b.state, "paused");
    assert.equal(b.steps, 1);
    assert.equal(b.tokens, 500);
    // A paused session's next step waits.
    let ran = false;
    const next = admission.acquireStep(b, first).then(() => {
      ran = true;
    });
    await settle();
    assert.equal(ran, false);
    assert.deepEqual(
      events.filter((e) => e.endsWith("paused")),
      ["c:paused", "b:paused"],
    );
    // Room opens: oldest pause (c) resumes first, then b.
    admission.setWindow("r1", 2, true);
    assert.equal(c.state, "active");
    assert.equal(b.state, "paused");
    admission.setWindow("r1", 3, true);
    await next;
    assert.equal(b.state, "active");
    assert.ok(events.includes("c:resumed") && events.includes("b:resumed"));
  });

  it("resumes paused sessions before admitting waiting ones", async () => {
    const { admission, first } = setup({}, { r1: 2 });
    const a = admission.open("a");
    const b = admission.open("b");
    await admission.acquireStep(a, first);
    await admission.acquireStep(b, first);
    admission.endStep(a, { completed: true });
    admission.endStep(b, { completed: true });
    admission.setWindow("r1", 1, true); // b (youngest) pauses
    assert.equal(b.state, "paused");
    const c = admission.open("c");
    const stepC = admission.acquireStep(c, first);
    admission.setWindow("r1", 2, true);
    assert.equal(b.state, "active");
    assert.equal(c.state, "waiting");
    admission.close("a");
    assert.equal(await stepC, "r1");
    assert.equal(c.state, "active");
  });

  it("refuses beyond the session queue with session_queue_full and times out waits with queue_timeout", async () => {
    const { clock, admission, first } = setup({ queueLimit: 1, waitLimitMs: 5_000 }, { r1: 1 });
    await admission.acquireStep(admission.open("a"), first);
    const waiting = admission.acquireStep(admission.open("b"), first);
    await assert.rejects(admission.acquireStep(admission.open("c"), first), (error: unknown) => {
      assert.ok(error instanceof Refusal);
      assert.equal(error.reason, "session_queue_full");
      assert.equal(error.status, 429);
      assert.ok((error.retryAfterSeconds ?? 0) >= 1);
      return true;
    });
    clock.advance(5_000);
    await assert.rejects(
      waiting,
      (error: unknown) => error instanceof Refusal && error.reason === "queue_timeout",
    );
    assert.equal(admission.queuedSessions, 0);
    assert.equal(admission.counts().queuedSteps, 0);
  });

  it("removes a waiter whose signal aborts and hands its place on", async () => {
    const { admission, first } = setup({}, { r1: 1 });
    const a = admission.open("a");
    await admission.acquireStep(a, first);
    const controller = new AbortController();
    const gone = admission.acquireStep(admission.open("b"), first, controller.signal);
    const c = admission.open("c");
    const stepC = admission.acquireStep(c, first);
    controller.abort(new DOMException("client left", "AbortError"));
    await assert.rejects(gone, { name: "AbortError" });
    admission.close("a");
    assert.equal(await stepC, "r1");
    assert.equal(admission.counts().queuedSteps, 0);
    assert.equal(admission.replicaCounts("r1").active, 1);
  });

  it("expires idle sessions, freeing their slot for the next", async () => {
    const { clock, admission, events, first } = setup(
      { idleTimeoutMs: 10_000, waitLimitMs: 60_000 },
      { r1: 1 },
    );
    const a = admission.open("a");
    await admission.acquireStep(a, first);
    admission.endStep(a, { completed: true });
    const b = admission.open("b");
    const stepB = admission.acquireStep(b, first);
    clock.advance(10_001);
    admission.sweep();
    assert.equal(a.state, "closed");
    assert.equal(await stepB, "r1");
    assert.ok(events.includes("a:closed"));
  });

  it("never expires a session while one of its steps runs", async () => {
    const { clock, admission, first } = setup({ idleTimeoutMs: 1_000 }, { r1: 1 });
    const a = admission.open("a");
    await admission.acquireStep(a, first);
    clock.advance(5_000);
    admission.sweep();
    await settle();
    assert.equal(a.state, "active");
    admission.endStep(a, { completed: true });
    clock.advance(1_001);
    admission.sweep();
    assert.equal(a.state, "closed");
  });

  it("takes no new session on a replica that does not accept, but lets active ones run", async () => {
    const { admission, first } = setup({}, { r1: 4 });
    const a = admission.open("a");
    await admission.acquireStep(a, first);
    admission.endStep(a, { completed: true });
    admission.setWindow("r1", 4, false);
    assert.equal(await admission.acquireStep(a, first), "r1");
    let admitted = false;
    const stepB = admission.acquireStep(admission.open("b"), first).then(() => {
      admitted = true;
    });
    await settle();
    assert.equal(admitted, false);
    admission.setWindow("r1", 4, true);
    await stepB;
    assert.equal(admitted, true);
  });

  it("places new sessions only on replicas with room, as the chooser prefers", async () => {
    const { admission } = setup({}, { r1: 1, r2: 1 });
    const prefer = (candidates: readonly string[]) => (candidates.includes("r2") ? "r2" : candidates[0]);
    assert.equal(await admission.acquireStep(admission.open("a"), prefer), "r2");
    assert.equal(await admission.acquireStep(admission.open("b"), prefer), "r1");
    const c = admission.open("c");
    const stepC = admission.acquireStep(c, prefer);
    admission.close("b");
    assert.equal(await stepC, "r1");
  });

  it("resumes a paused session with a step waiting on another replica's leftover room, after waiting sessions", async () => {
    const { admission, first } = setup({}, { r1: 2, r2: 0 });
    const a = admission.open("a");
    const b = admission.open("b");
    const idle = admission.open("idle");
    await admission.acquireStep(a, first);
    await admission.acquireStep(b, first);
    admission.endStep(b, { completed: true });
    admission.setWindow("r1", 1, true); // b (the younger) pauses at once: it is between steps
    assert.equal(b.state, "paused");
    const stepB = admission.acquireStep(b, first);
    // A waiting session goes before a paused one from elsewhere.
    const stepIdle = admission.acquireStep(idle, first);
    admission.setWindow("r2", 1, true);
    assert.equal(await stepIdle, "r2");
    assert.equal(b.state, "paused", "the waiting session took r2's room");
    admission.endStep(idle, { completed: true });
    admission.close("idle");
    assert.equal(await stepB, "r2", "r1 still has no room: b resumes where there is");
    assert.equal(b.movedFrom, "r1");
    assert.equal(admission.replicaCounts("r1").paused, 0);
    assert.equal(admission.replicaCounts("r2").active, 1);
  });

  it("leaves a paused session without a waiting step where it is", async () => {
    const { admission, first } = setup({}, { r1: 2, r2: 0 });
    const a = admission.open("a");
    const b = admission.open("b");
    await admission.acquireStep(a, first);
    await admission.acquireStep(b, first);
    admission.endStep(b, { completed: true });
    admission.setWindow("r1", 1, true);
    admission.setWindow("r2", 4, true);
    assert.equal(b.state, "paused");
    assert.equal(b.replica, "r1", "nothing to run: it keeps its place (and cache) on r1");
    admission.setWindow("r1", 2, true);
    assert.equal(b.state, "active");
    assert.equal(b.movedFrom, null);
  });

  it("returns every slot once all sessions close", async () => {
    const { admission, first } = setup({}, { r1: 2, r2: null });
    const ids = ["a", "b", "c", "d", "e"];
    const steps = ids.map((id) => admission.acquireStep(admission.open(id), first));
    const replicas = await Promise.all(steps);
    assert.equal(replicas.filter((r) => r === "r1").length, 2);
    for (const id of ids) admission.endStep(admission.get(id)!, { completed: true });
    for (const id of ids) assert.ok(admission.close(id));
    const counts = admission.counts();
    assert.deepEqual(
      {
        active: counts.active,
        paused: counts.paused,
        running: counts.runningSteps,
        queued: counts.queuedSteps,
      },
      { active: 0, paused: 0, running: 0, queued: 0 },
    );
    assert.equal(admission.close("a"), false);
    assert.equal(admission.get("a")?.state, "closed");
  });
});
