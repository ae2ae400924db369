/** @module The NATS API against a real nats-server: discovery, chat, streaming, refusals, events, requesters that leave. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { connect, createInbox, Empty, type NatsConnection } from "nats";
import { type NatsServerProcess, startNatsServer } from "../../adapters/nats/nats-server-process.js";
import { HEADERS, SUBJECTS } from "../../adapters/nats/protocol.js";
import { type NatsService, startNatsService } from "../../adapters/nats/service.js";
import type { Scheduler } from "../../src/scheduler.js";
import type { SchedulerEvents } from "../../src/types.js";
import {
  assertServiceError,
  chatBody,
  eventually,
  fastSim,
  hdrs,
  json,
  MODEL,
  makeScheduler,
  streamMessages,
} from "./nats-harness.js";

let server: NatsServerProcess;
let serverNc: NatsConnection;
let client: NatsConnection;

before(async () => {
  server = await startNatsServer();
  serverNc = await connect({ servers: server.url });
  client = await connect({ servers: server.url });
});

after(async () => {
  await client?.close();
  await serverNc?.close();
  await server?.close();
});

/** One scheduler and service for a group of tests, torn down (and checked idle) after them. */
function useService(config: Parameters<typeof makeScheduler>[0] = {}) {
  const ctx = {} as { scheduler: Scheduler; service: NatsService; finished: { outcome: string }[] };
  before(async () => {
    const { scheduler } = makeScheduler(config);
    ctx.scheduler = scheduler;
    ctx.finished = [];
    const events: SchedulerEvents = { finished: (e) => ctx.finished.push({ outcome: e.outcome }) };
    scheduler.addEvents(events);
    ctx.service = await startNatsService({ nc: serverNc, scheduler, probeIntervalMs: 20 });
  });
  after(async () => {
    await ctx.service.stop();
    await ctx.scheduler.stop();
  });
  return ctx;
}

describe("a frontend with one replica", () => {
  const ctx = useService();

  test("is discoverable through $SRV.PING, $SRV.INFO and $SRV.STATS", async () => {
    const ping = (await client.request("$SRV.PING.sluice", Empty, { timeout: 2000 })).json<
      Record<string, unknown>
    >();
    assert.equal(ping.name, "sluice");
    assert.equal(ping.type, "io.nats.micro.v1.ping_response");
    const info = (await client.request("$SRV.INFO.sluice", Empty, { timeout: 2000 })).json<{
      name: string;
      endpoints: { subject: string; queue_group: string }[];
    }>();
    assert.equal(info.name, "sluice");
    const subjects = info.endpoints.map((e) => e.subject).sort();
    assert.deepEqual(
      subjects,
      [
        SUBJECTS.chat,
        SUBJECTS.responses,
        SUBJECTS.sessionsClose,
        SUBJECTS.sessionsGet,
        SUBJECTS.sessionsOpen,
      ].sort(),
    );
    for (const endpoint of info.endpoints) assert.equal(endpoint.queue_group, "sluice");
    const stats = (await client.request("$SRV.STATS.sluice", Empty, { timeout: 2000 })).json<{
      endpoints: { name: string; num_requests: number }[];
    }>();
    assert.equal(stats.endpoints.length, 5);
  });

  test("answers a chat call with the completion JSON and its routing headers", async () => {
    const reply = await client.request(SUBJECTS.chat, json(chatBody("hello there")), {
      timeout: 10_000,
      headers: hdrs({ [HEADERS.requestId]: "req-nats-1" }),
    });
    assert.equal(reply.headers?.get(HEADERS.serviceErrorCode), "", reply.string());
    const body = reply.json<{
      object: string;
      choices: { message: { content: string } }[];
      usage: Record<string, number>;
    }>();
    assert.equal(body.object, "chat.completion");
    assert.ok(body.choices[0]!.message.content.length > 0);
    assert.equal(body.usage.completion_tokens, 8);
    assert.equal(reply.headers?.get(HEADERS.requestId), "req-nats-1");
    assert.equal(reply.headers?.get(HEADERS.replica), "sim-0");
    assert.equal(reply.headers?.get(HEADERS.lane), "interactive");
    assert.match(reply.headers?.get(HEADERS.queueMs) ?? "", /^[0-9]+$/);
  });

  test("streams one message per chunk in order, then the done marker", async () => {
    const body = chatBody("stream this please", { max_tokens: 12 });
    const whole = (await client.request(SUBJECTS.chat, json(body), { timeout: 10_000 })).json<{
      choices: { message: { content: string } }[];
    }>();
    const messages = await streamMessages(client, SUBJECTS.chat, body, { [HEADERS.requestId]: "req-stream" });
    const done = messages.at(-1)!;
    assert.equal(done.headers?.get(HEADERS.done), "true");
    assert.equal(done.data.byteLength, 0);
    assert.equal(done.headers?.get(HEADERS.requestId), "req-stream");
    type Chunk = {
      id: string;
      object: string;
      choices: { delta: { role?: string; content?: string }; finish_reason: string | null }[];
    };
    const chunks = messages.slice(0, -1).map((m) => m.json<Chunk>());
    assert.ok(chunks.length >= 3, `expected several chunks, got ${chunks.length}`);
    for (const chunk of chunks) {
      assert.equal(chunk.object, "chat.completion.chunk");
      assert.equal(chunk.id, "chatcmpl-req-stream");
    }
    assert.equal(chunks[0]!.choices[0]!.delta.role, "assistant");
    assert.equal(messages[0]!.headers?.get(HEADERS.replica), "sim-0");
    const last = chunks.at(-1)!;
    assert.equal(last.choices[0]!.finish_reason, "length");
    for (const chunk of chunks.slice(0, -1)) assert.equal(chunk.choices[0]!.finish_reason, null);
    // The simulator answers a prompt deterministically: the streamed text is the whole answer, in order.
    const text = chunks.map((c) => c.choices[0]!.delta.content ?? "").join("");
    assert.equal(text, whole.choices[0]!.message.content);
  });

  test("ends a stream with a usage chunk when asked", async () => {
    const messages = await streamMessages(
      client,
      SUBJECTS.chat,
      chatBody("with usage", { stream_options: { include_usage: true } }),
    );
    const usage = messages.at(-2)!.json<{ choices: unknown[]; usage: { completion_tokens: number } }>();
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, 8);
  });

  test("refuses an unknown model, a context overflow, bad JSON and a bad schema as service errors", async () => {
    const cases: [Uint8Array, number, string][] = [
      [json(chatBody("x", { model: "no-such-model" })), 404, "model_not_found"],
      [json(chatBody("x", { max_tokens: 200_000 })), 413, "context_limit"],
      [new TextEncoder().encode("{not json"), 400, "invalid_request"],
      [json({ model: MODEL, messages: [] }), 400, "invalid_request"],
      [Empty, 400, "invalid_request"],
    ];
    for (const [data, status, code] of cases) {
      const reply = await client.request(SUBJECTS.chat, data, { timeout: 5000 });
      assertServiceError(reply, status, code);
    }
    const schema = await client.request(SUBJECTS.chat, json({ model: MODEL, messages: [] }), {
      timeout: 5000,
    });
    assert.equal(assertServiceError(schema, 400, "invalid_request").param, "messages");
    const lane = await client.request(SUBJECTS.chat, json(chatBody("x")), {
      timeout: 5000,
      headers: hdrs({ [HEADERS.lane]: "urgent" }),
    });
    assert.equal(assertServiceError(lane, 400, "invalid_request").param, HEADERS.lane);
  });

  test("a refusal of a streamed call is a service error followed by the done marker", async () => {
    const messages = await streamMessages(client, SUBJECTS.chat, chatBody("x", { model: "nope" }));
    assert.equal(messages.length, 2);
    assertServiceError(messages[0]!, 404, "model_not_found");
    assert.equal(messages[1]!.headers?.get(HEADERS.done), "true");
  });

  test("opens, reads and closes sessions, and refuses unknown ones", async () => {
    const opened = (
      await client.request(SUBJECTS.sessionsOpen, json({ id: "s-api", lane: "interactive" }), {
        timeout: 5000,
      })
    ).json<Record<string, unknown>>();
    assert.deepEqual(opened, { id: "s-api", state: "waiting" });
    const generated = (await client.request(SUBJECTS.sessionsOpen, Empty, { timeout: 5000 })).json<{
      id: string;
    }>();
    assert.match(generated.id, /^sess-/);
    await client.request(SUBJECTS.chat, json(chatBody("step one")), {
      timeout: 10_000,
      headers: hdrs({ [HEADERS.session]: "s-api" }),
    });
    const view = (await client.request(SUBJECTS.sessionsGet, json({ id: "s-api" }), { timeout: 5000 })).json<
      Record<string, unknown>
    >();
    assert.equal(view.state, "active");
    assert.equal(view.replica, "sim-0");
    assert.equal(view.steps, 1);
    assert.equal(view.lane, "interactive");
    const closed = (
      await client.request(SUBJECTS.sessionsClose, json({ id: "s-api" }), { timeout: 5000 })
    ).json<Record<string, unknown>>();
    assert.deepEqual(closed, { id: "s-api", state: "closed" });
    for (const subject of [SUBJECTS.sessionsGet, SUBJECTS.sessionsClose]) {
      assertServiceError(
        await client.request(subject, json({ id: "never-opened" }), { timeout: 5000 }),
        404,
        "session_not_found",
      );
    }
    assertServiceError(
      await client.request(SUBJECTS.sessionsGet, json({}), { timeout: 5000 }),
      400,
      "invalid_request",
    );
    assertServiceError(
      await client.request(SUBJECTS.sessionsOpen, json({ id: "bad id" }), { timeout: 5000 }),
      400,
      "invalid_request",
    );
    await client.request(SUBJECTS.sessionsClose, json({ id: generated.id }), { timeout: 5000 });
  });

  test("publishes session state changes on sluice.v1.events.session.<id>", async () => {
    const events: { id: string; event: string; replica: string | null }[] = [];
    const sub = client.subscribe("sluice.v1.events.session.>", {
      callback: (_err, msg) => events.push(msg.json()),
    });
    await client.flush();
    await client.request(SUBJECTS.chat, json(chatBody("evented")), {
      timeout: 10_000,
      headers: hdrs({ [HEADERS.session]: "s.ev*1" }),
    });
    await client.request(SUBJECTS.sessionsClose, json({ id: "s.ev*1" }), { timeout: 5000 });
    await eventually(() => events.length >= 2, "two session events");
    sub.unsubscribe();
    assert.deepEqual(
      events.map((e) => [e.id, e.event, e.replica]),
      [
        ["s.ev*1", "admitted", "sim-0"],
        ["s.ev*1", "closed", "sim-0"],
      ],
    );
  });

  test("cancels a streamed call whose requester left mid-stream", async () => {
    const before = ctx.finished.length;
    const inbox = createInbox();
    const sub = client.subscribe(inbox);
    client.publish(SUBJECTS.chat, json(chatBody("a long answer", { max_tokens: 4000 })), {
      reply: inbox,
      headers: hdrs({ [HEADERS.stream]: "true" }),
    });
    let seen = 0;
    for await (const _msg of sub) {
      if (++seen === 3) break;
    }
    sub.unsubscribe();
    await eventually(() => ctx.finished.length > before, "the call ended");
    assert.equal(ctx.finished.at(-1)!.outcome, "cancelled");
    await eventually(() => ctx.scheduler.idleCheck().permits === 0, "permits released");
    assert.deepEqual(ctx.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
  });

  test("cancels a call whose requester's stated timeout passed", async () => {
    const before = ctx.finished.length;
    await assert.rejects(
      client.request(SUBJECTS.chat, json(chatBody("slow", { max_tokens: 4000 })), {
        timeout: 300,
        headers: hdrs({ [HEADERS.timeoutMs]: "300" }),
      }),
    );
    await eventually(() => ctx.finished.length > before, "the call ended");
    assert.equal(ctx.finished.at(-1)!.outcome, "cancelled");
    assert.deepEqual(ctx.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
  });
});

describe("a frontend whose gate has tiny limits", () => {
  const ctx = useService({
    engines: [fastSim("sim-tiny")],
    config: { gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 0 } },
  });

  test("refuses the second concurrent call with 529 worker_overloaded and Retry-After", async () => {
    const inbox = createInbox();
    const sub = client.subscribe(inbox);
    client.publish(SUBJECTS.chat, json(chatBody("hold the gate", { max_tokens: 2000 })), {
      reply: inbox,
      headers: hdrs({ [HEADERS.stream]: "true" }),
    });
    const iterator = sub[Symbol.asyncIterator]();
    await iterator.next();
    const refused = await client.request(SUBJECTS.chat, json(chatBody("one more")), { timeout: 5000 });
    const error = assertServiceError(refused, 529, "worker_overloaded");
    assert.equal(error.type, "overloaded_error");
    sub.unsubscribe();
    await eventually(() => ctx.scheduler.idleCheck().permits === 0, "the held permit was released");
    assert.deepEqual(ctx.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
  });
});

describe("the Responses API over NATS", () => {
  const ctx = useService({ engines: [fastSim("sim-0"), fastSim("sim-1")] });
  const responsesBody = (extra: Record<string, unknown> = {}) => ({
    model: MODEL,
    input: "write a haiku about queues",
    max_output_tokens: 8,
    ...extra,
  });

  test("answers with the replica's Response object, byte for byte as it sent it", async () => {
    const reply = await client.request(
      SUBJECTS.responses,
      json(responsesBody({ instructions: "be brief" })),
      {
        timeout: 10_000,
        headers: hdrs({ [HEADERS.requestId]: "req-resp-1" }),
      },
    );
    assert.equal(reply.headers?.get(HEADERS.serviceErrorCode), "", reply.string());
    const body = reply.json<{
      id: string;
      object: string;
      instructions: string;
      output: { type: string }[];
    }>();
    assert.equal(body.object, "response");
    assert.match(body.id, /^resp_/);
    assert.equal(body.instructions, "be brief");
    assert.equal(body.output[0]!.type, "message");
    assert.match(reply.headers?.get(HEADERS.replica) ?? "", /^sim-/);
    assert.equal(reply.headers?.get(HEADERS.requestId), "req-resp-1");
  });

  test("streams the Responses API's own events, one message each, then the done marker", async () => {
    const messages = await streamMessages(client, SUBJECTS.responses, responsesBody({ stream: true }));
    assert.equal(messages.at(-1)!.headers?.get(HEADERS.done), "true");
    const events = messages.slice(0, -1).map((m) => m.json<{ type: string; sequence_number: number }>());
    assert.deepEqual(
      events.slice(0, 2).map((e) => e.type),
      ["response.created", "response.in_progress"],
    );
    assert.equal(events.at(-1)!.type, "response.incomplete");
    assert.ok(events.some((e) => e.type === "response.output_text.delta"));
    for (const [i, event] of events.entries())
      assert.equal(event.sequence_number, i, "no event of sluice's own");
  });

  test("previous_response_id keeps a chain on the replica that holds it, in its session", async () => {
    const first = await client.request(SUBJECTS.responses, json(responsesBody()), {
      timeout: 10_000,
      headers: hdrs({ [HEADERS.session]: "nats-resp-agent" }),
    });
    const home = first.headers?.get(HEADERS.replica);
    let previous = first.json<{ id: string }>().id;
    for (let step = 0; step < 3; step++) {
      const next = await client.request(
        SUBJECTS.responses,
        json(responsesBody({ input: `step ${step}`, previous_response_id: previous })),
        { timeout: 10_000 },
      );
      assert.equal(next.headers?.get(HEADERS.serviceErrorCode), "", next.string());
      assert.equal(next.headers?.get(HEADERS.replica), home);
      // Sent without a key, counted in the session of the response it continues.
      assert.equal(next.headers?.get(HEADERS.session), "nats-resp-agent");
      assert.equal(next.headers?.get(HEADERS.sessionSource), "body");
      previous = next.json<{ id: string }>().id;
    }
    assert.equal(ctx.scheduler.getSession("nats-resp-agent")?.steps, 4);
    assert.equal(ctx.scheduler.closeSession("nats-resp-agent"), true);
  });

  test("a bad body is a 400 naming the field, and nothing is left held", async () => {
    const reply = await client.request(
      SUBJECTS.responses,
      json(responsesBody({ previous_response_id: "has space" })),
      {
        timeout: 10_000,
      },
    );
    const error = assertServiceError(reply, 400, "invalid_request");
    assert.equal(error.param, "previous_response_id");
    await eventually(
      () =>
        ctx.scheduler.state().replicas.every((r) => r.gate.requests === 0 && r.budget.reservedTokens === 0),
      "no permit or reservation held",
    );
  });
});
