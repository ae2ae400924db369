/** @module Tests of the drain estimate behind Retry-After, and of the lane share window. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { VirtualClock } from "../../src/clock.js";
import { DrainEstimator } from "../../src/gate/drain-estimator.js";
import { ShareWindow } from "../../src/gate/share-window.js";

describe("DrainEstimator", () => {
  test("validates its options, naming the value", () => {
    assert.throws(() => new DrainEstimator({ windowMs: 0 }), /windowMs.*got 0/);
    assert.throws(() => new DrainEstimator({ buckets: 2.5 }), /buckets.*got 2\.5/);
    assert.throws(() => new DrainEstimator({ maxSeconds: 0.5 }), /maxSeconds.*got 0\.5/);
    assert.throws(() => new DrainEstimator({ foldEvery: 0 }), /foldEvery.*got 0/);
  });

  test("rate is completions over the whole window, so it is never overestimated after start-up", () => {
    const clock = new VirtualClock();
    const d = new DrainEstimator({ clock, windowMs: 10_000 });
    for (let i = 0; i < 50; i++) d.record();
    // 50 completions in the first instant: 5/s over the 10 s window, not 50 000/s.
    assert.equal(d.ratePerSecond(), 5);
    assert.equal(d.estimateSeconds(10), 2);
    assert.equal(d.retryAfterSeconds(11), 3, "2.2 s rounds up");
  });

  test("with nothing completed in the window, each call ahead is taken to need as long as nothing has completed", () => {
    const clock = new VirtualClock();
    const d = new DrainEstimator({ clock, windowMs: 10_000, maxSeconds: 60, foldEvery: 1 });
    clock.advance(2_000);
    assert.equal(d.estimateSeconds(3), 6, "2 s since start-up without a completion, 3 calls ahead");
    d.record(10);
    clock.advance(15_000); // the completions leave the window: 15 s without one
    assert.equal(d.ratePerSecond(), 0);
    assert.equal(d.estimateSeconds(2), 30);
    clock.advance(60_000);
    assert.equal(d.retryAfterSeconds(1), 60, "a replica stuck this long gets the cap");
  });

  test("old completions leave the window", () => {
    const clock = new VirtualClock();
    const d = new DrainEstimator({ clock, windowMs: 10_000, buckets: 10 });
    d.record(100);
    clock.advance(9_999);
    assert.equal(d.ratePerSecond(), 10);
    clock.advance(1);
    assert.equal(d.ratePerSecond(), 0);
    d.record(20);
    assert.equal(d.ratePerSecond(), 2);
  });

  test("reading the clock once per batch of completions keeps the rate of a steady stream", () => {
    const clock = new VirtualClock();
    const batched = new DrainEstimator({ clock, windowMs: 10_000, buckets: 10 });
    const exact = new DrainEstimator({ clock, windowMs: 10_000, buckets: 10, foldEvery: 1 });
    for (let i = 0; i < 300; i++) {
      clock.advance(100);
      batched.record();
      exact.record();
    }
    // The window is the current (just started) bucket and the 9 before it: 91 completions over 10 s.
    assert.equal(exact.ratePerSecond(), 9.1);
    assert.ok(Math.abs(batched.ratePerSecond() - 9.1) < 0.2, `got ${batched.ratePerSecond()}`);
  });

  test("completions not yet timed are spread over the time since the last reading", () => {
    const clock = new VirtualClock();
    const d = new DrainEstimator({ clock, windowMs: 10_000, buckets: 10, foldEvery: 64 });
    d.record(64); // timed now, at 0
    clock.advance(50_000);
    for (let i = 0; i < 30; i++) d.record();
    // The 30 fell somewhere in (0, 50 s]; the window's buckets cover (41 s, 50 s]: 9/50 of them, 5.4 over 10 s.
    // The first 64 are out of the window.
    assert.ok(Math.abs(d.ratePerSecond() - 0.54) < 1e-9, `got ${d.ratePerSecond()}`);
  });

  test("Retry-After is whole seconds, at least 1, at most maxSeconds", () => {
    const clock = new VirtualClock();
    const d = new DrainEstimator({ clock, windowMs: 1_000, maxSeconds: 30 });
    assert.equal(d.retryAfterSeconds(5), 1, "nothing measured yet, nothing overdue: the minimum");
    assert.equal(d.retryAfterSeconds(0), 1);
    d.record(1_000);
    assert.equal(d.retryAfterSeconds(1), 1, "1 ms rounds up to 1 s");
    assert.equal(d.retryAfterSeconds(1_000_000), 30);
  });
});

describe("ShareWindow", () => {
  test("measures bulk's share over the window, all and contended, and expires entries", () => {
    const w = new ShareWindow(1_000);
    assert.equal(w.bulkShare(0), 0);
    assert.equal(w.contendedBulkShare(0), undefined);
    w.record(0, 0, 300, false);
    w.record(100, 1, 100, true);
    w.record(200, 0, 100, true);
    assert.equal(w.bulkShare(200), 0.2);
    assert.equal(w.contendedBulkShare(200), 0.5);
    assert.deepEqual(w.totals(200), [400, 100]);
    assert.equal(w.nextExpiryAt(200), 1_000);
    assert.equal(w.bulkShare(1_000), 0.5, "the first entry left the window");
    assert.equal(w.contendedBulkShare(1_150), 0);
    assert.equal(w.bulkShare(1_200), 0);
    assert.equal(w.nextExpiryAt(1_200), undefined);
  });

  test("grows past its initial capacity without losing entries", () => {
    const w = new ShareWindow(1_000_000);
    for (let i = 0; i < 1_000; i++) w.record(i, (i % 4 === 0 ? 1 : 0) as 0 | 1, 1, false);
    assert.equal(w.bulkShare(1_000), 0.25);
    assert.deepEqual(w.totals(1_000), [750, 250]);
  });
});
