/** @module The token window's evidence of thrash: predicted against delivered hits, and KV usage, over a horizon. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ThrashEvidence } from "../../src/signals/thrash-evidence.js";

describe("ThrashEvidence", () => {
  it("pairs each call's predicted hits with its own cached tokens, whenever its lookup was counted", () => {
    const e = new ThrashEvidence(5);
    const epoch = e.sent(30_000, 31_000);
    // The engine counts the lookup an interval later; meanwhile the counters show other calls' misses.
    e.close({ hits: 0, queries: 20_000 }, 0.8);
    e.ended(30_000, 30_016, epoch);
    e.close({ hits: 30_000, queries: 31_000 }, 0.8);
    const reading = e.read(0.2);
    assert.equal(reading.delivered, 1, "everything predicted was delivered");
    assert.ok(Math.abs(reading.predicted! - 30_000 / 31_000) < 1e-9);
  });

  it("reads lost predicted hits as a low share, and forgets them once acted on", () => {
    const e = new ThrashEvidence(5);
    const epoch = e.sent(9_000, 10_000);
    e.sent(9_000, 10_000);
    e.ended(9_000, 9_000, epoch);
    e.close(undefined, 0.9);
    assert.equal(e.read(0.2).delivered, 1);
    e.ended(9_000, 16, epoch);
    e.ended(9_000, 0, epoch);
    e.ended(9_000, 16, epoch);
    e.close(undefined, 0.9);
    const lost = e.read(0.2).delivered!;
    assert.ok(lost < 0.3 && lost > 0.25, `a quarter delivered, got ${lost}`);
    e.forget();
    assert.equal(e.read(0.2).delivered, undefined, "nothing ended since: no measurement");
    assert.equal(e.read(0.2).kvUsagePeak, 0.9, "KV usage is kept");
  });

  it("does not count, after a cut, calls sent before it: one loss episode, one cut", () => {
    const e = new ThrashEvidence(5);
    const before = e.sent(9_000, 10_000);
    e.sent(9_000, 10_000);
    e.ended(9_000, 90, before);
    e.close(undefined, 0.9);
    assert.equal(e.read(0.2).delivered, 0.01);
    e.forget();
    // The other call sent before the cut ends after it, its prefix lost in the same episode.
    e.ended(9_000, 16, before);
    e.close(undefined, 0.9);
    assert.equal(e.read(0.2).delivered, undefined, "only calls sent before the cut ended: no measurement");
    const after = e.sent(9_000, 10_000);
    assert.notEqual(after, before, "a cut starts a new epoch");
    e.ended(9_000, 9_000, after);
    e.close(undefined, 0.9);
    assert.equal(e.read(0.2).delivered, 1, "the window after the cut is read from calls it sent");
  });

  it("measures nothing where the router predicted less than the floor (little reuse is not thrash)", () => {
    const e = new ThrashEvidence(5);
    const epoch = e.sent(500, 10_000);
    e.ended(500, 16, epoch);
    e.close(undefined, 0.9);
    assert.equal(e.read(0.2).delivered, undefined);
  });

  it("uses the engine's counters over the horizon where calls report no cached tokens", () => {
    const e = new ThrashEvidence(2);
    const epoch = e.sent(9_000, 10_000);
    e.ended(9_000, 0, epoch);
    e.close({ hits: 1_000, queries: 10_000 }, 0.9);
    assert.ok(Math.abs(e.read(0.2).delivered! - 0.1 / 0.9) < 1e-9);
    e.close({ hits: 9_000, queries: 10_000 }, 0.9);
    assert.ok(Math.abs(e.read(0.2).delivered! - 0.5 / 0.9) < 1e-9, "both intervals of the horizon");
    e.close({ hits: 9_000, queries: 10_000 }, 0.9);
    assert.equal(e.read(0.2).delivered, 1, "the first interval left the horizon");
  });

  it("keeps the highest KV usage of the horizon", () => {
    const e = new ThrashEvidence(3);
    assert.equal(e.read(0.2).kvUsagePeak, 0);
    e.close(undefined, 0.6);
    e.close(undefined, 0.1);
    e.close(undefined, 0.1);
    assert.equal(e.read(0.2).kvUsagePeak, 0.6);
    e.close(undefined, 0.1);
    assert.equal(e.read(0.2).kvUsagePeak, 0.1);
  });

  it("rejects bad input with a message naming it", () => {
    assert.throws(() => new ThrashEvidence(0), /horizonIntervals.*got 0/);
    const e = new ThrashEvidence();
    assert.throws(() => e.sent(11, 10), /within \[0, prompt tokens\], got 11 of 10/);
    assert.throws(() => e.ended(-1, 0, 0), /non-negative counts, got -1 and 0/);
  });
});
