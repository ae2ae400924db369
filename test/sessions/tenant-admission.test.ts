import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { VirtualClock } from "../../src/clock.js";
import type { TenantSpec } from "../../src/config/scheduler-config.js";
import { Refusal } from "../../src/errors.js";
import { SessionAdmission, type SessionAdmissionOptions } from "../../src/sessions/session-admission.js";

function setup(
  tenants: Record<string, TenantSpec> = {},
  overrides: Partial<SessionAdmissionOptions> = {},
  windows: Record<string, number> = { r1: 10_000 },
) {
  const clock = new VirtualClock();
  const events: string[] = [];
  const admission = new SessionAdmission({
    clock,
    unit: "tokens",
    queueLimit: 64,
    waitLimitMs: 600_000,
    idleTimeoutMs: 1_200_000,
    fairness: "tenants",
    tenants,
    fairReclaimAfterMs: 5000,
    onEvent: (id, event, _replica, detail) =>
      events.push(`${id}:${event}${detail.reason ? `:${detail.reason}` : ""}`),
    ...overrides,
  });
  for (const [id, size] of Object.entries(windows)) admission.addReplica(id, size);
  const first = (candidates: readonly string[]) => candidates[0];
  /** Opens a session of `tenant` and starts a step of `tokens` (prompt, no output); resolves when it runs. */
  const step = (id: string, tenant: string, tokens: number) => {
    const session = admission.get(id) ?? admission.open(id, { tenant });
    const admitted = admission.acquireStep(session, first, undefined, { promptTokens: tokens, maxTokens: 0 });
    admitted.catch(() => {});
    return { session, admitted };
  };
  const isZero = () => {
    const counts = admission.counts();
    assert.deepEqual(
      { ...counts },
      {
        total: 0,
        waiting: 0,
        active: 0,
        idle: 0,
        dormant: 0,
        paused: 0,
        runningSteps: 0,
        queuedSteps: 0,
        promptBlocks: 0,
      },
    );
    for (const tenant of admission.tenants().tenants) assert.equal(tenant.usageTokens, 0, tenant.tenant);
  };
  const closeAll = (...ids: string[]) => {
    for (const id of ids) admission.close(id);
  };
  return { clock, admission, events, step, isZero, closeAll };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));
const admittedOrder = (events: string[]) =>
  events.filter((event) => event.endsWith(":admitted")).map((event) => event.split(":")[0]);

describe("tenants in session admission", () => {
  it("with one tenant, admits in arrival order whatever the sizes (the documented order)", async () => {
    const { admission, events, step, isZero, closeAll } = setup();
    const a1 = step("a1", "default", 8_000);
    await a1.admitted;
    step("a2", "default", 6_000);
    step("a3", "default", 1_000);
    await settle();
    assert.deepEqual(admittedOrder(events), ["a1"], "a3 fits but does not overtake a2");
    admission.close("a1");
    await settle();
    assert.deepEqual(admittedOrder(events), ["a1", "a2", "a3"]);
    closeAll("a2", "a3");
    isZero();
  });

  it("admits the tenant with the lowest usage ÷ entitlement first", async () => {
    const { admission, events, step, isZero, closeAll } = setup();
    await step("a1", "team-a", 4_000).admitted;
    await step("c1", "team-c", 4_000).admitted;
    step("a2", "team-a", 5_000);
    step("b1", "team-b", 5_000);
    await settle();
    const view = admission.view(admission.get("a2")!);
    assert.equal(view.tenant, "team-a");
    assert.equal(view.position, 2, "b1 (no usage) is ahead of a2");
    assert.equal(view.reason, "fairness");
    assert.equal(admission.view(admission.get("b1")!).position, 1);
    admission.close("c1");
    await settle();
    assert.deepEqual(admittedOrder(events), ["a1", "c1", "b1"], "b1 came later but its tenant holds nothing");
    closeAll("a1");
    await settle();
    assert.deepEqual(admittedOrder(events), ["a1", "c1", "b1", "a2"]);
    closeAll("a2", "b1");
    isZero();
  });

  it("breaks a tie of usage by least service received, with no credit banked while idle", async () => {
    const { clock, admission, events, step, isZero, closeAll } = setup();
    await step("a1", "team-a", 8_000).admitted;
    clock.advance(1_000);
    step("a2", "team-a", 6_000);
    step("b1", "team-b", 6_000);
    clock.advance(1_000);
    admission.close("a1");
    await settle();
    // Both hold nothing now; team-a was served 2 s of 8,000 tokens, team-b (lifted on arrival) 1 s of it.
    assert.deepEqual(admittedOrder(events), ["a1", "b1"]);
    closeAll("b1", "a2");
    isZero();
  });

  it("with fairness off, keeps arrival order across tenants", async () => {
    const { admission, events, step, isZero, closeAll } = setup({}, { fairness: "off" });
    await step("a1", "team-a", 4_000).admitted;
    await step("c1", "team-c", 4_000).admitted;
    step("a2", "team-a", 5_000);
    step("b1", "team-b", 5_000);
    admission.close("c1");
    await settle();
    assert.deepEqual(admittedOrder(events), ["a1", "c1", "a2"]);
    closeAll("a1", "a2", "b1");
    isZero();
  });

  it("orders bands strictly: a protected session goes before standard ones that came first", async () => {
    const { admission, events, step, isZero, closeAll } = setup({
      ops: { band: "protected" },
      batch: { band: "sheddable" },
    });
    await step("a1", "team-a", 9_000).admitted;
    step("s1", "batch", 5_000);
    step("a2", "team-a", 5_000);
    step("o1", "ops", 5_000);
    await settle();
    const s1 = admission.view(admission.get("s1")!);
    assert.equal(s1.band, "sheddable");
    assert.equal(s1.position, 3);
    assert.equal(s1.reason, "priority");
    admission.close("a1");
    await settle();
    assert.deepEqual(admittedOrder(events), ["a1", "o1", "a2"]);
    closeAll("o1", "a2");
    await settle();
    assert.deepEqual(admittedOrder(events), ["a1", "o1", "a2", "s1"]);
    closeAll("s1");
    isZero();
  });

  it("reclaims after the delay: pauses the over-share tenant's youngest session at its step boundary, paced", async () => {
    const { clock, admission, events, step, isZero, closeAll } = setup();
    const a1 = step("a1", "team-a", 5_000);
    const a2 = step("a2", "team-a", 5_000);
    await a1.admitted;
    await a2.admitted;
    const b1 = step("b1", "team-b", 5_000);
    const b2 = step("b2", "team-b", 5_000);
    let b1Admitted = false;
    b1.admitted.then(() => {
      b1Admitted = true;
    });
    clock.advance(4_000);
    admission.sweep();
    await settle();
    assert.ok(!events.some((event) => event.includes(":paused")), "not before the reclaim delay");
    clock.advance(1_500);
    admission.sweep();
    await settle();
    // a2 (youngest) is asked to pause but runs its step to its end: never mid-step.
    assert.equal(admission.get("a2")!.state, "active");
    assert.equal(admission.get("a2")!.pauseRequested, true);
    assert.equal(b1Admitted, false, "paced: b1 waits for the room a2 frees");
    admission.sweep();
    assert.equal(admission.get("a1")!.pauseRequested, false, "no second decision while a2 still runs");
    admission.endStep(a2.session, { completed: true, contextTokens: 5_000 });
    await settle();
    assert.equal(admission.get("a2")!.state, "paused");
    assert.equal(b1Admitted, true);
    assert.deepEqual(
      events.filter((event) => event.includes(":paused")),
      ["a2:paused:fairness"],
    );
    // Shares are now 5,000 each: team-a is at its entitlement and is not paused for b2.
    clock.advance(10_000);
    admission.sweep();
    await settle();
    assert.equal(admission.get("a1")!.pauseRequested, false);
    const tenantA = admission.tenants().tenants.find((tenant) => tenant.tenant === "team-a")!;
    assert.equal(tenantA.pauses.fairness, 1);
    assert.equal(tenantA.entitlementTokens, 5_000);
    assert.equal(tenantA.usageTokens, 5_000);
    admission.endStep(a1.session, { completed: true, contextTokens: 5_000 });
    admission.endStep(b1.session, { completed: true, contextTokens: 5_000 });
    closeAll("a1", "a2", "b1", "b2");
    await b2.admitted.catch(() => {});
    isZero();
  });

  it("pauses a lower band for a higher one (reason priority), but never a protected session for an equal band", async () => {
    const { clock, admission, events, step, isZero, closeAll } = setup({
      p: { band: "protected" },
      q: { band: "protected" },
      batch: { band: "sheddable" },
    });
    const s1 = step("s1", "batch", 3_000);
    await s1.admitted;
    // Idle, it holds its context plus the growth expected of its next step: 3,000 + 3,000.
    admission.endStep(s1.session, { completed: true, contextTokens: 3_000 });
    const p1 = step("p1", "p", 4_000);
    await p1.admitted;
    step("p2", "p", 6_000);
    clock.advance(6_000);
    admission.sweep();
    await settle();
    // The idle sheddable session is at its boundary: it leaves at once, and p2 takes its room.
    assert.deepEqual(
      events.filter((event) => event.includes(":paused")),
      ["s1:paused:priority"],
    );
    assert.equal(admission.get("p2")!.state, "active");
    const q1 = step("q1", "q", 5_000);
    clock.advance(60_000);
    admission.sweep();
    await settle();
    assert.equal(admission.get("p1")!.pauseRequested || admission.get("p2")!.pauseRequested, false);
    assert.equal(admission.get("q1")!.state, "waiting");
    closeAll("p1", "p2", "q1", "s1");
    await q1.admitted.catch(() => {});
    isZero();
  });

  it("refuses the sheddable session first when the session queue is full", async () => {
    const { admission, step, isZero, closeAll } = setup(
      { batch: { band: "sheddable" }, ops: { band: "protected" } },
      { queueLimit: 1 },
    );
    await step("a1", "team-a", 10_000).admitted;
    const s1 = step("s1", "batch", 5_000);
    const a2 = step("a2", "team-a", 5_000);
    await assert.rejects(s1.admitted, (err) => err instanceof Refusal && err.reason === "session_queue_full");
    const a3 = step("a3", "team-a", 5_000);
    await assert.rejects(a3.admitted, (err) => err instanceof Refusal && err.reason === "session_queue_full");
    const o1 = step("o1", "ops", 5_000);
    await assert.rejects(a2.admitted, (err) => err instanceof Refusal && err.reason === "session_queue_full");
    const s2 = step("s2", "batch", 5_000);
    await assert.rejects(s2.admitted, (err) => err instanceof Refusal && err.reason === "session_queue_full");
    admission.close("a1");
    await o1.admitted;
    closeAll("o1", "s1", "a2", "a3", "s2");
    isZero();
  });

  it("returns every counter to zero after aborted and timed-out waits of several tenants", async () => {
    const { clock, admission, step, isZero, closeAll } = setup({}, { waitLimitMs: 10_000 });
    await step("a1", "team-a", 10_000).admitted;
    const controller = new AbortController();
    const b = admission.open("b1", { tenant: "team-b" });
    const aborted = admission.acquireStep(b, (c) => c[0], controller.signal, {
      promptTokens: 4_000,
      maxTokens: 0,
    });
    const c1 = step("c1", "team-c", 4_000);
    controller.abort(new Error("client left"));
    await assert.rejects(aborted, /client left/);
    clock.advance(10_000);
    await assert.rejects(c1.admitted, (err) => err instanceof Refusal && err.reason === "queue_timeout");
    closeAll("a1", "b1", "c1");
    isZero();
  });
});

describe("a first step refused after admission", () => {
  it("keeps its session's footprint in the window, so tenants' order admits no one into room it does not have", async () => {
    const { admission, step, isZero, closeAll } = setup({ large: {}, small: {} });
    const settle = () => new Promise((resolve) => setImmediate(resolve));
    const big = step("big", "large", 6_000);
    const a = step("a", "small", 3_000);
    assert.equal(await big.admitted, "r1");
    assert.equal(await a.admitted, "r1");
    const b = step("b", "small", 3_000);
    let bAdmitted = false;
    b.admitted.then(() => {
      bAdmitted = true;
    });
    await settle();
    assert.equal(bAdmitted, false, "6,000 + 3,000 + 3,000 > 10,000: b waits");
    // a's first call is refused further on (token budget, feasibility): no step of it completed, and
    // its client retries, so it still needs its first step's 3,000 tokens.
    admission.endStep(a.session, { completed: false });
    await settle();
    assert.equal(admission.replicaCounts("r1").footprintTokens, 9_000);
    assert.equal(bAdmitted, false, "the room a's retry needs is not room for b");
    const retry = admission.acquireStep(a.session, (c) => c[0], undefined, {
      promptTokens: 3_000,
      maxTokens: 0,
    });
    assert.equal(await retry, "r1");
    assert.equal(admission.replicaCounts("r1").footprintTokens, 9_000, "the retry fits the window it kept");
    admission.endStep(a.session, { completed: true, contextTokens: 3_000 });
    admission.close("a");
    assert.equal(await b.admitted, "r1", "a's place freed, b is admitted");
    admission.endStep(big.session, { completed: true, contextTokens: 6_000 });
    admission.endStep(b.session, { completed: true, contextTokens: 3_000 });
    closeAll("big", "b");
    isZero();
  });

  it("when the window shrinks, pauses the tenant furthest over its share first, not the youngest sessions", async () => {
    const { admission, step, isZero, closeAll } = setup({}, {}, { r1: 100_000 });
    // a holds three sessions, b (arriving last, so the youngest) two: 60,000 against 40,000 of footprint.
    for (const id of ["a1", "a2", "a3", "b1", "b2"]) {
      const { session, admitted } = step(id, id.startsWith("a") ? "a" : "b", 10_000);
      await admitted;
      admission.endStep(session, { completed: true, contextTokens: 10_000 });
    }
    // 70,000 shared evenly is 35,000 each: a is at 1.7 × its share, b at 1.14 ×.
    admission.setWindow("r1", 70_000, true);
    const states = Object.fromEntries(
      ["a1", "a2", "a3", "b1", "b2"].map((id) => [id, admission.get(id)!.state]),
    );
    assert.deepEqual(states, { a1: "active", a2: "paused", a3: "paused", b1: "active", b2: "active" });
    closeAll("a1", "a2", "a3", "b1", "b2");
    isZero();
  });
});
