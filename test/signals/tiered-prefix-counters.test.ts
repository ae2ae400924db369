import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { EngineSignals } from "../../src/engine.js";
import { tieredPrefixCounters } from "../../src/signals/tiered-prefix-counters.js";

const signals = (over: Partial<EngineSignals>): EngineSignals =>
  ({ prefixQueryTokens: 1000, prefixHitTokens: 400, ...over }) as EngineSignals;

describe("prefix-cache counters with a host tier", () => {
  it("are the GPU counters without a tier, or while the tier's counters are unknown", () => {
    assert.deepEqual(tieredPrefixCounters(signals({}), 0), { hits: 400, queries: 1000 });
    assert.deepEqual(tieredPrefixCounters(signals({ hostPrefixQueryTokens: 600 }), 4096), {
      hits: 400,
      queries: 1000,
    });
    // A tier the policy does not see (0 tokens) is ignored even when its counters are stated.
    assert.deepEqual(
      tieredPrefixCounters(signals({ hostPrefixQueryTokens: 600, hostPrefixHitTokens: 500 }), 0),
      {
        hits: 400,
        queries: 1000,
      },
    );
  });

  it("count a hit in either tier: lookups less what neither tier had", () => {
    // 600 looked up in host memory, 500 found there: 100 tokens were in neither tier.
    assert.deepEqual(
      tieredPrefixCounters(signals({ hostPrefixQueryTokens: 600, hostPrefixHitTokens: 500 }), 4096),
      {
        hits: 900,
        queries: 1000,
      },
    );
    // Host counters past the GPU lookups never make hits negative.
    assert.equal(
      tieredPrefixCounters(signals({ hostPrefixQueryTokens: 5000, hostPrefixHitTokens: 0 }), 4096).hits,
      0,
    );
  });
});
