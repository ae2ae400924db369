/**
 * @module The tiers benchmark's breakdown of SLO misses by prompt length (`bench/tiers.ts`): which
 * calls a policy loses, read beside the trace's own mix of prompt lengths.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { PROMPT_BANDS, promptBand, sharesByPrompt } from "../../bench/tiers.js";

describe("misses by prompt length", () => {
  it("puts each prompt in one band, lower bound inclusive", () => {
    assert.equal(promptBand(0), "<8k");
    assert.equal(promptBand(7_999), "<8k");
    assert.equal(promptBand(8_000), "8k-16k");
    assert.equal(promptBand(31_999), "16k-32k");
    assert.equal(promptBand(64_000), ">=64k");
    assert.equal(promptBand(1_000_000), ">=64k");
  });

  it("gives the counted calls of each band as a share of all calls, every band present", () => {
    const calls = [
      { id: "a", promptTokens: 100 },
      { id: "b", promptTokens: 9_000 },
      { id: "c", promptTokens: 9_500 },
      { id: "d", promptTokens: 70_000 },
    ];
    const missed = new Set(["b", "d"]);
    const shares = sharesByPrompt(calls, (id) => missed.has(id));
    assert.deepEqual(
      Object.keys(shares),
      PROMPT_BANDS.map((band) => band.label),
    );
    assert.deepEqual(shares, { "<8k": 0, "8k-16k": 0.25, "16k-32k": 0, "32k-64k": 0, ">=64k": 0.25 });
    const all = sharesByPrompt(calls, () => true);
    assert.equal(
      Object.values(all).reduce((a, b) => a + b, 0),
      1,
    );
    assert.deepEqual(sharesByPrompt([], () => true)["<8k"], 0);
  });
});
