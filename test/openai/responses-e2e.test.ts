/**
 * @module The Responses API over real sockets: `sluice serve` in front of simulated replicas served over
 * HTTP (`sluice sim`), driven by the `openai` npm client (`client.responses.create`, streamed and not);
 * `previous_response_id` kept on its replica, 409 `response_state_lost` once that replica is gone; and
 * OpenAI's published event stream (fixtures/README.md) forwarded byte for byte by the upstream adapter.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, afterEach, before, describe, it } from "node:test";
import OpenAI, { APIError } from "openai";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { type SimServer, startSimServer } from "../../adapters/engines/sim/http-server.js";
import type { EngineCall, EngineChunk } from "../../src/engine.js";
import { Refusal } from "../../src/errors.js";
import type { Scheduler } from "../../src/scheduler.js";
import { type FakeUpstream, startFakeUpstream } from "./fake-upstream.js";

const decoder = new TextDecoder();

function assertIdle(scheduler: Scheduler): void {
  assert.deepEqual(scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
}

/** Polls (real time) until `done`, at most `limitMs`. */
async function until(done: () => boolean, what: string, limitMs = 20_000): Promise<void> {
  const start = Date.now();
  while (!done()) {
    if (Date.now() - start > limitMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** `sluice serve` over two `sluice sim` servers, named a and b. */
async function fleet(policy: "rr" | "sluice") {
  const sims = {
    a: await startSimServer({ port: 0, id: "a" }),
    b: await startSimServer({ port: 0, id: "b" }),
  };
  const server = await startServer({
    port: 0,
    host: "127.0.0.1",
    upstreams: [`a=${sims.a.url}`, `b=${sims.b.url}`],
    config: { policy },
    log: () => {},
  });
  const client = new OpenAI({
    baseURL: `${server.url}/v1`,
    apiKey: "unused",
    maxRetries: 0,
    timeout: 30_000,
  });
  const model = server.scheduler.models()[0]!;
  return { sims, server, client, model };
}

async function closeFleet(f: { sims: Record<string, SimServer>; server: RunningServer }): Promise<void> {
  await f.server.close();
  await Promise.all(Object.values(f.sims).map((sim) => sim.close().catch(() => {})));
}

describe("the Responses API through sluice serve, with the openai client", () => {
  let f: Awaited<ReturnType<typeof fleet>>;
  before(async () => {
    f = await fleet("sluice");
  });
  after(async () => {
    await closeFleet(f);
  });

  it("responses.create, not streamed: the replica's Response object, its output_text and usage", async () => {
    const { data: response, response: raw } = await f.client.responses
      .create({
        model: f.model,
        instructions: "answer briefly",
        input: "What is a queue?",
        max_output_tokens: 8,
      })
      .withResponse();
    assert.match(response.id, /^resp_/);
    assert.equal(response.object, "response");
    assert.ok(response.output_text.length > 0, "the client's output_text helper reads the output message");
    assert.equal(response.usage?.output_tokens, 8);
    const replica = raw.headers.get("x-sluice-replica");
    assert.ok(replica === "a" || replica === "b");
    assert.equal(f.sims[replica as "a" | "b"].engine.responses.holds(response.id), true);
    assertIdle(f.server.scheduler);
  });

  it("responses.create, streamed: the engine's events reach the client in order, ending with the terminal event", async () => {
    const stream = await f.client.responses.create({
      model: f.model,
      input: [{ role: "user", content: [{ type: "input_text", text: "Count to three." }] }],
      max_output_tokens: 6,
      stream: true,
    });
    const types: string[] = [];
    let text = "";
    let id: string | undefined;
    let final: OpenAI.Responses.Response | undefined;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === "response.created") id = event.response.id;
      if (event.type === "response.output_text.delta") text += event.delta;
      if (event.type === "response.incomplete" || event.type === "response.completed") final = event.response;
    }
    assert.equal(types[0], "response.created");
    assert.equal(types.at(-1), "response.incomplete");
    assert.ok(id && final && final.id === id);
    assert.equal(final.output_text ?? responseText(final), text);
    assertIdle(f.server.scheduler);
  });

  it("409 response_state_lost once the replica holding a previous response is gone; the rest keep working", async () => {
    const local = await fleet("sluice");
    try {
      const { data: first, response: raw } = await local.client.responses
        .create({ model: local.model, input: "remember this", max_output_tokens: 4 })
        .withResponse();
      const home = raw.headers.get("x-sluice-replica") as "a" | "b";
      await local.sims[home].close();
      await until(
        () => local.server.scheduler.state().replicas.find((r) => r.id === home)?.healthy === false,
        `replica ${home} to be seen down`,
      );
      const lost = await local.client.responses
        .create({
          model: local.model,
          input: "and now?",
          previous_response_id: first.id,
          max_output_tokens: 4,
        })
        .then(
          () => undefined,
          (error: unknown) => error,
        );
      assert.ok(lost instanceof APIError, String(lost));
      assert.equal(lost.status, 409);
      assert.equal(lost.code, "response_state_lost");
      assert.equal(lost.param, "previous_response_id");
      assert.match(lost.message, /resend the conversation/);
      // Resent whole, the conversation runs on the survivor.
      const { response: again } = await local.client.responses
        .create({ model: local.model, input: "remember this; and now?", max_output_tokens: 4 })
        .withResponse();
      assert.notEqual(again.headers.get("x-sluice-replica"), home);
      assertIdle(local.server.scheduler);
    } finally {
      await closeFleet(local);
    }
  });
});

function responseText(response: OpenAI.Responses.Response): string {
  let text = "";
  for (const item of response.output) {
    if (item.type !== "message") continue;
    for (const part of item.content) if (part.type === "output_text") text += part.text;
  }
  return text;
}

describe("previous_response_id under round robin: placement alternates, a continued response does not", () => {
  let f: Awaited<ReturnType<typeof fleet>>;
  before(async () => {
    f = await fleet("rr");
  });
  after(async () => {
    await closeFleet(f);
  });

  it("three chains over two replicas each stay on the replica that holds their state, streamed and not", async () => {
    const chains: { id: string; home: string }[] = [];
    // An odd number of chains: round robin alone would send each next step to the other replica.
    for (let c = 0; c < 3; c++) {
      const { data, response } = await f.client.responses
        .create({ model: f.model, input: `chain ${c}: start`, max_output_tokens: 4 })
        .withResponse();
      chains.push({ id: data.id, home: response.headers.get("x-sluice-replica")! });
    }
    assert.deepEqual(
      new Set(chains.map((c) => c.home)),
      new Set(["a", "b"]),
      "round robin spread the openers",
    );
    for (let step = 0; step < 3; step++) {
      for (const chain of chains) {
        let id: string;
        let replica: string | null;
        if (step % 2 === 0) {
          const { data, response } = await f.client.responses
            .create({
              model: f.model,
              input: `step ${step}`,
              previous_response_id: chain.id,
              max_output_tokens: 4,
            })
            .withResponse();
          id = data.id;
          replica = response.headers.get("x-sluice-replica");
          assert.equal(data.previous_response_id, chain.id);
        } else {
          const { data: stream, response } = await f.client.responses
            .create({
              model: f.model,
              input: `step ${step}`,
              previous_response_id: chain.id,
              max_output_tokens: 4,
              stream: true,
            })
            .withResponse();
          replica = response.headers.get("x-sluice-replica");
          let created: string | undefined;
          for await (const event of stream)
            if (event.type === "response.created") created = event.response.id;
          id = created!;
        }
        assert.equal(replica, chain.home, `step ${step} of a chain left its replica`);
        assert.equal(f.sims[chain.home as "a" | "b"].engine.responses.holds(id), true);
        chain.id = id;
      }
    }
    assertIdle(f.server.scheduler);
  });
});

describe("the upstream adapter against OpenAI's published Responses API events", () => {
  const lines = readFileSync(
    new URL("./fixtures/openai-responses-stream-reference.jsonl", import.meta.url),
    "utf8",
  )
    .trim()
    .split("\n");
  // Framed as vLLM frames them: `event: <type>` then `data: <json>`, and no `[DONE]`.
  const frames = lines.map(
    (line) => `event: ${(JSON.parse(line) as { type: string }).type}\ndata: ${line}\n\n`,
  );
  const completed = JSON.parse(lines.at(-1)!) as { response: Record<string, unknown> };
  let upstream: FakeUpstream;
  let engine: OpenAIUpstreamEngine;
  const bodies: Record<string, unknown>[] = [];

  before(async () => {
    upstream = await startFakeUpstream({
      "/v1/responses": (req, res) => {
        const body = JSON.parse(req.body) as Record<string, unknown>;
        bodies.push(body);
        if (body.previous_response_id === "resp_gone") {
          // vLLM's answer (serving_responses.py, `_make_not_found_error`).
          res.writeHead(404, { "content-type": "application/json" });
          res.end(
            JSON.stringify({
              error: {
                message: "Response with id 'resp_gone' not found.",
                type: "invalid_request_error",
                param: "response_id",
                code: 404,
              },
            }),
          );
          return;
        }
        if (body.stream === true) {
          res.writeHead(200, { "content-type": "text/event-stream" });
          for (const frame of frames) res.write(frame);
          res.end();
          return;
        }
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(completed.response));
      },
    });
    engine = new OpenAIUpstreamEngine({
      baseUrl: upstream.url,
      id: "up",
      models: ["gpt-4o-mini-2024-07-18"],
    });
  });
  afterEach(() => {
    bodies.length = 0;
  });
  after(async () => {
    await engine.close();
    await upstream.close();
  });

  const call = (over: Partial<EngineCall> = {}): EngineCall => ({
    requestId: "fixture-1",
    model: "gpt-4o-mini-2024-07-18",
    promptTokens: [1, 2, 3],
    maxTokens: 64,
    endpoint: "responses",
    body: { input: "Tell me a three sentence bedtime story about a unicorn." },
    stream: true,
    signal: new AbortController().signal,
    ...over,
  });

  it("streams each event untouched, reads the response id, the text and the usage, and ends without [DONE]", async () => {
    const stream = await engine.generate(call());
    const chunks: EngineChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    const result = await stream.result;
    assert.deepEqual(
      chunks.map((c) => decoder.decode(c.raw)),
      frames,
      "one chunk per event, byte for byte",
    );
    assert.equal(chunks[0]!.responseId, "resp_67ccfcdd16748190a91872c75d38539e09e4d4aac714747c");
    assert.equal(
      chunks.filter((c) => c.responseId !== undefined).length,
      1,
      "the id is named once, on its first event",
    );
    assert.equal(chunks.map((c) => c.text).join(""), "In");
    assert.equal(result.responseId, "resp_67ccfcdd16748190a91872c75d38539e09e4d4aac714747c");
    assert.equal(result.finishReason, "stop");
    // The reference's usage is all zeros: read as stated, not replaced by sluice's own count.
    assert.equal(result.promptTokens, 0);
    assert.equal(result.completionTokens, 0);
    assert.deepEqual(bodies[0], {
      input: "Tell me a three sentence bedtime story about a unicorn.",
      model: "gpt-4o-mini-2024-07-18",
      max_output_tokens: 64,
      stream: true,
    });
    assert.equal(engine.inFlight(), 0);
  });

  it("not streamed: the Response object's bytes as one chunk, its id, text and finish", async () => {
    const stream = await engine.generate(call({ stream: false }));
    const chunks: EngineChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    const result = await stream.result;
    assert.equal(chunks.length, 1);
    assert.equal(decoder.decode(chunks[0]!.raw), JSON.stringify(completed.response));
    assert.equal(chunks[0]!.responseId, "resp_123");
    assert.match(chunks[0]!.text, /^In a shimmering forest/);
    assert.equal(result.responseId, "resp_123");
    assert.equal(result.finishReason, "stop");
    assert.equal(bodies[0]!.stream, false);
  });

  it("the engine's 404 for a previous response it does not hold is 409 response_state_lost", async () => {
    const failure = await engine
      .generate(call({ body: { input: "more", previous_response_id: "resp_gone" } }))
      .then(
        () => undefined,
        (error: unknown) => error,
      );
    assert.ok(failure instanceof Refusal);
    assert.equal(failure.reason, "response_state_lost");
    assert.equal(failure.status, 409);
    assert.match(failure.message, /Response with id 'resp_gone' not found\./);
  });
});
