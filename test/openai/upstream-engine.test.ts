/** @module The OpenAI-compatible upstream engine over real loopback HTTP: pass-through, aborts, refusals, faults, scraping. */

import assert from "node:assert/strict";
import { after, afterEach, describe, it } from "node:test";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { flushMicrotasks, VirtualClock } from "../../src/clock.js";
import type { EngineCall, EngineChunk } from "../../src/engine.js";
import { EngineError, Refusal } from "../../src/errors.js";
import {
  chatChunk,
  deferred,
  type FakeUpstream,
  type Handler,
  type SeenRequest,
  sse,
  startFakeUpstream,
  startSse,
  usageChunk,
  vllmPage,
} from "./fake-upstream.js";

const decoder = new TextDecoder();
const CHAT = "/v1/chat/completions";

function makeCall(over: Partial<EngineCall> = {}): EngineCall & { controller: AbortController } {
  const controller = new AbortController();
  return {
    requestId: "req-1",
    model: "m",
    promptTokens: [1, 2, 3, 4, 5],
    maxTokens: 32,
    endpoint: "chat",
    body: { model: "client-model", messages: [{ role: "user", content: "hi" }], max_tokens: 9999 },
    stream: true,
    signal: controller.signal,
    controller,
    ...over,
  };
}

async function collect(iterable: AsyncIterable<EngineChunk>): Promise<EngineChunk[]> {
  const out: EngineChunk[] = [];
  for await (const chunk of iterable) out.push(chunk);
  return out;
}

const rawText = (chunk: EngineChunk | undefined): string | undefined =>
  chunk?.raw === undefined ? undefined : decoder.decode(chunk.raw);

const servers: FakeUpstream[] = [];
const engines: OpenAIUpstreamEngine[] = [];

async function upstream(routes: Record<string, Handler>): Promise<FakeUpstream> {
  const up = await startFakeUpstream(routes);
  servers.push(up);
  return up;
}

function engineFor(
  up: FakeUpstream,
  options: Partial<ConstructorParameters<typeof OpenAIUpstreamEngine>[0]> = {},
) {
  const engine = new OpenAIUpstreamEngine({ baseUrl: up.url, ...options });
  engines.push(engine);
  return engine;
}

afterEach(async () => {
  for (const engine of engines.splice(0)) {
    assert.equal(engine.inFlight(), 0, "every call ended");
    await engine.close();
  }
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

/** A handler that never answers (the test decides when the client gives up). */
const hang: Handler = () => undefined;

describe("OpenAIUpstreamEngine: streaming pass-through", () => {
  it("forwards each upstream event as it arrives, byte for byte, before the upstream has finished", async () => {
    const proceed = deferred();
    const written: string[] = [];
    let finished = false;
    const up = await upstream({
      [CHAT]: async (_req, res) => {
        startSse(res);
        written.push(sse(res, chatChunk({ role: "assistant", content: "" })));
        written.push(sse(res, chatChunk({ content: "Hel" })));
        await proceed.promise;
        written.push(sse(res, chatChunk({ content: "lo" }, "stop")));
        sse(res, usageChunk(12, 2, 8));
        sse(res, "[DONE]");
        res.end();
        finished = true;
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(makeCall());
    let firstToken = false;
    void stream.firstToken.then(() => {
      firstToken = true;
    });
    const iterator = stream[Symbol.asyncIterator]();

    const role = await iterator.next();
    assert.equal(rawText(role.value as EngineChunk), written[0]);
    await flushMicrotasks();
    assert.equal(firstToken, false, "a role-only event is not a generated token");

    const hel = await iterator.next();
    assert.equal(rawText(hel.value as EngineChunk), written[1]);
    assert.equal((hel.value as EngineChunk).text, "Hel");
    await flushMicrotasks();
    assert.equal(firstToken, true);
    assert.equal(finished, false, "the chunk reached us while the upstream was still generating");

    proceed.resolve();
    const rest: EngineChunk[] = [];
    for (let r = await iterator.next(); !r.done; r = await iterator.next()) rest.push(r.value);
    assert.deepEqual(
      rest.map(rawText),
      [written[2]],
      "usage event (asked on the client's behalf) and [DONE] are not forwarded",
    );
    assert.deepEqual(await stream.result, {
      promptTokens: 12,
      completionTokens: 2,
      cachedTokens: 8,
      finishReason: "stop",
    });

    const sent = JSON.parse(up.requests[0]!.body) as Record<string, unknown>;
    assert.equal(sent.model, "m", "the admitted model, not the client's alias");
    assert.equal(sent.max_tokens, 32, "the admitted output cap");
    assert.equal(sent.stream, true);
    assert.deepEqual(sent.stream_options, { include_usage: true });
    assert.deepEqual(sent.messages, [{ role: "user", content: "hi" }]);
    assert.equal(up.requests[0]!.headers["x-request-id"], "req-1");
  });

  it("keeps one upstream connection for consecutive calls, streamed to [DONE] or answered whole", async () => {
    const up = await upstream({
      [CHAT]: (req, res) => {
        if ((JSON.parse(req.body) as { stream?: boolean }).stream) {
          startSse(res);
          sse(res, chatChunk({ content: "a" }, "stop"));
          sse(res, "[DONE]");
          res.end();
        } else {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify({ choices: [{ message: { content: "a" }, finish_reason: "stop" }] }));
        }
      },
    });
    const engine = engineFor(up);
    const kinds = [true, true, false, true, true, false, true, true];
    for (const stream of kinds) {
      const call = await engine.generate(makeCall({ stream }));
      await collect(call);
      assert.equal((await call.result).finishReason, "stop");
    }
    const ports = new Set(up.requests.filter((r) => r.path === CHAT).map((r) => r.remotePort));
    // The next call may start before the last one's connection is back in the pool, hence 2, not 1.
    assert.ok(ports.size <= 2, `${kinds.length} calls used ${ports.size} connections`);
  });

  it("forwards the usage event when the client asked for it, and counts tokens when no usage comes", async () => {
    const up = await upstream({
      [CHAT]: (req, res) => {
        const body = JSON.parse(req.body) as { stream_options?: { include_usage?: boolean; extra?: number } };
        startSse(res);
        sse(res, chatChunk({ content: "a" }));
        sse(res, chatChunk({ tool_calls: [{ index: 0, function: { arguments: "{" } }] }));
        sse(res, chatChunk({ content: "b" }, "length"));
        if (body.stream_options?.extra === 1) sse(res, usageChunk(7, 3));
        sse(res, "[DONE]");
        res.end();
      },
    });
    const engine = engineFor(up);
    const asked = await engine.generate(
      makeCall({ body: { messages: [], stream_options: { include_usage: true, extra: 1 } } }),
    );
    const chunks = await collect(asked);
    assert.equal(chunks.length, 4, "three deltas and the usage event");
    assert.match(rawText(chunks[3])!, /"usage"/);
    assert.deepEqual(await asked.result, {
      promptTokens: 7,
      completionTokens: 3,
      cachedTokens: 0,
      finishReason: "length",
    });

    const counted = await engine.generate(makeCall({ body: { messages: [] } }));
    const plain = await collect(counted);
    assert.equal(plain.length, 3);
    assert.deepEqual(
      plain.map((c) => c.tokenCount),
      [1, 1, 1],
      "a tool-call delta is a generated token too",
    );
    assert.deepEqual(await counted.result, {
      promptTokens: 5,
      completionTokens: 3,
      cachedTokens: 0,
      finishReason: "length",
    });
  });

  it("asks a non-streaming upstream call for a non-streaming client, and still reads an upstream that streams anyway", async () => {
    const up = await upstream({
      "/v1/completions": (_req, res) => {
        startSse(res);
        const base = { id: "cmpl-1", object: "text_completion", created: 1, model: "m" };
        sse(res, { ...base, choices: [{ index: 0, text: "Hello", finish_reason: null, token_ids: [11] }] });
        sse(res, {
          ...base,
          choices: [{ index: 0, text: " world", finish_reason: "stop", token_ids: [12] }],
        });
        sse(res, {
          ...base,
          choices: [],
          usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 },
        });
        sse(res, "[DONE]");
        res.end();
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(
      makeCall({ endpoint: "completions", stream: false, body: { prompt: "Say hello", stream: false } }),
    );
    const chunks = await collect(stream);
    assert.deepEqual(
      chunks.map((c) => [c.text, c.tokenCount, c.raw]),
      [
        ["Hello", 1, undefined],
        [" world", 1, undefined],
      ],
    );
    assert.deepEqual(
      chunks.map((c) => c.tokens),
      [[11], [12]],
    );
    const result = await stream.result;
    assert.deepEqual(result, {
      promptTokens: 5,
      completionTokens: 2,
      cachedTokens: 0,
      finishReason: "stop",
      outputTokens: [11, 12],
    });
    const sent = JSON.parse(up.requests[0]!.body) as Record<string, unknown>;
    assert.equal(sent.stream, false, "a non-streaming client's call is sent as one JSON request");
    assert.equal(sent.stream_options, undefined);
    assert.equal(sent.prompt, "Say hello");
  });

  it("sends the data-parallel rank and the API key", async () => {
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "x" }, "stop"));
        sse(res, "[DONE]");
        res.end();
      },
    });
    const engine = engineFor(up, { apiKey: "sk-upstream" });
    await collect(
      await engine.generate(makeCall({ rank: 1, body: { messages: [], max_completion_tokens: 5 } })),
    );
    const seen = up.requests[0]!;
    assert.equal(seen.headers["x-data-parallel-rank"], "1");
    assert.equal(seen.headers.authorization, "Bearer sk-upstream");
    const sent = JSON.parse(seen.body) as Record<string, unknown>;
    assert.equal(sent.max_completion_tokens, 32);
    assert.equal("max_tokens" in sent, false);
  });
});

describe("OpenAIUpstreamEngine: cancellation reaches the upstream", () => {
  it("client abort before the upstream's headers closes the upstream connection", async () => {
    const up = await upstream({ [CHAT]: hang });
    const engine = engineFor(up);
    const call = makeCall();
    const pending = engine.generate(call);
    const seen = await up.nextRequest(CHAT);
    call.controller.abort();
    await assert.rejects(pending, { name: "AbortError" });
    await seen.aborted;
    assert.equal(seen.wasAborted(), true);
  });

  it("client abort after the headers closes the upstream connection; the result says abort", async () => {
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "one" }));
      },
    });
    const engine = engineFor(up);
    const call = makeCall();
    const stream = await engine.generate(call);
    const iterator = stream[Symbol.asyncIterator]();
    assert.equal(((await iterator.next()).value as EngineChunk).text, "one");
    const next = iterator.next();
    call.controller.abort();
    await assert.rejects(next, { name: "AbortError" });
    await up.requests[0]!.aborted;
    const result = await stream.result;
    assert.equal(result.finishReason, "abort");
    assert.equal(result.completionTokens, 1);
  });

  it("a consumer that stops iterating (break) cancels the upstream call", async () => {
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "one" }));
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(makeCall());
    for await (const chunk of stream) {
      assert.equal(chunk.text, "one");
      break;
    }
    await up.requests[0]!.aborted;
    assert.equal((await stream.result).finishReason, "abort");
  });

  it("return() while a read is pending cancels at once instead of waiting for the next event", async () => {
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "one" }));
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(makeCall());
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next();
    const pending = iterator.next();
    const returned = iterator.return?.();
    assert.deepEqual(await pending, { done: true, value: undefined });
    await returned;
    await up.requests[0]!.aborted;
    assert.equal((await stream.result).finishReason, "abort");
  });

  it("an abort before iteration starts settles the result and frees the connection", async () => {
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "one" }));
      },
    });
    const engine = engineFor(up);
    const call = makeCall();
    const stream = await engine.generate(call);
    call.controller.abort();
    assert.equal((await stream.result).finishReason, "abort");
    await up.requests[0]!.aborted;
    assert.equal(engine.inFlight(), 0);
  });

  it("close() aborts running calls with EngineError and refuses new ones", async () => {
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "one" }));
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(makeCall());
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next();
    const next = iterator.next();
    await engine.close();
    await assert.rejects(next, EngineError);
    await assert.rejects(stream.result, EngineError);
    await up.requests[0]!.aborted;
    await assert.rejects(
      engine.generate(makeCall()),
      (e: unknown) => e instanceof Refusal && e.reason === "unavailable",
    );
  });
});

describe("OpenAIUpstreamEngine: upstream refusals before the body", () => {
  const cases: {
    status: number;
    headers?: Record<string, string>;
    body: string;
    reason: string;
    refusalStatus: number;
    retryAfter?: number;
  }[] = [
    {
      status: 529,
      headers: { "retry-after": "7" },
      body: '{"error":{"message":"busy"}}',
      reason: "worker_overloaded",
      refusalStatus: 529,
      retryAfter: 7,
    },
    {
      status: 429,
      headers: { "retry-after": "3" },
      body: '{"error":{"message":"slow down"}}',
      reason: "worker_overloaded",
      refusalStatus: 529,
      retryAfter: 3,
    },
    {
      status: 503,
      headers: { "retry-after": "12" },
      body: "Service Unavailable",
      reason: "unavailable",
      refusalStatus: 503,
      retryAfter: 12,
    },
    { status: 503, body: "", reason: "unavailable", refusalStatus: 503, retryAfter: 1 },
    {
      status: 400,
      body: '{"object":"error","message":"temperature must be ≥ 0","type":"BadRequestError","code":400}',
      reason: "invalid_request",
      refusalStatus: 400,
    },
    {
      status: 400,
      body: '{"object":"error","message":"This model\'s maximum context length is 8192 tokens. However, you requested 9000 tokens.","code":400}',
      reason: "context_limit",
      refusalStatus: 413,
    },
    {
      status: 404,
      body: '{"object":"error","message":"The model `x` does not exist.","code":404}',
      reason: "model_not_found",
      refusalStatus: 404,
    },
    { status: 500, body: "Internal Server Error", reason: "unavailable", refusalStatus: 503, retryAfter: 1 },
    {
      status: 429,
      headers: { "retry-after": "4" },
      body: '{"error":{"message":"queue timed out","code":"queue_timeout","type":"overloaded_error"}}',
      reason: "queue_timeout",
      refusalStatus: 429,
      retryAfter: 4,
    },
  ];

  it("maps each upstream error status to a refusal with the upstream's Retry-After", async () => {
    const up = await upstream({
      [CHAT]: (req, res) => {
        const which = (JSON.parse(req.body) as { case: number }).case;
        const c = cases[which]!;
        res.writeHead(c.status, { "content-type": "application/json", ...c.headers });
        res.end(c.body);
      },
    });
    const engine = engineFor(up);
    for (const [index, c] of cases.entries()) {
      const error = await engine.generate(makeCall({ body: { messages: [], case: index } })).then(
        () => assert.fail(`case ${index} resolved`),
        (e: unknown) => e,
      );
      assert.ok(error instanceof Refusal, `case ${index}: ${String(error)}`);
      assert.equal(error.reason, c.reason, `case ${index}`);
      assert.equal(error.status, c.refusalStatus, `case ${index}`);
      assert.equal(error.retryAfterSeconds, c.retryAfter, `case ${index}`);
    }
    const busy = await engine
      .generate(makeCall({ body: { messages: [], case: 0 } }))
      .catch((e: unknown) => e);
    assert.ok(busy instanceof Refusal);
    assert.match(busy.message, /busy/, "the upstream's message is kept");
  });

  it("a connection refused is a clean 503 refusal and marks the replica unhealthy", async () => {
    const page = vllmPage({ kv: 0.1, running: 0, waiting: 0, queries: 0, hits: 0 });
    const up = await upstream({
      "/metrics": (_req, res) => {
        res.end(page);
      },
    });
    const engine = engineFor(up);
    assert.equal((await engine.scrape()).healthy, true);
    await up.close();
    const error = await engine.generate(makeCall()).catch((e: unknown) => e);
    assert.ok(error instanceof Refusal);
    assert.equal(error.reason, "unavailable");
    assert.equal(error.status, 503);
    assert.match(error.message, /ECONNREFUSED/);
    assert.equal(engine.signals().healthy, false);
  });

  it("an upstream that never answers is refused after requestTimeoutMs (virtual time) and its connection closed", async () => {
    const clock = new VirtualClock();
    const up = await upstream({ [CHAT]: hang });
    const engine = engineFor(up, { clock, requestTimeoutMs: 30_000 });
    const pending = engine.generate(makeCall());
    const seen = await up.nextRequest(CHAT);
    clock.advance(29_999);
    await flushMicrotasks();
    assert.equal(seen.wasAborted(), false);
    clock.advance(1);
    const error = await pending.catch((e: unknown) => e);
    assert.ok(error instanceof Refusal);
    assert.equal(error.reason, "unavailable");
    assert.match(error.message, /30000 ms/);
    await seen.aborted;
  });
});

describe("OpenAIUpstreamEngine: failures after the body started", () => {
  it("an upstream that dies mid-stream makes iteration throw EngineError and the result reject", async () => {
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "partial" }));
        setImmediate(() => res.destroy());
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(makeCall());
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const chunk of stream) seen.push(chunk.text);
      })(),
      EngineError,
    );
    assert.deepEqual(seen, ["partial"]);
    await assert.rejects(stream.result, EngineError);
  });

  it("an error event mid-stream is an EngineError carrying the upstream's message", async () => {
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "a" }));
        sse(res, {
          error: { object: "error", message: "CUDA out of memory", type: "InternalServerError", code: 500 },
        });
        sse(res, "[DONE]");
        res.end();
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(makeCall());
    await assert.rejects(
      collect(stream),
      (e: unknown) => e instanceof EngineError && /CUDA out of memory/.test(e.message),
    );
    await assert.rejects(stream.result, /CUDA out of memory/);
  });

  it("a stream cut short (no finish, no [DONE]) is an EngineError; one that finished without [DONE] is not", async () => {
    const up = await upstream({
      [CHAT]: (req, res) => {
        const finish = (JSON.parse(req.body) as { finish: boolean }).finish;
        startSse(res);
        sse(res, chatChunk({ content: "a" }, finish ? "stop" : null));
        res.end();
      },
    });
    const engine = engineFor(up);
    const cut = await engine.generate(makeCall({ body: { messages: [], finish: false } }));
    await assert.rejects(collect(cut), /before the call finished/);
    await assert.rejects(cut.result, EngineError);
    const whole = await engine.generate(makeCall({ body: { messages: [], finish: true } }));
    await collect(whole);
    assert.equal((await whole.result).finishReason, "stop");
  });

  it("the result of a failed call never surfaces as an unhandled rejection", async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on("unhandledRejection", onUnhandled);
    after(() => process.off("unhandledRejection", onUnhandled));
    const up = await upstream({
      [CHAT]: (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "a" }));
        setImmediate(() => res.destroy());
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(makeCall());
    await collect(stream).catch(() => undefined);
    await flushMicrotasks();
    await flushMicrotasks();
    assert.deepEqual(unhandled, []);
  });
});

describe("OpenAIUpstreamEngine: /metrics scraping and /v1/models", () => {
  it("follows a redirect of /metrics and /v1/models (a server mounting them one slash deeper)", async () => {
    const up = await upstream({
      "/metrics": (_req, res) => {
        res.writeHead(307, { location: "/metrics/" });
        res.end();
      },
      "/metrics/": (_req, res) => {
        res.end(vllmPage({ kv: 0.25, running: 1, waiting: 0, queries: 10, hits: 5 }));
      },
      "/v1/models": (_req, res) => {
        res.writeHead(308, { location: "/v1/models/" });
        res.end();
      },
      "/v1/models/": (_req, res) => {
        res.end(JSON.stringify({ data: [{ id: "m", max_model_len: 4096 }] }));
      },
    });
    const engine = engineFor(up);
    await engine.start();
    const signals = engine.signals();
    assert.equal(signals.healthy, true);
    assert.equal(signals.kvUsage, 0.25);
    assert.deepEqual(engine.models(), ["m"]);
    assert.equal(engine.contextWindow(), 4096);
  });

  it("reads signals at the clock's time; a garbage or failing page keeps the last values and their age, and the replica healthy", async () => {
    const clock = new VirtualClock(1_000);
    let mode: "good" | "garbage" | "error" = "good";
    const up = await upstream({
      "/metrics": (_req, res) => {
        if (mode === "error") {
          res.writeHead(500);
          res.end("boom");
        } else
          res.end(
            mode === "good"
              ? vllmPage({ kv: 0.42, running: 3, waiting: 1, queries: 100, hits: 40 })
              : "<html>nope</html>",
          );
      },
    });
    const engine = engineFor(up, { clock });
    assert.equal(engine.signals().healthy, false, "never scraped");
    assert.equal(engine.signals().readAtMs, Number.NEGATIVE_INFINITY);

    const good = await engine.scrape();
    assert.equal(good.healthy, true);
    assert.equal(good.readAtMs, 1_000);
    assert.equal(good.kvUsage, 0.42);
    assert.equal(good.running, 3);
    assert.equal(good.waiting, 1);
    assert.equal(good.prefixQueryTokens, 100);
    assert.equal(good.prefixHitTokens, 40);
    assert.equal(good.preemptions, 3);
    assert.equal(good.kvCapacityTokens, 16_000);
    assert.equal(good.blockSize, 16);
    assert.equal(engine.flavor(), "vllm");

    for (const bad of ["garbage", "error"] as const) {
      mode = bad;
      clock.advance(1_000);
      const after = await engine.scrape();
      assert.equal(after.healthy, true, `${bad}: a replica that answers stays healthy; its signals go stale`);
      assert.equal(after.readAtMs, 1_000, `${bad}: the age of the last good read shows`);
      assert.equal(after.kvUsage, 0.42, `${bad}: last good values kept`);
    }
    mode = "good";
    clock.advance(500);
    const back = await engine.scrape();
    assert.equal(back.healthy, true);
    assert.equal(back.readAtMs, 3_500);
  });

  it("a hung /metrics fails after scrapeTimeoutMs (virtual time), whether before or after its headers", async () => {
    const clock = new VirtualClock();
    let served = 0;
    const up = await upstream({
      "/metrics": (_req, res) => {
        served++;
        if (served === 1) res.end(vllmPage({ kv: 0.1, running: 0, waiting: 0, queries: 0, hits: 0 }));
        else if (served === 3) {
          // Headers and half a page, then silence.
          res.writeHead(200, { "content-type": "text/plain" });
          res.write("vllm:num_requests_running 1\nvllm:kv_cache");
        }
        // The second request gets nothing at all.
      },
    });
    let headersSeen = deferred();
    const fetchSpy: typeof fetch = async (input, init) => {
      const response = await fetch(input, init);
      headersSeen.resolve();
      return response;
    };
    const engine = engineFor(up, { clock, scrapeTimeoutMs: 2_000, fetch: fetchSpy });
    assert.equal((await engine.scrape()).healthy, true);
    for (const n of [2, 3]) {
      headersSeen = deferred();
      const pending = engine.scrape();
      const seen: SeenRequest = await up.nextRequest("/metrics", n);
      if (n === 3) await headersSeen.promise;
      clock.advance(1_999);
      await flushMicrotasks();
      assert.equal(seen.wasAborted(), false, `scrape ${n} still waiting`);
      clock.advance(1);
      const signals = await pending;
      assert.equal(signals.healthy, true, `scrape ${n}: reachable, so stale rather than unhealthy`);
      assert.equal(signals.readAtMs, 0, "the last good read's time");
      await seen.aborted;
    }
  });

  it("a dead upstream gives unhealthy, stale signals and never throws", async () => {
    const up = await upstream({});
    await up.close();
    const clock = new VirtualClock(5_000);
    const engine = engineFor(up, { clock });
    await engine.start();
    const s = engine.signals();
    assert.equal(s.healthy, false);
    assert.equal(s.readAtMs, Number.NEGATIVE_INFINITY);
    assert.deepEqual(engine.models(), []);
    assert.equal(engine.contextWindow(), undefined);
  });

  it("start() fetches /v1/models (retrying until it answers), scrapes on every interval, and close() stops it", async () => {
    const clock = new VirtualClock();
    let modelsUp = false;
    const up = await upstream({
      "/metrics": (_req, res) => {
        res.end(vllmPage({ kv: 0.2, running: 1, waiting: 0, queries: 10, hits: 5 }));
      },
      "/v1/models": (_req, res) => {
        if (!modelsUp) {
          res.writeHead(503);
          res.end();
          return;
        }
        res.setHeader("content-type", "application/json");
        res.end(
          JSON.stringify({
            object: "list",
            data: [
              { id: "meta-llama/Llama-3.1-8B-Instruct", object: "model", max_model_len: 131072 },
              { id: "lora-a", object: "model", max_model_len: 8192 },
            ],
          }),
        );
      },
    });
    const engine = engineFor(up, { clock, scrapeIntervalMs: 1_000, models: ["configured"] });
    await engine.start();
    assert.deepEqual(engine.models(), ["configured"], "configured names until /v1/models answers");
    assert.equal(engine.signals().healthy, true);
    assert.equal(clock.pending(), 1, "one scrape timer armed");

    modelsUp = true;
    clock.advance(1_000);
    await up.nextRequest("/metrics", 2);
    await up.nextRequest("/v1/models", 2);
    // Both fetches of this tick are done once the only timer left is the next tick's.
    await waitFor(
      () => engine.models().length === 2 && clock.pending() === 1 && clock.nextTimerAt() === 2_000,
    );
    assert.deepEqual(engine.models(), ["meta-llama/Llama-3.1-8B-Instruct", "lora-a"]);
    assert.equal(engine.contextWindow(), 131_072);
    assert.equal(engine.contextWindow("lora-a"), 8_192);
    assert.equal(engine.contextWindow("unknown"), undefined);

    clock.advance(1_000);
    await up.nextRequest("/metrics", 3);
    await waitFor(() => clock.pending() === 1 && clock.nextTimerAt() === 3_000);
    assert.equal(
      up.requests.filter((r) => r.path === "/v1/models").length,
      2,
      "models are not refetched once known",
    );

    await engine.close();
    assert.equal(clock.pending(), 0, "no timer left after close()");
    clock.advance(10_000);
    await flushMicrotasks();
    assert.equal(up.requests.filter((r) => r.path === "/metrics").length, 3);
    assert.equal(engine.signals().healthy, false, "a closed replica is not healthy");
  });

  it("validates its options, naming the value received", () => {
    assert.throws(() => new OpenAIUpstreamEngine({ baseUrl: "not a url" }), /baseUrl.*"not a url"/);
    assert.throws(() => new OpenAIUpstreamEngine({ baseUrl: "ftp://x" }), /http or https/);
    assert.throws(
      () => new OpenAIUpstreamEngine({ baseUrl: "http://x", scrapeIntervalMs: 0 }),
      /scrapeIntervalMs.*got 0/,
    );
    assert.throws(
      () => new OpenAIUpstreamEngine({ baseUrl: "http://x", requestTimeoutMs: -1 }),
      /requestTimeoutMs.*got -1/,
    );
    const engine = new OpenAIUpstreamEngine({ baseUrl: "http://127.0.0.1:8000/v1/" });
    assert.equal(engine.baseUrl, "http://127.0.0.1:8000");
    assert.equal(engine.id, "127.0.0.1:8000");
  });
});

/** Lets I/O callbacks run until `done()` holds (each round yields to the event loop; no timers, no sleeps). */
async function waitFor(done: () => boolean, rounds = 1_000): Promise<void> {
  for (let i = 0; i < rounds && !done(); i++) await flushMicrotasks();
  assert.ok(done(), "condition not reached");
}
