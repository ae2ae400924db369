import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { resolveTokenWindowOptions, TokenWindow } from "../../src/index.js";

const CAPACITY = 160_000;

describe("TokenWindow", () => {
  it("starts at the capacity less the guard band, with α a sixteenth of it and room to grow past it", () => {
    const w = new TokenWindow({ capacityTokens: CAPACITY });
    assert.equal(w.size, 144_000);
    assert.equal(w.options.increase, 10_000);
    assert.equal(w.options.max, 640_000);
    assert.equal(w.inSlowStart, true);
  });

  it("doubles while sessions wait and KV usage is low, up to the maximum", () => {
    const w = new TokenWindow({ capacityTokens: CAPACITY, max: 500_000 });
    assert.equal(w.observe({ kvUsage: 0.1, hitRate: 0.9, waiting: true }), 288_000);
    assert.equal(w.lastAction, "slow-start");
    assert.equal(w.observe({ kvUsage: 0.1, hitRate: 0.9, waiting: true }), 500_000);
    assert.equal(w.observe({ kvUsage: 0.1, hitRate: 0.9, waiting: true }), 500_000);
  });

  it("holds when nobody waits, or KV usage is not low", () => {
    const w = new TokenWindow({ capacityTokens: CAPACITY });
    assert.equal(w.observe({ kvUsage: 0.05, hitRate: 0.9, waiting: false }), 144_000);
    assert.equal(w.observe({ kvUsage: 0.3, hitRate: 0.9, waiting: true }), 144_000);
    assert.equal(w.lastAction, "hold");
  });

  it("in slow start, holds while the recent peak of KV usage is not low, though the last interval's is", () => {
    const w = new TokenWindow({ capacityTokens: CAPACITY });
    assert.equal(w.observe({ kvUsage: 0.1, kvUsagePeak: 0.6, hitRate: 0.9, waiting: true }), 144_000);
    assert.equal(w.lastAction, "hold");
    assert.equal(w.observe({ kvUsage: 0.1, kvUsagePeak: 0.15, hitRate: 0.9, waiting: true }), 288_000);
    assert.throws(
      () => w.observe({ kvUsage: 0.1, kvUsagePeak: Number.NaN, waiting: true }),
      /kvUsagePeak should be a non-negative ratio or undefined, got NaN/,
    );
  });

  it("cuts by β on thrash, ends slow start, then grows additively", () => {
    const w = new TokenWindow({ capacityTokens: CAPACITY });
    assert.equal(w.observe({ kvUsage: 0.7, hitRate: 0.1, waiting: true }), 72_000);
    assert.equal(w.lastAction, "decrease");
    assert.equal(w.inSlowStart, false);
    assert.equal(w.observe({ kvUsage: 0.1, hitRate: 0.5, waiting: true }), 82_000);
    assert.equal(w.lastAction, "increase");
  });

  it("after the first cut, adds α on one interval of low KV usage, whatever the recent peak", () => {
    const w = new TokenWindow({ capacityTokens: CAPACITY });
    assert.equal(w.observe({ kvUsage: 0.7, hitRate: 0.1, waiting: true }), 72_000);
    assert.equal(w.observe({ kvUsage: 0.1, kvUsagePeak: 0.7, hitRate: 0.5, waiting: true }), 82_000);
    assert.equal(w.lastAction, "increase");
    assert.equal(w.observe({ kvUsage: 0.3, kvUsagePeak: 0.3, hitRate: 0.5, waiting: true }), 82_000);
    assert.equal(w.lastAction, "hold");
  });

  it("never cuts on an interval that measured no hit rate, nor on a good one", () => {
    const w = new TokenWindow({ capacityTokens: CAPACITY });
    assert.equal(w.observe({ kvUsage: 0.9, waiting: true }), 144_000);
    assert.equal(w.observe({ kvUsage: 0.9, hitRate: 0.5, waiting: true }), 144_000);
  });

  it("is never cut below its floor, which follows the largest footprint", () => {
    const w = new TokenWindow({ capacityTokens: CAPACITY, min: 1_000 });
    w.setFloor(100_000);
    assert.equal(w.observe({ kvUsage: 0.9, hitRate: 0, waiting: false }), 100_000);
    w.setFloor(200_000);
    assert.equal(w.size, 200_000, "raising the floor raises W at once");
    w.setFloor(10);
    assert.equal(w.observe({ kvUsage: 0.9, hitRate: 0, waiting: false }), 100_000);
  });

  it("clamps an initial window into its bounds and names bad options", () => {
    assert.equal(new TokenWindow({ capacityTokens: CAPACITY, max: 50_000 }).size, 50_000);
    assert.throws(() => new TokenWindow({ capacityTokens: 0 }), /capacityTokens/);
    assert.throws(() => new TokenWindow({ capacityTokens: CAPACITY, decrease: 1 }), /decrease/);
    assert.throws(() => new TokenWindow({ capacityTokens: CAPACITY, kvLow: 0.6, kvHigh: 0.5 }), /kvLow/);
    assert.throws(() => resolveTokenWindowOptions({ capacityTokens: CAPACITY, min: 10, max: 5 }), /max/);
    assert.throws(
      () => new TokenWindow({ capacityTokens: CAPACITY }).observe({ kvUsage: -1, waiting: true }),
      /kvUsage/,
    );
  });
});
