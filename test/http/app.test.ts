/** @module The HTTP API in process (`app.request`), over a real scheduler and simulated replicas in virtual time. */

import assert from "node:assert/strict";
import { afterEach, describe, test } from "node:test";
import { Registry } from "prom-client";
import { StateHistory } from "../../adapters/dashboard/history.js";
import { ApiKeys } from "../../adapters/http/api-keys.js";
import { createApp } from "../../adapters/http/app.js";
import { VirtualClock } from "../../src/clock.js";
import {
  assertIdle,
  assertRefusal,
  chat,
  failingAfter,
  type Harness,
  MODEL,
  makeHarness,
  parseSse,
  rawSse,
} from "./harness.js";
import { StubScheduler } from "./stub-scheduler.js";

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

function harness(options: Parameters<typeof makeHarness>[0] = {}): Harness {
  h = makeHarness(options);
  return h;
}

describe("completions", () => {
  test("non-streaming chat returns OpenAI JSON with usage and the sluice headers", async () => {
    const { call, scheduler } = harness();
    const { response, json } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 5 }),
      headers: { "x-request-id": "abc-123" },
    });
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("x-request-id"), "abc-123");
    assert.equal(response.headers.get("x-sluice-lane"), "interactive");
    assert.match(response.headers.get("x-sluice-replica") ?? "", /^sim-[01]$/);
    assert.match(response.headers.get("x-sluice-queue-ms") ?? "", /^[0-9]+$/);
    const body = json();
    assert.equal(body.object, "chat.completion");
    assert.equal(body.model, MODEL);
    assert.equal(body.choices[0].message.role, "assistant");
    assert.ok(body.choices[0].message.content.length > 0);
    assert.equal(body.choices[0].finish_reason, "length");
    assert.equal(body.usage.completion_tokens, 5);
    assert.ok(body.usage.prompt_tokens > 0);
    assert.equal(body.usage.total_tokens, body.usage.prompt_tokens + 5);
    assert.equal(typeof body.usage.prompt_tokens_details.cached_tokens, "number");
    assertIdle(scheduler);
  });

  test("streaming chat sends SSE chunks, a finish chunk, the usage chunk and one [DONE]", async () => {
    const { call, scheduler } = harness();
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 6, stream: true, stream_options: { include_usage: true } }),
    });
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type") ?? "", /^text\/event-stream/);
    assert.equal(response.headers.get("x-sluice-lane"), "interactive");
    const events = parseSse(text);
    assert.equal(events.at(-1)?.data, "[DONE]");
    assert.equal(events.filter((e) => e.data === "[DONE]").length, 1);
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.data));
    assert.equal(chunks[0].object, "chat.completion.chunk");
    assert.equal(chunks[0].choices[0].delta.role, "assistant");
    const content = chunks.flatMap((c) => (c.choices[0]?.delta?.content ? [c.choices[0].delta.content] : []));
    assert.ok(content.join("").length > 0);
    const finish = chunks.find((c) => c.choices[0]?.finish_reason);
    assert.equal(finish.choices[0].finish_reason, "length");
    const usage = chunks.at(-1);
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, 6);
    assertIdle(scheduler);
  });

  test("legacy completions accept a text prompt and a token prompt", async () => {
    const { call, scheduler } = harness();
    const text = await call("/v1/completions", {
      method: "POST",
      json: { model: MODEL, prompt: "Once upon a time", max_tokens: 4 },
    });
    assert.equal(text.response.status, 200);
    assert.equal(text.json().object, "text_completion");
    assert.equal(text.json().usage.completion_tokens, 4);
    assert.ok(text.json().choices[0].text.length > 0);
    const tokens = await call("/v1/completions", {
      method: "POST",
      json: { model: MODEL, prompt: [1, 2, 3, 4, 5, 6, 7], max_tokens: 3, stream: true },
    });
    assert.equal(tokens.response.status, 200);
    const events = parseSse(tokens.text);
    assert.equal(JSON.parse(events[0]!.data).object, "text_completion");
    assert.equal(events.at(-1)?.data, "[DONE]");
    assertIdle(scheduler);
  });

  test("a missing or unsafe x-request-id is replaced by a generated one", async () => {
    const { call } = harness();
    const generated = await call("/healthz");
    assert.match(generated.response.headers.get("x-request-id") ?? "", /^req-[0-9a-f-]{36}$/);
    const tooLong = await call("/healthz", { headers: { "x-request-id": "x".repeat(129) } });
    assert.notEqual(tooLong.response.headers.get("x-request-id"), "x".repeat(129));
    assert.match(tooLong.response.headers.get("x-request-id") ?? "", /^req-/);
    const exact = await call("/healthz", { headers: { "x-request-id": "y".repeat(128) } });
    assert.equal(exact.response.headers.get("x-request-id"), "y".repeat(128));
  });

  test("a declared bulk lane is honoured and returned", async () => {
    const { call } = harness();
    const { response } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat(),
      headers: { "x-sluice-lane": "bulk" },
    });
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("x-sluice-lane"), "bulk");
  });
});

describe("models, health, admin", () => {
  test("GET /v1/models lists the replicas' model with its context window", async () => {
    const { call } = harness();
    const { response, json } = await call("/v1/models");
    assert.equal(response.status, 200);
    const body = json();
    assert.equal(body.object, "list");
    assert.deepEqual(
      body.data.map((m: { id: string }) => m.id),
      [MODEL],
    );
    assert.equal(body.data[0].object, "model");
    assert.ok(body.data[0].max_model_len > 0);
  });

  test("healthz, readyz, admin state and dashboard answer", async () => {
    const { call } = harness();
    assert.equal((await call("/healthz")).response.status, 200);
    const ready = await call("/readyz");
    assert.equal(ready.response.status, 200);
    assert.equal(ready.json().replicas, 2);
    const state = await call("/v1/admin/state");
    assert.equal(state.response.status, 200);
    assert.equal(state.json().replicas.length, 2);
    assert.equal(state.json().policy, "sluice");
    const page = await call("/dashboard");
    assert.equal(page.response.status, 200);
    assert.match(page.response.headers.get("content-type") ?? "", /text\/html/);
    assert.match(page.text, /<svg|sluice-config/);
    assert.doesNotMatch(page.text, /<script[^>]+src=/, "the dashboard must not load external scripts");
  });

  test("readyz is 503 unavailable with Retry-After when no replica is healthy, and calls are refused", async () => {
    const { call } = harness({
      wrap: (engine) =>
        Object.assign(Object.create(engine) as typeof engine, {
          signals: () => ({ ...engine.signals(), healthy: false }),
        }),
    });
    const ready = await call("/readyz");
    assertRefusal(ready.response, ready.text, 503, "unavailable");
    const completion = await call("/v1/chat/completions", { method: "POST", json: chat() });
    assertRefusal(completion.response, completion.text, 503, "unavailable");
  });

  test("no CORS unless configured; configured origins get preflight answers and exposed headers", async () => {
    const plain = harness();
    const none = await plain.call("/v1/models", { headers: { origin: "https://app.example" } });
    assert.equal(none.response.headers.get("access-control-allow-origin"), null);
    await plain.close();
    const { call } = harness({ cors: { origins: ["https://app.example"] } });
    const preflight = await call("/v1/chat/completions", {
      method: "OPTIONS",
      headers: {
        origin: "https://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "x-session-id",
      },
    });
    assert.equal(preflight.response.headers.get("access-control-allow-origin"), "https://app.example");
    assert.match(preflight.response.headers.get("access-control-allow-headers") ?? "", /x-session-id/);
    const asyncPreflight = await call("/v1/chat/completions", {
      method: "OPTIONS",
      headers: {
        origin: "https://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "prefer, idempotency-key",
      },
    });
    const allowed = asyncPreflight.response.headers.get("access-control-allow-headers") ?? "";
    assert.match(allowed, /prefer/);
    assert.match(allowed, /idempotency-key/);
    const simple = await call("/v1/models", { headers: { origin: "https://app.example" } });
    assert.match(simple.response.headers.get("access-control-expose-headers") ?? "", /x-sluice-replica/);
    assert.match(simple.response.headers.get("access-control-expose-headers") ?? "", /location/);
    const other = await call("/v1/models", { headers: { origin: "https://evil.example" } });
    assert.notEqual(other.response.headers.get("access-control-allow-origin"), "https://evil.example");
  });

  test("unknown routes are a JSON 404", async () => {
    const { call } = harness();
    const { response, json } = await call("/v2/nothing");
    assert.equal(response.status, 404);
    assert.equal(json().error.type, "not_found_error");
  });
});

describe("sessions", () => {
  test("open, step, inspect and close a session", async () => {
    const { call, scheduler } = harness();
    const opened = await call("/v1/sessions", {
      method: "POST",
      json: { id: "agent-1", lane: "interactive" },
    });
    assert.equal(opened.response.status, 201);
    assert.deepEqual(opened.json(), { id: "agent-1", state: "waiting" });
    const replicas = new Set<string>();
    for (let step = 0; step < 3; step++) {
      const { response } = await call("/v1/sessions/agent-1/chat/completions", {
        method: "POST",
        json: chat({ max_tokens: 4 }, 20 + step * 10),
      });
      assert.equal(response.status, 200);
      replicas.add(response.headers.get("x-sluice-replica") ?? "");
    }
    assert.equal(replicas.size, 1, "a session's steps stay on one replica");
    const view = await call("/v1/sessions/agent-1");
    assert.equal(view.response.status, 200);
    assert.equal(view.json().id, "agent-1");
    assert.equal(view.json().state, "active");
    assert.equal(view.json().steps, 3);
    assert.equal(view.json().replica, [...replicas][0]);
    assert.ok(view.json().tokens > 0);
    const closed = await call("/v1/sessions/agent-1", { method: "DELETE" });
    assert.equal(closed.response.status, 204);
    assert.equal(closed.text, "");
    assertIdle(scheduler);
    const again = await call("/v1/sessions/agent-1", { method: "DELETE" });
    assertRefusal(again.response, again.text, 404, "session_not_found");
  });

  test("POST /v1/sessions without a body opens a session with a generated id", async () => {
    const { call } = harness();
    const { response, json } = await call("/v1/sessions", { method: "POST" });
    assert.equal(response.status, 201);
    assert.equal(typeof json().id, "string");
    assert.equal(json().state, "waiting");
  });

  test("a session header opens a session implicitly and pins it", async () => {
    const { call } = harness();
    const first = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({}, 30),
      headers: { "x-claude-code-session-id": "cc-7" },
    });
    assert.equal(first.response.status, 200);
    const view = await call("/v1/sessions/cc-7");
    assert.equal(view.json().state, "active");
    assert.equal(view.json().replica, first.response.headers.get("x-sluice-replica"));
  });

  test("session headers are read in the documented order", async () => {
    const { call } = harness();
    await call("/v1/chat/completions", {
      method: "POST",
      json: chat(),
      headers: { "x-dynamo-session-id": "first", session_id: "last", "x-session-affinity": "middle" },
    });
    assert.equal((await call("/v1/sessions/first")).response.status, 200);
    assertRefusal(...(await refusal(call("/v1/sessions/middle"))), 404, "session_not_found");
    assertRefusal(...(await refusal(call("/v1/sessions/last"))), 404, "session_not_found");
  });
});

async function refusal(p: Promise<{ response: Response; text: string }>): Promise<[Response, string]> {
  const { response, text } = await p;
  return [response, text];
}

describe("refusals", () => {
  test("bad JSON is 400 invalid_request", async () => {
    const { call } = harness();
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      body: "{not json",
      headers: { "content-type": "application/json", "x-request-id": "bad-json" },
    });
    const error = assertRefusal(response, text, 400, "invalid_request", {
      param: null,
      requestId: "bad-json",
    });
    assert.equal(error.type, "invalid_request_error");
    assert.match(error.message as string, /JSON/);
  });

  test("schema errors are 400 invalid_request naming the field, never a raw zod dump", async () => {
    const { call } = harness();
    const missing = await call("/v1/chat/completions", { method: "POST", json: { model: MODEL } });
    const e1 = assertRefusal(missing.response, missing.text, 400, "invalid_request", { param: "messages" });
    assert.doesNotMatch(e1.message as string, /"code":|\[\s*\{/);
    const nested = await call("/v1/chat/completions", {
      method: "POST",
      json: { model: MODEL, messages: [{ role: 7, content: "x" }] },
    });
    assertRefusal(nested.response, nested.text, 400, "invalid_request", { param: "messages[0].role" });
    const range = await call("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: -3 }) });
    assertRefusal(range.response, range.text, 400, "invalid_request", { param: "max_tokens" });
    const temperature = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ temperature: 9 }),
    });
    assertRefusal(temperature.response, temperature.text, 400, "invalid_request", { param: "temperature" });
    const session = await call("/v1/sessions", { method: "POST", json: { lane: "fast" } });
    assertRefusal(session.response, session.text, 400, "invalid_request", { param: "lane" });
  });

  test("bad sluice headers are 400 invalid_request naming the header", async () => {
    const { call } = harness();
    const lane = await call("/v1/chat/completions", {
      method: "POST",
      json: chat(),
      headers: { "x-sluice-lane": "urgent" },
    });
    assertRefusal(lane.response, lane.text, 400, "invalid_request", { param: "x-sluice-lane" });
    const deadline = await call("/v1/chat/completions", {
      method: "POST",
      json: chat(),
      headers: { "x-sluice-deadline-ms": "soon" },
    });
    assertRefusal(deadline.response, deadline.text, 400, "invalid_request", {
      param: "x-sluice-deadline-ms",
    });
  });

  test("an unknown model is 404 model_not_found", async () => {
    const { call } = harness();
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ model: "gpt-9" }),
    });
    const error = assertRefusal(response, text, 404, "model_not_found", { param: "model" });
    assert.equal(error.type, "not_found_error");
  });

  test("an unknown session is 404 session_not_found", async () => {
    const { call } = harness();
    const get = await call("/v1/sessions/nope");
    assertRefusal(get.response, get.text, 404, "session_not_found");
    const step = await call("/v1/sessions/nope/chat/completions", { method: "POST", json: chat() });
    assertRefusal(step.response, step.text, 404, "session_not_found");
  });

  test("a body over the limit is 413 body_too_large, by content-length and while streaming in", async () => {
    const { call, request, drive } = harness({ bodyLimitBytes: 1024 });
    const big = JSON.stringify(chat({}, 600));
    const declared = await call("/v1/chat/completions", {
      method: "POST",
      body: big,
      headers: { "content-type": "application/json" },
    });
    assertRefusal(declared.response, declared.text, 413, "body_too_large");
    // No content-length: the limit must hold while reading, and the rest is never read.
    let pulled = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        pulled++;
        if (pulled > 1000) controller.close();
        else controller.enqueue(new TextEncoder().encode(" ".repeat(256)));
      },
    });
    const response = await drive(
      request("/v1/chat/completions", {
        method: "POST",
        body,
        headers: { "content-type": "application/json" },
        duplex: "half",
      } as RequestInit),
    );
    const text = await response.text();
    assertRefusal(response, text, 413, "body_too_large");
    assert.ok(pulled < 20, `the body was read on after the limit (${pulled} pulls)`);
  });

  test("input + max_tokens over the context window is 413 context_limit with limits", async () => {
    const { call } = harness({ config: { contextWindowTokens: 2048 } });
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 4000 }),
    });
    const error = assertRefusal(response, text, 413, "context_limit");
    assert.equal((error.limits as { max_total_tokens: number }).max_total_tokens, 2048);
  });

  test("a call beyond the bulk limit is 413 overflow", async () => {
    const { call, scheduler } = harness({ config: { lanes: { bulkMaxTotalTokens: 1500 } } });
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 1600 }),
    });
    const error = assertRefusal(response, text, 413, "overflow");
    assert.equal(error.lane, "overflow");
    assertIdle(scheduler);
  });

  test("a deadline the replica cannot meet is 429 deadline_infeasible", async () => {
    const { call, scheduler } = harness();
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({}, 3000),
      headers: { "x-sluice-deadline-ms": "1" },
    });
    assertRefusal(response, text, 429, "deadline_infeasible");
    assertIdle(scheduler);
  });

  test("a full gate is 529 worker_overloaded with Retry-After; counters return to zero", async () => {
    const { request, drive, scheduler, call } = harness({
      replicas: 1,
      config: { gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 0 } },
    });
    const holder = await drive(
      request("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 500, stream: true }) }),
    );
    assert.equal(holder.status, 200);
    const { response, text } = await call("/v1/chat/completions", { method: "POST", json: chat() });
    const error = assertRefusal(response, text, 529, "worker_overloaded");
    assert.equal(error.type, "overloaded_error");
    await holder.body!.cancel();
    assertIdle(scheduler);
  });

  test("the overload status is configurable", async () => {
    const { request, drive, scheduler, call } = harness({
      replicas: 1,
      config: { gate: { engineRequestLimit: 1, requestQueueLimit: 0, overloadStatus: 503 } },
    });
    const holder = await drive(
      request("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 500, stream: true }) }),
    );
    const { response, text } = await call("/v1/chat/completions", { method: "POST", json: chat() });
    assertRefusal(response, text, 503, "worker_overloaded");
    await holder.body!.cancel();
    assertIdle(scheduler);
  });

  test("a full lane queue is 429 queue_full; a queued call that outlives its lane is 429 queue_timeout", async () => {
    const { request, drive, scheduler, call, clock } = harness({
      replicas: 1,
      config: {
        gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 4 },
        lanes: { interactive: { queueLimit: 1, maxResidenceMs: 500 } },
      },
    });
    const holder = await drive(
      request("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 800, stream: true }) }),
    );
    assert.equal(holder.status, 200);
    const queued = request("/v1/chat/completions", { method: "POST", json: chat() });
    await clock.advanceAsync(0);
    const full = await call("/v1/chat/completions", { method: "POST", json: chat() });
    assertRefusal(full.response, full.text, 429, "queue_full");
    await clock.advanceAsync(600);
    const timedOut = await drive(queued);
    assertRefusal(timedOut, await timedOut.text(), 429, "queue_timeout");
    await holder.body!.cancel();
    assertIdle(scheduler);
  });

  test("a call the token budget cannot hold waits for room; x-sluice-queue-ttl-ms shortens the wait to a 429 token_budget_exhausted", async () => {
    const { request, drive, scheduler, call, clock } = harness({
      replicas: 1,
      config: { budget: { ceilingTokens: 10_000 } },
    });
    const holder = await drive(
      request("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 5000, stream: true }) }),
    );
    assert.equal(holder.status, 200);
    const from = clock.now();
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 5000 }),
      headers: { "x-sluice-queue-ttl-ms": "1500" },
    });
    assertRefusal(response, text, 429, "token_budget_exhausted");
    assert.ok(clock.now() - from >= 1500, "it waited its queue TTL first");
    assert.ok(Number(response.headers.get("retry-after")) >= 1);
    const bad = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 5000 }),
      headers: { "x-sluice-queue-ttl-ms": "soon" },
    });
    assertRefusal(bad.response, bad.text, 400, "invalid_request");
    const waiting = request("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 5000 }) });
    await clock.advanceAsync(1000);
    const metrics = await call("/metrics");
    assert.match(metrics.text, /sluice_budget_queue_calls\{replica="sim-0"\} 1\b/);
    assert.match(metrics.text, /sluice_budget_queue_oldest_age_seconds\{replica="sim-0"\} 1\b/);
    await holder.body!.cancel();
    const served = await drive(waiting);
    assert.equal(served.status, 200, "served once the holder let go of its budget");
    assert.ok(Number(served.headers.get("x-sluice-queue-ms")) >= 1000);
    await served.text();
    assertIdle(scheduler);
  });

  test("a full session queue is 429 session_queue_full", async () => {
    const { call, scheduler } = harness({
      replicas: 1,
      config: { window: { unit: "sessions", initial: 1, min: 1, max: 1 }, sessions: { queueLimit: 0 } },
    });
    const first = await call("/v1/chat/completions", {
      method: "POST",
      json: chat(),
      headers: { "x-session-id": "s1" },
    });
    assert.equal(first.response.status, 200);
    const second = await call("/v1/chat/completions", {
      method: "POST",
      json: chat(),
      headers: { "x-session-id": "s2" },
    });
    assertRefusal(second.response, second.text, 429, "session_queue_full");
    assert.equal((await call("/v1/sessions/s1", { method: "DELETE" })).response.status, 204);
    scheduler.closeSession("s2");
    assertIdle(scheduler);
  });
});

describe("API keys", () => {
  const keys = {
    "sk-team-a-0001": { tenant: "team-a", priority: 1, rps: 1, burst: 1 },
    "sk-ops-admin-01": { tenant: "ops", admin: true },
  };

  test("without a valid key every /v1 route is 401 unauthorized", async () => {
    const { call } = harness({ keys });
    const none = await call("/v1/chat/completions", { method: "POST", json: chat() });
    const error = assertRefusal(none.response, none.text, 401, "unauthorized");
    assert.equal(error.type, "authentication_error");
    const wrong = await call("/v1/models", { headers: { authorization: "Bearer sk-team-a-0002" } });
    assertRefusal(wrong.response, wrong.text, 401, "unauthorized");
    const right = await call("/v1/models", { headers: { authorization: "Bearer sk-team-a-0001" } });
    assert.equal(right.response.status, 200);
    assert.equal((await call("/healthz")).response.status, 200);
  });

  test("admin routes need an admin key (403 for a known key without the right); the dashboard also takes ?key=", async () => {
    const { call } = harness({ keys, adminKey: "root-admin-key" });
    const user = await call("/v1/admin/state", { headers: { authorization: "Bearer sk-team-a-0001" } });
    assert.equal(user.response.status, 403);
    assert.equal(JSON.parse(user.text).error.code, "unauthorized");
    const unknown = await call("/v1/admin/state", { headers: { authorization: "Bearer sk-nobody-0001" } });
    assertRefusal(unknown.response, unknown.text, 401, "unauthorized");
    const anonymous = await call("/dashboard");
    assertRefusal(anonymous.response, anonymous.text, 401, "unauthorized");
    const admin = await call("/v1/admin/state", { headers: { authorization: "Bearer root-admin-key" } });
    assert.equal(admin.response.status, 200);
    const flagged = await call("/v1/admin/state", { headers: { authorization: "Bearer sk-ops-admin-01" } });
    assert.equal(flagged.response.status, 200);
    const page = await call("/dashboard?key=root-admin-key");
    assert.equal(page.response.status, 200);
    assert.equal((await call("/metrics")).response.status, 200, "Prometheus scrapes /metrics without a key");
  });

  test("the per-key rate limit is 429 rate_limited with Retry-After, and refills with time", async () => {
    const { call, clock } = harness({ keys });
    const auth = { authorization: "Bearer sk-team-a-0001" };
    const first = await call("/v1/chat/completions", { method: "POST", json: chat(), headers: auth });
    assert.equal(first.response.status, 200);
    const second = await call("/v1/chat/completions", { method: "POST", json: chat(), headers: auth });
    const error = assertRefusal(second.response, second.text, 429, "rate_limited");
    assert.equal(error.type, "overloaded_error");
    assert.equal(second.response.headers.get("retry-after"), "1");
    await clock.advanceAsync(1000);
    const third = await call("/v1/chat/completions", { method: "POST", json: chat(), headers: auth });
    assert.equal(third.response.status, 200);
  });
});

describe("engine output", () => {
  test("raw upstream SSE bytes pass through untouched, with exactly one [DONE]", async () => {
    const { call, scheduler } = harness({ wrap: rawSse });
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 5, stream: true }),
    });
    assert.equal(response.status, 200);
    const events = parseSse(text);
    assert.equal(events.filter((e) => e.data === "[DONE]").length, 1);
    assert.equal(events.at(-1)?.data, "[DONE]");
    const upstream = events.slice(0, -1).map((e) => JSON.parse(e.data));
    assert.ok(upstream.length >= 1);
    for (const [i, event] of upstream.entries()) assert.equal(event.upstream, i);
    assert.ok(text.startsWith('data: {"upstream":0,'), "bytes are the upstream's own");
    assertIdle(scheduler);
  });

  test("an engine failure mid-stream ends the 200 stream with an SSE error event, then [DONE]", async () => {
    const { call, scheduler } = harness({ wrap: (engine) => failingAfter(engine, 2) });
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 20, stream: true }),
      headers: { "x-request-id": "mid-stream" },
    });
    assert.equal(response.status, 200);
    const events = parseSse(text);
    assert.equal(events.at(-1)?.data, "[DONE]");
    const error = events.at(-2)!;
    assert.equal(error.event, "error");
    const envelope = JSON.parse(error.data);
    assert.equal(envelope.error.request_id, "mid-stream");
    assert.equal(typeof envelope.error.code, "string");
    assert.match(envelope.error.message, /connection reset/);
    assert.equal(events.filter((e) => e.event === "message" && e.data !== "[DONE]").length, 2);
    assertIdle(scheduler);
  });

  test("an engine failure of a non-streaming call is an error response, not a 200", async () => {
    const { call, scheduler } = harness({ wrap: (engine) => failingAfter(engine, 1) });
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 20 }),
    });
    assertRefusal(response, text, 503, "unavailable");
    assertIdle(scheduler);
  });

  test("a client that cancels the response body mid-stream releases everything at once", async () => {
    const { request, drive, scheduler } = harness();
    const response = await drive(
      request("/v1/chat/completions", {
        method: "POST",
        json: chat({ max_tokens: 500, stream: true }),
        headers: { "x-session-id": "quitter" },
      }),
    );
    const reader = response.body!.getReader();
    await drive(reader.read());
    assert.equal(scheduler.idleCheck().permits > 0, true);
    await reader.cancel();
    const check = scheduler.idleCheck();
    assert.deepEqual(
      { ...check, windowSlots: 0 },
      { permits: 0, reservations: 0, windowSlots: 0, queued: 0 },
    );
    scheduler.closeSession("quitter");
    assertIdle(scheduler);
  });
});

describe("the app's own timers", () => {
  test("close() stops the dashboard history the app started, and leaves a history it was given running", async () => {
    const clock = new VirtualClock();
    const scheduler = new StubScheduler();
    const own = createApp({ scheduler, clock, registry: new Registry() });
    assert.equal(clock.pending(), 1, "the history samples on a timer");
    own.close();
    assert.equal(clock.pending(), 0, "nothing of the app is left on the clock");
    const history = new StateHistory({ scheduler, clock });
    const given = createApp({ scheduler, clock, registry: new Registry(), history });
    given.close();
    assert.equal(clock.pending(), 1, "the caller's history is the caller's to stop");
    history.stop();
    assert.equal(clock.pending(), 0);
  });
});

describe("plugins", () => {
  test("a plugin's routes run behind the app's key check and see the caller's identity", async () => {
    const scheduler = new StubScheduler();
    const keys = new ApiKeys({ "key-team-a-0001": { tenant: "team-a" } });
    const seen: (string | undefined)[] = [];
    const app = createApp({
      scheduler,
      clock: new VirtualClock(),
      registry: new Registry(),
      keys,
      plugins: [
        {
          mount(plugin, ctx) {
            plugin.get("/v1/whoami", ctx.requireKey, (c) => {
              seen.push(c.get("requestId"));
              return c.json({ tenant: c.get("identity")?.tenant });
            });
          },
        },
      ],
    });
    try {
      const refused = await app.request("/v1/whoami");
      assert.equal(refused.status, 401);
      assert.equal((await refused.json()).error.code, "unauthorized");
      const ok = await app.request("/v1/whoami", {
        headers: { authorization: "Bearer key-team-a-0001", "x-request-id": "req-plugin-1" },
      });
      assert.equal(ok.status, 200);
      assert.deepEqual(await ok.json(), { tenant: "team-a" });
      assert.deepEqual(seen, ["req-plugin-1"]);
    } finally {
      app.close();
    }
  });
});
