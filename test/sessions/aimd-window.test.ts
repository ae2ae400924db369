/** @module The AIMD window law, step by step (docs/library.md and docs/how-it-works.md#session-window-tokens-of-cache-footprint). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { AimdWindow, DEFAULT_AIMD_OPTIONS } from "../../src/sessions/aimd-window.js";

describe("AimdWindow", () => {
  it("has the SPEC defaults", () => {
    assert.deepEqual(
      { ...DEFAULT_AIMD_OPTIONS },
      {
        initial: 8,
        min: 1,
        max: 1024,
        increase: 2,
        decrease: 0.5,
        kvLow: 0.2,
        kvHigh: 0.5,
        hitLow: 0.2,
      },
    );
    assert.equal(new AimdWindow().size, 8);
  });

  it("grows by α while KV usage is below U_low, whatever the hit rate", () => {
    const w = new AimdWindow();
    assert.equal(w.observe({ kvUsage: 0.1, hitRate: 0 }), 10);
    assert.equal(w.lastAction, "increase");
    assert.equal(w.observe({ kvUsage: 0.19, hitRate: 0.9 }), 12);
    assert.equal(w.size, 12);
  });

  it("halves only when KV usage is above U_high AND the hit rate is below H_low", () => {
    const w = new AimdWindow({ initial: 40 });
    assert.equal(w.observe({ kvUsage: 0.9, hitRate: 0.5 }), 40, "high usage, good hit rate: hold");
    assert.equal(w.lastAction, "hold");
    assert.equal(w.observe({ kvUsage: 0.3, hitRate: 0 }), 40, "middle usage, no hits: hold");
    assert.equal(w.observe({ kvUsage: 0.9, hitRate: 0.1 }), 20);
    assert.equal(w.lastAction, "decrease");
    assert.equal(w.observe({ kvUsage: 0.51, hitRate: 0.19 }), 10);
  });

  it("holds at the thresholds themselves", () => {
    const w = new AimdWindow({ initial: 16 });
    assert.equal(w.observe({ kvUsage: 0.2, hitRate: 0 }), 16, "U = U_low does not grow");
    assert.equal(w.observe({ kvUsage: 0.5, hitRate: 0 }), 16, "U = U_high does not shrink");
    assert.equal(w.observe({ kvUsage: 0.8, hitRate: 0.2 }), 16, "H = H_low does not shrink");
  });

  it("floors the decrease at ⌊W·β⌋ and at min", () => {
    const w = new AimdWindow({ initial: 7 });
    const high = { kvUsage: 0.95, hitRate: 0 };
    assert.equal(w.observe(high), 3, "⌊7 × 0.5⌋ = 3");
    assert.equal(w.observe(high), 1);
    assert.equal(w.observe(high), 1, "never below min");
    const floored = new AimdWindow({ initial: 10, min: 4 });
    assert.equal(floored.observe(high), 5);
    assert.equal(floored.observe(high), 4);
    assert.equal(floored.observe(high), 4);
    assert.equal(floored.lastAction, "hold");
  });

  it("does not lose a session to float error in W·β", () => {
    const w = new AimdWindow({ initial: 100, decrease: 0.29 });
    assert.equal(w.observe({ kvUsage: 1, hitRate: 0 }), 29);
  });

  it("caps the increase at max", () => {
    const w = new AimdWindow({ initial: 1021, max: 1024 });
    const low = { kvUsage: 0, hitRate: 0 };
    assert.equal(w.observe(low), 1023);
    assert.equal(w.observe(low), 1024);
    assert.equal(w.observe(low), 1024);
    assert.equal(w.lastAction, "hold");
  });

  it("stays a whole number in [min, max] for any signal sequence", () => {
    const signal = fc.record({
      kvUsage: fc.double({ min: 0, max: 1, noNaN: true }),
      hitRate: fc.double({ min: 0, max: 1, noNaN: true }),
    });
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 64 }),
        fc.array(signal, { maxLength: 100 }),
        (initial, signals) => {
          const w = new AimdWindow({ initial, min: 1, max: 64 });
          for (const s of signals) {
            const before = w.size;
            const after = w.observe(s);
            assert.ok(Number.isInteger(after) && after >= 1 && after <= 64);
            if (s.kvUsage < 0.2) assert.equal(after, Math.min(64, before + 2));
            else if (s.kvUsage > 0.5 && s.hitRate < 0.2)
              assert.equal(after, Math.max(1, Math.floor(before / 2)));
            else assert.equal(after, before);
          }
        },
      ),
    );
  });

  it("validates options and signals, naming the value", () => {
    assert.throws(() => new AimdWindow({ min: 0 }), /min.*0/);
    assert.throws(() => new AimdWindow({ max: 4, initial: 8 }), /initial.*8/);
    assert.throws(() => new AimdWindow({ min: 10, max: 5, initial: 10 }), /max.*5/);
    assert.throws(() => new AimdWindow({ decrease: 1 }), /decrease.*1/);
    assert.throws(() => new AimdWindow({ increase: 0 }), /increase.*0/);
    assert.throws(() => new AimdWindow({ kvLow: 0.6 }), /kvLow.*0.6/);
    assert.throws(() => new AimdWindow({ hitLow: 2 }), /hitLow.*2/);
    const w = new AimdWindow();
    assert.throws(() => w.observe({ kvUsage: Number.NaN, hitRate: 0 }), /kvUsage.*NaN/);
    assert.throws(() => w.observe({ kvUsage: 0.1, hitRate: -1 }), /hitRate.*-1/);
    assert.equal(w.size, 8, "a rejected signal changes nothing");
  });
});
