/** @module Tests of the gate's data-parallel ranks: per-rank limits, combined capacity, shared queue, scope. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { VirtualClock } from "../../src/clock.js";
import { BackendGate, GateRejection, type Permit } from "../../src/gate/backend-gate.js";
import { idleInvariant, settle, type Tracked, track } from "./gate-helpers.js";

function gate(e: number, w: number, q: number, ranks?: number) {
  return new BackendGate({
    engineRequestLimit: e,
    engineRequestWaitingLimit: w,
    requestQueueLimit: q,
    clock: new VirtualClock(),
    ...(ranks === undefined ? {} : { ranks }),
  });
}

function permitOf(t: Tracked): Permit {
  assert.equal(t.state, "admitted", `expected an admitted call, got ${t.state} (${String(t.error)})`);
  return t.permit!;
}

function rejection(t: Tracked): GateRejection {
  assert.equal(t.state, "failed");
  assert.ok(t.error instanceof GateRejection, `expected a GateRejection, got ${String(t.error)}`);
  return t.error;
}

describe("BackendGate ranks", () => {
  test("a busy rank never blocks another rank with room", async () => {
    const g = gate(1, 1, 2, 2);
    const a = track(g.acquire({ rank: 0 }));
    const b = track(g.acquire({ rank: 0 }));
    const c = track(g.acquire({ rank: 1 }));
    await settle();
    assert.equal(permitOf(a).rank, 0);
    assert.equal(b.state, "pending");
    assert.equal(permitOf(c).source, "direct");
    assert.equal(permitOf(c).rank, 1);
    assert.deepEqual(g.snapshot().ranks, [
      { rank: 0, requests: 1, waiting: 1, queued: 1 },
      { rank: 1, requests: 1, waiting: 1, queued: 0 },
    ]);
    permitOf(c).release();
    await settle();
    assert.equal(b.state, "pending", "rank 1's capacity is not rank 0's");
    permitOf(a).release();
    await settle();
    permitOf(b).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("freed capacity goes to the oldest queued head that fits, across queues", async () => {
    const g = gate(1, 1, 2, 2);
    const a = track(g.acquire({ rank: 0 }));
    const b = track(g.acquire({ rank: 1 }));
    const c = track(g.acquire({ rank: 0 })); // oldest, but rank 0 stays full
    const d = track(g.acquire({ rank: 1 }));
    const u = track(g.acquire()); // unranked, youngest
    await settle();
    assert.deepEqual(
      [c, d, u].map((t) => t.state),
      ["pending", "pending", "pending"],
    );
    permitOf(b).release();
    await settle();
    assert.deepEqual(
      [c, d, u].map((t) => t.state),
      ["pending", "admitted", "pending"],
      "rank 1's head fits and is older than the unranked call",
    );
    permitOf(a).release();
    await settle();
    assert.deepEqual(
      [c, u].map((t) => t.state),
      ["admitted", "pending"],
    );
    permitOf(d).release();
    await settle();
    assert.equal(permitOf(u).rank, undefined);
    for (const t of [c, u]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("ranked calls queue behind full combined capacity held by unranked calls", async () => {
    const g = gate(2, 2, 2, 2);
    const unranked = Array.from({ length: 4 }, () => track(g.acquire()));
    const ranked = track(g.acquire({ rank: 0 }));
    await settle();
    assert.ok(unranked.every((t) => t.state === "admitted"));
    assert.equal(ranked.state, "pending", "rank 0 holds nothing, yet the combined 4 requests are in use");
    assert.deepEqual(g.snapshot().ranks[0], { rank: 0, requests: 0, waiting: 0, queued: 1 });
    assert.deepEqual(g.snapshot().unranked, { requests: 4, waiting: 4, queued: 0 });
    permitOf(unranked[0]!).release();
    await settle();
    assert.equal(permitOf(ranked).rank, 0);
    for (const t of [...unranked.slice(1), ranked]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("unranked calls use the shared queue, bounded by the combined queue limit", async () => {
    const g = gate(1, 1, 1, 2);
    const r0 = track(g.acquire({ rank: 0 }));
    const r1 = track(g.acquire({ rank: 1 }));
    const u1 = track(g.acquire());
    const u2 = track(g.acquire());
    const u3 = track(g.acquire());
    const lateRanked = track(g.acquire({ rank: 0 }));
    await settle();
    assert.deepEqual(
      [u1, u2].map((t) => t.state),
      ["pending", "pending"],
    );
    assert.equal(g.snapshot().unranked.queued, 2);
    assert.equal(rejection(u3).scope, "worker");
    // Rank 0's own queue is empty, but the combined queue (2) is full: the ranked call is held back too.
    const e = rejection(lateRanked);
    assert.equal(e.scope, "worker");
    assert.equal(e.rank, 0);
    permitOf(r1).release();
    await settle();
    assert.equal(permitOf(u1).source, "queue");
    for (const t of [r0, u1]) permitOf(t).release();
    await settle();
    permitOf(u2).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("unranked calls never count against a single rank", async () => {
    const g = gate(1, 1, 1, 2);
    const u = track(g.acquire());
    const r0 = track(g.acquire({ rank: 0 }));
    const r1 = track(g.acquire({ rank: 1 }));
    await settle();
    assert.equal(permitOf(u).rank, undefined);
    assert.equal(permitOf(r0).source, "direct", "rank 0 holds nothing of the unranked call");
    assert.equal(r1.state, "pending", "combined 2/2 in use");
    assert.deepEqual(g.snapshot().ranks, [
      { rank: 0, requests: 1, waiting: 1, queued: 0 },
      { rank: 1, requests: 0, waiting: 0, queued: 1 },
    ]);
    permitOf(u).release();
    await settle();
    for (const t of [r0, r1]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("a rejection names the rank while another rank can still take calls, else the worker", async () => {
    const g = gate(1, 1, 1, 2);
    const a = track(g.acquire({ rank: 0 }));
    const b = track(g.acquire({ rank: 0 }));
    const c = track(g.acquire({ rank: 0 }));
    await settle();
    const rankScoped = rejection(c);
    assert.equal(rankScoped.scope, "rank");
    assert.equal(rankScoped.rank, 0);
    const d = track(g.acquire({ rank: 1 }));
    const e = track(g.acquire({ rank: 1 }));
    const f = track(g.acquire({ rank: 0 }));
    const h = track(g.acquire({ rank: 1 }));
    await settle();
    assert.equal(e.state, "pending");
    assert.equal(rejection(f).scope, "worker");
    assert.equal(rejection(h).scope, "worker");
    const counts = g.rankCounters();
    assert.deepEqual(counts[0]!.rejected, { worker: 1, rank: 1, lane: 0 });
    assert.deepEqual(counts[1]!.rejected, { worker: 1, rank: 0, lane: 0 });
    for (const t of [a, d]) permitOf(t).release();
    await settle();
    for (const t of [b, e]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("a ranked call is rank-scoped while unranked calls could still queue", async () => {
    const g = gate(1, 1, 1, 3);
    const holders = [0, 1, 2].map((rank) => track(g.acquire({ rank })));
    const q0 = track(g.acquire({ rank: 0 }));
    const rejected = track(g.acquire({ rank: 0 }));
    await settle();
    assert.equal(q0.state, "pending");
    assert.equal(
      rejection(rejected).scope,
      "rank",
      "ranks 1 and 2 (and the shared queue) still have queue places",
    );
    for (const t of holders) permitOf(t).release();
    await settle();
    permitOf(q0).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("until setRanks, every call is unranked, even with a rank", async () => {
    const g = gate(1, 1, 1);
    assert.equal(g.ranksKnown, false);
    const a = track(g.acquire({ rank: 0 }));
    const b = track(g.acquire({ rank: 3 }));
    const c = track(g.acquire({ rank: 1 }));
    await settle();
    assert.equal(permitOf(a).rank, undefined);
    assert.equal(b.state, "pending", "one rank is assumed: combined capacity 1");
    const e = rejection(c);
    assert.equal(e.scope, "worker");
    assert.equal(e.rank, undefined);
    assert.deepEqual(g.snapshot().unranked, { requests: 1, waiting: 1, queued: 1 });
    g.setRanks(2);
    await settle();
    assert.equal(permitOf(b).rank, undefined, "a queued unranked call stays unranked; capacity doubled");
    const r1 = track(g.acquire({ rank: 1 }));
    await settle();
    assert.equal(r1.state, "pending", "rank 1 holds nothing, but the combined 2/2 are in use");
    assert.deepEqual(g.snapshot().ranks[1], { rank: 1, requests: 0, waiting: 0, queued: 1 });
    permitOf(a).release();
    await settle();
    const ranked = permitOf(r1);
    assert.equal(ranked.rank, 1);
    const unknown = track(g.acquire({ rank: 7 }));
    await settle();
    assert.equal(unknown.state, "pending");
    assert.equal(g.snapshot().unranked.queued, 1, "an unknown rank is unranked");
    for (const p of [permitOf(b), ranked]) p.release();
    await settle();
    permitOf(unknown).release();
    assert.equal(g.counters().received, 5);
    assert.equal(idleInvariant(g), undefined);
  });

  test("setRanks shrinking moves queued calls to the shared queue in arrival order", async () => {
    const g = gate(1, 1, 3, 3);
    const held = [0, 1, 2].map((rank) => track(g.acquire({ rank })));
    const r2a = track(g.acquire({ rank: 2 }));
    const u1 = track(g.acquire());
    const r2b = track(g.acquire({ rank: 2 }));
    const r1 = track(g.acquire({ rank: 1 }));
    await settle();
    g.setRanks(2);
    await settle();
    const s = g.snapshot();
    assert.equal(s.queued, 4);
    assert.equal(s.unranked.queued, 3, "rank 2's two calls joined the shared queue");
    assert.deepEqual(
      s.ranks.map((r) => [r.rank, r.requests, r.queued]),
      [
        [0, 1, 0],
        [1, 1, 1],
        [2, 1, 0],
      ],
      "rank 2 is listed while it still holds a call",
    );
    const states = () => [r2a, u1, r2b, r1].map((t) => t.state[0]).join("");
    // Combined capacity is now 2 and three calls hold it.
    permitOf(held[2]!).release();
    await settle();
    assert.equal(states(), "pppp");
    permitOf(held[0]!).release(); // rank 0 frees: the shared queue's head fits
    await settle();
    assert.equal(states(), "appp");
    assert.equal(permitOf(r2a).rank, undefined);
    permitOf(held[1]!).release(); // rank 1 fits too now, but the shared head u1 is older than r1
    await settle();
    assert.equal(states(), "aapp");
    permitOf(r2a).release();
    await settle();
    assert.equal(states(), "aaap");
    permitOf(u1).release();
    await settle();
    assert.equal(permitOf(r1).rank, 1);
    for (const t of [r2b, r1]) permitOf(t).release();
    assert.deepEqual(
      g.snapshot().ranks.map((r) => r.rank),
      [0, 1],
    );
    assert.equal(idleInvariant(g), undefined);
  });

  test("setRanks growing admits queued calls at once and validates its argument", async () => {
    const g = gate(1, 1, 4);
    const calls = Array.from({ length: 3 }, () => track(g.acquire()));
    await settle();
    assert.equal(g.snapshot().queued, 2);
    g.setRanks(3);
    await settle();
    assert.ok(calls.every((t) => t.state === "admitted"));
    assert.equal(g.rankCount, 3);
    assert.throws(() => g.setRanks(0), /setRanks.*got 0/);
    assert.throws(() => g.setRanks(1.5), /setRanks.*got 1\.5/);
    for (const t of calls) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("rankCounters attribute each call to the rank it arrived for", async () => {
    const g = gate(1, 1, 0, 2);
    const a = await g.acquire({ rank: 0 });
    const b = await g.acquire({ rank: 1 });
    await assert.rejects(g.acquire({ rank: 1 }));
    await assert.rejects(g.acquire());
    a.release();
    b.release();
    const byRank = Object.fromEntries(g.rankCounters().map((r) => [String(r.rank), r]));
    assert.deepEqual(Object.keys(byRank), ["0", "1", "unspecified"]);
    assert.equal(byRank["0"]!.admittedDirect, 1);
    assert.equal(byRank["1"]!.received, 2);
    assert.deepEqual(byRank["1"]!.rejected, { worker: 1, rank: 0, lane: 0 });
    assert.deepEqual(byRank.unspecified!.rejected, { worker: 1, rank: 0, lane: 0 });
    assert.equal(idleInvariant(g), undefined);
  });
});
