/**
 * @module Hostile input over HTTP, property-based: invalid UTF-8 and JSON, wrong types, absurd numbers,
 * deep and huge bodies, prototype keys, hostile headers, bogus sessions — in process for volume
 * (`app.request` with the virtual clock) and raw over a real socket for what only a socket can carry.
 * Every input gets an answer (a completion or a docs/http-api.md refusal, never a 500 or a hang), and afterwards
 * every permit, reservation, queue place and window slot is back at zero.
 */

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import fc from "fast-check";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";
import { SESSION_HEADERS } from "../../adapters/openai-api/call-headers.js";
import { type Harness, makeHarness } from "../http/harness.js";
import {
  assertQuiescent,
  checkRefusal,
  type RawExchange,
  rawHttp,
  recordFigures,
  SAFE_REQUEST_ID,
  sseEvents,
} from "./helpers.js";
import {
  type BodySpec,
  bodyArb,
  CHAT_FIELDS,
  COMPLETION_FIELDS,
  chatTemplate,
  completionTemplate,
  described,
  encode,
  FC_OPTIONS,
  headerValueArb,
  message,
  Obj,
  preview,
  runs,
  SEED,
  safeIdArb,
  sessionBodyArb,
} from "./hostile-input.js";

const figures = {
  inProcessCases: 0,
  concurrentCalls: 0,
  socketCases: 0,
  outcomes: {} as Record<string, number>,
  classes: {} as Record<string, number>,
};
function count(outcome: string, klass: string): void {
  figures.outcomes[outcome] = (figures.outcomes[outcome] ?? 0) + 1;
  figures.classes[klass] = (figures.classes[klass] ?? 0) + 1;
}

after(async () => {
  const total = figures.inProcessCases + figures.concurrentCalls + figures.socketCases;
  await recordFigures("fuzzHttp", { totalCases: total, ...figures, seed: SEED });
});

const headersArb = (keys: readonly string[]) =>
  fc.record(
    {
      requestId: fc.oneof(safeIdArb, headerValueArb, fc.constant("x".repeat(129)), fc.constant("a\tb")),
      lane: fc.oneof(
        fc.constantFrom("interactive", "bulk", "BULK", " bulk ", "overflow", ""),
        headerValueArb,
      ),
      deadline: fc.oneof(
        fc.constantFrom(
          "0",
          "-5",
          "1",
          "1e308",
          "1e400",
          "NaN",
          "Infinity",
          "0x10",
          " 500 ",
          "",
          "100000000000",
        ),
        fc.integer({ min: -1000, max: 10_000_000 }).map(String),
        headerValueArb,
      ),
      session: fc.tuple(
        fc.constantFrom(...SESSION_HEADERS),
        fc.oneof(
          fc.constantFrom("s-1", "s-2", "s-3", "__proto__", "constructor", "x".repeat(300), "a b"),
          safeIdArb,
          headerValueArb,
        ),
      ),
      // Usually absent, so the valid key added per case gets through and the deeper paths are reached.
      authorization: fc.oneof(
        { weight: 12, arbitrary: fc.constant(undefined) },
        fc.constantFrom(...keys.map((k) => `Bearer ${k}`), ...keys.map((k) => `bearer   ${k}  `)),
        fc.constantFrom("Bearer", "Bearer ", "Basic dXNlcjpwYXNz", `Bearer ${"k".repeat(20_000)}`),
        headerValueArb.map((v) => `Bearer ${v}`),
        headerValueArb,
      ),
      priority: fc.oneof(fc.constantFrom("999", "-1", "high", "1e9"), headerValueArb),
      contentType: fc.oneof(
        fc.constantFrom("application/json", "text/plain", "application/x-www-form-urlencoded", ""),
        headerValueArb,
      ),
      rank: fc.oneof(fc.constantFrom("0", "1", "-1", "999999", "NaN"), headerValueArb),
    },
    { requiredKeys: [] },
  );

type HeaderSpec = {
  requestId?: string;
  lane?: string;
  deadline?: string;
  session?: [string, string];
  authorization?: string;
  priority?: string;
  contentType?: string;
  rank?: string;
};

function toHeaders(spec: HeaderSpec): Headers {
  const headers = new Headers();
  const set = (name: string, value: string | undefined) => {
    if (value === undefined) return;
    try {
      headers.set(name, value);
    } catch {
      // A value `Headers` itself refuses cannot reach the server this way; the socket part covers those.
    }
  };
  set("x-request-id", spec.requestId);
  set("x-sluice-lane", spec.lane);
  set("x-sluice-deadline-ms", spec.deadline);
  if (spec.session) set(spec.session[0], spec.session[1]);
  set("authorization", spec.authorization);
  set("x-sluice-priority", spec.priority);
  set("content-type", spec.contentType);
  set("x-data-parallel-rank", spec.rank);
  return headers;
}

// --- routes --------------------------------------------------------------------------------------

const pathIdArb = fc
  .oneof(
    fc.constantFrom(
      "s-1",
      "s-2",
      "__proto__",
      "constructor",
      "%00",
      "%E0%A4%A",
      "%",
      "%2F..%2Fadmin",
      "x".repeat(5000),
    ),
    safeIdArb.map(encodeURIComponent),
    fc.string({ unit: "binary", minLength: 1, maxLength: 30 }).map(encodeURIComponent),
    // "." and ".." are path navigation, not ids: the URL resolves them before any route sees them.
  )
  .filter((id) => id !== "." && id !== "..");

type RouteSpec = { method: string; path: string; body: "chat" | "completion" | "session" | "none" };

const routeArb: fc.Arbitrary<RouteSpec> = fc.oneof(
  {
    weight: 10,
    arbitrary: fc.constant<RouteSpec>({ method: "POST", path: "/v1/chat/completions", body: "chat" }),
  },
  {
    weight: 3,
    arbitrary: fc.constant<RouteSpec>({ method: "POST", path: "/v1/completions", body: "completion" }),
  },
  {
    weight: 2,
    arbitrary: pathIdArb.map<RouteSpec>((id) => ({
      method: "POST",
      path: `/v1/sessions/${id}/chat/completions`,
      body: "chat",
    })),
  },
  { weight: 2, arbitrary: fc.constant<RouteSpec>({ method: "POST", path: "/v1/sessions", body: "session" }) },
  {
    weight: 1,
    arbitrary: fc
      .tuple(fc.constantFrom("GET", "DELETE"), pathIdArb)
      .map<RouteSpec>(([method, id]) => ({ method, path: `/v1/sessions/${id}`, body: "none" })),
  },
  {
    weight: 1,
    arbitrary: fc
      .constantFrom(
        "/v1/models",
        "/v1/admin/state",
        "/healthz",
        "/readyz",
        "/dashboard",
        "/dashboard?key=%00",
        "/v1/admin/state?key=admin-key-0001",
      )
      .map<RouteSpec>((path) => ({ method: "GET", path, body: "none" })),
  },
);

// --- checking one answer ---------------------------------------------------------------------------

const SUCCESS = new Set([200, 201, 204]);

function sentRequestId(headers: Headers): string | undefined {
  const value = headers.get("x-request-id")?.trim();
  return value && value.length <= 128 && /^[\x20-\x7e]+$/.test(value) ? value : undefined;
}

/** Reads (or, when asked, abandons) one response and checks it; returns the outcome label. */
async function checkResponse(
  h: Harness,
  response: Response,
  sent: Headers,
  options: { abandon?: boolean; context: string },
): Promise<string> {
  const requestId = response.headers.get("x-request-id");
  assert.ok(requestId && SAFE_REQUEST_ID.test(requestId), `unsafe x-request-id ${JSON.stringify(requestId)}`);
  const expectedId = sentRequestId(sent);
  if (expectedId !== undefined) assert.equal(requestId, expectedId, "a safe request id is echoed as sent");
  else assert.match(requestId, /^req-[0-9a-f-]{36}$/, "an unsafe or missing request id is replaced");
  response.headers.forEach((_, name) => {
    assert.ok(!name.startsWith("access-control-"), `CORS header ${name} without CORS configured`);
  });
  if (!SUCCESS.has(response.status)) {
    const text = await h.drive(response.text());
    if (response.status === 404 && text.includes('"route_not_found"')) {
      assert.fail(`a fuzzed path missed every route (${options.context}): ${text.slice(0, 200)}`);
    }
    return `${response.status} ${checkRefusal(response.status, response.headers, text, { context: options.context })}`;
  }
  if ((response.headers.get("content-type") ?? "").includes("text/event-stream")) {
    if (options.abandon) {
      const reader = response.body!.getReader();
      await h.drive(reader.read());
      await reader.cancel();
      return `${response.status} stream abandoned`;
    }
    const text = await h.drive(response.text());
    const events = sseEvents(text);
    assert.equal(events.at(-1)?.data, "[DONE]", `a stream ends with [DONE] (${options.context})`);
    assert.ok(
      !events.some((e) => e.event === "error"),
      `the simulator never fails a stream: ${text.slice(0, 300)}`,
    );
    return `${response.status} stream`;
  }
  const text = await h.drive(response.text());
  const type = response.headers.get("content-type") ?? "";
  if (type.includes("application/json")) JSON.parse(text);
  else if (response.status !== 204) assert.match(type, /text\/(html|plain)/, `unexpected ${type} answer`);
  return `${response.status}`;
}

/** Runs virtual time until every call has let go of its permit (a cancelled stream takes a few turns). */
async function settle(h: Harness): Promise<void> {
  for (let i = 0; i < 50; i++) {
    const check = h.scheduler.idleCheck();
    if (check.permits === 0 && check.reservations === 0 && check.queued === 0) return;
    await h.clock.advanceAsync(50);
  }
}

/** Ends every session (idle expiry), then checks that nothing at all is held. */
async function expireSessionsAndCheck(h: Harness): Promise<void> {
  const { idleTimeoutMs, controlIntervalMs } = h.scheduler.config.sessions;
  await h.clock.advanceAsync(idleTimeoutMs + 3 * controlIntervalMs);
  assertQuiescent(h.scheduler, { sessionsClosed: true });
}

// --- the properties ------------------------------------------------------------------------------

const KEYS = {
  "key-good-00000001": { tenant: "acme" },
  "admin-key-0001": { tenant: "ops", admin: true },
  "key-slow-00000001": { tenant: "slow", rps: 1, burst: 2 },
};

describe("hostile HTTP input, in process", () => {
  test("every request gets a completion or a docs/http-api.md refusal, never a 500; nothing stays held", async () => {
    // The instant replica answers at once, so thousands of cases stay cheap; keys are on, so 401 and 429 rate_limited are reachable.
    const h = makeHarness({ replicas: 2, preset: { base: "instant" }, keys: KEYS });
    try {
      const model = h.scheduler.models()[0]!;
      const keyNames = Object.keys(KEYS);
      // Built once: some bodies are megabytes of text.
      const bodies = {
        chat: bodyArb(chatTemplate(model), CHAT_FIELDS),
        completion: bodyArb(completionTemplate(model), COMPLETION_FIELDS),
        session: sessionBodyArb().map((b) => described(b, `${b.klass} body, ${preview(b.bytes)}`)),
        none: fc.constant<BodySpec>({ klass: "no-body", bytes: undefined }),
      };
      const caseArb = routeArb.chain((route) =>
        fc.record({
          route: fc.constant(route),
          body: bodies[route.body],
          headers: headersArb(keyNames),
          // Most calls carry a valid key, or the fuzzer would only ever see 401.
          // The rate-limited key is rare, or 429 rate_limited would hide everything behind it.
          validKey: fc.constantFrom(
            ...["key-good-00000001", "admin-key-0001"].flatMap((k) => [k, k, k, k, k]),
            "key-slow-00000001",
            undefined,
          ),
          abandon: fc.boolean(),
        }),
      );
      await fc.assert(
        fc.asyncProperty(caseArb, async ({ route, body, headers: spec, validKey, abandon }) => {
          const headers = toHeaders(spec);
          if (validKey && !headers.has("authorization")) headers.set("authorization", `Bearer ${validKey}`);
          if (body.bytes !== undefined && !headers.has("content-type"))
            headers.set("content-type", "application/json");
          const context = `${route.method} ${route.path.slice(0, 80)} ${body.klass}`;
          const response = await h.drive(
            Promise.resolve(
              h.app.request(route.path, {
                method: route.method,
                headers,
                ...(body.bytes !== undefined && route.method === "POST"
                  ? { body: typeof body.bytes === "string" ? body.bytes : new Uint8Array(body.bytes) }
                  : {}),
              }),
            ),
          );
          const outcome = await checkResponse(h, response, headers, { abandon, context });
          figures.inProcessCases++;
          count(outcome, body.klass);
          await settle(h);
          const check = h.scheduler.idleCheck();
          assert.deepEqual(
            { permits: check.permits, reservations: check.reservations, queued: check.queued },
            { permits: 0, reservations: 0, queued: 0 },
            `held after ${context}`,
          );
          // Nothing a request carried may reach Object.prototype.
          assert.equal(({} as Record<string, unknown>).polluted, undefined);
        }),
        { ...FC_OPTIONS, numRuns: runs(9000) },
      );
      await expireSessionsAndCheck(h);
      // The refusal metrics keep bounded labels whatever the input was.
      const metrics = await h.drive(Promise.resolve(h.app.request("/metrics")));
      const text = await metrics.text();
      const reasons = new Set(
        [...text.matchAll(/sluice_rejections_total\{[^}]*reason="([^"]*)"/g)].map((m) => m[1]),
      );
      for (const reason of reasons) assert.ok(/^[a-z_]+$/.test(reason!), `metric label ${reason}`);
    } finally {
      await h.close();
    }
  });

  test("concurrent hostile calls against a tiny gate, some abandoned at every stage: counters return to zero", async () => {
    // A real-speed replica with room for two calls per rank and three queued: queues, 529s and 429s happen.
    const h = makeHarness({
      replicas: 2,
      config: {
        gate: { engineRequestLimit: 2, engineRequestWaitingLimit: 2, requestQueueLimit: 3 },
        sessions: { queueLimit: 3, waitLimitMs: 20_000 },
        lanes: { interactive: { maxResidenceMs: 2000 } },
      },
    });
    try {
      const model = h.scheduler.models()[0]!;
      const callArb = fc.record({
        maxTokens: fc.oneof(fc.integer({ min: 1, max: 300 }), fc.constantFrom(0, -1, 5000, 131_072, 2 ** 40)),
        words: fc.constantFrom(1, 20, 400, 3000),
        stream: fc.boolean(),
        session: fc.option(fc.constantFrom("c-1", "c-2", "c-3", "c-4", "c-5", "c-6", "c-7")),
        lane: fc.option(fc.constantFrom("interactive", "bulk", "nonsense")),
        deadline: fc.option(fc.constantFrom("1", "50", "5000", "-3")),
        stop: fc.constantFrom("never", "never", "while-waiting", "after-headers", "after-first-chunk"),
        stopAtMs: fc.integer({ min: 0, max: 400 }),
      });
      await fc.assert(
        fc.asyncProperty(fc.array(callArb, { minLength: 4, maxLength: 24 }), async (calls) => {
          const outcomes = calls.map(async (call) => {
            const headers = new Headers({ "content-type": "application/json" });
            if (call.session) headers.set("x-session-id", call.session);
            if (call.lane) headers.set("x-sluice-lane", call.lane);
            if (call.deadline) headers.set("x-sluice-deadline-ms", call.deadline);
            const controller = new AbortController();
            if (call.stop === "while-waiting") h.clock.setTimeout(() => controller.abort(), call.stopAtMs);
            const body = encode(
              new Obj([
                ["model", model],
                [
                  "messages",
                  [message("user", Array.from({ length: call.words }, (_, i) => `w${i % 97}`).join(" "))],
                ],
                ["max_tokens", call.maxTokens],
                ["stream", call.stream],
              ]),
            );
            const response = await h.app.request("/v1/chat/completions", {
              method: "POST",
              headers,
              body,
              signal: controller.signal,
            });
            if (call.stop === "after-headers" && response.status === 200) {
              await response.body?.cancel();
              return "200 abandoned";
            }
            return checkResponse(h, response, headers, {
              abandon: call.stop === "after-first-chunk",
              context: `concurrent ${JSON.stringify(call)}`,
            });
          });
          const settled = await h.drive(Promise.allSettled(outcomes));
          for (const result of settled) {
            if (result.status === "rejected") throw result.reason;
            figures.concurrentCalls++;
            count(result.value, "concurrent-call");
          }
          await settle(h);
          const check = h.scheduler.idleCheck();
          assert.deepEqual(
            { permits: check.permits, reservations: check.reservations, queued: check.queued },
            { permits: 0, reservations: 0, queued: 0 },
          );
        }),
        { ...FC_OPTIONS, numRuns: runs(120) },
      );
      await expireSessionsAndCheck(h);
    } finally {
      await h.close();
    }
  });
});

// --- over a real socket ------------------------------------------------------------------------------

describe("hostile HTTP input, over a socket", () => {
  let server: RunningServer | undefined;
  after(async () => {
    await server?.close();
  });

  test("malformed requests, hostile header bytes and lying lengths get a JSON 4xx or a closed connection, never a hang", async () => {
    server = await startServer({
      port: 0,
      host: "127.0.0.1",
      simReplicas: 1,
      simPreset: "instant",
      log: () => {},
    });
    const port = Number(new URL(server.url).port);
    const model = server.scheduler.models()[0]!;
    const goodBody = JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 2 });

    type Wire = { klass: string; head: string; body: string; complete: boolean };
    const controlByte = fc.constantFrom(
      "\u0000",
      "\u0001",
      "\u0007",
      "\u001b",
      "\u007f",
      "\r",
      "\n",
      "\r\n",
      "\t",
      "\u00ff",
    );
    const wireArb: fc.Arbitrary<Wire> = fc.oneof(
      // A header value with a control byte (or CRLF injection) somewhere inside it.
      fc
        .tuple(
          fc.constantFrom("x-request-id", "x-session-id", "authorization", "x-sluice-lane", "user-agent"),
          fc.string({ maxLength: 10 }),
          controlByte,
          fc.string({ maxLength: 10 }),
        )
        .map(([name, a, c, b]) => ({
          klass: "header-control-bytes",
          head: `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n${name}: ${a}${c}${b}\r\nx-evil-marker: ${c === "\r\n" ? "injected" : "plain"}\r\ncontent-length: ${Buffer.byteLength(goodBody)}\r\n\r\n`,
          body: goodBody,
          complete: true,
        })),
      // Oversized headers: one huge value, or very many.
      fc.constantFrom(20_000, 70_000).map((n) => ({
        klass: "oversized-header",
        head: `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: ${"r".repeat(n)}\r\ncontent-length: ${Buffer.byteLength(goodBody)}\r\n\r\n`,
        body: goodBody,
        complete: true,
      })),
      fc.constant({
        klass: "many-headers",
        head: `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n${Array.from({ length: 3000 }, (_, i) => `x-h${i}: ${i}\r\n`).join("")}content-length: ${Buffer.byteLength(goodBody)}\r\n\r\n`,
        body: goodBody,
        complete: true,
      }),
      // Lengths that lie, conflict or are nonsense.
      fc.constantFrom("-1", "abc", "1e3", "99999999999999999999", "0x10", "10, 20").map((length) => ({
        klass: "bad-content-length",
        head: `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: ${length}\r\n\r\n`,
        body: goodBody,
        complete: true,
      })),
      fc.constant({
        klass: "length-and-chunked",
        head: `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n`,
        body: "0\r\n\r\n",
        complete: true,
      }),
      fc.integer({ min: 1, max: 40 }).map((extra) => ({
        klass: "body-longer-than-length",
        head: `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Math.max(1, Buffer.byteLength(goodBody) - extra)}\r\n\r\n`,
        body: `${goodBody}GARBAGE / HTTP/1.1\r\n\r\n`,
        complete: true,
      })),
      fc.integer({ min: 1, max: 40 }).map((missing) => ({
        klass: "body-shorter-than-length",
        head: `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(goodBody) + missing}\r\n\r\n`,
        body: goodBody,
        complete: false,
      })),
      fc.tuple(fc.uint8Array({ minLength: 1, maxLength: 200 }), fc.boolean()).map(([bytes, chunked]) => ({
        klass: "bad-chunked-body",
        head: `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n`,
        body: chunked
          ? `${bytes.length.toString(16)}\r\n${Buffer.from(bytes).toString("latin1")}\r\n0\r\n\r\n`
          : Buffer.from(bytes).toString("latin1"),
        complete: chunked,
      })),
      // Junk request lines and paths.
      fc
        .oneof(
          fc.string({ unit: "binary-ascii", minLength: 1, maxLength: 80 }),
          fc.constantFrom(
            "GET / HTTP/9.9",
            "POST /v1/chat/completions",
            "POST /v1/chat/completions HTTP/1.1 extra",
            `GET /v1/sessions/${"%".repeat(5)} HTTP/1.1`,
            `GET /${"a".repeat(20_000)} HTTP/1.1`,
            "BREW /v1/chat/completions HTTP/1.1",
            "GET /v1/sessions/a\u0000b HTTP/1.1",
          ),
        )
        .map((line) => ({
          klass: "junk-request-line",
          head: `${line}\r\nhost: x\r\n\r\n`,
          body: "",
          complete: true,
        })),
    );

    const describedWireArb = wireArb.map((w) =>
      described(w, `${w.klass}: ${preview(w.head)} + ${preview(w.body)}`),
    );
    await fc.assert(
      fc.asyncProperty(describedWireArb, async (wire) => {
        const exchange: RawExchange = await rawHttp(port, Buffer.from(wire.head + wire.body, "latin1"), {
          timeoutMs: wire.complete ? 5000 : 300,
        });
        figures.socketCases++;
        if (!wire.complete && exchange.status === 0) {
          // The server rightly waits for the body it was promised; the client gave up. Nothing may be held afterwards.
          count("incomplete request, client left", wire.klass);
          return;
        }
        assert.ok(
          exchange.status !== 0 || exchange.closed,
          `no answer and the connection still open for ${wire.klass}: ${JSON.stringify(wire.head.slice(0, 120))}`,
        );
        assert.ok(
          !/x-evil-marker|injected/i.test(Object.keys(exchange.headers).join(" ")),
          "a header was injected",
        );
        if (exchange.status === 0) {
          count("connection closed", wire.klass);
          return;
        }
        assert.ok(
          exchange.status < 500,
          `${exchange.status} for ${wire.klass}: ${exchange.raw.slice(0, 300)}`,
        );
        if (exchange.status >= 400) {
          count(
            `${exchange.status} ${checkRefusal(exchange.status, exchange.headers, exchange.body, { context: wire.klass, transport: true })}`,
            wire.klass,
          );
        } else {
          count(`${exchange.status}`, wire.klass);
        }
      }),
      { ...FC_OPTIONS, numRuns: runs(300) },
    );

    // Still serving, and every call that was admitted has ended.
    const health = await fetch(`${server.url}/healthz`);
    assert.equal(health.status, 200);
    const ok = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: goodBody,
    });
    assert.equal(ok.status, 200);
    await ok.text();
    assertQuiescent(server.scheduler);
    assert.equal(server.tracker.size, 0, "no HTTP call is still tracked as in flight");
  });
});
