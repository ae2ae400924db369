/** @module Splitting an SSE byte stream into whole events, whatever the chunk boundaries. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SseSplitter } from "../../adapters/engines/openai/sse.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

const STREAM =
  'data: {"a":1}\n\n' +
  ": keep-alive\n\n" +
  'event: error\r\ndata: {"error":{"message":"x"}}\r\n\r\n' +
  "data: line one\ndata: line two\r\r" +
  'data: {"emoji":"héllo ✓"}\n\n' +
  "\n" + // a stray blank line carries nothing
  "data: [DONE]\n\n";

function split(chunks: Uint8Array[]): { raw: string; data: string | undefined; event: string | undefined }[] {
  const splitter = new SseSplitter();
  const out = chunks.flatMap((c) => splitter.push(c));
  assert.equal(splitter.pendingBytes(), 0);
  return out.map((e) => ({ raw: decoder.decode(e.raw), data: e.data, event: e.event }));
}

describe("SseSplitter", () => {
  const expected = [
    { raw: 'data: {"a":1}\n\n', data: '{"a":1}', event: undefined },
    { raw: ": keep-alive\n\n", data: undefined, event: undefined },
    {
      raw: 'event: error\r\ndata: {"error":{"message":"x"}}\r\n\r\n',
      data: '{"error":{"message":"x"}}',
      event: "error",
    },
    { raw: "data: line one\ndata: line two\r\r", data: "line one\nline two", event: undefined },
    { raw: 'data: {"emoji":"héllo ✓"}\n\n', data: '{"emoji":"héllo ✓"}', event: undefined },
    { raw: "data: [DONE]\n\n", data: "[DONE]", event: undefined },
  ];

  it("splits a whole stream into events with their exact bytes", () => {
    assert.deepEqual(split([encoder.encode(STREAM)]), expected);
  });

  it("gives the same events when fed one byte at a time (CR LF split across chunks, UTF-8 split mid-character)", () => {
    const bytes = encoder.encode(STREAM);
    const chunks = Array.from(bytes, (b) => Uint8Array.of(b));
    assert.deepEqual(split(chunks), expected);
  });

  it("gives the same events at every two-way cut of the stream", () => {
    const bytes = encoder.encode(STREAM);
    for (let cut = 0; cut <= bytes.length; cut++) {
      assert.deepEqual(split([bytes.subarray(0, cut), bytes.subarray(cut)]), expected, `cut at ${cut}`);
    }
  });

  it("holds an unfinished event until its blank line arrives", () => {
    const splitter = new SseSplitter();
    assert.deepEqual(splitter.push(encoder.encode('data: {"partial":')), []);
    assert.ok(splitter.pendingBytes() > 0);
    const events = splitter.push(encoder.encode("true}\n\n"));
    assert.equal(events.length, 1);
    assert.equal(events[0]!.data, '{"partial":true}');
    assert.equal(splitter.pendingBytes(), 0);
  });
});
