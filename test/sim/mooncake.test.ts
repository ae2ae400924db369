/** @module The Mooncake trace loader on the real shared trace: counts, session chains, token expansion. */

import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  expandMooncakeTokens,
  loadMooncakeTrace,
  MOONCAKE_BLOCK_TOKENS,
  mooncakeTracePath,
} from "../../adapters/bench/workloads/mooncake.js";

describe("loadMooncakeTrace", () => {
  const requests = loadMooncakeTrace(mooncakeTracePath("conversation"));

  test("the conversation trace: 12,031 requests, 3,975 extend an earlier one, chains up to 43 deep", () => {
    assert.equal(requests.length, 12_031);
    assert.equal(requests.filter((r) => r.parent !== undefined).length, 3_975);
    const depth: number[] = [];
    for (const r of requests) depth[r.index] = r.parent === undefined ? 1 : depth[r.parent]! + 1;
    assert.equal(Math.max(...depth), 43);
    assert.ok(
      requests.every((r) => r.hashIds[0] === 0),
      "every request starts with the shared block 0",
    );
  });

  test("a child extends its parent's full blocks, comes later, and shares its session key", () => {
    for (const r of requests) {
      assert.equal(r.hashIds.length, Math.ceil(r.inputLength / MOONCAKE_BLOCK_TOKENS));
      if (r.parent === undefined) {
        assert.equal(r.sessionKey, r.index);
        continue;
      }
      const p = requests[r.parent]!;
      assert.ok(p.index < r.index);
      assert.ok(p.arrivalMs <= r.arrivalMs);
      const full = Math.floor(p.inputLength / MOONCAKE_BLOCK_TOKENS);
      assert.ok(full >= 2);
      assert.deepEqual(r.hashIds.slice(0, full), p.hashIds.slice(0, full));
      assert.equal(r.sessionKey, p.sessionKey);
    }
    const last = requests.at(-1)!;
    assert.ok(last.arrivalMs > 3_500_000 && last.arrivalMs < 3_600_000, "about 59 minutes");
  });

  test("limit and timeScale", () => {
    const some = loadMooncakeTrace(mooncakeTracePath("conversation"), { limit: 100, timeScale: 0.5 });
    assert.equal(some.length, 100);
    for (let i = 0; i < 100; i++) {
      assert.equal(some[i]!.arrivalMs, requests[i]!.arrivalMs * 0.5);
      assert.equal(some[i]!.parent, requests[i]!.parent);
    }
    assert.throws(
      () => loadMooncakeTrace(mooncakeTracePath(), { timeScale: 0 }),
      /timeScale should be .* got 0/,
    );
  });

  test("the synthetic trace loads too; a relative path is read from the repository root", () => {
    const synthetic = loadMooncakeTrace("../shared/traces/mooncake-synthetic.jsonl");
    assert.equal(synthetic.length, 3_993);
  });

  test("a malformed line is reported with its line number and field", () => {
    const dir = mkdtempSync(join(tmpdir(), "mooncake-"));
    const file = join(dir, "bad.jsonl");
    writeFileSync(
      file,
      '{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[0]}\n{"timestamp":"x"}\n',
    );
    assert.throws(() => loadMooncakeTrace(file), /bad\.jsonl:2: timestamp should be a number ≥ 0, got "x"/);
  });
});

describe("expandMooncakeTokens", () => {
  test("equal ids expand to equal blocks, so shared prefixes stay shared; the last block is cut to length", () => {
    const a = expandMooncakeTokens([0, 5, 9], 1200);
    const b = expandMooncakeTokens([0, 5, 7, 8], 1800);
    assert.equal(a.length, 1200);
    assert.equal(b.length, 1800);
    assert.deepEqual(a.slice(0, 1024), b.slice(0, 1024));
    assert.notDeepEqual(a.slice(1024, 1200), b.slice(1024, 1200));
    assert.deepEqual(expandMooncakeTokens([0, 5, 9], 1200), a, "deterministic");
    assert.ok(a.every((t) => Number.isInteger(t) && t >= 0 && t < 100_000));
    // A block's tokens depend on its id only, not on its position.
    assert.deepEqual(expandMooncakeTokens([9], 512), expandMooncakeTokens([0, 5, 9], 1536).slice(1024));
  });

  test("a real child's prompt starts with its parent's full blocks, token for token", () => {
    const requests = loadMooncakeTrace(mooncakeTracePath(), { limit: 2000 });
    const child = requests.find((r) => r.parent !== undefined)!;
    const parent = requests[child.parent!]!;
    const full = Math.floor(parent.inputLength / 512) * 512;
    assert.deepEqual(
      expandMooncakeTokens(child.hashIds, child.inputLength).slice(0, full),
      expandMooncakeTokens(parent.hashIds, parent.inputLength).slice(0, full),
    );
  });
});
