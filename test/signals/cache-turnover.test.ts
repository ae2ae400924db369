/** @module How long a block outlives its last use in a replica's GPU prefix cache. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { CacheTurnover } from "../../src/signals/cache-turnover.js";

describe("CacheTurnover", () => {
  it("is the capacity over the smoothed inflow of computed prompt tokens", () => {
    const t = new CacheTurnover();
    assert.equal(t.turnoverMs(400_000), Number.POSITIVE_INFINITY, "nothing known yet");
    t.observe({ hits: 0, queries: 0 }, 0);
    // 20,000 tokens looked up in 2 s, 0 found: 10,000 computed tokens a second.
    t.observe({ hits: 0, queries: 20_000 }, 2_000);
    assert.equal(t.tokensPerSecond, 10_000);
    assert.equal(t.turnoverMs(400_000), 40_000);
    // Next interval: 30,000 looked up, 10,000 found — 10,000 a second again.
    t.observe({ hits: 10_000, queries: 50_000 }, 4_000);
    assert.equal(t.tokensPerSecond, 10_000);
    // An idle interval pulls the average down by α = 0.2, so the turnover grows.
    t.observe({ hits: 10_000, queries: 50_000 }, 6_000);
    assert.equal(t.tokensPerSecond, 8_000);
    assert.equal(t.turnoverMs(400_000), 50_000);
  });

  it("starts a new baseline when the counters go down, and knows nothing without inflow", () => {
    const t = new CacheTurnover();
    t.observe({ hits: 0, queries: 100_000 }, 0);
    t.observe({ hits: 0, queries: 10 }, 2_000);
    assert.equal(t.tokensPerSecond, undefined, "a restart is no sample");
    t.observe({ hits: 0, queries: 10 }, 4_000);
    assert.equal(t.tokensPerSecond, 0);
    assert.equal(t.turnoverMs(400_000), Number.POSITIVE_INFINITY);
  });
});
