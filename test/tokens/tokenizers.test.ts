/** @module Tests of the tokenizer adapters: o200k_base counts and Hugging Face tokenizer.json loading. */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { createHfTokenizer } from "../../adapters/tokenizers/hf.js";
import { createTokenizer } from "../../adapters/tokenizers/index.js";
import { createO200kTokenizer } from "../../adapters/tokenizers/o200k.js";

const dir = mkdtempSync(join(tmpdir(), "sluice-tokenizers-"));
after(() => rmSync(dir, { recursive: true, force: true }));

/** A byte-level BPE model with two merges, the shape of Llama 3 / Qwen tokenizers. */
const bpe = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [
    {
      id: 6,
      content: "<|bos|>",
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    },
  ],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<|bos|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { "<|bos|>": { id: "<|bos|>", ids: [6], tokens: ["<|bos|>"] } },
  },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: "BPE",
    dropout: null,
    unk_token: null,
    continuing_subword_prefix: null,
    end_of_word_suffix: null,
    fuse_unk: false,
    byte_fallback: false,
    vocab: { a: 0, b: 1, ab: 2, Ġ: 3, Ġab: 4, c: 5 },
    merges: ["a b", "Ġ ab"],
  },
};

/** A word-level model: one id per whitespace-separated word. */
const wordLevel = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [
    {
      id: 0,
      content: "[UNK]",
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    },
  ],
  normalizer: null,
  pre_tokenizer: { type: "Whitespace" },
  post_processor: null,
  decoder: null,
  model: { type: "WordLevel", vocab: { "[UNK]": 0, hello: 1, world: 2, "!": 3 }, unk_token: "[UNK]" },
};

function write(name: string, value: unknown): string {
  const path = join(dir, name);
  writeFileSync(path, typeof value === "string" ? value : JSON.stringify(value));
  return path;
}

describe("o200k_base", () => {
  const t = createO200kTokenizer();

  it("gives the known token ids", () => {
    assert.equal(t.name, "o200k_base");
    assert.deepEqual(t.encode("hello world"), [24912, 2375]);
    assert.equal(t.encode("The quick brown fox jumps over the lazy dog.").length, 10);
    assert.deepEqual(t.encode(""), []);
  });

  it("counts text that looks like a special token as ordinary text", () => {
    const ids = t.encode("<|endoftext|> hi");
    assert.ok(ids.length > 2);
    assert.ok(!ids.includes(199_999), "not the end-of-text control token");
  });
});

describe("Hugging Face tokenizer.json", () => {
  it("encodes with a byte-level BPE model exactly, without special tokens by default", () => {
    const t = createHfTokenizer(write("bpe.json", bpe));
    assert.deepEqual(t.encode("ab ab abc"), [2, 4, 4, 5]);
    assert.deepEqual(t.encode("ba"), [1, 0]);
  });

  it("adds special tokens when asked", () => {
    const t = createHfTokenizer(write("bpe2.json", bpe), { addSpecialTokens: true });
    assert.deepEqual(t.encode("ab"), [6, 2]);
  });

  it("encodes with a word-level model, unknown words as the unknown token", () => {
    const t = createHfTokenizer(write("words.json", wordLevel));
    assert.deepEqual(t.encode("hello world !"), [1, 2, 3]);
    assert.deepEqual(t.encode("hello there"), [1, 0]);
  });

  it("is what createTokenizer returns for a .json path; o200k otherwise", () => {
    const path = write("via-index.json", bpe);
    assert.deepEqual(createTokenizer(path).encode("ab ab"), [2, 4]);
    assert.equal(createTokenizer().name, "o200k_base");
    assert.equal(createTokenizer("o200k").name, "o200k_base");
    assert.equal(createTokenizer(" o200k_base ").name, "o200k_base");
  });

  it("fails clearly on a missing file, bad JSON or an unknown spec", () => {
    assert.throws(
      () => createHfTokenizer(join(dir, "missing.json")),
      /cannot read tokenizer file .*missing\.json/,
    );
    assert.throws(() => createHfTokenizer(write("bad.json", "{ not json")), /bad\.json.* not valid JSON/);
    assert.throws(() => createTokenizer("llama"), /got "llama"/);
  });
});
