/** @module Tests of chained block hashes and longest-prefix matching. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import {
  BlockHasher,
  blockHashes,
  blockHashesFrom,
  extendBlockHashes,
  longestPrefixMatch,
} from "../../src/routing/block-hash.js";

function tokens(n: number, salt = 0): number[] {
  return Array.from({ length: n }, (_, i) => (Math.imul(i + salt, 2654435761) >>> 8) % 200_000);
}

describe("blockHashes", () => {
  it("renders one 16-hex-digit hash per full block and ignores a trailing partial block", () => {
    const h = blockHashes(tokens(64 * 3 + 10), 64);
    assert.equal(h.length, 3);
    for (const x of h) assert.match(x, /^[0-9a-f]{16}$/);
    assert.deepEqual(blockHashes(tokens(64 * 3 + 63), 64), h);
    assert.deepEqual(blockHashes(tokens(63), 64), []);
    assert.deepEqual(blockHashes([], 16), []);
  });

  it("gives equal prompts equal hashes and a shared prefix shared leading hashes", () => {
    const base = tokens(64 * 4);
    const other = [...base.slice(0, 64 * 2), ...tokens(64 * 2, 999)];
    const a = blockHashes(base, 64);
    const b = blockHashes(other, 64);
    assert.deepEqual(blockHashes([...base], 64), a);
    assert.deepEqual(b.slice(0, 2), a.slice(0, 2));
    assert.notEqual(b[2], a[2]);
    assert.notEqual(b[3], a[3]);
  });

  it("chains: a change in block 0 changes every hash", () => {
    const base = tokens(64 * 8);
    const changed = [...base];
    changed[5] = changed[5]! + 1;
    const a = blockHashes(base, 64);
    const b = blockHashes(changed, 64);
    for (let i = 0; i < a.length; i++) assert.notEqual(a[i], b[i], `block ${i}`);
  });

  it("depends on the position of a block, not only its content", () => {
    const block = tokens(16);
    const h = blockHashes([...block, ...block, ...block], 16);
    assert.equal(new Set(h).size, 3);
  });

  it("depends on the seed and on the block size", () => {
    const t = tokens(256);
    assert.notDeepEqual(blockHashes(t, 64, "model-a"), blockHashes(t, 64, "model-b"));
    assert.notDeepEqual(blockHashes(t, 64, "model-a"), blockHashes(t, 64));
    assert.deepEqual(blockHashes(t, 64, "model-a"), blockHashes(t, 64, "model-a"));
    assert.notEqual(blockHashes(t, 32)[1], blockHashes(t, 64)[0]);
  });

  it("hashes typed arrays like plain arrays", () => {
    const t = tokens(1000);
    assert.deepEqual(blockHashes(Uint32Array.from(t), 16), blockHashes(t, 16));
  });

  it("has no collisions among many distinct blocks", () => {
    const seen = new Set<string>();
    for (let s = 0; s < 200; s++) for (const h of blockHashes(tokens(16 * 50, s * 7919), 16)) seen.add(h);
    assert.equal(seen.size, 200 * 50);
  });

  it("rejects a block size that is not a positive integer, naming it", () => {
    assert.throws(() => blockHashes([1, 2], 0), /blockSize .* got 0/);
    assert.throws(() => blockHashes([1, 2], 1.5), /got 1\.5/);
    assert.throws(() => new BlockHasher(-1), /got -1/);
  });
});

describe("incremental hashing", () => {
  it("blockHashesFrom equals hashing from scratch for any grown prompt", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 300_000 }), { maxLength: 400 }),
        fc.array(fc.integer({ min: 0, max: 300_000 }), { maxLength: 400 }),
        fc.integer({ min: 1, max: 70 }),
        (prefix, grown, blockSize) => {
          const prev = blockHashes(prefix, blockSize, "s");
          const all = [...prefix, ...grown];
          assert.deepEqual(blockHashesFrom(prev, all, blockSize, "s"), blockHashes(all, blockSize, "s"));
        },
      ),
    );
  });

  it("extendBlockHashes continues a prompt's hashes with its partial block and output, as hashing it all", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 300_000 }), { maxLength: 400 }),
        fc.array(fc.integer({ min: 0, max: 300_000 }), { maxLength: 400 }),
        fc.integer({ min: 1, max: 70 }),
        (prompt, output, blockSize) => {
          const prev = blockHashes(prompt, blockSize, "s");
          const frozen = [...prev];
          const tail = [...prompt.slice(prev.length * blockSize), ...output];
          const all = [...prompt, ...output];
          assert.deepEqual(extendBlockHashes(prev, tail, blockSize, "s"), blockHashes(all, blockSize, "s"));
          assert.deepEqual(prev, frozen, "the prompt's hashes are not modified");
        },
      ),
    );
  });

  it("blockHashesFrom leaves its input alone and re-hashes when the reused tail changed", () => {
    const prefix = tokens(64 * 3);
    const prev = blockHashes(prefix, 64);
    const copy = [...prev];
    const grown = [...prefix.slice(0, 64 * 2), ...tokens(64 * 3, 5)];
    assert.deepEqual(blockHashesFrom(prev, grown, 64), blockHashes(grown, 64));
    assert.deepEqual(prev, copy);
    // A shorter prompt than before keeps only what still exists.
    assert.deepEqual(blockHashesFrom(prev, prefix.slice(0, 64 * 2 + 5), 64), prev.slice(0, 2));
  });

  it("BlockHasher fed in arbitrary pieces equals hashing from scratch", () => {
    fc.assert(
      fc.property(
        fc.array(fc.array(fc.integer({ min: 0, max: 300_000 }), { maxLength: 90 }), { maxLength: 12 }),
        fc.integer({ min: 1, max: 40 }),
        (pieces, blockSize) => {
          const hasher = new BlockHasher(blockSize, "seed");
          const all: number[] = [];
          for (const piece of pieces) {
            const before = hasher.hashes.length;
            const added = hasher.extend(piece);
            all.push(...piece);
            assert.equal(hasher.hashes.length - before, added);
            assert.deepEqual(hasher.hashes, blockHashes(all, blockSize, "seed"));
          }
          assert.equal(hasher.tokenCount, all.length);
        },
      ),
    );
  });
});

describe("longestPrefixMatch", () => {
  const h = ["a", "b", "c", "d"];

  it("counts leading held blocks and stops at the first gap", () => {
    assert.equal(
      longestPrefixMatch(h, (x) => x !== "c"),
      2,
    );
    assert.equal(
      longestPrefixMatch(h, () => true),
      4,
    );
    assert.equal(
      longestPrefixMatch([], () => true),
      0,
    );
  });

  it("scores 0 for a replica holding blocks 1 and 2 but not 0", () => {
    const held = new Set(["b", "c"]);
    assert.equal(
      longestPrefixMatch(h, (x) => held.has(x)),
      0,
    );
  });

  it("never asks past the first miss", () => {
    const asked: string[] = [];
    longestPrefixMatch(h, (x) => {
      asked.push(x);
      return x === "a";
    });
    assert.deepEqual(asked, ["a", "b"]);
  });
});
