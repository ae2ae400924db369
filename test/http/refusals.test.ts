/** @module Refusals that say what to do: replica and queue time on the refusal, the limit and the flag that sets it, retry advice, rate-limit headers, 403, x-api-key, 405, chat roles. */

import assert from "node:assert/strict";
import { afterEach, describe, test } from "node:test";
import { SluiceError } from "../../adapters/client/types.js";
import { CHAT_ROLES } from "../../adapters/openai-api/schemas.js";
import { assertIdle, assertRefusal, chat, type Harness, makeHarness } from "./harness.js";

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

function harness(options: Parameters<typeof makeHarness>[0] = {}): Harness {
  h = makeHarness(options);
  return h;
}

describe("refusals after routing name the replica and the time spent", () => {
  test("529 worker_overloaded names the replica, the limits and the flags that set them", async () => {
    const { request, drive, scheduler, call } = harness({
      replicas: 1,
      config: { gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 0 } },
    });
    const holder = await drive(
      request("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 500, stream: true }) }),
    );
    let fleetSnapshots = 0;
    const state = scheduler.state.bind(scheduler);
    scheduler.state = () => {
      fleetSnapshots++;
      return state();
    };
    const { response, text } = await call("/v1/chat/completions", { method: "POST", json: chat() });
    scheduler.state = state;
    assert.equal(fleetSnapshots, 0, "the refusal's advice reads its own replica, not the fleet's state");
    const error = assertRefusal(response, text, 529, "worker_overloaded");
    assert.equal(response.headers.get("x-sluice-replica"), "sim-0");
    assert.match(response.headers.get("x-sluice-queue-ms") ?? "", /^\d+$/);
    assert.match(String(error.message), /^replica sim-0: worker overloaded/);
    assert.match(String(error.message), /--engine-request-limit/);
    assert.match(String(error.message), /--request-queue-limit/);
    assert.match(String(error.message), /1 requests, 1 waiting, 0 queued/);
    await holder.body!.cancel();
    assertIdle(scheduler);
  });

  test("token_budget_exhausted shows reserved against the ceiling, and the queue time", async () => {
    const { request, drive, scheduler, call } = harness({
      replicas: 1,
      config: { budget: { ceilingTokens: 10_000 } },
    });
    const holder = await drive(
      request("/v1/chat/completions", { method: "POST", json: chat({ max_tokens: 5000, stream: true }) }),
    );
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 5000 }),
      headers: { "x-sluice-queue-ttl-ms": "0" },
    });
    const error = assertRefusal(response, text, 429, "token_budget_exhausted");
    assert.equal(response.headers.get("x-sluice-replica"), "sim-0");
    assert.match(response.headers.get("x-sluice-queue-ms") ?? "", /^\d+$/);
    assert.match(
      String(error.message),
      /replica sim-0: [\d,]+ tokens reserved of a ceiling of 10,000 \(guard band 1,000\)/,
    );
    assert.match(String(error.message), /lower max_tokens/);
    await holder.body!.cancel();
    assertIdle(scheduler);
  });

  test("deadline_infeasible keeps Retry-After (docs/http-api.md) but says, and signals, not to retry unchanged", async () => {
    const { call, scheduler } = harness();
    const { response, text } = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({}, 3000),
      headers: { "x-sluice-deadline-ms": "1" },
    });
    const error = assertRefusal(response, text, 429, "deadline_infeasible");
    assert.ok(response.headers.get("retry-after"));
    assert.equal(response.headers.get("x-should-retry"), "false", "OpenAI's SDKs honour x-should-retry");
    assert.match(response.headers.get("x-sluice-replica") ?? "", /^sim-[01]$/);
    assert.match(String(error.message), /Not worth retrying unchanged/);
    assert.match(String(error.message), /x-sluice-deadline-ms/);
    // The client library does not retry it either.
    const client = SluiceError.fromEnvelope(429, JSON.parse(text), { retryAfter: "3" });
    assert.equal(client.code, "deadline_infeasible");
    assert.equal(client.retryable, false);
    assert.equal(SluiceError.fromEnvelope(429, { error: { code: "queue_full" } }, {}).retryable, true);
    assertIdle(scheduler);
  });

  test("413s give the accepted maximums and the flag; validation refusals have no replica", async () => {
    const { call, scheduler } = harness({ config: { lanes: { bulkMaxTotalTokens: 3000 } } });
    const overflow = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 2000 }, 1500),
    });
    const error = assertRefusal(overflow.response, overflow.text, 413, "overflow");
    assert.match(
      String(error.message),
      /accepted: at most 3,000 tokens of input \+ max_tokens \(set by --bulk-max-total-tokens\)/,
    );
    assert.equal(overflow.response.headers.get("x-should-retry"), "false");
    const big = await call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 10_000_000 }),
    });
    const context = assertRefusal(big.response, big.text, 413, "context_limit");
    assert.match(String(context.message), /accepted: at most [\d,]+ tokens of input \+ max_tokens/);
    assert.match(String(context.message), /do not retry unchanged/);
    assert.equal(big.response.headers.get("x-sluice-replica"), null, "refused before routing");
    const bad = await call("/v1/chat/completions", {
      method: "POST",
      body: "{",
      headers: { "content-type": "application/json" },
    });
    assert.equal(bad.response.status, 400);
    assert.equal(bad.response.headers.get("x-sluice-queue-ms"), null, "refused before it was submitted");
    assertIdle(scheduler);
  });
});

describe("keys", () => {
  const keys = {
    "sk-team-a-0001": { tenant: "team-a", priority: 1, rps: 1, burst: 2 },
    "sk-ops-admin-01": { tenant: "ops", admin: true },
  };

  test("x-api-key is accepted as well as authorization: Bearer", async () => {
    const { call } = harness({ keys });
    const viaHeader = await call("/v1/models", { headers: { "x-api-key": "sk-team-a-0001" } });
    assert.equal(viaHeader.response.status, 200);
    const wrong = await call("/v1/models", { headers: { "x-api-key": "sk-team-a-9999" } });
    assertRefusal(wrong.response, wrong.text, 401, "unauthorized");
    const admin = await call("/v1/admin/state", { headers: { "x-api-key": "sk-ops-admin-01" } });
    assert.equal(admin.response.status, 200);
  });

  test("a known key without the admin right gets 403 on admin routes, an unknown one 401", async () => {
    const { call } = harness({ keys });
    for (const path of ["/v1/admin/state", "/v1/admin/history", "/dashboard"]) {
      const user = await call(path, { headers: { authorization: "Bearer sk-team-a-0001" } });
      assert.equal(user.response.status, 403, path);
      const body = user.json();
      assert.equal(
        body.error.code,
        "unauthorized",
        "the documented reason, with the status that says the key is known",
      );
      assert.equal(body.error.type, "authentication_error");
      assert.match(body.error.message, /admin/);
      const stranger = await call(path, { headers: { authorization: "Bearer sk-stranger-01" } });
      assertRefusal(stranger.response, stranger.text, 401, "unauthorized");
    }
  });

  test("x-ratelimit-* headers on calls and on the rate-limit refusal", async () => {
    const { call } = harness({ keys });
    const auth = { authorization: "Bearer sk-team-a-0001" };
    const first = await call("/v1/chat/completions", { method: "POST", json: chat(), headers: auth });
    assert.equal(first.response.status, 200);
    assert.equal(first.response.headers.get("x-ratelimit-limit-requests"), "2");
    assert.equal(first.response.headers.get("x-ratelimit-remaining-requests"), "1");
    assert.match(first.response.headers.get("x-ratelimit-reset-requests") ?? "", /^\d+(\.\d+)?s$/);
    await call("/v1/chat/completions", { method: "POST", json: chat(), headers: auth });
    const limited = await call("/v1/chat/completions", { method: "POST", json: chat(), headers: auth });
    const error = assertRefusal(limited.response, limited.text, 429, "rate_limited");
    assert.equal(limited.response.headers.get("x-ratelimit-limit-requests"), "2");
    assert.equal(limited.response.headers.get("x-ratelimit-remaining-requests"), "0");
    assert.ok(limited.response.headers.get("retry-after"));
    assert.match(String(error.message), /2 call\(s\) in a burst/);
    const admin = await call("/v1/models", { headers: { authorization: "Bearer sk-ops-admin-01" } });
    assert.equal(admin.response.headers.get("x-ratelimit-limit-requests"), null, "no rate limit, no headers");
  });
});

describe("methods and roles", () => {
  test("a wrong method on a known path is 405 with Allow; an unknown path stays 404", async () => {
    const { call } = harness();
    const get = await call("/v1/chat/completions");
    assert.equal(get.response.status, 405);
    assert.equal(get.response.headers.get("allow"), "POST");
    assert.equal(get.json().error.code, "invalid_request");
    assert.match(get.json().error.message, /GET is not allowed on \/v1\/chat\/completions; use POST/);
    const put = await call("/v1/sessions/abc", { method: "PUT" });
    assert.equal(put.response.status, 405);
    assert.deepEqual(put.response.headers.get("allow")?.split(", ").sort(), ["DELETE", "GET", "HEAD"]);
    const post = await call("/metrics", { method: "POST" });
    assert.equal(post.response.status, 405);
    const missing = await call("/v1/nothing-here");
    assert.equal(missing.response.status, 404);
  });

  test("chat roles are validated: the six OpenAI roles pass, anything else is 400 naming the field", async () => {
    const { call, scheduler } = harness();
    const wrong = await call("/v1/chat/completions", {
      method: "POST",
      json: { messages: [{ role: "usr", content: "hi" }], max_tokens: 3 },
    });
    const error = assertRefusal(wrong.response, wrong.text, 400, "invalid_request");
    assert.equal(error.param, "messages[0].role");
    assert.match(String(error.message), /system, user, assistant, tool, developer, function/);
    const messages = CHAT_ROLES.map((role) => ({
      role,
      content: `as ${role}`,
      ...(role === "tool" ? { tool_call_id: "call-1" } : {}),
      ...(role === "function" ? { name: "lookup" } : {}),
    }));
    const ok = await call("/v1/chat/completions", { method: "POST", json: { messages, max_tokens: 3 } });
    assert.equal(ok.response.status, 200);
    assertIdle(scheduler);
  });
});
