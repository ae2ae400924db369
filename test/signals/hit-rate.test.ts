/** @module Windowed, token-weighted prefix-cache hit rate from cumulative counters. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { deliveredHitShare, HitRateMeter } from "../../src/signals/hit-rate.js";

describe("HitRateMeter", () => {
  it("returns Δhits / Δqueries over the last interval, not the lifetime ratio", () => {
    const m = new HitRateMeter();
    m.observe({ hits: 0, queries: 1000 });
    // Interval 1: 1,000 tokens looked up, 900 found.
    assert.equal(m.observe({ hits: 900, queries: 2000 }), 0.9);
    // Interval 2: 4,000 looked up, 400 found. The lifetime ratio would be 1300/6000.
    assert.equal(m.observe({ hits: 1300, queries: 6000 }), 0.1);
    assert.deepEqual(m.lastInterval, { hits: 400, queries: 4000 });
    assert.equal(m.value, 0.1);
  });

  it("weights by tokens: one large lookup outweighs many small ones in the same interval", () => {
    const m = new HitRateMeter();
    m.observe({ hits: 0, queries: 0 });
    // Ten 100-token misses and one 9,000-token hit in one interval.
    assert.equal(m.observe({ hits: 9000, queries: 10_000 }), 0.9);
  });

  it("takes the lifetime ratio on the first reading, and the initial value when there were no lookups", () => {
    assert.equal(new HitRateMeter().observe({ hits: 300, queries: 1000 }), 0.3);
    assert.equal(new HitRateMeter({ initial: 0.5 }).observe({ hits: 0, queries: 0 }), 0.5);
    assert.equal(new HitRateMeter().value, 0);
  });

  it("holds the previous value through an interval with no lookups", () => {
    const m = new HitRateMeter();
    m.observe({ hits: 0, queries: 0 });
    assert.equal(m.observe({ hits: 50, queries: 100 }), 0.5);
    assert.equal(m.observe({ hits: 50, queries: 100 }), 0.5);
    assert.equal(m.observe({ hits: 80, queries: 200 }), 0.3);
  });

  it("says whether the last interval measured anything", () => {
    const m = new HitRateMeter();
    assert.equal(m.measured, false);
    m.observe({ hits: 0, queries: 0 });
    assert.equal(m.measured, false, "no lookups yet");
    m.observe({ hits: 50, queries: 100 });
    assert.equal(m.measured, true);
    m.observe({ hits: 50, queries: 100 });
    assert.equal(m.measured, false, "a held value is not a measurement");
    m.observe({ hits: 10, queries: 20 });
    assert.equal(m.measured, false, "nor is a restart's baseline");
  });

  it("treats a counter going down as an engine restart: new baseline, value held", () => {
    const m = new HitRateMeter();
    m.observe({ hits: 5000, queries: 10_000 });
    assert.equal(m.observe({ hits: 9000, queries: 15_000 }), 0.8);
    assert.equal(m.observe({ hits: 10, queries: 100 }), 0.8, "the restart reading is a baseline");
    assert.equal(m.observe({ hits: 10, queries: 200 }), 0, "the next interval is measured from it");
    // Only one counter going down (a scrape of a partly restarted sum) also re-baselines.
    assert.equal(m.observe({ hits: 100, queries: 150 }), 0);
    assert.equal(m.observe({ hits: 200, queries: 350 }), 0.5);
  });

  it("clamps an inconsistent scrape (more hits than lookups) to 1", () => {
    const m = new HitRateMeter();
    m.observe({ hits: 0, queries: 0 });
    assert.equal(m.observe({ hits: 120, queries: 100 }), 1);
  });

  it("re-baselines after resetBaseline()", () => {
    const m = new HitRateMeter();
    m.observe({ hits: 0, queries: 100 });
    assert.equal(m.observe({ hits: 50, queries: 200 }), 0.5);
    m.resetBaseline();
    assert.equal(m.observe({ hits: 50, queries: 200 }), 0.25, "first reading again: lifetime ratio");
    assert.deepEqual(m.toJSON(), { hitRate: 0.25, hits: 50, queries: 200 });
  });

  it("validates counters and options, naming the value", () => {
    assert.throws(() => new HitRateMeter({ initial: 1.5 }), /1.5/);
    const m = new HitRateMeter();
    assert.throws(() => m.observe({ hits: -1, queries: 1 }), /hits.*-1/);
    assert.throws(() => m.observe({ hits: 1, queries: Number.NaN }), /queries.*NaN/);
  });
});

describe("deliveredHitShare", () => {
  it("reads a low hit rate that was predicted as nothing lost, and one far below the prediction as thrash", () => {
    // A fifth of what was predicted delivered: not below H_low (0.2).
    assert.equal(deliveredHitShare(0.05, 0.25, 0.2), 0.2);
    assert.equal(deliveredHitShare(0.24, 0.25, 0.2), 0.96);
    // Agents on an over-full replica: 0.1 of a predicted 0.85.
    assert.ok(deliveredHitShare(0.1, 0.85, 0.2)! < 0.2);
    assert.equal(deliveredHitShare(0.95, 0.85, 0.2), 1, "never above 1");
  });

  it("measures nothing where either rate is unknown or the router predicted less than the floor", () => {
    assert.equal(deliveredHitShare(undefined, 0.5, 0.2), undefined);
    assert.equal(deliveredHitShare(0.01, undefined, 0.2), undefined);
    assert.equal(
      deliveredHitShare(0.01, 0.06, 0.2),
      undefined,
      "a workload with little reuse cannot show thrash",
    );
    assert.equal(deliveredHitShare(0, 0, 0), undefined);
  });
});
