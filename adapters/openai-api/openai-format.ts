/** @module OpenAI response shapes sluice writes itself when an engine gives text rather than upstream bytes. */

import type { CallEndpoint, EngineResult, FinishReason } from "../../src/engine.js";

/** What every response object of one call shares. */
export interface ResponseContext {
  /** `chatcmpl-…`, `cmpl-…` or `resp-…`. */
  id: string;
  /** Unix seconds. */
  created: number;
  model: string;
  /** A `responses` call is written in the engine's own bytes: sluice adds only its error event, and no `[DONE]`. */
  endpoint: CallEndpoint;
}

/** OpenAI usage block, with vLLM's cached-token detail. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

const encoder = new TextEncoder();

/** One SSE `data:` event. */
export function sseData(payload: unknown): Uint8Array {
  return encoder.encode(`data: ${typeof payload === "string" ? payload : JSON.stringify(payload)}\n\n`);
}

/** A named SSE event (`event: error`). */
export function sseEvent(event: string, payload: unknown): Uint8Array {
  return encoder.encode(`event: ${event}\ndata: ${JSON.stringify(payload)}\n\n`);
}

/** The stream terminator OpenAI clients wait for. */
export const SSE_DONE: Uint8Array = encoder.encode("data: [DONE]\n\n");

/** Whether raw upstream bytes are the upstream's own `[DONE]` event (sluice writes its own, once). */
export function isDoneEvent(raw: Uint8Array): boolean {
  if (raw.byteLength > 64) return false;
  const text = new TextDecoder().decode(raw).trim();
  return text === "data: [DONE]" || text === "data:[DONE]";
}

/** OpenAI's finish reasons; an engine's `abort` reads as `stop` to a client that is still there. */
export function openAiFinishReason(reason: FinishReason): "stop" | "length" {
  return reason === "length" ? "length" : "stop";
}

export function usageOf(result: EngineResult): Usage {
  return {
    prompt_tokens: result.promptTokens,
    completion_tokens: result.completionTokens,
    total_tokens: result.promptTokens + result.completionTokens,
    prompt_tokens_details: { cached_tokens: result.cachedTokens },
  };
}

/** A streaming chunk carrying `text` (the first one of a chat stream also carries the role). */
export function deltaChunk(ctx: ResponseContext, text: string, first: boolean): Record<string, unknown> {
  if (ctx.endpoint === "chat") {
    const delta: Record<string, string> = first ? { role: "assistant", content: text } : { content: text };
    return {
      id: ctx.id,
      object: "chat.completion.chunk",
      created: ctx.created,
      model: ctx.model,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: null }],
    };
  }
  return {
    id: ctx.id,
    object: "text_completion",
    created: ctx.created,
    model: ctx.model,
    choices: [{ index: 0, text, logprobs: null, finish_reason: null }],
  };
}

/** The last content chunk of a stream: empty delta with the finish reason. */
export function finishChunk(ctx: ResponseContext, reason: FinishReason): Record<string, unknown> {
  const finish_reason = openAiFinishReason(reason);
  if (ctx.endpoint === "chat") {
    return {
      id: ctx.id,
      object: "chat.completion.chunk",
      created: ctx.created,
      model: ctx.model,
      choices: [{ index: 0, delta: {}, logprobs: null, finish_reason }],
    };
  }
  return {
    id: ctx.id,
    object: "text_completion",
    created: ctx.created,
    model: ctx.model,
    choices: [{ index: 0, text: "", logprobs: null, finish_reason }],
  };
}

/** The usage chunk `stream_options.include_usage` asks for: no choices, only usage. */
export function usageChunk(ctx: ResponseContext, result: EngineResult): Record<string, unknown> {
  return {
    id: ctx.id,
    object: ctx.endpoint === "chat" ? "chat.completion.chunk" : "text_completion",
    created: ctx.created,
    model: ctx.model,
    choices: [],
    usage: usageOf(result),
  };
}

/** A whole (non-streaming) completion. */
export function completionBody(
  ctx: ResponseContext,
  text: string,
  result: EngineResult,
): Record<string, unknown> {
  const finish_reason = openAiFinishReason(result.finishReason);
  const choice =
    ctx.endpoint === "chat"
      ? { index: 0, message: { role: "assistant", content: text }, logprobs: null, finish_reason }
      : { index: 0, text, logprobs: null, finish_reason };
  return {
    id: ctx.id,
    object: ctx.endpoint === "chat" ? "chat.completion" : "text_completion",
    created: ctx.created,
    model: ctx.model,
    choices: [choice],
    usage: usageOf(result),
  };
}
