/**
 * @module The upstream engine over real loopback HTTP, serving genuine pages
 * (`fixtures/README.md` cites each): profiles and unknown signals as scraped,
 * the operator's capacity and SGLang's server info standing in for a missing
 * one, `/v1/models`, and genuine `include_usage` streams (OpenAI's chat, SGLang's
 * completions) passed through byte for byte.
 */

import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { readFileSync } from "node:fs";
import { afterEach, describe, it } from "node:test";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { VirtualClock } from "../../src/clock.js";
import type { EngineCall, EngineChunk } from "../../src/engine.js";
import { Refusal } from "../../src/errors.js";
import { type FakeUpstream, type Handler, startFakeUpstream, startSse } from "./fake-upstream.js";

const fixture = (name: string) => readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8");
const SGLANG_PAGE = fixture("sglang-docs-production-metrics.prom");
const VLLM_V0_PAGE = fixture("vllm-v0-aibrix-runtime.prom");
const VLLM_V0_MODELS = fixture("vllm-v0-aibrix-models.json");
const NIM_PAGE = fixture("nim-llm-vllm-datadog.prom");
/** The genuine stream's events, framed as the OpenAI API sends them. */
const STREAM_EVENTS = fixture("openai-chat-stream-include-usage.jsonl")
  .split("\n")
  .filter((line) => line !== "")
  .map((line) => `data: ${line}\n\n`);
/** SGLang's completions stream as it sent it (the tail of one, with its usage event), one event per element. */
const SGLANG_STREAM_EVENTS = fixture("sglang-completions-stream-include-usage-pr3760.sse")
  .split(/(?<=\n\n)/)
  .filter((event) => event !== "");

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
  // A virtual clock: no scrape runs but those the test asks for.
  const engine = new OpenAIUpstreamEngine({ baseUrl: up.url, clock: new VirtualClock(), ...options });
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

const page =
  (text: string): Handler =>
  (_req, res) => {
    res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
    res.end(text);
  };
const json =
  (text: string): Handler =>
  (_req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(text);
  };

describe("signals from genuine pages", () => {
  it("SGLang without a stated capacity: unknown, and the budget-less state is reported as such", async () => {
    const up = await upstream({ "/metrics": page(SGLANG_PAGE) });
    const engine = engineFor(up);
    await engine.start();
    const s = engine.signals();
    assert.equal(s.healthy, true);
    assert.equal(s.profile, "sglang");
    assert.equal(s.kvCapacityTokens, 0);
    assert.equal(s.kvCapacitySource, "unknown");
    assert.ok(s.unknown?.includes("kvCapacityTokens"));
    assert.ok(s.unknown?.includes("prefixCache"));
    assert.equal(s.prefixQueryTokens, 0);
    // The server info was asked for once (both paths), and not again on the next scrape.
    await engine.scrape();
    const asked = up.requests.filter((r) => r.path === "/server_info" || r.path === "/get_server_info");
    assert.deepEqual(
      asked.map((r) => r.path),
      ["/server_info", "/get_server_info"],
    );
  });

  it("the operator's --kv-capacity-tokens stands in for the capacity the engine does not state", async () => {
    const up = await upstream({ "/metrics": page(SGLANG_PAGE) });
    const engine = engineFor(up, { kvCapacityTokens: 400_000 });
    await engine.start();
    const s = engine.signals();
    assert.equal(s.kvCapacityTokens, 400_000);
    assert.equal(s.kvCapacitySource, "configured");
    assert.ok(!s.unknown?.includes("kvCapacityTokens"));
  });

  it("SGLang's server info is the engine's own statement and wins over the operator's figure", async () => {
    // A server-info answer reduced to the fields read (the full one carries every server argument).
    const info = JSON.stringify({ max_total_num_tokens: 141_994, page_size: 16, max_running_requests: 48 });
    const up = await upstream({ "/metrics": page(SGLANG_PAGE), "/server_info": json(info) });
    const engine = engineFor(up, { kvCapacityTokens: 400_000 });
    await engine.start();
    const s = engine.signals();
    assert.equal(s.kvCapacityTokens, 141_994);
    assert.equal(s.kvCapacitySource, "engine");
    assert.equal(s.blockSize, 16);
    assert.equal(s.maxNumSeqs, 48);
    assert.deepEqual([...(s.unknown ?? [])].sort(), ["preemptions", "prefixCache"]);
  });

  it("vLLM V0 with its /v1/models: derived capacity, the context window the engine states", async () => {
    const up = await upstream({ "/metrics": page(VLLM_V0_PAGE), "/v1/models": json(VLLM_V0_MODELS) });
    const engine = engineFor(up, { kvCapacityTokens: 5 });
    await engine.start();
    const s = engine.signals();
    assert.equal(s.profile, "vllm-v0");
    assert.equal(s.kvCapacityTokens, 81767 * 16, "a derived figure still beats the operator's fallback");
    assert.equal(s.kvCapacitySource, "derived");
    assert.deepEqual(engine.models(), ["Qwen/Qwen2.5-Coder-1.5B-Instruct", "lora-1", "lora-2"]);
    assert.equal(engine.contextWindow("Qwen/Qwen2.5-Coder-1.5B-Instruct"), 32768);
    assert.equal(engine.contextWindow("lora-1"), undefined, "null: not stated");
    assert.equal(up.requests.filter((r) => r.path.includes("server_info")).length, 0, "vLLM is never asked");
  });
});

describe("where the page is", () => {
  it("NIM for LLMs publishes at /v1/metrics: found there when /metrics is missing, and kept", async () => {
    const up = await upstream({ "/v1/metrics": page(NIM_PAGE) });
    const engine = engineFor(up);
    await engine.start();
    const s = engine.signals();
    assert.equal(s.healthy, true);
    assert.equal(s.profile, "nim");
    assert.equal(s.running, 1);
    assert.equal(s.maxNumSeqs, 64);
    await engine.scrape();
    assert.deepEqual(
      up.requests.filter((r) => r.path.endsWith("metrics")).map((r) => r.path),
      ["/metrics", "/v1/metrics", "/v1/metrics"],
      "once a path served a page, only that path is scraped",
    );
  });

  it("an engine at /metrics is never asked for /v1/metrics", async () => {
    const up = await upstream({ "/metrics": page(VLLM_V0_PAGE), "/v1/metrics": page(NIM_PAGE) });
    const engine = engineFor(up);
    await engine.start();
    await engine.scrape();
    assert.equal(engine.signals().profile, "vllm-v0");
    assert.equal(up.requests.filter((r) => r.path === "/v1/metrics").length, 0);
  });
});

describe("a genuine include_usage stream", () => {
  function call(body: Record<string, unknown>, endpoint: EngineCall["endpoint"] = "chat"): EngineCall {
    return {
      requestId: "req-usage",
      model: "gpt-4o-2024-05-13",
      promptTokens: [1, 2, 3],
      maxTokens: 16,
      endpoint,
      body: {
        ...(endpoint === "chat"
          ? { messages: [{ role: "user", content: "你的名字叫什么？只回答名字" }] }
          : { prompt: [1, 2, 3] }),
        stream: true,
        ...body,
      },
      stream: true,
      signal: new AbortController().signal,
    };
  }

  async function run(
    body: Record<string, unknown>,
    events = STREAM_EVENTS,
    endpoint: EngineCall["endpoint"] = "chat",
  ) {
    const path = endpoint === "chat" ? "/v1/chat/completions" : "/v1/completions";
    const up = await upstream({
      [path]: (_req, res) => {
        startSse(res);
        for (const event of events) res.write(event);
        res.end();
      },
    });
    const engine = engineFor(up);
    const stream = await engine.generate(call(body, endpoint));
    const chunks: EngineChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    const sent = JSON.parse(up.requests[0]!.body) as Record<string, unknown>;
    return { chunks, result: await stream.result, sent };
  }

  it("passes every event through byte for byte when the client asked for usage, [DONE] excepted", async () => {
    const { chunks, result, sent } = await run({ stream_options: { include_usage: true } });
    const decoder = new TextDecoder();
    assert.deepEqual(
      chunks.map((c) => decoder.decode(c.raw)),
      STREAM_EVENTS.slice(0, -1),
    );
    assert.deepEqual(sent.stream_options, { include_usage: true });
    assert.deepEqual(result, {
      promptTokens: 14,
      completionTokens: 3,
      cachedTokens: 0,
      finishReason: "stop",
    });
  });

  it("asks for usage anyway when the client did not, and keeps that event from it", async () => {
    const { chunks, result, sent } = await run({});
    const decoder = new TextDecoder();
    assert.deepEqual(
      chunks.map((c) => decoder.decode(c.raw)),
      STREAM_EVENTS.slice(0, -2),
    );
    assert.deepEqual(sent.stream_options, { include_usage: true });
    assert.equal(result.promptTokens, 14);
    assert.equal(result.completionTokens, 3);
  });

  it("SGLang's completions stream (PR #3760): its usage event, with its own id and no object, passed through as sent", async () => {
    assert.equal(SGLANG_STREAM_EVENTS.length, 3, "the last text event, the usage event, [DONE]");
    const asked = await run({ stream_options: { include_usage: true } }, SGLANG_STREAM_EVENTS, "completions");
    const decoder = new TextDecoder();
    assert.deepEqual(
      asked.chunks.map((c) => decoder.decode(c.raw)),
      SGLANG_STREAM_EVENTS.slice(0, -1),
    );
    assert.deepEqual(asked.result, {
      promptTokens: 8,
      completionTokens: 10,
      cachedTokens: 0,
      finishReason: "length",
    });
    const notAsked = await run({}, SGLANG_STREAM_EVENTS, "completions");
    assert.deepEqual(
      notAsked.chunks.map((c) => decoder.decode(c.raw)),
      SGLANG_STREAM_EVENTS.slice(0, 1),
      "sluice's own request for usage stays sluice's",
    );
    assert.equal(notAsked.result.promptTokens, 8);
  });
});

describe("one signal per call", () => {
  /** The engine's closing signal, to count who still listens to it. */
  const closingOf = (engine: OpenAIUpstreamEngine) =>
    (engine as unknown as { closing: AbortController }).closing.signal;

  it("ended calls and scrapes leave nothing listening to the engine; a call waiting for headers is refused when it closes", async () => {
    let hold = false;
    const up = await upstream({
      "/metrics": page(SGLANG_PAGE),
      "/v1/chat/completions": (_req, res) => {
        if (hold) return; // never answers
        startSse(res);
        for (const event of STREAM_EVENTS) res.write(event);
        res.end();
      },
    });
    const engine = engineFor(up);
    await engine.start();
    const call = (): EngineCall => ({
      requestId: "r",
      model: "m",
      promptTokens: [1],
      maxTokens: 4,
      endpoint: "chat",
      body: { messages: [] },
      stream: true,
      signal: new AbortController().signal,
    });
    for (let i = 0; i < 3; i++) {
      const stream = await engine.generate(call());
      for await (const _ of stream) {
        // drained
      }
    }
    await engine.scrape();
    assert.equal(getEventListeners(closingOf(engine), "abort").length, 0, "no listener left behind");

    hold = true;
    const waiting = engine.generate(call());
    await up.nextRequest("/v1/chat/completions", 4);
    assert.equal(getEventListeners(closingOf(engine), "abort").length, 1);
    await engine.close();
    await assert.rejects(waiting, (e: unknown) => e instanceof Refusal && e.reason === "unavailable");
    assert.equal(engine.inFlight(), 0);
  });
});
