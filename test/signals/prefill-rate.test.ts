/** @module Prefill rate estimator: prior, EWMA learning, floor, ignored samples. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { DEFAULT_PREFILL_RATE_OPTIONS, PrefillRateEstimator } from "../../src/signals/index.js";

describe("PrefillRateEstimator", () => {
  it("starts from the prior", () => {
    assert.equal(new PrefillRateEstimator().rate(), DEFAULT_PREFILL_RATE_OPTIONS.priorTokensPerSecond);
    const est = new PrefillRateEstimator({ priorTokensPerSecond: 20_000 });
    assert.equal(est.rate(), 20_000);
    assert.equal(est.samples, 0);
  });

  it("moves by alpha toward each observed sample's rate", () => {
    const est = new PrefillRateEstimator({ priorTokensPerSecond: 10_000, alpha: 0.5 });
    // 4,000 tokens in 200 ms = 20,000 tokens/s; halfway from 10,000.
    assert.equal(est.observe(4000, 200), 15_000);
    assert.equal(est.observe(4000, 200), 17_500);
    assert.equal(est.samples, 2);
  });

  it("converges on a steady measured rate", () => {
    const est = new PrefillRateEstimator({ priorTokensPerSecond: 1000 });
    for (let i = 0; i < 100; i++) est.observe(45_000, 1000);
    assert.ok(Math.abs(est.rate() - 45_000) < 1, `got ${est.rate()}`);
  });

  it("never goes below the floor, and recovers from it at the EWMA's pace", () => {
    const est = new PrefillRateEstimator({
      priorTokensPerSecond: 5000,
      floorTokensPerSecond: 1000,
      alpha: 1,
    });
    assert.equal(est.observe(10, 1000), 1000, "10 tokens/s is floored at 1,000");
    assert.equal(est.observe(8000, 1000), 8000);
  });

  it("ignores samples that carry no rate", () => {
    const est = new PrefillRateEstimator({ priorTokensPerSecond: 5000, minSampleTokens: 64 });
    est.observe(0, 100);
    est.observe(4000, 0);
    est.observe(63, 1000);
    assert.equal(est.rate(), 5000);
    assert.equal(est.samples, 0);
    assert.deepEqual(est.toJSON(), { tokensPerSecond: 5000, samples: 0 });
  });

  it("validates options and samples, naming the value", () => {
    assert.throws(() => new PrefillRateEstimator({ priorTokensPerSecond: 0 }), /priorTokensPerSecond.*0/);
    assert.throws(() => new PrefillRateEstimator({ floorTokensPerSecond: -1 }), /floorTokensPerSecond.*-1/);
    assert.throws(() => new PrefillRateEstimator({ alpha: 1.5 }), /alpha.*1.5/);
    const est = new PrefillRateEstimator();
    assert.throws(() => est.observe(-1, 10), /prefillTokens.*-1/);
    assert.throws(() => est.observe(1, Number.NaN), /prefillMs.*NaN/);
  });
});
