/** @module What every route of the simulated replica's HTTP server shares: vLLM's error body, request checks, the call a request makes. */

import { randomUUID } from "node:crypto";
import type { Context } from "hono";
import type { EngineCall } from "../../../src/engine.js";
import type { PromptTokenizer } from "../../../src/tokens/prompt-tokenizer.js";
import type { ChatMessage } from "../../../src/types.js";
import type { SimEngine } from "./sim-engine.js";

export type Json = Record<string, unknown>;

/** vLLM's error body (OpenAI envelope with vLLM's types). */
export function errorBody(message: string, status: number, param: string | null = null): Json {
  const type = status === 404 ? "NotFoundError" : status >= 500 ? "InternalServerError" : "BadRequestError";
  return { error: { message, type, param, code: status } };
}

/** An answer with an error status (400 unless said), in vLLM's error body. */
export class HttpError extends Error {
  constructor(
    message: string,
    readonly status = 400,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

export function positiveInt(value: unknown, name: string): number | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 1) {
    throw new HttpError(`${name} must be an integer ≥ 1, got ${JSON.stringify(value)}`, 400, name);
  }
  return value;
}

/** The rank a request picks: the `x-data-parallel-rank` header, else a `data_parallel_rank` body field. */
export function requestedRank(c: Context, body: Json): number | undefined {
  const header = c.req.header("x-data-parallel-rank");
  const field = body.data_parallel_rank;
  const raw = header ?? (field === undefined || field === null ? undefined : String(field));
  if (raw === undefined || raw.trim() === "") return undefined;
  const rank = Number(raw.trim());
  if (!Number.isInteger(rank) || rank < 0) {
    throw new HttpError(`x-data-parallel-rank must be a non-negative integer, got ${JSON.stringify(raw)}`);
  }
  return rank;
}

/** What a route needs to answer the requests it serves. */
export interface RouteContext {
  engine: SimEngine;
  prompts: PromptTokenizer;
  /** Output tokens when a request asks for none, capped by what the context window leaves. */
  defaultMaxTokens: number;
  /** A call's body: a JSON object naming a model this replica serves (or none), as vLLM checks it. */
  servedBody(c: Context): Promise<Json>;
}

export function servedBodyOf(engine: SimEngine): (c: Context) => Promise<Json> {
  return async (c) => {
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
}

/** The output tokens of a request that asks for none: the default, within what the context window leaves (at least 1). */
export function defaultedMaxTokens(routes: RouteContext, promptTokens: number[]): number {
  const room = routes.engine.params.maxModelLen - promptTokens.length;
  return Math.max(1, Math.min(routes.defaultMaxTokens, room));
}

/** A call ready for the engine, with what its answer needs. */
export interface PreparedCall {
  call: EngineCall;
  requestId: string;
  stream: boolean;
  /** Aborts the call when the client stops reading its stream. */
  local: AbortController;
  signal: AbortSignal;
}

/**
 * The engine call of a checked request: its id (`x-request-id`, else a fresh one),
 * aborted when the client disconnects or stops reading. Nothing here rejects a
 * request, so every check a route makes comes before it.
 */
export function prepareCall(
  c: Context,
  engine: SimEngine,
  body: Json,
  request: Pick<EngineCall, "endpoint" | "promptTokens" | "maxTokens"> & { rank: number | undefined },
): PreparedCall {
  const stream = body.stream === true;
  const requestId = c.req.header("x-request-id") ?? randomUUID().replaceAll("-", "");
  const local = new AbortController();
  const signal = AbortSignal.any([c.req.raw.signal, local.signal]);
  const call: EngineCall = {
    requestId,
    model: engine.model,
    promptTokens: request.promptTokens,
    maxTokens: request.maxTokens,
    endpoint: request.endpoint,
    body,
    stream,
    signal,
  };
  if (request.rank !== undefined) call.rank = request.rank;
  return { call, requestId, stream, local, signal };
}

/** The headers of a streamed answer. */
export function sseHeaders(requestId: string): Record<string, string> {
  return {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-request-id": requestId,
  };
}

export function chatTokens(prompts: PromptTokenizer, messages: unknown): number[] {
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
