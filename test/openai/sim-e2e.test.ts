/** @module The upstream engine end to end against the simulated replica's HTTP server (real time, loopback). */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { type SimServer, startSimServer } from "../../adapters/engines/sim/http-server.js";
import type { EngineCall, EngineChunk } from "../../src/engine.js";
import { Refusal } from "../../src/errors.js";

const decoder = new TextDecoder();
// Long enough to fill several 16-token KV blocks, so a repeat finds them cached.
const SYSTEM = `You are a careful assistant. ${"Follow the house rules and answer briefly. ".repeat(20)}`;

function chatCall(over: Partial<EngineCall> = {}): EngineCall {
  return {
    requestId: `e2e-${Math.random().toString(36).slice(2)}`,
    model: "",
    promptTokens: [],
    maxTokens: 8,
    endpoint: "chat",
    body: {
      messages: [
        { role: "system", content: SYSTEM },
        { role: "user", content: "What is the capital of France?" },
      ],
    },
    stream: true,
    signal: new AbortController().signal,
    ...over,
  };
}

describe("OpenAIUpstreamEngine against the simulated replica", () => {
  let sim: SimServer;
  let engine: OpenAIUpstreamEngine;

  before(async () => {
    sim = await startSimServer({ port: 0, preset: "h100-llama3-8b" });
    engine = new OpenAIUpstreamEngine({ baseUrl: sim.url, id: "sim-0" });
    await engine.start();
  });

  after(async () => {
    assert.equal(engine.inFlight(), 0);
    await engine.close();
    await sim.close();
  });

  it("learns the models, the context window and the KV geometry at start", () => {
    assert.deepEqual(engine.models(), [sim.engine.model]);
    assert.equal(engine.contextWindow(), sim.engine.params.maxModelLen);
    const s = engine.signals();
    const truth = sim.engine.signals();
    assert.equal(s.healthy, true);
    assert.ok(Number.isFinite(s.readAtMs));
    assert.equal(s.kvCapacityTokens, truth.kvCapacityTokens);
    assert.equal(s.blockSize, 16);
    assert.equal(s.maxNumSeqs, sim.engine.params.maxNumSeqs);
    assert.equal(s.dataParallelSize, 1);
    assert.equal(engine.flavor(), "vllm");
  });

  it("streams raw SSE events through and reads usage, including cached tokens on a repeat", async () => {
    const model = engine.models()[0]!;
    const first = await engine.generate(chatCall({ model }));
    const chunks: EngineChunk[] = [];
    for await (const chunk of first) chunks.push(chunk);
    await first.firstToken;
    const result = await first.result;
    assert.ok(chunks.length >= 1);
    for (const chunk of chunks) {
      const raw = decoder.decode(chunk.raw);
      assert.match(raw, /^data: \{.*\}\n\n$/s, "one whole upstream event per chunk");
      assert.doesNotMatch(raw, /\[DONE\]/);
    }
    assert.equal(
      chunks.reduce((n, c) => n + c.tokenCount, 0),
      result.completionTokens,
      "counted tokens agree with the upstream's usage",
    );
    assert.equal(result.completionTokens, 8);
    assert.equal(result.finishReason, "length");
    assert.ok(result.promptTokens > 64, `prompt tokens from usage, got ${result.promptTokens}`);
    assert.equal(result.cachedTokens, 0, "a cold cache");

    const repeat = await engine.generate(chatCall({ model }));
    for await (const _ of repeat) {
      // drain
    }
    const again = await repeat.result;
    assert.ok(again.cachedTokens >= 64, `the shared prefix is cached, got ${again.cachedTokens}`);
    assert.equal(again.cachedTokens % 16, 0, "only full blocks hit");
  });

  it("serves a non-streaming client from an upstream stream (text, no raw bytes)", async () => {
    const stream = await engine.generate(
      chatCall({
        model: engine.models()[0]!,
        stream: false,
        maxTokens: 5,
        body: { messages: [{ role: "user", content: "Hi" }] },
      }),
    );
    const chunks: EngineChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    assert.ok(chunks.every((c) => c.raw === undefined));
    assert.ok(chunks.map((c) => c.text).join("").length > 0);
    const result = await stream.result;
    assert.equal(result.completionTokens, 5);
  });

  it("completions endpoint with a text prompt", async () => {
    const stream = await engine.generate(
      chatCall({
        model: engine.models()[0]!,
        endpoint: "completions",
        maxTokens: 4,
        body: { prompt: "Once upon a time" },
      }),
    );
    for await (const _ of stream) {
      // drain
    }
    const result = await stream.result;
    assert.equal(result.completionTokens, 4);
    assert.ok(result.promptTokens > 0);
  });

  it("an unknown model is refused model_not_found before any output", async () => {
    const error = await engine.generate(chatCall({ model: "no-such-model" })).catch((e: unknown) => e);
    assert.ok(error instanceof Refusal, String(error));
    assert.equal(error.reason, "model_not_found");
    assert.equal(error.status, 404);
  });

  it("scraped prefix-cache counters match the replica's own", async () => {
    const s = await engine.scrape();
    const truth = sim.engine.signals();
    assert.equal(s.healthy, true);
    assert.equal(s.prefixQueryTokens, truth.prefixQueryTokens);
    assert.equal(s.prefixHitTokens, truth.prefixHitTokens);
    assert.ok(s.prefixHitTokens > 0);
    assert.equal(s.running, 0);
    assert.equal(s.waiting, 0);
  });
});
