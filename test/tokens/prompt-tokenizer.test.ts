/** @module Tests of incremental prompt tokenization: each message tokenized once across a growing conversation. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { createO200kTokenizer } from "../../adapters/tokenizers/o200k.js";
import type { Tokenizer } from "../../src/tokenizer.js";
import { PromptTokenizer, renderChatMessage } from "../../src/tokens/prompt-tokenizer.js";
import type { ChatMessage } from "../../src/types.js";

const o200k = createO200kTokenizer();

/** The real tokenizer, with a record of every text it was asked to encode. */
function recording(): Tokenizer & { texts: string[] } {
  const texts: string[] = [];
  return {
    name: o200k.name,
    texts,
    encode(text: string) {
      texts.push(text);
      return o200k.encode(text);
    },
  };
}

function toolOutput(step: number): string {
  return `step ${step}: ${Array.from({ length: 40 + step }, (_, i) => `line ${i} of the tool's output, value ${i * step}`).join("\n")}`;
}

describe("PromptTokenizer", () => {
  it("tokenizes a chat as its rendered messages, concatenated", () => {
    const pt = new PromptTokenizer(o200k);
    const messages: ChatMessage[] = [
      { role: "system", content: "You are terse." },
      { role: "user", content: "hello world" },
    ];
    const expected = messages.flatMap((m) => o200k.encode(renderChatMessage(m)));
    assert.deepEqual(pt.chat(messages), expected);
    assert.equal(renderChatMessage(messages[1]!), "<|user|>\nhello world\n<|end|>\n");
    // The template's markers cost a few tokens per message beyond the content's own.
    const content = o200k.encode("hello world").length;
    assert.ok(pt.chat([messages[1]!]).length > content);
    assert.ok(pt.chat([messages[1]!]).length <= content + 12);
  });

  it("renders text parts like a string and serializes tool calls as JSON", () => {
    const pt = new PromptTokenizer(o200k);
    const parts = {
      role: "user",
      content: [
        { type: "text", text: "a" },
        { type: "text", text: "b" },
      ],
    };
    assert.deepEqual(pt.chat([parts]), pt.chat([{ role: "user", content: "a\nb" }]));
    const image = renderChatMessage({
      role: "user",
      content: [{ type: "image_url", image_url: { url: "x" } }],
    });
    assert.match(image, /<\|image_url\|>/);
    const call = [{ id: "c1", type: "function", function: { name: "grep", arguments: '{"q":"x"}' } }];
    const rendered = renderChatMessage({ role: "assistant", content: null, tool_calls: call });
    assert.ok(rendered.includes(JSON.stringify(call)));
    const result = renderChatMessage({ role: "tool", tool_call_id: "c1", content: "found" });
    assert.match(result, /^<\|tool:c1\|>\nfound/);
    assert.notDeepEqual(
      pt.chat([{ role: "assistant", tool_calls: call }]),
      pt.chat([{ role: "assistant", tool_calls: [{ ...call[0], id: "c2" }] }]),
    );
  });

  it("keys the cache by the whole rendered message, role included", () => {
    const pt = new PromptTokenizer(o200k);
    const asUser = pt.chat([{ role: "user", content: "same words" }]);
    const asTool = pt.chat([{ role: "tool", content: "same words" }]);
    assert.notDeepEqual(asUser, asTool);
    assert.equal(pt.stats().cacheMisses, 2);
  });

  it("tokenizes each message once across a growing 30-step conversation", () => {
    const tok = recording();
    const pt = new PromptTokenizer(tok);
    const messages: ChatMessage[] = [
      { role: "system", content: "You are an agent. Use tools." },
      { role: "user", content: "Fix the failing build." },
    ];
    let hitsExpected = 0;
    let last: number[] = [];
    for (let step = 0; step < 30; step++) {
      hitsExpected += messages.length - (step === 0 ? messages.length : 2);
      last = pt.chat(messages);
      messages.push({ role: "assistant", content: `calling a tool, step ${step}` });
      messages.push({ role: "tool", tool_call_id: `call_${step}`, content: toolOutput(step) });
    }
    last = pt.chat(messages);
    hitsExpected += messages.length - 2;
    const stats = pt.stats();
    // Every message went through the tokenizer exactly once…
    assert.equal(stats.cacheMisses, messages.length);
    assert.equal(new Set(tok.texts).size, tok.texts.length);
    assert.equal(stats.cacheHits, hitsExpected);
    // …so the work equals the final context, and the context is exactly the tokenizer's count.
    assert.equal(stats.tokenizedTokens, last.length);
    assert.deepEqual(
      last,
      messages.flatMap((m) => o200k.encode(renderChatMessage(m))),
    );
    assert.equal(
      stats.tokenizedChars,
      tok.texts.reduce((n, t) => n + t.length, 0),
    );
  });

  it("caches long messages and never confuses two that share a sampled key", () => {
    const tok = recording();
    const pt = new PromptTokenizer(tok);
    const long = "alpha beta gamma delta ".repeat(2000);
    // Same length, one character apart at a position the sampled key skips (index 1).
    const twin = `${long[0]}Z${long.slice(2)}`;
    assert.equal(twin.length, long.length);
    const a = pt.chat([{ role: "tool", content: long }]);
    const b = pt.chat([{ role: "tool", content: twin }]);
    const a2 = pt.chat([{ role: "tool", content: long }]);
    assert.deepEqual(a, o200k.encode(renderChatMessage({ role: "tool", content: long })));
    assert.deepEqual(b, o200k.encode(renderChatMessage({ role: "tool", content: twin })));
    assert.notDeepEqual(a, b);
    assert.deepEqual(a2, a);
    // The twins share one key, so each replaced the other: three misses, each a correct count.
    assert.equal(pt.stats().cacheMisses, 3);
    assert.equal(pt.stats().cacheHits, 0);
  });

  it("returns arrays the caller may modify without touching the cache", () => {
    const pt = new PromptTokenizer(o200k);
    const m: ChatMessage = { role: "user", content: "hello world" };
    const first = pt.chat([m]);
    first.length = 0;
    assert.ok(pt.chat([m]).length > 0);
  });

  it("re-tokenizes what its LRU evicted", () => {
    const tok = recording();
    const pt = new PromptTokenizer(tok, { cacheEntries: 2 });
    const m = (s: string): ChatMessage => ({ role: "user", content: s });
    pt.chat([m("one"), m("two"), m("three")]);
    pt.chat([m("three")]);
    pt.chat([m("one")]);
    assert.deepEqual(pt.stats().cacheHits, 1);
    assert.equal(tok.texts.length, 4);
  });

  it("bounds the cache by tokens as well as entries", () => {
    const pt = new PromptTokenizer(o200k, { cacheTokens: 50 });
    const big: ChatMessage = { role: "user", content: "word ".repeat(100) };
    pt.chat([big]);
    pt.chat([big]);
    assert.equal(pt.stats().cacheHits, 0);
    assert.equal(pt.stats().cacheMisses, 2);
  });

  it("tokenizes plain text with the tokenizer, uncached, and counts the work", () => {
    const pt = new PromptTokenizer(o200k);
    assert.deepEqual(pt.text("hello world"), [24912, 2375]);
    pt.text("hello world");
    assert.deepEqual(pt.stats(), { tokenizedChars: 22, tokenizedTokens: 4, cacheHits: 0, cacheMisses: 0 });
    pt.resetStats();
    assert.deepEqual(pt.stats(), { tokenizedChars: 0, tokenizedTokens: 0, cacheHits: 0, cacheMisses: 0 });
  });

  it("rejects cache sizes that are not positive integers, naming them", () => {
    assert.throws(() => new PromptTokenizer(o200k, { cacheEntries: 0 }), /cacheEntries .* got 0/);
    assert.throws(() => new PromptTokenizer(o200k, { cacheTokens: 1.5 }), /cacheTokens .* got 1\.5/);
  });
});
