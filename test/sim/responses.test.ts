/**
 * @module The simulated replica's Responses API behind the `Engine` port: ids, the state
 * `previous_response_id` continues, vLLM's refusal of an id it does not hold, and event shapes
 * checked against OpenAI's published examples (test/openai/fixtures/README.md).
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";
import { CallStream } from "../../adapters/engines/sim/call-stream.js";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { SimResponses } from "../../adapters/engines/sim/sim-responses.js";
import { VirtualClock } from "../../src/clock.js";
import type { EngineCall, EngineChunk, EngineStream } from "../../src/engine.js";
import { Refusal } from "../../src/errors.js";

const decoder = new TextDecoder();

function engine(): SimEngine {
  return new SimEngine({ id: "sim-r", clock: new VirtualClock(), preset: "instant" });
}

function call(over: Partial<EngineCall> = {}): EngineCall {
  return {
    requestId: `r-${Math.random().toString(36).slice(2)}`,
    model: "m",
    promptTokens: Array.from({ length: 40 }, (_, i) => 100 + i),
    maxTokens: 5,
    endpoint: "responses",
    body: { input: "hello" },
    stream: true,
    signal: new AbortController().signal,
    ...over,
  };
}

async function drain(stream: EngineStream): Promise<EngineChunk[]> {
  const chunks: EngineChunk[] = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

function events(chunks: EngineChunk[]): { event: string; data: Record<string, unknown> }[] {
  const text = chunks.map((c) => decoder.decode(c.raw)).join("");
  return text
    .split("\n\n")
    .filter((block) => block !== "")
    .map((block) => {
      const [eventLine, dataLine] = block.split("\n");
      return {
        event: eventLine!.replace(/^event: /, ""),
        data: JSON.parse(dataLine!.replace(/^data: /, "")),
      };
    });
}

describe("the simulated replica's Responses API", () => {
  test("streamed: events carry the fields of OpenAI's published examples, the id named on the first chunk", async () => {
    const sim = engine();
    const stream = await sim.generate(call());
    const chunks = await drain(stream);
    const result = await stream.result;
    assert.match(chunks[0]!.responseId ?? "", /^resp_[0-9a-f]{32}$/);
    assert.equal(result.responseId, chunks[0]!.responseId);
    assert.equal(
      chunks.reduce((n, c) => n + c.tokenCount, 0),
      5,
    );
    const written = events(chunks);
    const reference = readFileSync(
      new URL("../openai/fixtures/openai-responses-stream-reference.jsonl", import.meta.url),
      "utf8",
    )
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    for (const example of reference) {
      const type = example.type as string;
      // The sim ends at its output cap: the reference's `response.completed` is compared with `response.incomplete`.
      const mine = written.find(
        (e) => e.event === (type === "response.completed" ? "response.incomplete" : type),
      );
      assert.ok(mine, `the sim writes ${type}`);
      for (const key of Object.keys(example)) {
        if (key !== "type") assert.ok(key in mine.data, `${type} carries ${key}`);
      }
      const response = example.response as Record<string, unknown> | undefined;
      if (response) {
        const own = mine.data.response as Record<string, unknown>;
        // `input` and `reasoning_effort` appear in the completed example only, fields OpenAI's response object no longer lists.
        for (const key of Object.keys(response).filter((k) => k !== "input" && k !== "reasoning_effort")) {
          assert.ok(key in own, `${type}.response carries ${key}`);
        }
      }
    }
    assert.deepEqual(
      written.map((e) => e.data.sequence_number),
      written.map((_, i) => i),
    );
  });

  test("previous_response_id runs the held conversation first; an id not held is vLLM's 404 as response_state_lost", async () => {
    const sim = engine();
    const first = await sim.generate(call({ stream: false }));
    const [whole] = await drain(first);
    const body = JSON.parse(decoder.decode(whole!.raw)) as { id: string; usage: { input_tokens: number } };
    assert.equal(body.usage.input_tokens, 40);
    assert.equal(sim.responses.holds(body.id), true);
    const next = await sim.generate(
      call({ promptTokens: [7, 8, 9], body: { input: "more", previous_response_id: body.id } }),
    );
    await drain(next);
    const result = await next.result;
    assert.equal(result.promptTokens, 40 + 5 + 3, "the previous prompt and its output, then the new input");
    assert.ok(result.cachedTokens >= 32, "the held conversation is in the prefix cache");
    await assert.rejects(
      sim.generate(call({ body: { input: "x", previous_response_id: "resp_nope" } })),
      (error: unknown) =>
        error instanceof Refusal &&
        error.reason === "response_state_lost" &&
        error.message === "Response with id 'resp_nope' not found.",
    );
  });

  test("store: false keeps nothing; the store is bounded, oldest first", async () => {
    const sim = engine();
    const kept = await sim.generate(call({ body: { input: "x", store: false } }));
    await drain(kept);
    assert.equal(sim.responses.size, 0);
    const responses = new SimResponses("m", 2);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const stream = responses.start(call(), (running) => {
        // A call that ends at once, as the replica's own path would end it.
        const done = new CallStream(() => {});
        done.end({
          promptTokens: running.promptTokens.length,
          completionTokens: 0,
          cachedTokens: 0,
          finishReason: "stop",
        });
        return done;
      });
      ids.push((await stream.result).responseId!);
    }
    assert.equal(responses.size, 2);
    assert.deepEqual(
      ids.map((id) => responses.holds(id)),
      [false, true, true],
    );
  });
});
