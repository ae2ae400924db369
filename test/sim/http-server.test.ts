/** @module The simulated replica over real loopback HTTP: SSE streaming, JSON, /v1/models, vLLM-named /metrics, disconnects. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { type SimServer, startSimServer } from "../../adapters/engines/sim/http-server.js";
import type { SimCallEvent } from "../../adapters/engines/sim/rank-types.js";

/** Waits for the first call event that matches (pushed by the engine's hook), without timers. */
class CallEvents {
  private readonly seen: SimCallEvent[] = [];
  private waiters: { match: (e: SimCallEvent) => boolean; resolve: (e: SimCallEvent) => void }[] = [];

  push = (event: SimCallEvent): void => {
    this.seen.push(event);
    this.waiters = this.waiters.filter((w) => {
      if (!w.match(event)) return true;
      w.resolve(event);
      return false;
    });
  };

  next(match: (e: SimCallEvent) => boolean): Promise<SimCallEvent> {
    const found = this.seen.find(match);
    if (found) return Promise.resolve(found);
    return new Promise((resolve) => this.waiters.push({ match, resolve }));
  }
}

/** Reads SSE `data:` payloads one by one. */
async function* sseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  const reader = body.getReader();
  for (;;) {
    const { value: bytes, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(bytes, { stream: true });
    for (let cut = buffer.indexOf("\n\n"); cut >= 0; cut = buffer.indexOf("\n\n")) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      assert.ok(event.startsWith("data: "), `an SSE data event, got ${JSON.stringify(event)}`);
      yield event.slice(6);
    }
  }
  assert.equal(buffer, "", "no partial event at the end");
}

/** Parses a Prometheus text page into `name{labels}` → value, and the TYPE of each family. */
function parseMetrics(text: string): {
  samples: { name: string; labels: Record<string, string>; value: number }[];
  types: Map<string, string>;
} {
  const samples: { name: string; labels: Record<string, string>; value: number }[] = [];
  const types = new Map<string, string>();
  for (const line of text.split("\n")) {
    const type = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (type) types.set(type[1]!, type[2]!);
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `a sample line, got ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/(\w+)="([^"]*)"/g)) labels[l[1]!] = l[2]!;
    samples.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return { samples, types };
}

describe("sim HTTP server (real time, loopback)", () => {
  let server: SimServer;
  const events = new CallEvents();
  const MODEL = "sim-model";

  before(async () => {
    // 20 ms per decode step: a 40-token call takes most of a second, so "before the end" is unambiguous.
    server = await startSimServer({
      preset: { base: "h100-llama3-8b", c0: 20 },
      model: MODEL,
      dataParallelSize: 2,
      engine: { onCall: events.push },
    });
  });
  after(async () => {
    await server.close();
  });

  const post = (path: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) =>
    fetch(`${server.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: typeof body === "string" ? body : JSON.stringify(body),
      ...(signal ? { signal } : {}),
    });

  test("GET /v1/models lists the model with max_model_len", async () => {
    const res = await fetch(`${server.url}/v1/models`);
    assert.equal(res.status, 200);
    const body = (await res.json()) as { object: string; data: { id: string; max_model_len: number }[] };
    assert.equal(body.object, "list");
    assert.equal(body.data[0]!.id, MODEL);
    assert.equal(body.data[0]!.max_model_len, 131_072);
  });

  test("streaming chat: SSE chunks arrive while the call is still running, then usage and [DONE]", async () => {
    const res = await post(
      "/v1/chat/completions",
      {
        model: MODEL,
        messages: [{ role: "user", content: "Tell me about block tables." }],
        max_tokens: 40,
        stream: true,
        stream_options: { include_usage: true },
      },
      { "x-request-id": "stream-1" },
    );
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
    let content = "";
    let sawContentWhileRunning = false;
    const payloads: string[] = [];
    for await (const data of sseEvents(res.body!)) {
      payloads.push(data);
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data) as {
        object: string;
        choices: { delta: { content?: string }; finish_reason: string | null }[];
      };
      assert.equal(chunk.object, "chat.completion.chunk");
      const piece = chunk.choices[0]?.delta.content;
      if (piece) {
        if (content === "") {
          // The first generated text reached us; the engine has not finished the call.
          sawContentWhileRunning = server.engine.signals().running > 0;
        }
        content += piece;
      }
    }
    assert.ok(sawContentWhileRunning, "the first content chunk arrived before the call ended");
    assert.equal(payloads.at(-1), "[DONE]");
    const usageChunk = JSON.parse(payloads.at(-2)!) as { choices: unknown[]; usage: Record<string, unknown> };
    assert.deepEqual(usageChunk.choices, []);
    assert.equal(usageChunk.usage.completion_tokens, 40);
    assert.equal((usageChunk.usage.prompt_tokens_details as { cached_tokens: number }).cached_tokens, 0);
    const finish = JSON.parse(payloads.at(-3)!) as { choices: { finish_reason: string }[] };
    assert.equal(finish.choices[0]!.finish_reason, "length");
    assert.equal(content.trim().split(/\s+/).length, 40, "one word per token");
  });

  test("non-streaming chat returns JSON with usage and cached tokens on a repeated prefix", async () => {
    const messages = [
      { role: "system", content: "You are a careful assistant. ".repeat(20) },
      { role: "user", content: "Summarise paged attention." },
    ];
    const first = await post(
      "/v1/chat/completions",
      { model: MODEL, messages, max_tokens: 3 },
      { "x-data-parallel-rank": "0" },
    );
    assert.equal(first.status, 200);
    const a = (await first.json()) as {
      object: string;
      choices: { message: { role: string; content: string }; finish_reason: string }[];
      usage: {
        prompt_tokens: number;
        completion_tokens: number;
        total_tokens: number;
        prompt_tokens_details: { cached_tokens: number };
      };
    };
    assert.equal(a.object, "chat.completion");
    assert.equal(a.choices[0]!.message.role, "assistant");
    assert.equal(a.choices[0]!.finish_reason, "length");
    assert.equal(a.usage.completion_tokens, 3);
    assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + 3);
    const second = await post(
      "/v1/chat/completions",
      { model: MODEL, messages, max_tokens: 3 },
      { "x-data-parallel-rank": "0" },
    );
    const b = (await second.json()) as typeof a;
    assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens);
    assert.equal(
      b.usage.prompt_tokens_details.cached_tokens,
      Math.floor((a.usage.prompt_tokens - 1) / 16) * 16,
    );
    assert.equal(b.choices[0]!.message.content, a.choices[0]!.message.content, "same prompt, same output");
  });

  test("legacy completions with a text prompt, and the rank header picks the rank", async () => {
    const res = await post(
      "/v1/completions",
      { model: MODEL, prompt: "The KV cache holds", max_tokens: 4 },
      {
        "x-data-parallel-rank": "1",
        "x-request-id": "ranked",
      },
    );
    assert.equal(res.status, 200);
    const body = (await res.json()) as {
      object: string;
      choices: { text: string }[];
      usage: { completion_tokens: number };
    };
    assert.equal(body.object, "text_completion");
    assert.equal(body.usage.completion_tokens, 4);
    assert.equal(body.choices[0]!.text.trim().split(" ").length, 4);
    const arrival = await events.next((e) => e.requestId === "ranked" && e.type === "arrival");
    assert.equal(arrival.rank, 1);
  });

  test("a client that disconnects mid-stream aborts its call", async () => {
    const controller = new AbortController();
    const res = await post(
      "/v1/completions",
      { model: MODEL, prompt: "Go on for a long time", max_tokens: 2000, stream: true },
      { "x-request-id": "leaver" },
      controller.signal,
    );
    const reader = res.body!.getReader();
    await reader.read();
    controller.abort();
    const finished = await events.next((e) => e.requestId === "leaver" && e.type === "finished");
    assert.equal(finished.finishReason, "abort");
    assert.ok(finished.completionTokens! < 2000);
  });

  test("errors: unknown model 404, bad JSON 400, too long 400 — in the OpenAI envelope", async () => {
    const unknown = await post("/v1/chat/completions", {
      model: "nope",
      messages: [{ role: "user", content: "x" }],
    });
    assert.equal(unknown.status, 404);
    const u = (await unknown.json()) as { error: { message: string; code: number } };
    assert.match(u.error.message, /`nope` does not exist/);
    const bad = await post("/v1/chat/completions", "{not json");
    assert.equal(bad.status, 400);
    const long = await post("/v1/completions", { model: MODEL, prompt: [1, 2, 3], max_tokens: 200_000 });
    assert.equal(long.status, 400);
    assert.match(
      ((await long.json()) as { error: { message: string } }).error.message,
      /maximum context length/,
    );
    const noMessages = await post("/v1/chat/completions", { model: MODEL, messages: [] });
    assert.equal(noMessages.status, 400);
    const badMax = await post("/v1/completions", { model: MODEL, prompt: "x", max_tokens: -1 });
    assert.equal(badMax.status, 400);
  });

  test("errors come in a fixed order: max tokens, then rank, then n, then kv_transfer_params", async () => {
    type ErrorBody = { error: { message: string; param: string | null; code: number } };
    const refused = async (path: string, body: unknown, headers: Record<string, string> = {}) => {
      const res = await post(path, body, headers);
      assert.equal(res.status, 400);
      return ((await res.json()) as ErrorBody).error;
    };
    const chat = { model: MODEL, messages: [{ role: "user", content: "x" }] };
    const badRank = { "x-data-parallel-rank": "-1" };
    const maxFirst = await refused("/v1/chat/completions", { ...chat, max_tokens: 0, n: 2 }, badRank);
    assert.equal(maxFirst.param, "max_tokens");
    const rankFirst = await refused("/v1/chat/completions", { ...chat, n: 2 }, badRank);
    assert.match(rankFirst.message, /x-data-parallel-rank must be a non-negative integer, got "-1"/);
    assert.equal(rankFirst.param, null);
    const fieldRank = await refused("/v1/completions", {
      model: MODEL,
      prompt: "x",
      n: 3,
      data_parallel_rank: "a",
    });
    assert.match(fieldRank.message, /x-data-parallel-rank/);
    const nNext = await refused("/v1/chat/completions", { ...chat, n: 2, kv_transfer_params: [] });
    assert.equal(nNext.param, "n");
    const transfer = await refused("/v1/chat/completions", { ...chat, kv_transfer_params: "x" });
    assert.equal(transfer.param, "kv_transfer_params");
    const responses = { model: MODEL, input: "x" };
    const outputFirst = await refused("/v1/responses", { ...responses, max_output_tokens: 0 }, badRank);
    assert.equal(outputFirst.param, "max_output_tokens");
    const responsesRank = await refused("/v1/responses", responses, badRank);
    assert.match(responsesRank.message, /x-data-parallel-rank/);
    const signals = server.engine.signals();
    assert.equal(signals.running, 0, "a refused request never reaches the engine");
    assert.equal(signals.waiting, 0);
  });

  test("GET /metrics exposes every vLLM name, per engine rank with model_name", async () => {
    const res = await fetch(`${server.url}/metrics`);
    assert.equal(res.status, 200);
    const { samples, types } = parseMetrics(await res.text());
    const names = [
      "vllm:kv_cache_usage_perc",
      "vllm:prefix_cache_queries_total",
      "vllm:prefix_cache_hits_total",
      "vllm:num_requests_running",
      "vllm:num_requests_waiting",
      "vllm:num_preemptions_total",
      "vllm:cache_config_info",
    ];
    for (const name of names) {
      const series = samples.filter((s) => s.name === name);
      assert.equal(series.length, 2, `${name}: one series per rank`);
      assert.deepEqual(series.map((s) => s.labels.engine).sort(), ["0", "1"]);
      if (name !== "vllm:cache_config_info") assert.ok(series.every((s) => s.labels.model_name === MODEL));
    }
    assert.equal(types.get("vllm:prefix_cache_queries_total"), "counter");
    assert.equal(types.get("vllm:kv_cache_usage_perc"), "gauge");
    const info = samples.find((s) => s.name === "vllm:cache_config_info")!;
    assert.equal(info.value, 1);
    assert.equal(info.labels.block_size, "16");
    assert.equal(
      info.labels.num_gpu_blocks,
      String(2 * 27437),
      "both ranks' blocks, as vLLM's front end prints them",
    );
    assert.equal(info.labels.max_num_seqs, "256");
    const sum = (name: string) => samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
    const signals = server.engine.signals();
    assert.equal(sum("vllm:prefix_cache_queries_total"), signals.prefixQueryTokens);
    assert.equal(sum("vllm:prefix_cache_hits_total"), signals.prefixHitTokens);
    assert.ok(sum("vllm:prefix_cache_hits_total") > 0);
    assert.equal(sum("vllm:num_requests_running"), signals.running);
  });
});
