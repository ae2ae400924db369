/** @module One simulated replica as an OpenAI-compatible HTTP server with vLLM-named `/metrics` (real time by default). */

import { randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { type Context, Hono } from "hono";
import { createTokenizer } from "../../../adapters/tokenizers/index.js";
import { type Clock, realClock } from "../../../src/clock.js";
import type { EngineCall, EngineResult, EngineStream, ReplicaRole } from "../../../src/engine.js";
import { Refusal } from "../../../src/errors.js";
import { PromptTokenizer } from "../../../src/tokens/prompt-tokenizer.js";
import type { ChatMessage } from "../../../src/types.js";
import { responsesMessages } from "../../openai-api/responses-input.js";
import { createSimRegistry } from "./metrics.js";
import type { PresetName, PresetOverrides } from "./presets.js";
import { BootstrapRooms, joinPrefill, RoomTaken } from "./sglang-bootstrap.js";
import { SimEngine, type SimEngineOptions } from "./sim-engine.js";
import { vocabularyFromTokenizer } from "./vocabulary.js";

/** Options of {@link startSimServer} and {@link createSimApp}. */
export interface SimServerOptions {
  /** TCP port; 0 (default) picks a free one. */
  port?: number;
  /** Interface to listen on; default 127.0.0.1. */
  host?: string;
  preset?: PresetName | PresetOverrides;
  model?: string;
  /** Default: real time. */
  clock?: Clock;
  /** Data-parallel ranks; a call picks one with the `x-data-parallel-rank` header. Default 1. */
  dataParallelSize?: number;
  seed?: number;
  /** Tokenizer spec for prompts (`o200k` default, or a `tokenizer.json` path). */
  tokenizer?: string;
  /**
   * Output tokens when a request gives no `max_tokens`/`max_completion_tokens`,
   * capped by what the context window leaves. Default 1024 (vLLM would take
   * the whole remaining window; a simulator generating 100k tokens helps nobody).
   */
  defaultMaxTokens?: number;
  /** Further engine options (preset overrides such as `maxNumSeqs`, hooks). */
  engine?: Partial<Omit<SimEngineOptions, "id" | "clock">>;
  /** Engine id; default `sim`. */
  id?: string;
  /** Role in a disaggregated fleet (`prefill`, `decode`); default `both`. */
  role?: ReplicaRole;
  /**
   * The request flow a `prefill` or `decode` replica speaks: `vllm` (default,
   * `kv_transfer_params`) or `sglang` (SGLang's PD mode: `bootstrap_host`,
   * `bootstrap_port`, `bootstrap_room` on both requests; `sglang-bootstrap.ts`).
   */
  pd?: "vllm" | "sglang";
}

/** A running simulated replica server. */
export interface SimServer {
  /** Base URL, e.g. `http://127.0.0.1:9000`. */
  url: string;
  engine: SimEngine;
  /** SGLang's PD mode: rooms a prefill replica holds open (a request waiting for its other half); 0 once idle. */
  openRooms(): number;
  close(): Promise<void>;
}

type Json = Record<string, unknown>;

/** vLLM's error body (OpenAI envelope with vLLM's types). */
function errorBody(message: string, status: number, param: string | null = null): Json {
  const type = status === 404 ? "NotFoundError" : status >= 500 ? "InternalServerError" : "BadRequestError";
  return { error: { message, type, param, code: status } };
}

/** An answer with an error status (400 unless said), in vLLM's error body. */
class HttpError extends Error {
  constructor(
    message: string,
    readonly status = 400,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

function positiveInt(value: unknown, name: string): number | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 1) {
    throw new HttpError(`${name} must be an integer ≥ 1, got ${JSON.stringify(value)}`, 400, name);
  }
  return value;
}

function parseRank(header: string | undefined, field: unknown): number | undefined {
  const raw = header ?? (field === undefined || field === null ? undefined : String(field));
  if (raw === undefined || raw.trim() === "") return undefined;
  const rank = Number(raw.trim());
  if (!Number.isInteger(rank) || rank < 0) {
    throw new HttpError(`x-data-parallel-rank must be a non-negative integer, got ${JSON.stringify(raw)}`);
  }
  return rank;
}

function usageOf(result: EngineResult): Json {
  return {
    prompt_tokens: result.promptTokens,
    total_tokens: result.promptTokens + result.completionTokens,
    completion_tokens: result.completionTokens,
    prompt_tokens_details: { cached_tokens: result.cachedTokens },
  };
}

function streamOptions(body: Json): { includeUsage: boolean } {
  const options = body.stream_options;
  return {
    includeUsage: !!options && typeof options === "object" && (options as Json).include_usage === true,
  };
}

/**
 * The hono app of a simulated replica: `POST /v1/chat/completions`,
 * `POST /v1/completions` (stream or not), `GET /v1/models`, `GET /metrics`,
 * `GET /health`. A client that disconnects aborts its call.
 */
export function createSimApp(
  engine: SimEngine,
  options: Pick<SimServerOptions, "tokenizer" | "defaultMaxTokens" | "pd"> & {
    prompts?: PromptTokenizer;
    /** The port the server listens on, once it does (its SGLang bootstrap port too). */
    port?: () => number;
    /** SGLang's PD mode on a prefill replica: the rooms its requests meet in. */
    rooms?: BootstrapRooms;
  } = {},
): Hono {
  const sglang = options.pd === "sglang";
  if (sglang && engine.role === "both") {
    throw new RangeError("pd sglang is for a prefill or a decode replica (role prefill or decode)");
  }
  const rooms = options.rooms ?? new BootstrapRooms();
  const prompts = options.prompts ?? new PromptTokenizer(createTokenizer(options.tokenizer));
  const defaultMaxTokens = options.defaultMaxTokens ?? 1024;
  if (!(Number.isInteger(defaultMaxTokens) && defaultMaxTokens >= 1)) {
    throw new RangeError(`defaultMaxTokens should be a positive integer, got ${defaultMaxTokens}`);
  }
  const registry = createSimRegistry(engine);
  const startedAt = Math.floor(Date.now() / 1000);
  const app = new Hono();

  app.onError((error, c) => {
    if (error instanceof HttpError)
      return c.json(errorBody(error.message, error.status, error.param), error.status as 400);
    if (error instanceof Refusal && error.reason === "response_state_lost") {
      // vLLM's answer to a previous_response_id it does not hold (serving_responses.py, `_make_not_found_error`).
      return c.json(
        { error: { message: error.message, type: "invalid_request_error", param: "response_id", code: 404 } },
        404,
      );
    }
    if (error instanceof Refusal) {
      // vLLM answers every request it cannot serve (too long, bad parameters) with 400.
      const status = error.reason === "unavailable" ? 503 : 400;
      return c.json(errorBody(error.message, status, error.param), status);
    }
    return c.json(errorBody(error instanceof Error ? error.message : String(error), 500), 500);
  });

  app.get("/health", (c) => c.body(null, 200));
  app.get("/version", (c) => c.json({ version: "sluice-sim" }));

  app.get("/v1/models", (c) =>
    c.json({
      object: "list",
      data: engine.models().map((id) => ({
        id,
        object: "model",
        created: startedAt,
        owned_by: "vllm",
        root: id,
        parent: null,
        max_model_len: engine.params.maxModelLen,
        permission: [],
      })),
    }),
  );

  // SGLang's server info carries its server_args; a router reads the mode and bootstrap port there.
  const serverInfo = (c: Context) =>
    c.json({
      model_path: engine.model,
      disaggregation_mode: engine.role === "both" ? "null" : engine.role,
      ...(sglang && engine.role === "prefill"
        ? { disaggregation_bootstrap_port: options.port?.() ?? 0 }
        : {}),
    });
  app.get("/server_info", serverInfo);
  app.get("/get_server_info", serverInfo);

  if (sglang && engine.role === "prefill") {
    // A decode server joins a room here (sglang-bootstrap.ts).
    app.post("/sim/bootstrap/join", async (c) => {
      const body = (await c.req.json().catch(() => undefined)) as Json | undefined;
      const room = roomOf(body?.bootstrap_room);
      try {
        const handover = await rooms.join(room, c.req.raw.signal);
        return c.json({ prompt_tokens: handover.promptTokens });
      } catch (error) {
        return c.json(errorBody(`bootstrap_room ${room}: ${(error as Error).message}`, 500), 500);
      }
    });
  }

  app.get("/metrics", async (c) => {
    const text = await registry.metrics();
    return c.body(text, 200, { "content-type": registry.contentType });
  });

  /** A call's body: a JSON object naming a model this replica serves (or none), as vLLM checks it. */
  const servedBody = async (c: Context): Promise<Json> => {
    let body: Json;
    try {
      body = (await c.req.json()) as Json;
    } catch (error) {
      throw new HttpError(`request body is not JSON: ${(error as Error).message}`);
    }
    if (!body || typeof body !== "object" || Array.isArray(body))
      throw new HttpError("request body must be a JSON object");
    const model = body.model;
    if (model !== undefined && model !== null && !engine.models().includes(String(model))) {
      throw new HttpError(`The model \`${String(model)}\` does not exist.`, 404, "model");
    }
    return body;
  };

  const handle = (kind: "chat" | "completions") =>
    async function completion(c: Context): Promise<Response> {
      const body = await servedBody(c);
      const promptTokens =
        kind === "chat" ? chatTokens(prompts, body.messages) : completionTokens(prompts, body.prompt);
      const requested =
        positiveInt(body.max_completion_tokens, "max_completion_tokens") ??
        positiveInt(body.max_tokens, "max_tokens");
      const room = engine.params.maxModelLen - promptTokens.length;
      const maxTokens = requested ?? Math.max(1, Math.min(defaultMaxTokens, room));
      const rank = parseRank(c.req.header("x-data-parallel-rank"), body.data_parallel_rank);
      const n = body.n;
      if (n !== undefined && n !== null && n !== 1) throw new HttpError("only n = 1 is supported", 400, "n");
      const stream = body.stream === true;
      const requestId = c.req.header("x-request-id") ?? randomUUID().replaceAll("-", "");
      const local = new AbortController();
      const signal = AbortSignal.any([c.req.raw.signal, local.signal]);
      const call: EngineCall = {
        requestId,
        model: engine.model,
        promptTokens,
        maxTokens,
        endpoint: kind,
        body,
        stream,
        signal,
      };
      if (rank !== undefined) call.rank = rank;
      const transfer = body.kv_transfer_params;
      if (transfer !== undefined && transfer !== null) {
        if (typeof transfer !== "object" || Array.isArray(transfer)) {
          throw new HttpError("kv_transfer_params must be an object", 400, "kv_transfer_params");
        }
        call.kvTransferParams = transfer as Json;
      }
      const running = sglang
        ? await sglangLeg(call, body, signal, engine, rooms)
        : await engine.generate(call);
      const id = `${kind === "chat" ? "chatcmpl" : "cmpl"}-${requestId}`;
      const created = Math.floor(Date.now() / 1000);
      if (!stream) return c.json(await fullResponse(kind, running, id, created, engine.model));
      return new Response(sseBody(kind, running, id, created, engine.model, streamOptions(body), local), {
        headers: {
          "content-type": "text/event-stream; charset=utf-8",
          "cache-control": "no-cache",
          "x-request-id": requestId,
        },
      });
    };

  app.post("/v1/chat/completions", handle("chat"));
  app.post("/v1/completions", handle("completions"));

  // The Responses API: the engine writes its own events (or Response object), which are sent as they are.
  app.post("/v1/responses", async function responses(c: Context): Promise<Response> {
    const body = await servedBody(c);
    const input = body.input;
    if (typeof input !== "string" && !(Array.isArray(input) && input.length > 0)) {
      throw new HttpError("input must be a string or a non-empty array of items", 400, "input");
    }
    const promptTokens = chatTokens(prompts, responsesMessages(body));
    const room = engine.params.maxModelLen - promptTokens.length;
    const maxTokens =
      positiveInt(body.max_output_tokens, "max_output_tokens") ??
      Math.max(1, Math.min(defaultMaxTokens, room));
    const stream = body.stream === true;
    const requestId = c.req.header("x-request-id") ?? randomUUID().replaceAll("-", "");
    const local = new AbortController();
    const signal = AbortSignal.any([c.req.raw.signal, local.signal]);
    const call: EngineCall = {
      requestId,
      model: engine.model,
      promptTokens,
      maxTokens,
      endpoint: "responses",
      body,
      stream,
      signal,
    };
    const rank = parseRank(c.req.header("x-data-parallel-rank"), body.data_parallel_rank);
    if (rank !== undefined) call.rank = rank;
    const running = await engine.generate(call);
    if (!stream) {
      let raw = "";
      const decoder = new TextDecoder();
      for await (const chunk of running) if (chunk.raw) raw += decoder.decode(chunk.raw);
      return c.body(raw, 200, { "content-type": "application/json" });
    }
    const iterator = running[Symbol.asyncIterator]();
    const events = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const next = await iterator.next();
        if (next.done) controller.close();
        else if (next.value.raw) controller.enqueue(next.value.raw);
      },
      async cancel() {
        local.abort();
        await iterator.return?.();
      },
    });
    return new Response(events, {
      headers: {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        "x-request-id": requestId,
      },
    });
  });
  return app;
}

/** A `bootstrap_room`, as SGLang's scheduler requires one of every request in PD mode. */
function roomOf(value: unknown): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    // sgl-project/sglang, python/sglang/srt/managers/scheduler.py (handle_generate_request).
    throw new HttpError(
      "Invalid request: Disaggregated request received without bootstrap room id.",
      400,
      "bootstrap_room",
    );
  }
  return value;
}

/**
 * One leg of SGLang's PD mode. A prefill request waits for its decode server
 * to join its room, then computes the prompt to its first token (SGLang's
 * prefill stops there, `FINISH_LENGTH(length=0)`, whatever it was asked) and
 * hands the KV over. A decode request joins the prefill server named in it,
 * then receives the prompt's KV over its link before it queues; a failed join
 * is SGLang's 500 "Decode transfer failed for request …"
 * (python/sglang/srt/disaggregation/decode.py).
 */
async function sglangLeg(
  call: EngineCall,
  body: Json,
  signal: AbortSignal,
  engine: SimEngine,
  rooms: BootstrapRooms,
): Promise<EngineStream> {
  const room = roomOf(body.bootstrap_room);
  if (engine.role === "prefill") {
    call.maxTokens = 1;
    let computed: EngineStream | undefined;
    try {
      await rooms.prefill(room, signal, async () => {
        computed = await engine.generate(call);
        const result = await computed.result;
        if (result.finishReason === "abort") throw signal.reason ?? new Error("the prefill was aborted");
        return { promptTokens: call.promptTokens.length };
      });
    } catch (error) {
      if (error instanceof RoomTaken) throw new HttpError(error.message, 400, "bootstrap_room");
      throw error;
    }
    // The answer is its one token, read from the finished computation.
    return computed!;
  }
  const host = body.bootstrap_host;
  const port = body.bootstrap_port;
  if (typeof host !== "string" || host === "" || !Number.isInteger(port)) {
    throw new HttpError(
      "bootstrap_host and bootstrap_port must name the prefill server",
      400,
      "bootstrap_host",
    );
  }
  try {
    await joinPrefill(host, port as number, room, signal);
  } catch (error) {
    if (signal.aborted) throw signal.reason;
    throw new HttpError(
      `Decode transfer failed for request rid=${call.requestId} bootstrap_room=${room}: ${(error as Error).message}`,
      500,
    );
  }
  call.kvTransferParams = { do_remote_prefill: true };
  return await engine.generate(call);
}

function chatTokens(prompts: PromptTokenizer, messages: unknown): number[] {
  if (!Array.isArray(messages) || messages.length === 0) {
    throw new HttpError("messages must be a non-empty array", 400, "messages");
  }
  for (const [i, m] of messages.entries()) {
    if (!m || typeof m !== "object" || typeof (m as Json).role !== "string") {
      throw new HttpError(`messages[${i}] must be an object with a string role`, 400, "messages");
    }
  }
  const tokens = prompts.chat(messages as ChatMessage[]);
  // The generation prompt: the assistant's header, as a chat template appends it.
  for (const t of prompts.text("<|assistant|>\n")) tokens.push(t);
  return tokens;
}

function completionTokens(prompts: PromptTokenizer, prompt: unknown): number[] {
  if (typeof prompt === "string") return prompts.text(prompt);
  if (Array.isArray(prompt)) {
    if (prompt.length > 0 && prompt.every((t) => Number.isInteger(t) && t >= 0)) return prompt as number[];
    if (prompt.length === 1) return completionTokens(prompts, prompt[0]);
    throw new HttpError(
      "prompt must be one string or one array of token ids (batches are not supported)",
      400,
      "prompt",
    );
  }
  throw new HttpError("prompt must be a string or an array of token ids", 400, "prompt");
}

async function fullResponse(
  kind: "chat" | "completions",
  running: EngineStream,
  id: string,
  created: number,
  model: string,
): Promise<Json> {
  let text = "";
  for await (const chunk of running) text += chunk.text;
  const result = await running.result;
  const finish = result.finishReason;
  const choice =
    kind === "chat"
      ? {
          index: 0,
          message: { role: "assistant", content: text, tool_calls: [] },
          logprobs: null,
          finish_reason: finish,
          stop_reason: null,
        }
      : { index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null };
  return {
    id,
    object: kind === "chat" ? "chat.completion" : "text_completion",
    created,
    model,
    choices: [choice],
    usage: usageOf(result),
    // vLLM returns a prefill's hand-over parameters at the top level of a non-streamed answer
    // (vllm/entrypoints/openai/protocol.py, `kv_transfer_params` on the completion responses).
    ...(result.kvTransferParams ? { kv_transfer_params: result.kvTransferParams } : {}),
  };
}

/** The SSE body: one `data:` event per engine chunk, a final chunk with the finish reason, usage if asked, `[DONE]`. */
function sseBody(
  kind: "chat" | "completions",
  running: EngineStream,
  id: string,
  created: number,
  model: string,
  { includeUsage }: { includeUsage: boolean },
  local: AbortController,
): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  const object = kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const event = (choices: Json[], extra: Json = {}): Uint8Array => {
    const payload: Json = { id, object, created, model, choices, ...extra };
    if (includeUsage && !("usage" in payload)) payload.usage = null;
    return encoder.encode(`data: ${JSON.stringify(payload)}\n\n`);
  };
  const choice = (text: string, finish: string | null): Json =>
    kind === "chat"
      ? {
          index: 0,
          delta: text === "" && finish ? {} : { content: text },
          logprobs: null,
          finish_reason: finish,
        }
      : { index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null };
  const iterator = running[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    start(controller) {
      if (kind === "chat") {
        controller.enqueue(
          event([
            { index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null },
          ]),
        );
      }
    },
    async pull(controller) {
      const next = await iterator.next();
      if (!next.done) {
        controller.enqueue(event([choice(next.value.text, null)]));
        return;
      }
      const result = await running.result;
      if (result.finishReason === "abort") {
        controller.close();
        return;
      }
      controller.enqueue(event([choice("", result.finishReason)]));
      if (includeUsage) controller.enqueue(event([], { usage: usageOf(result) }));
      controller.enqueue(encoder.encode("data: [DONE]\n\n"));
      controller.close();
    },
    async cancel() {
      local.abort();
      await iterator.return?.();
    },
  });
}

/**
 * Starts a simulated replica on `host:port` (real time unless `clock` is
 * given) and resolves once it listens. Prompts are tokenized with sluice's
 * tokenizer, and generated words are single tokens of it, so a client that
 * sends the output back keeps its prefix cacheable.
 */
export async function startSimServer(options: SimServerOptions = {}): Promise<SimServer> {
  const { port = 0, host = "127.0.0.1", preset, model, clock = realClock, dataParallelSize, seed } = options;
  if (!(Number.isInteger(port) && port >= 0 && port <= 65535)) {
    throw new RangeError(`port should be an integer in [0, 65535], got ${port}`);
  }
  const tokenizer = createTokenizer(options.tokenizer);
  const engineOptions: SimEngineOptions = {
    vocabulary: vocabularyFromTokenizer((text) => tokenizer.encode(text)),
    ...options.engine,
    id: options.id ?? "sim",
    clock,
  };
  if (preset !== undefined) engineOptions.preset = preset;
  if (model !== undefined) engineOptions.model = model;
  if (dataParallelSize !== undefined) engineOptions.dataParallelSize = dataParallelSize;
  if (seed !== undefined) engineOptions.seed = seed;
  if (options.role !== undefined) engineOptions.role = options.role;
  const engine = new SimEngine(engineOptions);
  let listeningPort = 0;
  const rooms = new BootstrapRooms();
  const appOptions: Parameters<typeof createSimApp>[1] = {
    prompts: new PromptTokenizer(tokenizer),
    port: () => listeningPort,
    rooms,
  };
  if (options.pd !== undefined) appOptions.pd = options.pd;
  if (options.defaultMaxTokens !== undefined) appOptions.defaultMaxTokens = options.defaultMaxTokens;
  const app = createSimApp(engine, appOptions);
  const server = await new Promise<ReturnType<typeof serve>>((resolve, reject) => {
    const s = serve({ fetch: app.fetch, port, hostname: host }, () => resolve(s));
    s.once("error", reject);
  });
  const address = server.address() as AddressInfo;
  listeningPort = address.port;
  const urlHost = host.includes(":") ? `[${host}]` : host;
  let closed: Promise<void> | undefined;
  return {
    url: `http://${urlHost}:${address.port}`,
    engine,
    openRooms: () => rooms.size,
    close() {
      closed ??= (async () => {
        await engine.close();
        await new Promise<void>((resolve) => {
          server.close(() => resolve());
          (server as { closeAllConnections?: () => void }).closeAllConnections?.();
        });
      })();
      return closed;
    },
  };
}
