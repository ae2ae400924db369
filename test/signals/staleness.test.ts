/** @module Signal staleness on the virtual clock. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { VirtualClock } from "../../src/clock.js";
import { DEFAULT_STALE_AFTER_MS, isStale, SignalAge } from "../../src/signals/index.js";

describe("isStale", () => {
  it("is stale only when strictly older than the limit", () => {
    assert.equal(isStale(1000, 6000, 5000), false);
    assert.equal(isStale(1000, 6001, 5000), true);
  });

  it("treats never-read signals as stale", () => {
    assert.equal(isStale(undefined, 0, 5000), true);
    assert.equal(isStale(Number.NEGATIVE_INFINITY, 0, 5000), true);
    assert.equal(isStale(Number.NaN, 0, 5000), true);
  });
});

describe("SignalAge", () => {
  it("tracks the age of the last reading on the injected clock", () => {
    const clock = new VirtualClock(10_000);
    const age = new SignalAge({ clock });
    assert.equal(age.stale(), true, "never read");
    assert.equal(age.ageMs(), Number.POSITIVE_INFINITY);
    age.mark();
    assert.equal(age.lastReadAtMs, 10_000);
    clock.advance(DEFAULT_STALE_AFTER_MS);
    assert.equal(age.ageMs(), 5000);
    assert.equal(age.stale(), false);
    clock.advance(1);
    assert.equal(age.stale(), true);
    age.mark(clock.now() - 100);
    assert.equal(age.ageMs(), 100);
    assert.equal(age.stale(), false);
  });

  it("takes its limit from options and validates it", () => {
    const clock = new VirtualClock();
    const age = new SignalAge({ clock, staleAfterMs: 100 });
    age.mark();
    clock.advance(101);
    assert.equal(age.stale(), true);
    assert.throws(() => new SignalAge({ clock, staleAfterMs: -1 }), /staleAfterMs.*-1/);
  });
});
