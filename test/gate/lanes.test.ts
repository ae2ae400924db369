/** @module Tests of the lanes inside the gate: priority, floor and cap shares, lane queues, residence limits. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { VirtualClock } from "../../src/clock.js";
import { Refusal } from "../../src/errors.js";
import { BackendGate, GateRejection, type LaneOptions, type Permit } from "../../src/gate/backend-gate.js";
import type { Lane } from "../../src/types.js";
import { idleInvariant, settle, type Tracked, track } from "./gate-helpers.js";

function laneGate(e: number, q: number, lanes: LaneOptions, ranks?: number) {
  const clock = new VirtualClock();
  const gate = new BackendGate({
    engineRequestLimit: e,
    engineRequestWaitingLimit: e,
    requestQueueLimit: q,
    lanes,
    clock,
    ...(ranks === undefined ? {} : { ranks }),
  });
  return { clock, gate };
}

function permitOf(t: Tracked): Permit {
  assert.equal(t.state, "admitted", `expected an admitted call, got ${t.state} (${String(t.error)})`);
  return t.permit!;
}

describe("lanes: queues and residence", () => {
  test("without lanes there is no residence limit and no timer", async () => {
    const clock = new VirtualClock();
    const g = new BackendGate({
      engineRequestLimit: 1,
      engineRequestWaitingLimit: 1,
      requestQueueLimit: 2,
      clock,
    });
    const a = track(g.acquire());
    const b = track(g.acquire({ lane: "bulk" }));
    const c = track(g.acquire({ lane: "interactive" }));
    await settle();
    assert.equal(clock.pending(), 0);
    clock.advance(10_000_000);
    await settle();
    assert.deepEqual([b.state, c.state], ["pending", "pending"]);
    assert.equal(g.snapshot().lanes, undefined, "one FIFO: no lanes in the snapshot");
    assert.deepEqual(
      [g.queuedCount("interactive"), g.queuedCount("bulk"), g.oldestQueuedAgeMs("bulk")],
      [1, 1, 10_000_000],
      "declared lanes are still counted",
    );
    permitOf(a).release();
    await settle();
    assert.equal(permitOf(b).lane, "bulk", "one FIFO: the older bulk call goes first");
    permitOf(b).release();
    await settle();
    permitOf(c).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("a call that outlives its lane's residence time is refused with queue_timeout and leaks nothing", async () => {
    const { gate: g, clock } = laneGate(1, 10, {});
    const a = track(g.acquire());
    const i = track(g.acquire({ lane: "interactive" }));
    const b = track(g.acquire({ lane: "bulk" }));
    await settle();
    assert.equal(clock.pending(), 2, "one residence timer per queued call");
    clock.advance(9_999);
    await settle();
    assert.equal(i.state, "pending");
    assert.equal(g.oldestQueuedAgeMs("interactive"), 9_999);
    clock.advance(1);
    await settle();
    assert.equal(i.state, "failed");
    const error = i.error as Refusal;
    assert.ok(error instanceof Refusal && !(error instanceof GateRejection));
    assert.equal(error.reason, "queue_timeout");
    assert.equal(error.status, 429);
    assert.equal(error.scope, "lane");
    assert.equal(error.lane, "interactive");
    assert.ok(error.retryAfterSeconds! >= 1);
    assert.equal(g.queuedCount("interactive"), 0);
    assert.equal(g.queuedCount(), 1);
    clock.advance(300_000 - 10_000 - 1);
    await settle();
    assert.equal(b.state, "pending");
    clock.advance(1);
    await settle();
    assert.equal((b.error as Refusal).reason, "queue_timeout");
    assert.equal((b.error as Refusal).lane, "bulk");
    assert.deepEqual([g.snapshot().queued, g.snapshot().requests], [0, 1]);
    assert.equal(clock.pending(), 0);
    permitOf(a).release();
    assert.deepEqual(g.counters(), {
      received: 3,
      admittedDirect: 1,
      admittedQueue: 0,
      rejected: 2,
      cancelled: 0,
    });
    assert.deepEqual(g.rankCounters().at(-1)!.rejected, { worker: 0, rank: 0, lane: 2 });
    assert.equal(idleInvariant(g), undefined);
  });

  test("admission and cancellation cancel the residence timer", async () => {
    const { gate: g, clock } = laneGate(1, 10, { interactive: { maxResidenceMs: 500 } });
    const a = track(g.acquire());
    const controller = new AbortController();
    const b = track(g.acquire({ signal: controller.signal }));
    const c = track(g.acquire());
    await settle();
    assert.equal(clock.pending(), 2);
    controller.abort();
    await settle();
    assert.equal(b.state, "failed");
    assert.equal(clock.pending(), 1);
    permitOf(a).release();
    await settle();
    assert.equal(permitOf(c).source, "queue");
    assert.equal(clock.pending(), 0);
    clock.advance(1_000);
    permitOf(c).release();
    assert.deepEqual(g.counters(), {
      received: 3,
      admittedDirect: 1,
      admittedQueue: 1,
      rejected: 0,
      cancelled: 1,
    });
    assert.equal(idleInvariant(g), undefined);
  });

  test("a full lane queue refuses with queue_full while the rank queue has room", async () => {
    const { gate: g } = laneGate(1, 5, { interactive: { queueLimit: 1 } });
    const a = track(g.acquire());
    const i1 = track(g.acquire());
    const i2 = track(g.acquire({ lane: "interactive" }));
    const b1 = track(g.acquire({ lane: "bulk" }));
    await settle();
    assert.equal(i1.state, "pending");
    assert.equal(i2.state, "failed");
    const error = i2.error as Refusal;
    assert.ok(!(error instanceof GateRejection));
    assert.deepEqual(
      [error.reason, error.status, error.scope, error.lane],
      ["queue_full", 429, "lane", "interactive"],
    );
    assert.equal(b1.state, "pending", "bulk's queue limit defaults to the gate's queue limit");
    permitOf(a).release();
    await settle();
    permitOf(i1).release();
    await settle();
    permitOf(b1).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("a full rank queue rejects with worker_overloaded even when the lane has room", async () => {
    const { gate: g } = laneGate(1, 1, { interactive: { queueLimit: 10 } });
    const a = track(g.acquire());
    const b = track(g.acquire());
    const c = track(g.acquire());
    await settle();
    assert.ok(c.error instanceof GateRejection);
    assert.equal((c.error as GateRejection).lane, "interactive");
    permitOf(a).release();
    await settle();
    permitOf(b).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("requestQueueLimit 0 means no queueing in either lane", async () => {
    const { gate: g } = laneGate(1, 0, {});
    const a = await g.acquire();
    await assert.rejects(g.acquire({ lane: "interactive" }), GateRejection);
    await assert.rejects(g.acquire({ lane: "bulk" }), GateRejection);
    a.release();
    assert.equal(idleInvariant(g), undefined);
  });
});

describe("lanes: priority with a floor", () => {
  test("interactive goes first; then bulk gets its floor share", async () => {
    const { gate: g } = laneGate(1, 10, {});
    const a = track(g.acquire({ prefillTokens: 100 }));
    const b1 = track(g.acquire({ lane: "bulk", prefillTokens: 100 }));
    const i1 = track(g.acquire({ lane: "interactive", prefillTokens: 100 }));
    const i2 = track(g.acquire({ lane: "interactive", prefillTokens: 100 }));
    await settle();
    permitOf(a).release();
    await settle();
    assert.deepEqual(
      [b1, i1, i2].map((t) => t.state),
      ["pending", "admitted", "pending"],
      "the younger interactive call goes before the older bulk call",
    );
    permitOf(i1).release();
    await settle();
    assert.deepEqual(
      [b1.state, i2.state],
      ["admitted", "pending"],
      "bulk had 0 % of the contended tokens, below its 10 % floor",
    );
    assert.equal(permitOf(b1).lane, "bulk");
    permitOf(b1).release();
    await settle();
    permitOf(i2).release();
    assert.equal(idleInvariant(g), undefined);
  });

  /**
   * A closed loop in virtual time: calls run for a fixed time after admission,
   * and each lane's queue is topped up every 50 ms, so both always wait.
   */
  async function saturate(opts: {
    lanes: LaneOptions;
    ranks?: number;
    perRank: number;
    interactive: { tokens: number; runMs: number; rank?: number };
    bulk: { tokens: number; runMs: number; rank?: number };
    durationMs: number;
  }) {
    const { gate: g, clock } = laneGate(opts.perRank, 1000, opts.lanes, opts.ranks);
    const log: Array<{ at: number; lane: Lane; tokens: number }> = [];
    const queued: Record<Lane, number> = { interactive: 0, bulk: 0 };
    let failures = 0;
    const spec = { interactive: opts.interactive, bulk: opts.bulk };
    const launch = (lane: Lane) => {
      const { tokens, runMs, rank } = spec[lane];
      queued[lane]++;
      g.acquire({ lane, prefillTokens: tokens, ...(rank === undefined ? {} : { rank }) }).then(
        (permit) => {
          queued[lane]--;
          log.push({ at: clock.now(), lane, tokens });
          clock.setTimeout(() => permit.firstToken(), Math.min(20, runMs));
          clock.setTimeout(() => permit.release(), runMs);
        },
        () => {
          queued[lane]--;
          failures++;
        },
      );
    };
    const topUp = () => {
      while (queued.interactive < 20) launch("interactive");
      while (queued.bulk < 5) launch("bulk");
      if (clock.now() < opts.durationMs) clock.setTimeout(topUp, 50);
    };
    topUp();
    let nextSample = 0;
    const samples: number[] = [];
    while (clock.now() < opts.durationMs) {
      await clock.advanceAsync(10);
      if (clock.now() >= nextSample) {
        nextSample += 1_000;
        samples.push(g.queuedCount("interactive"));
      }
    }
    return { gate: g, clock, log, failures, samples };
  }

  function bulkShareOver(log: Array<{ at: number; lane: Lane; tokens: number }>, from: number, to: number) {
    let bulk = 0;
    let total = 0;
    for (const entry of log) {
      if (entry.at <= from || entry.at > to) continue;
      total += entry.tokens;
      if (entry.lane === "bulk") bulk += entry.tokens;
    }
    return total > 0 ? bulk / total : 0;
  }

  test("bulk keeps its floor share over a long run while interactive saturates", async () => {
    const run = (floor: number) =>
      saturate({
        lanes: { bulkFloorShare: floor, interactive: { maxResidenceMs: 1e9 }, bulk: { maxResidenceMs: 1e9 } },
        perRank: 4,
        interactive: { tokens: 500, runMs: 200 },
        bulk: { tokens: 8_000, runMs: 2_000 },
        durationMs: 600_000,
      });
    const withFloor = await run(0.1);
    assert.equal(withFloor.failures, 0);
    assert.ok(
      withFloor.samples.every((n) => n > 0),
      "interactive calls wait throughout",
    );
    const minuteShares: number[] = [];
    for (let t = 60_000; t <= 600_000; t += 5_000)
      minuteShares.push(bulkShareOver(withFloor.log, t - 60_000, t));
    const lowest = Math.min(...minuteShares);
    const overall = bulkShareOver(withFloor.log, 0, 600_000);
    // One bulk call is 8000 tokens of a ~600k-token window: the share may dip that much as calls leave the window.
    assert.ok(lowest >= 0.095, `bulk share over every minute ≥ 9.5 %, lowest ${lowest.toFixed(4)}`);
    assert.ok(
      overall >= 0.1 && overall < 0.2,
      `overall bulk share near its 10 % floor, got ${overall.toFixed(4)}`,
    );
    // Without a floor the same load starves bulk entirely: the test can tell the difference.
    const withoutFloor = await run(0);
    assert.equal(bulkShareOver(withoutFloor.log, 0, 600_000), 0);
  });

  test("bulk is held at its max share while interactive calls wait", async () => {
    const run = (max: number) =>
      saturate({
        lanes: { bulkMaxShare: max, interactive: { maxResidenceMs: 1e9 }, bulk: { maxResidenceMs: 1e9 } },
        ranks: 2,
        perRank: 2,
        // Interactive only on rank 0, bulk only on rank 1: bulk never competes for the same slots,
        // so only the cap keeps it from taking all of rank 1.
        interactive: { tokens: 500, runMs: 200, rank: 0 },
        bulk: { tokens: 8_000, runMs: 1_000, rank: 1 },
        durationMs: 300_000,
      });
    const capped = await run(0.5);
    assert.equal(capped.failures, 0);
    assert.ok(capped.samples.every((n) => n > 0));
    const window = 60_000;
    let bulkAdmissions = 0;
    for (let k = 0; k < capped.log.length; k++) {
      const entry = capped.log[k]!;
      if (entry.lane !== "bulk") continue;
      bulkAdmissions++;
      // The share of the window before this admission, as the gate saw it.
      let bulk = 0;
      let total = 0;
      for (let j = 0; j < k; j++) {
        const prior = capped.log[j]!;
        if (prior.at <= entry.at - window) continue;
        total += prior.tokens;
        if (prior.lane === "bulk") bulk += prior.tokens;
      }
      const share = total > 0 ? bulk / total : 0;
      assert.ok(share < 0.5, `bulk admitted at ${entry.at} ms with its share at ${share.toFixed(3)}`);
    }
    assert.ok(bulkAdmissions > 50, `bulk still runs under the cap (${bulkAdmissions} admissions)`);
    const cappedShare = bulkShareOver(capped.log, window, 300_000);
    assert.ok(cappedShare <= 0.55, `bulk share ≈ its 50 % cap, got ${cappedShare.toFixed(3)}`);
    const uncapped = await run(1);
    const uncappedShare = bulkShareOver(uncapped.log, window, 300_000);
    assert.ok(uncappedShare > 0.65, `without the cap bulk takes more, got ${uncappedShare.toFixed(3)}`);
  });

  test("within a lane, the oldest head that fits goes first across rank queues", async () => {
    const { gate: g } = laneGate(1, 4, {}, 2);
    const u1 = track(g.acquire());
    const u2 = track(g.acquire());
    const older = track(g.acquire({ rank: 1 }));
    const younger = track(g.acquire({ rank: 0 }));
    const youngest = track(g.acquire());
    await settle();
    assert.deepEqual(
      [older.state, younger.state, youngest.state],
      ["pending", "pending", "pending"],
      "both ranks are idle but the combined capacity is held by unranked calls",
    );
    permitOf(u1).release();
    await settle();
    assert.deepEqual([older.state, younger.state, youngest.state], ["admitted", "pending", "pending"]);
    permitOf(u2).release();
    await settle();
    assert.deepEqual([younger.state, youngest.state], ["admitted", "pending"]);
    permitOf(older).release();
    await settle();
    for (const t of [younger, youngest]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
  });

  test("a bulk call held at its cap is admitted when the share window slides, with no other event", async () => {
    const { gate: g, clock } = laneGate(1, 4, { shareWindowMs: 1_000, bulkMaxShare: 0.5 }, 2);
    const i0 = track(g.acquire({ rank: 0, prefillTokens: 10 }));
    const b0 = track(g.acquire({ rank: 1, lane: "bulk", prefillTokens: 100 }));
    const i1 = track(g.acquire({ rank: 0, prefillTokens: 10 }));
    await settle();
    assert.equal(i1.state, "pending");
    permitOf(b0).release();
    const b1 = track(g.acquire({ rank: 1, lane: "bulk", prefillTokens: 100 }));
    await settle();
    assert.equal(
      b1.state,
      "pending",
      "rank 1 is free, but bulk holds 100 of 110 tokens while interactive waits",
    );
    assert.ok(Math.abs(g.bulkShare() - 100 / 110) < 1e-12);
    clock.advance(999);
    await settle();
    assert.equal(b1.state, "pending");
    clock.advance(1);
    await settle();
    assert.equal(permitOf(b1).queueMs, 1_000);
    assert.equal(i1.state, "pending");
    permitOf(i0).release();
    await settle();
    for (const t of [i1, b1]) permitOf(t).release();
    assert.equal(idleInvariant(g), undefined);
    assert.equal(clock.pending(), 0);
  });

  test("snapshot and counters per lane", async () => {
    const { gate: g, clock } = laneGate(1, 10, {});
    const a = track(g.acquire());
    const i = track(g.acquire());
    clock.advance(30);
    const b = track(g.acquire({ lane: "bulk" }));
    clock.advance(20);
    await settle();
    assert.deepEqual(g.snapshot().lanes, {
      interactive: { queued: 1, oldestAgeMs: 50 },
      bulk: { queued: 1, oldestAgeMs: 20 },
    });
    assert.equal(g.oldestQueuedAgeMs(), 50);
    assert.equal(g.queuedCount("bulk"), 1);
    permitOf(a).release();
    await settle();
    assert.equal(permitOf(i).queueMs, 50);
    assert.equal(permitOf(i).lane, "interactive");
    permitOf(i).release();
    await settle();
    permitOf(b).release();
    assert.equal(idleInvariant(g), undefined);
    assert.equal(clock.pending(), 0);
  });
});
