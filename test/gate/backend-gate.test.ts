/** @module Tests of the backend gate on one rank: limits, queue, FIFO, cancellation, permits, counters. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { VirtualClock } from "../../src/clock.js";
import { Refusal, renderRefusal } from "../../src/errors.js";
import { BackendGate, GateCancelled, GateRejection, type Permit } from "../../src/gate/backend-gate.js";
import { idleInvariant, settle, type Tracked, track } from "./gate-helpers.js";

function gate(
  e: number,
  w: number,
  q: number,
  extra: Partial<ConstructorParameters<typeof BackendGate>[0]> = {},
) {
  const clock = new VirtualClock();
  return {
    clock,
    gate: new BackendGate({
      engineRequestLimit: e,
      engineRequestWaitingLimit: w,
      requestQueueLimit: q,
      clock,
      ...extra,
    }),
  };
}

function permitOf(t: Tracked): Permit {
  assert.equal(t.state, "admitted", `expected an admitted call, got ${t.state} (${String(t.error)})`);
  return t.permit!;
}

describe("BackendGate options", () => {
  const base = { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 0 };
  const bad: Array<[string, Record<string, unknown>, RegExp]> = [
    ["engineRequestLimit 0", { engineRequestLimit: 0 }, /engineRequestLimit.*got 0/],
    ["engineRequestLimit 1.5", { engineRequestLimit: 1.5 }, /engineRequestLimit.*got 1\.5/],
    [
      "engineRequestWaitingLimit NaN",
      { engineRequestWaitingLimit: Number.NaN },
      /engineRequestWaitingLimit.*got NaN/,
    ],
    ["requestQueueLimit -1", { requestQueueLimit: -1 }, /requestQueueLimit.*got -1/],
    ["requestQueueLimit string", { requestQueueLimit: "3" }, /requestQueueLimit.*got 3/],
    ["ranks 0", { ranks: 0 }, /ranks.*got 0/],
    ["overloadStatus 42", { overloadStatus: 42 }, /overloadStatus.*got 42/],
    ["bulkFloorShare 2", { lanes: { bulkFloorShare: 2 } }, /bulkFloorShare.*got 2/],
    ["floor above max", { lanes: { bulkFloorShare: 0.6, bulkMaxShare: 0.5 } }, /0\.6.*0\.5/],
    ["residence 0", { lanes: { bulk: { maxResidenceMs: 0 } } }, /bulk\.maxResidenceMs.*got 0/],
    ["lane queue -2", { lanes: { interactive: { queueLimit: -2 } } }, /interactive\.queueLimit.*got -2/],
    ["share window 0", { lanes: { shareWindowMs: 0 } }, /shareWindowMs.*got 0/],
  ];
  for (const [name, patch, message] of bad) {
    test(`rejects ${name}`, () => {
      assert.throws(
        () => new BackendGate({ ...base, ...patch } as ConstructorParameters<typeof BackendGate>[0]),
        (error: unknown) => error instanceof RangeError && message.test(error.message),
      );
    });
  }

  test("rejects an invalid lane and prefillTokens without counting them", async () => {
    const { gate: g } = gate(1, 1, 1, { lanes: {} });
    await assert.rejects(g.acquire({ lane: "overflow" as "bulk" }), /lane must be.*overflow/);
    await assert.rejects(g.acquire({ prefillTokens: -1 }), /prefillTokens.*-1/);
    assert.equal(g.counters().received, 0);
  });
});

describe("BackendGate engine limits", () => {
  test("the request limit alone holds admission (waiting limit has room)", async () => {
    const { gate: g } = gate(2, 10, 5);
    const a = track(g.acquire());
    const b = track(g.acquire());
    await settle();
    permitOf(a).firstToken();
    permitOf(b).firstToken();
    const c = track(g.acquire());
    await settle();
    assert.equal(c.state, "pending");
    assert.deepEqual([g.snapshot().requests, g.snapshot().waiting, g.snapshot().queued], [2, 0, 1]);
    permitOf(a).release();
    await settle();
    assert.equal(permitOf(c).source, "queue");
    permitOf(b).release();
    permitOf(c).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("the waiting limit alone holds admission (request limit has room)", async () => {
    const { gate: g } = gate(10, 2, 5);
    const a = track(g.acquire());
    const b = track(g.acquire());
    const c = track(g.acquire());
    await settle();
    assert.equal(c.state, "pending");
    assert.deepEqual([g.snapshot().requests, g.snapshot().waiting, g.snapshot().queued], [2, 2, 1]);
    permitOf(a).firstToken();
    await settle();
    assert.equal(permitOf(c).source, "queue");
    for (const t of [a, b, c]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("a first token admits a queued call only when the request limit has room", async () => {
    const { gate: g } = gate(2, 1, 5);
    const a = track(g.acquire());
    const b = track(g.acquire());
    await settle();
    assert.equal(b.state, "pending", "waiting limit 1 is full");
    permitOf(a).firstToken();
    await settle();
    permitOf(b);
    const c = track(g.acquire());
    await settle();
    permitOf(b).firstToken();
    await settle();
    assert.equal(c.state, "pending", "waiting has room but requests are 2/2");
    permitOf(a).release();
    await settle();
    permitOf(c);
    for (const t of [b, c]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("a completion admits a queued call only when the waiting limit has room", async () => {
    const { gate: g } = gate(3, 2, 5);
    const a = track(g.acquire());
    const b = track(g.acquire());
    const c = track(g.acquire());
    await settle();
    assert.equal(c.state, "pending");
    permitOf(a).firstToken();
    await settle();
    permitOf(c);
    const d = track(g.acquire());
    await settle();
    permitOf(a).release(); // frees a request; waiting stays 2/2 (b and c)
    await settle();
    assert.equal(d.state, "pending");
    permitOf(b).release(); // b still held its waiting part
    await settle();
    permitOf(d);
    for (const t of [c, d]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("queue limit 0 rejects at once with 529 worker_overloaded", async () => {
    const { gate: g } = gate(1, 1, 0);
    const a = track(g.acquire());
    const b = track(g.acquire());
    await settle();
    permitOf(a);
    assert.equal(b.state, "failed");
    const error = b.error as GateRejection;
    assert.ok(error instanceof GateRejection);
    assert.ok(error instanceof Refusal);
    assert.equal(error.status, 529);
    assert.equal(error.reason, "worker_overloaded");
    assert.equal(error.scope, "worker");
    assert.equal(error.rank, undefined);
    assert.ok(error.retryAfterSeconds! >= 1);
    const rendered = renderRefusal(error, "req-1");
    assert.equal(rendered.status, 529);
    assert.equal(rendered.body.error.code, "worker_overloaded");
    assert.equal(rendered.headers["retry-after"], String(error.retryAfterSeconds));
    permitOf(a).release();
    assert.deepEqual(g.counters(), {
      received: 2,
      admittedDirect: 1,
      admittedQueue: 0,
      rejected: 1,
      cancelled: 0,
    });
    assert.equal(idleInvariant(g), undefined);
  });

  test("overloadStatus sets the rejection status", async () => {
    const { gate: g } = gate(1, 1, 0, { overloadStatus: 503 });
    const a = await g.acquire();
    await assert.rejects(g.acquire(), (e: unknown) => e instanceof GateRejection && e.status === 503);
    a.release();
  });
});

describe("BackendGate queue", () => {
  test("exactly N direct, then Q queued, then a rejection", async () => {
    const { gate: g, clock } = gate(3, 3, 4);
    const calls = Array.from({ length: 8 }, () => track(g.acquire()));
    await settle();
    assert.deepEqual(
      calls.map((c) => c.state),
      ["admitted", "admitted", "admitted", "pending", "pending", "pending", "pending", "failed"],
    );
    for (const c of calls.slice(0, 3)) assert.equal(permitOf(c).source, "direct");
    assert.equal(g.snapshot().queued, 4);
    clock.advance(250);
    permitOf(calls[0]!).release();
    await settle();
    const fourth = permitOf(calls[3]!);
    assert.equal(fourth.source, "queue");
    assert.equal(fourth.queueMs, 250);
    for (let i = 1; i < 7; i++) {
      permitOf(calls[i]!).release();
      await settle();
    }
    assert.deepEqual(g.counters(), {
      received: 8,
      admittedDirect: 3,
      admittedQueue: 4,
      rejected: 1,
      cancelled: 0,
    });
    assert.equal(idleInvariant(g), undefined);
  });

  test("queued calls are admitted in strict FIFO order", async () => {
    const { gate: g } = gate(1, 1, 20);
    const first = track(g.acquire());
    const queued = Array.from({ length: 20 }, () => track(g.acquire()));
    await settle();
    const order: number[] = [];
    let holder = permitOf(first);
    for (let step = 0; step < 20; step++) {
      holder.release();
      await settle();
      const admitted = queued
        .map((t, i) => (t.state === "admitted" && !order.includes(i) ? i : -1))
        .filter((i) => i >= 0);
      assert.equal(admitted.length, 1, "one release admits exactly one call");
      order.push(admitted[0]!);
      holder = permitOf(queued[admitted[0]!]!);
    }
    holder.release();
    assert.deepEqual(
      order,
      Array.from({ length: 20 }, (_, i) => i),
    );
    assert.equal(idleInvariant(g), undefined);
  });

  test("a cancelled waiter frees its place, is never admitted, and capacity moves to the next", async () => {
    const { gate: g } = gate(1, 1, 2);
    const a = track(g.acquire());
    const controller = new AbortController();
    const b = track(g.acquire({ signal: controller.signal }));
    const c = track(g.acquire());
    const full = track(g.acquire());
    await settle();
    assert.equal(full.state, "failed", "queue of 2 is full");
    controller.abort(new Error("client left"));
    await settle();
    assert.equal(b.state, "failed");
    assert.ok(b.error instanceof GateCancelled);
    assert.equal((b.error as Error).name, "AbortError");
    assert.equal(g.snapshot().queued, 1);
    const d = track(g.acquire());
    await settle();
    assert.equal(d.state, "pending", "the freed place takes a new call");
    permitOf(a).release();
    await settle();
    assert.equal(b.state, "failed");
    permitOf(c).release();
    await settle();
    permitOf(d).release();
    controller.abort(); // a second abort changes nothing
    assert.deepEqual(g.counters(), {
      received: 5,
      admittedDirect: 1,
      admittedQueue: 2,
      rejected: 1,
      cancelled: 1,
    });
    assert.equal(idleInvariant(g), undefined);
  });

  test("an aborted signal after admission does not touch the permit", async () => {
    const { gate: g } = gate(1, 1, 1);
    const a = track(g.acquire());
    const controller = new AbortController();
    const b = track(g.acquire({ signal: controller.signal }));
    await settle();
    permitOf(a).release();
    await settle();
    const permit = permitOf(b);
    controller.abort();
    assert.equal(g.snapshot().requests, 1);
    assert.equal(g.counters().cancelled, 0);
    permit.release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("an already aborted signal never enters, even with free capacity", async () => {
    const { gate: g } = gate(5, 5, 5);
    const controller = new AbortController();
    controller.abort();
    await assert.rejects(
      g.acquire({ signal: controller.signal }),
      (e: unknown) => e instanceof GateCancelled,
    );
    const s = g.snapshot();
    assert.deepEqual([s.requests, s.waiting, s.queued], [0, 0, 0]);
    assert.deepEqual(g.counters(), {
      received: 1,
      admittedDirect: 0,
      admittedQueue: 0,
      rejected: 0,
      cancelled: 1,
    });
    // Also when the call would have had to queue.
    const held = await Promise.all(Array.from({ length: 5 }, () => g.acquire()));
    await assert.rejects(
      g.acquire({ signal: AbortSignal.abort() }),
      (e: unknown) => e instanceof GateCancelled,
    );
    assert.equal(g.snapshot().queued, 0);
    for (const p of held) p.release();
    assert.equal(idleInvariant(g), undefined);
  });
});

describe("BackendGate permits", () => {
  test("firstToken and release are idempotent; release also ends the waiting part", async () => {
    const { gate: g } = gate(2, 2, 0);
    const a = await g.acquire();
    const b = await g.acquire();
    a.firstToken();
    a.firstToken();
    assert.deepEqual([g.snapshot().requests, g.snapshot().waiting], [2, 1]);
    b.release();
    assert.deepEqual([g.snapshot().requests, g.snapshot().waiting], [1, 0]);
    b.release();
    b.firstToken();
    a.release();
    a.release();
    a.firstToken();
    assert.deepEqual([g.snapshot().requests, g.snapshot().waiting], [0, 0]);
    assert.equal(idleInvariant(g), undefined);
  });

  test("a permit reports source, queue time, rank and lane", async () => {
    const { gate: g, clock } = gate(1, 1, 1);
    const a = await g.acquire({ lane: "bulk" });
    assert.equal(a.source, "direct");
    assert.equal(a.queueMs, 0);
    assert.equal(a.rank, undefined);
    assert.equal(a.lane, "bulk");
    const b = track(g.acquire());
    clock.advance(40);
    a.release();
    await settle();
    assert.equal(permitOf(b).source, "queue");
    assert.equal(permitOf(b).queueMs, 40);
    assert.equal(permitOf(b).lane, undefined);
    permitOf(b).release();
  });
});

describe("BackendGate limits at run time", () => {
  test("setLimits raises capacity and admits queued calls now", async () => {
    const { gate: g } = gate(1, 1, 5);
    const calls = Array.from({ length: 4 }, () => track(g.acquire()));
    await settle();
    assert.equal(g.snapshot().queued, 3);
    g.setLimits({ engineRequestLimit: 3, engineRequestWaitingLimit: 3 });
    await settle();
    assert.deepEqual(g.limits(), {
      engineRequestLimit: 3,
      engineRequestWaitingLimit: 3,
      requestQueueLimit: 5,
    });
    assert.deepEqual(
      calls.map((c) => c.state),
      ["admitted", "admitted", "admitted", "pending"],
    );
    assert.throws(() => g.setLimits({ requestQueueLimit: -1 }), /requestQueueLimit.*-1/);
    g.setLimits({ engineRequestLimit: 1 }); // lowering never preempts
    assert.equal(g.snapshot().requests, 3);
    for (const c of calls.slice(0, 3)) {
      permitOf(c).release();
      await settle();
    }
    assert.equal(calls[3]!.state, "admitted");
    permitOf(calls[3]!).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("Retry-After follows the measured completion rate", async () => {
    const { gate: g, clock } = gate(1, 1, 20, { drainWindowMs: 10_000 });
    // 100 completions spread over 10 s: 10 per second.
    for (let i = 0; i < 100; i++) {
      const p = await g.acquire();
      clock.advance(100);
      p.release();
    }
    const held = await g.acquire();
    const queued = Array.from({ length: 20 }, () => track(g.acquire()));
    const rejected = track(g.acquire());
    await settle();
    // 21 calls ahead (20 queued and this one) at 10/s: 2.1 s, rounded up.
    assert.equal((rejected.error as GateRejection).retryAfterSeconds, 3);
    // Nothing completes for a whole window (20 s): 21 calls ahead at 20 s each, capped at 60.
    clock.advance(20_000);
    await assert.rejects(
      g.acquire(),
      (e: unknown) => e instanceof GateRejection && e.retryAfterSeconds === 60,
    );
    held.release();
    for (const t of queued) {
      await settle();
      permitOf(t).release();
    }
    assert.equal(idleInvariant(g), undefined);
  });
});
