/** @module POST /v1/responses in process: streamed and not, previous_response_id bound to its replica, 409 when it is gone. */

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import type { Engine } from "../../src/engine.js";
import {
  assertIdle,
  assertRefusal,
  type Harness,
  type HarnessOptions,
  MODEL,
  makeHarness,
  parseSse,
} from "./harness.js";

const harnesses: Harness[] = [];
after(async () => {
  for (const h of harnesses) await h.close();
});

/** A harness whose replicas can be taken down (their signals say unhealthy) by id. */
function harness(options: HarnessOptions = {}) {
  const down = new Set<string>();
  const h = makeHarness({
    replicas: 2,
    ...options,
    wrap: (engine: Engine) =>
      Object.assign(Object.create(engine) as Engine, {
        signals: () => ({ ...engine.signals(), healthy: !down.has(engine.id) }),
      }),
  });
  harnesses.push(h);
  return { ...h, down };
}

function responsesBody(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { model: MODEL, input: "write a haiku about queues", max_output_tokens: 8, ...extra };
}

const post = (json: unknown, headers: Record<string, string> = {}) => ({ method: "POST", json, headers });

describe("POST /v1/responses", () => {
  test("not streamed: the replica's Response object, with its id, output text and usage", async () => {
    const { call, scheduler } = harness();
    const { response, json } = await call("/v1/responses", post(responsesBody({ instructions: "be brief" })));
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type") ?? "", /application\/json/);
    const body = json();
    assert.match(body.id, /^resp_/);
    assert.equal(body.object, "response");
    assert.equal(body.status, "incomplete", "8 tokens of output is the cap the sim always reaches");
    assert.deepEqual(body.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(body.instructions, "be brief");
    assert.equal(body.output[0].type, "message");
    assert.equal(body.output[0].content[0].type, "output_text");
    assert.ok(body.output[0].content[0].text.length > 0);
    assert.equal(body.usage.output_tokens, 8);
    assert.ok(body.usage.input_tokens > 0);
    assert.equal(response.headers.get("x-sluice-replica")?.startsWith("sim-"), true);
    assertIdle(scheduler);
  });

  test("streamed: the Responses API's events, in order, ending with the terminal event and no [DONE]", async () => {
    const { call, scheduler } = harness();
    const { response, text } = await call("/v1/responses", post(responsesBody({ stream: true })));
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type") ?? "", /text\/event-stream/);
    const events = parseSse(text);
    const types = events.map((e) => e.event);
    assert.deepEqual(types.slice(0, 4), [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
    ]);
    assert.equal(types.at(-1), "response.incomplete");
    assert.ok(types.includes("response.output_text.delta"));
    assert.ok(!text.includes("[DONE]"), "the Responses API has no [DONE]");
    const payloads = events.map((e) => JSON.parse(e.data) as Record<string, unknown>);
    for (const [i, p] of payloads.entries()) {
      assert.equal(p.type, types[i], "event name and payload type agree");
      assert.equal(p.sequence_number, i);
    }
    const deltas = payloads
      .filter((p) => p.type === "response.output_text.delta")
      .map((p) => p.delta as string);
    const last = payloads.at(-1)!.response as { output: { content: { text: string }[] }[]; usage: unknown };
    assert.equal(last.output[0]!.content[0]!.text, deltas.join(""));
    assertIdle(scheduler);
  });

  test("previous_response_id goes to the replica that produced it, in the session of the call that did", async () => {
    const { call, scheduler } = harness();
    const first = await call("/v1/responses", post(responsesBody(), { "x-session-id": "agent-7" }));
    const home = first.response.headers.get("x-sluice-replica");
    const id = first.json().id as string;
    // Spread other work so placement alone would not keep the chain home.
    for (let i = 0; i < 6; i++) {
      const other = await call("/v1/responses", post(responsesBody({ input: `unrelated task ${i}` })));
      assert.equal(other.response.status, 200);
    }
    const seen = new Set<string>();
    let previous = id;
    for (let step = 0; step < 4; step++) {
      const next = await call(
        "/v1/responses",
        post(responsesBody({ input: `step ${step}`, previous_response_id: previous })),
      );
      assert.equal(next.response.status, 200, next.text);
      seen.add(next.response.headers.get("x-sluice-replica") ?? "");
      assert.equal(next.json().previous_response_id, previous);
      previous = next.json().id;
    }
    assert.deepEqual([...seen], [home]);
    // The calls without a session header continued agent-7's session.
    assert.equal(scheduler.getSession("agent-7")?.steps, 5);
    assert.equal(scheduler.closeSession("agent-7"), true);
    assertIdle(scheduler);
  });

  test("a chain without a session key stays on its replica too, wherever placement would send its input", async () => {
    const { call, scheduler } = harness();
    const homes = new Map<string, string>();
    // Two chains started side by side: with two replicas, they start on different ones or share one.
    let chains = [] as { id: string; home: string }[];
    for (let c = 0; c < 4; c++) {
      const first = await call("/v1/responses", post(responsesBody({ input: `chain ${c} opens` })));
      chains.push({ id: first.json().id, home: first.response.headers.get("x-sluice-replica")! });
    }
    assert.equal(new Set(chains.map((c) => c.home)).size, 2, "the openers were spread over both replicas");
    for (let step = 0; step < 3; step++) {
      chains = await Promise.all(
        chains.map(async (chain) => {
          const next = await call(
            "/v1/responses",
            post(responsesBody({ input: `s${step}`, previous_response_id: chain.id })),
          );
          assert.equal(next.response.status, 200, next.text);
          homes.set(next.json().id, chain.home);
          assert.equal(next.response.headers.get("x-sluice-replica"), chain.home);
          return { id: next.json().id as string, home: chain.home };
        }),
      );
    }
    assert.equal(homes.size, 12);
    assertIdle(scheduler);
  });

  test("the engine's stored conversation is continued: the replica runs the previous context before the new input", async () => {
    const { call, engines } = harness({ replicas: 1 });
    const first = await call("/v1/responses", post(responsesBody()));
    const second = await call(
      "/v1/responses",
      post(responsesBody({ input: "again", previous_response_id: first.json().id })),
    );
    const usage = second.json().usage as {
      input_tokens: number;
      input_tokens_details: { cached_tokens: number };
    };
    assert.ok(
      usage.input_tokens > first.json().usage.input_tokens + 8,
      "the previous prompt and output come first",
    );
    assert.ok(usage.input_tokens_details.cached_tokens > 0, "and hit the replica's prefix cache");
    assert.equal(engines.length, 1);
  });

  test("409 response_state_lost when the replica holding the previous response is unhealthy; nothing leaks", async () => {
    const { call, scheduler, clock, down } = harness();
    const first = await call("/v1/responses", post(responsesBody(), { "x-session-id": "lost-1" }));
    const home = first.response.headers.get("x-sluice-replica")!;
    down.add(home);
    await clock.advanceAsync(3_000);
    const next = await call("/v1/responses", post(responsesBody({ previous_response_id: first.json().id })));
    const error = assertRefusal(next.response, next.text, 409, "response_state_lost", {
      param: "previous_response_id",
    });
    assert.match(error.message as string, new RegExp(home));
    assert.equal(error.type, "invalid_request_error");
    // The same history sent whole (no previous_response_id) runs on the replica that is left.
    const resent = await call("/v1/responses", post(responsesBody()));
    assert.equal(resent.response.status, 200);
    assert.notEqual(resent.response.headers.get("x-sluice-replica"), home);
    const state = (await call("/v1/admin/state")).json();
    assert.equal(state.rejections.response_state_lost, 1);
    const metrics = (await call("/metrics")).text;
    assert.match(metrics, /reason="response_state_lost"/);
    scheduler.closeSession("lost-1");
    assertIdle(scheduler);
  });

  test("a previous_response_id sluice never saw is routed, and the replica's own 'not found' is a 409", async () => {
    const { call, scheduler } = harness({ replicas: 1 });
    const next = await call("/v1/responses", post(responsesBody({ previous_response_id: "resp_unknown" })));
    const error = assertRefusal(next.response, next.text, 409, "response_state_lost");
    assert.match(error.message as string, /Response with id 'resp_unknown' not found\./);
    assertIdle(scheduler);
  });

  test("another tenant's previous_response_id reaches the replica but never joins the producer's session", async () => {
    const { call, scheduler } = harness({
      keys: { "sk-tenant-a-123": { tenant: "a" }, "sk-tenant-b-456": { tenant: "b" } },
    });
    const asA = { authorization: "Bearer sk-tenant-a-123" };
    const first = await call("/v1/responses", post(responsesBody(), { ...asA, "x-session-id": "a-agent" }));
    assert.equal(first.response.status, 200, first.text);
    const mine = await call(
      "/v1/responses",
      post(responsesBody({ previous_response_id: first.json().id }), asA),
    );
    assert.equal(mine.response.status, 200, mine.text);
    assert.equal(
      scheduler.getSession("a-agent", "a")?.steps,
      2,
      "the producer's tenant continues its session",
    );
    const theirs = await call(
      "/v1/responses",
      post(responsesBody({ previous_response_id: mine.json().id }), {
        authorization: "Bearer sk-tenant-b-456",
      }),
    );
    assert.equal(theirs.response.status, 200, theirs.text);
    assert.equal(
      theirs.response.headers.get("x-sluice-replica"),
      first.response.headers.get("x-sluice-replica"),
    );
    assert.equal(scheduler.getSession("a-agent", "a")?.steps, 2, "another tenant's call is not a step of it");
    scheduler.closeSession("a-agent", "a");
    assertIdle(scheduler);
  });

  test("conversation is a session key, as a string or { id }", async () => {
    const { call, scheduler } = harness();
    await call("/v1/responses", post(responsesBody({ conversation: "conv_abc" })));
    await call("/v1/responses", post(responsesBody({ conversation: { id: "conv_abc" } })));
    assert.equal(scheduler.getSession("conv_abc")?.steps, 2);
    // A session header wins over the body.
    await call(
      "/v1/responses",
      post(responsesBody({ conversation: "conv_abc" }), { "x-session-id": "hdr-1" }),
    );
    assert.equal(scheduler.getSession("hdr-1")?.steps, 1);
    scheduler.closeSession("conv_abc");
    scheduler.closeSession("hdr-1");
    assertIdle(scheduler);
  });

  test("bad bodies are 400 invalid_request naming the field", async () => {
    const { call, scheduler } = harness();
    for (const [body, param] of [
      [{ model: MODEL }, "input"],
      [{ model: MODEL, input: [] }, "input"],
      [responsesBody({ max_output_tokens: 0 }), "max_output_tokens"],
      [responsesBody({ previous_response_id: "has space" }), "previous_response_id"],
      [responsesBody({ conversation: { id: "" } }), "conversation"],
      [responsesBody({ background: true }), "background"],
    ] as const) {
      const out = await call("/v1/responses", post(body));
      const error = assertRefusal(out.response, out.text, 400, "invalid_request");
      assert.match(String(error.param), new RegExp(`^${param}`), out.text);
    }
    assertIdle(scheduler);
  });

  test("input items (messages, tool calls and their outputs, reasoning) are tokenized and counted", async () => {
    const { call, scheduler } = harness();
    const input = [
      { role: "user", content: [{ type: "input_text", text: "list the files" }] },
      { type: "reasoning", id: "rs_1", summary: [{ type: "summary_text", text: "I should call ls" }] },
      { type: "function_call", call_id: "call_1", name: "shell", arguments: '{"cmd":"ls"}' },
      { type: "function_call_output", call_id: "call_1", output: "a.txt\nb.txt" },
      { type: "message", role: "assistant", content: [{ type: "output_text", text: "two files" }] },
    ];
    const out = await call("/v1/responses", post(responsesBody({ input })));
    assert.equal(out.response.status, 200, out.text);
    const small = await call("/v1/responses", post(responsesBody({ input: "list the files" })));
    assert.ok(out.json().usage.input_tokens > small.json().usage.input_tokens);
    assertIdle(scheduler);
  });
});
