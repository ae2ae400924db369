/** @module The step-time model of docs/simulator.md against hand-computed batches, and preset resolution. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  PRESETS,
  type PresetName,
  prefillTokensPerSecond,
  resolveSimParams,
  stepTimeMs,
} from "../../adapters/engines/sim/presets.js";
import { harness } from "./sim-helpers.js";

const close = (actual: number, expected: number, what: string) =>
  assert.ok(Math.abs(actual - expected) < 1e-9, `${what}: expected ${expected}, got ${actual}`);

// Batches: A = one 1000-token prefill from scratch; B = 64 decodes of 2000-token contexts;
// C = a 512-token chunk on top of 4096 cached tokens plus 10 decodes totalling 50,000 context tokens.
// Expected values worked by hand from the table:
//   A: c0 + (1000 − 128)·c_prefill + c_pfattn·1000·500
//   B: c0 + max(0, 64·c_dec − 128·c_prefill) + c_kv·128,000
//   C: c0 + max(0, (512 − 128)·c_prefill + 10·c_dec) + c_kv·50,000 + c_pfattn·512·(4096 + 256)
const HAND: Record<Exclude<PresetName, "instant">, { A: number; B: number; C: number }> = {
  // A: 7 + 872·0.022 + 1.3e-6·500,000 = 7 + 19.184 + 0.65
  // B: 64·0.015 = 0.96 < 2.816 → 7 + 0 + 6.272
  // C: 7 + (8.448 + 0.15) + 2.45 + 1.3e-6·2,228,224 = 7 + 8.598 + 2.45 + 2.8966912
  "h100-llama3-8b": { A: 26.834, B: 13.272, C: 20.9446912 },
  // A: 15 + 872·0.053 + 2.6e-6·500,000 = 15 + 46.216 + 1.3
  // B: 64·0.020 = 1.28 < 6.784 → 15 + 6.272
  // C: 15 + (20.352 + 0.2) + 2.45 + 2.6e-6·2,228,224 = 15 + 20.552 + 2.45 + 5.7933824
  "h100x2-qwen3-32b": { A: 62.516, B: 21.272, C: 43.7953824 },
  // A: 18 + 872·0.066 + 1.6e-6·500,000 = 18 + 57.552 + 0.8
  // B: 64·0.025 = 1.6 < 8.448 → 18 + 3.1e-5·128,000 = 18 + 3.968
  // C: 18 + (25.344 + 0.25) + 1.55 + 1.6e-6·2,228,224 = 18 + 25.594 + 1.55 + 3.5651584
  "h100x4-llama3-70b": { A: 76.352, B: 21.968, C: 48.7091584 },
  // A: 12 + 872·0.0405 + 8.2e-7·500,000 = 12 + 35.316 + 0.41
  // B: 64·0.020 = 1.28 < 5.184 → 12 + 1.5e-5·128,000 = 12 + 1.92
  // C: 12 + (15.552 + 0.2) + 0.75 + 8.2e-7·2,228,224 = 12 + 15.752 + 0.75 + 1.82714368
  "h100x8-llama3-70b": { A: 47.726, B: 13.92, C: 30.32914368 },
};

describe("step-time model", () => {
  for (const [name, expected] of Object.entries(HAND)) {
    test(`${name}: hand-computed batches`, () => {
      const p = resolveSimParams(name as PresetName);
      close(
        stepTimeMs(p, {
          prefillTokens: 1000,
          decodeSeqs: 0,
          decodeContextTokens: 0,
          prefillPairs: 1000 * 500,
        }),
        expected.A,
        "A",
      );
      close(
        stepTimeMs(p, { prefillTokens: 0, decodeSeqs: 64, decodeContextTokens: 128_000, prefillPairs: 0 }),
        expected.B,
        "B",
      );
      close(
        stepTimeMs(p, {
          prefillTokens: 512,
          decodeSeqs: 10,
          decodeContextTokens: 50_000,
          prefillPairs: 512 * (4096 + 256),
        }),
        expected.C,
        "C",
      );
    });
  }

  test("the floor credit: up to 128 prefill tokens cost no more than none", () => {
    const p = resolveSimParams("h100-llama3-8b");
    assert.equal(
      stepTimeMs(p, { prefillTokens: 128, decodeSeqs: 0, decodeContextTokens: 0, prefillPairs: 0 }),
      7,
    );
    assert.equal(
      stepTimeMs(p, { prefillTokens: 0, decodeSeqs: 0, decodeContextTokens: 0, prefillPairs: 0 }),
      7,
    );
    close(
      stepTimeMs(p, { prefillTokens: 129, decodeSeqs: 0, decodeContextTokens: 0, prefillPairs: 0 }),
      7.022,
      "129",
    );
  });

  for (const name of Object.keys(HAND) as PresetName[]) {
    test(`${name}: the engine's own steps take the formula's time`, async () => {
      // One call: prompt 1000 tokens, 3 output tokens. Step 1 is batch A (first token at its end);
      // steps 2 and 3 are single decodes with contexts 1001 and 1002.
      const h = harness({ preset: name });
      const p = h.engine.params;
      const call = await h.call(
        "one",
        Array.from({ length: 1000 }, (_, i) => 7000 + i),
        3,
      );
      await h.drain();
      const a = HAND[name as keyof typeof HAND].A;
      const d1 = p.c0 + Math.max(0, p.cDec - p.cPrefill * 128) + p.cKv * 1001;
      const d2 = p.c0 + Math.max(0, p.cDec - p.cPrefill * 128) + p.cKv * 1002;
      close(call.firstTokenMs!, a, "first token");
      close(call.endMs!, a + d1 + d2, "completion");
      assert.equal(h.engine.stats().steps, 3);
      close(h.engine.stats().busyMs, a + d1 + d2, "busy time");
    });
  }
});

describe("presets", () => {
  test("KV capacities and block counts of docs/simulator.md", () => {
    const blocks = (name: PresetName) => Math.floor(resolveSimParams(name).kvCapacityTokens / 16);
    assert.equal(blocks("h100-llama3-8b"), 27_437);
    assert.equal(blocks("h100x2-qwen3-32b"), 19_187);
    assert.equal(blocks("h100x4-llama3-70b"), 28_812);
    assert.equal(blocks("h100x8-llama3-70b"), 84_375);
    for (const name of Object.keys(PRESETS) as PresetName[]) {
      const p = resolveSimParams(name);
      assert.equal(p.blockSize, 16);
      assert.equal(p.maxNumSeqs, 256);
      assert.equal(p.maxNumBatchedTokens, 8192);
      assert.equal(p.floorCreditTokens, 128);
    }
  });

  test("every value can be overridden, by name + overrides or by overrides on a base", () => {
    const p = resolveSimParams("h100x2-qwen3-32b", { maxNumSeqs: 8, c0: 1 });
    assert.equal(p.maxNumSeqs, 8);
    assert.equal(p.c0, 1);
    assert.equal(p.cPrefill, 0.053);
    const q = resolveSimParams({
      base: "h100x8-llama3-70b",
      kvCapacityTokens: 1600,
      maxNumBatchedTokens: 64,
    });
    assert.equal(q.kvCapacityTokens, 1600);
    assert.equal(q.maxNumBatchedTokens, 64);
    assert.equal(q.maxModelLen, 1600, "max model length is capped at the KV capacity");
    assert.equal(resolveSimParams({ cDec: 0.5 }).c0, 7, "overrides without base apply to h100-llama3-8b");
  });

  test("invalid values are refused with the value named", () => {
    assert.throws(() => resolveSimParams("h200" as PresetName), /preset should be one of .*got "h200"/);
    assert.throws(
      () => resolveSimParams(undefined, { maxNumSeqs: 0 }),
      /maxNumSeqs should be a positive integer, got 0/,
    );
    assert.throws(() => resolveSimParams(undefined, { c0: -1 }), /c0 should be a finite number ≥ 0, got -1/);
    assert.throws(
      () => resolveSimParams(undefined, { kvCapacityTokens: 8 }),
      /at least one block of 16 tokens, got 8/,
    );
  });

  test("prefill rate is 1000 / c_prefill tokens per second", () => {
    close(prefillTokensPerSecond(resolveSimParams("h100-llama3-8b")), 1000 / 0.022, "8b");
    const h = harness({ preset: "h100x4-llama3-70b", dataParallelSize: 2 });
    close(h.engine.signals().prefillTokensPerSecond!, (2 * 1000) / 0.066, "two ranks");
  });
});
