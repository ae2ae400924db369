/**
 * @module llama.cpp's `llama-server` read by its profile, on genuine text from its repository
 * (`fixtures/README.md`): the `llamacpp:` page, `/props` and `/slots` for capacity and slots, each
 * call's `cached_tokens` (or `timings.cache_n`) as the hit signal, and its error bodies.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { afterEach, describe, it } from "node:test";
import { refusalFor } from "../../adapters/engines/openai/error-mapping.js";
import { usageOf } from "../../adapters/engines/openai/event-interpretation.js";
import { parseEngineMetrics } from "../../adapters/engines/openai/metrics-parser.js";
import type { UpstreamResponse } from "../../adapters/engines/openai/transport.js";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { VirtualClock } from "../../src/clock.js";
import type { EngineCall } from "../../src/engine.js";
import {
  chatChunk,
  type FakeUpstream,
  type Handler,
  sse,
  startFakeUpstream,
  startSse,
} from "./fake-upstream.js";

const fixture = (name: string) => readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8");
/** The README's `js` examples, with their `//` comments (and `// ...` elisions) taken out. */
const jsonc = (name: string): Record<string, unknown> =>
  JSON.parse(fixture(name).replace(/\/\/[^\n]*/g, "")) as Record<string, unknown>;

const PAGE = fixture("llamacpp-requests-gauges-commit-a2df278.prom");
const PROPS = fixture("llamacpp-props-readme.json");
const SLOTS = fixture("llamacpp-slots-readme.json");
const USAGE = jsonc("llamacpp-chat-usage-readme.jsonc").usage as Record<string, unknown>;
const TIMINGS = jsonc("llamacpp-chat-timings-readme.jsonc").timings as Record<string, unknown>;
/** A whole page and a chat answer of a llama-server built from llama.cpp at c392e50 (February 2025), captured live. */
const LIVE_PAGE = fixture("llamacpp-metrics-live-c392e50.prom");
const LIVE_CHAT = JSON.parse(fixture("llamacpp-chat-live-c392e50.json")) as Record<string, unknown>;

const servers: FakeUpstream[] = [];
const engines: OpenAIUpstreamEngine[] = [];

afterEach(async () => {
  for (const engine of engines.splice(0)) {
    assert.equal(engine.inFlight(), 0, "every call ended");
    await engine.close();
  }
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

const text =
  (body: string, code = 200, type = "application/json"): Handler =>
  (_req, res) => {
    res.writeHead(code, { "content-type": type });
    res.end(body);
  };

async function engineOn(
  routes: Record<string, Handler>,
): Promise<{ engine: OpenAIUpstreamEngine; up: FakeUpstream }> {
  const up = await startFakeUpstream(routes);
  servers.push(up);
  const engine = new OpenAIUpstreamEngine({ baseUrl: up.url, id: "llama", clock: new VirtualClock() });
  engines.push(engine);
  await engine.start();
  return { engine, up };
}

function response(status: number): UpstreamResponse {
  return { status, header: () => undefined } as unknown as UpstreamResponse;
}

describe("llama.cpp's page", () => {
  it("is llama.cpp's: requests processing and deferred read (0 and 0 on this page), nothing else stated", () => {
    const signals = parseEngineMetrics(PAGE);
    assert.ok(signals);
    assert.equal(signals.profile, "llamacpp");
    assert.equal(signals.flavor, "llamacpp");
    assert.equal(signals.running, 0);
    assert.equal(signals.waiting, 0);
    assert.ok(!signals.unknown.includes("running"));
    assert.ok(!signals.unknown.includes("waiting"));
    for (const field of [
      "kvUsage",
      "prefixCache",
      "kvCapacityTokens",
      "maxNumSeqs",
      "blockSize",
      "preemptions",
    ]) {
      assert.ok((signals.unknown as readonly string[]).includes(field), field);
    }
  });

  it("a whole live page of an early-2025 build: requests 0 and 0, KV usage from kv_cache_usage_ratio (0.0893555)", () => {
    const signals = parseEngineMetrics(LIVE_PAGE);
    assert.ok(signals);
    assert.equal(signals.profile, "llamacpp");
    assert.equal(signals.running, 0);
    assert.equal(signals.waiting, 0);
    assert.equal(signals.kvUsage, 0.0893555);
    assert.ok(!signals.unknown.includes("kvUsage"));
    assert.ok(signals.unknown.includes("prefixCache"), "the page has no prefix-cache counter");
  });

  it("a page forced to another profile is not read as llama.cpp's", () => {
    assert.equal(parseEngineMetrics(PAGE, "vllm")?.profile, "vllm");
    assert.equal(parseEngineMetrics(PAGE, "unknown"), undefined);
  });
});

describe("llama.cpp's /props and /slots", () => {
  it("slots from /props (total_slots 1), capacity from /slots (two slots of n_ctx 65536), context window one slot's", async () => {
    const { engine } = await engineOn({
      "/metrics": text(PAGE, 200, "text/plain; version=0.0.4"),
      "/props": text(PROPS),
      "/slots": text(SLOTS),
    });
    const signals = engine.signals();
    assert.equal(signals.healthy, true);
    assert.equal(signals.profile, "llamacpp");
    assert.equal(signals.maxNumSeqs, 1);
    assert.equal(signals.kvCapacityTokens, 2 * 65536);
    assert.equal(signals.kvCapacitySource, "engine");
    assert.equal(engine.contextWindow(), 65536);
    // The page states running (0): the slots' is_processing (both true in the README's example) does not override it.
    assert.equal(signals.running, 0);
    assert.ok(!signals.unknown?.includes("kvCapacityTokens"));
    assert.ok(!signals.unknown?.includes("maxNumSeqs"));
  });

  it("with /slots switched off (501, the README's body), capacity is total_slots × n_ctx from /props, derived; /slots is not asked again", async () => {
    const { engine, up } = await engineOn({
      "/metrics": text(PAGE, 200, "text/plain; version=0.0.4"),
      "/props": text(PROPS),
      "/slots": text(fixture("llamacpp-metrics-disabled-readme.json"), 501),
    });
    const signals = engine.signals();
    assert.equal(signals.kvCapacityTokens, 1 * 1024);
    assert.equal(signals.kvCapacitySource, "derived");
    assert.equal(engine.contextWindow(), 1024);
    await engine.scrape();
    assert.equal(up.requests.filter((r) => r.path === "/slots").length, 1);
  });

  it("with --metrics off (501 on /metrics, the README's body) it is served on /health as an unknown engine", async () => {
    const { engine } = await engineOn({
      "/metrics": text(fixture("llamacpp-metrics-disabled-readme.json"), 501),
      "/health": text('{"status": "ok" }'),
    });
    const signals = engine.signals();
    assert.equal(signals.healthy, true);
    assert.equal(signals.profile, "unknown");
    assert.match(signals.warning ?? "", /GET \/metrics answered 501/);
  });
});

describe("llama.cpp's per-call hit signal", () => {
  it("usage.prompt_tokens_details.cached_tokens is stated (0 of 44 here); timings.cache_n stands in when the usage has no details (236)", () => {
    assert.deepEqual(usageOf(USAGE), { prompt: 44, completion: 48, cached: 0, cachedStated: true });
    const { prompt_tokens_details: _details, ...bare } = USAGE;
    assert.deepEqual(usageOf(bare, undefined, TIMINGS), {
      prompt: 44,
      completion: 48,
      cached: 236,
      cachedStated: true,
    });
    // Neither stated: not a measurement.
    assert.deepEqual(usageOf(bare), { prompt: 44, completion: 48, cached: 0 });
  });

  it("a build without cache_n: the prompt tokens it did not evaluate (80 − prompt_n 1) are the cached ones", () => {
    assert.deepEqual(usageOf(LIVE_CHAT.usage, undefined, LIVE_CHAT.timings), {
      prompt: 80,
      completion: 4,
      cached: 79,
      cachedStated: true,
    });
    // cache_n, where stated, wins over the difference.
    assert.equal(usageOf(LIVE_CHAT.usage, undefined, { prompt_n: 1, cache_n: 50 })?.cached, 50);
  });

  it("the calls' usage becomes the prefix-cache counters, and prefixCache is no longer unknown", async () => {
    const usage = { ...USAGE, prompt_tokens_details: { cached_tokens: 30 } };
    const { engine } = await engineOn({
      "/metrics": text(PAGE, 200, "text/plain; version=0.0.4"),
      "/props": text(PROPS),
      "/slots": text(SLOTS),
      "/v1/chat/completions": (_req, res) => {
        startSse(res);
        sse(res, chatChunk({ content: "hi" }));
        sse(res, { ...chatChunk({}, "stop"), usage });
        sse(res, "[DONE]");
        res.end();
      },
    });
    assert.ok(engine.signals().unknown?.includes("prefixCache"));
    const call: EngineCall = {
      requestId: "r1",
      model: "m",
      promptTokens: [1, 2, 3],
      maxTokens: 8,
      endpoint: "chat",
      body: { messages: [{ role: "user", content: "hello" }], stream: true },
      stream: true,
      signal: new AbortController().signal,
    };
    for (let i = 0; i < 2; i++) {
      const stream = await engine.generate(call);
      for await (const _chunk of stream) {
        // drain
      }
      assert.equal((await stream.result).cachedTokens, 30);
    }
    const signals = engine.signals();
    assert.equal(signals.prefixQueryTokens, 2 * 44);
    assert.equal(signals.prefixHitTokens, 2 * 30);
    assert.ok(!signals.unknown?.includes("prefixCache"));
  });
});

describe("llama.cpp's error bodies", () => {
  const body = fixture("llamacpp-exceed-context-pr15780.json");

  it("exceed_context_size_error is 413 context_limit, at the 400 it answers now and the 500 it first did", () => {
    for (const status of [400, 500]) {
      const refusal = refusalFor(response(status), body, "llama");
      assert.equal(refusal.reason, "context_limit", String(status));
      assert.equal(refusal.status, 413);
      assert.match(refusal.message, /exceeds the available context size/);
    }
  });

  it("503 unavailable_error (a model loading) is a retryable refusal: 503 unavailable with Retry-After", () => {
    const refusal = refusalFor(response(503), fixture("llamacpp-health-loading-readme.json"), "llama");
    assert.equal(refusal.reason, "unavailable");
    assert.equal(refusal.status, 503);
    // Worker-scoped: the call may go to another replica, or come back (every 503 carries Retry-After).
    assert.equal(refusal.scope, "worker");
    assert.match(refusal.message, /Loading model/);
  });
});
