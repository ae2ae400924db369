/** @module What one OpenAI streaming event (or a whole answer) says about generation: text, tokens, finish, usage. */

import type { EngineCall, FinishReason } from "../../../src/engine.js";
import { isRecord } from "./upstream-http.js";

export function mapFinish(reason: unknown): FinishReason | undefined {
  if (reason === null || reason === undefined) return undefined;
  if (reason === "length") return "length";
  if (reason === "abort") return "abort";
  if (reason === "error") return "error";
  return "stop";
}

/** Token usage as the upstream reported it. */
export interface Usage {
  prompt: number;
  completion: number;
  cached: number;
  /** Whether the upstream stated its cached prompt tokens (`prompt_tokens_details.cached_tokens`, llama.cpp's `timings.cache_n`). */
  cachedStated?: boolean;
}

/** Where an API writes its usage: chat and completions (`prompt_tokens` …) or the Responses API (`input_tokens` …). */
export interface UsageFields {
  prompt: string;
  completion: string;
  details: string;
}

const CHAT_USAGE: UsageFields = {
  prompt: "prompt_tokens",
  completion: "completion_tokens",
  details: "prompt_tokens_details",
};

/**
 * A usage object's token counts, read by the API's field names; cached prompt tokens default to 0.
 * llama.cpp also states them as `timings.cache_n` beside the usage (prompt tokens reused from its
 * slot's cache), read when the usage itself does not. Its builds before `cache_n` existed (early
 * 2025) state only `timings.prompt_n`, the prompt tokens it evaluated: the rest of the prompt came
 * from the slot's cache (docs/engines.md#llamacpp-llama-server).
 */
export function usageOf(
  value: unknown,
  fields: UsageFields = CHAT_USAGE,
  timings?: unknown,
): Usage | undefined {
  if (!isRecord(value)) return undefined;
  const prompt = value[fields.prompt];
  const completion = value[fields.completion];
  if (typeof prompt !== "number" || typeof completion !== "number") return undefined;
  const details = value[fields.details];
  if (isRecord(details) && typeof details.cached_tokens === "number") {
    return { prompt, completion, cached: details.cached_tokens, cachedStated: true };
  }
  if (isRecord(timings) && typeof timings.cache_n === "number" && timings.cache_n >= 0) {
    return { prompt, completion, cached: timings.cache_n, cachedStated: true };
  }
  if (isRecord(timings) && typeof timings.prompt_n === "number" && timings.prompt_n >= 0) {
    return { prompt, completion, cached: Math.max(0, prompt - timings.prompt_n), cachedStated: true };
  }
  return { prompt, completion, cached: 0 };
}

/** What one parsed event says about generation. */
export interface EventInfo {
  text: string;
  /** Tool-call pieces of choice 0 (`name␁arguments`, calls joined by `␂`), for session inference. */
  toolCalls: string;
  tokens: number[];
  tokenCount: number;
  generated: boolean;
  finish: FinishReason | undefined;
  finishedChoices: number[];
  /** Indexes of every choice the event carries. */
  choices: number[];
  usage: Usage | undefined;
  usageOnly: boolean;
}

export function inspect(payload: Record<string, unknown>): EventInfo {
  const info: EventInfo = {
    text: "",
    toolCalls: "",
    tokens: [],
    tokenCount: 0,
    generated: false,
    finish: undefined,
    finishedChoices: [],
    choices: [],
    usage: usageOf(payload.usage, CHAT_USAGE, payload.timings),
    usageOnly: false,
  };
  const choices = Array.isArray(payload.choices) ? payload.choices : [];
  for (const choice of choices) {
    if (!isRecord(choice)) continue;
    const index = typeof choice.index === "number" ? choice.index : 0;
    info.choices.push(index);
    const delta = isRecord(choice.delta) ? choice.delta : undefined;
    let piece = "";
    let generated = false;
    if (typeof choice.text === "string") piece = choice.text;
    else if (delta) {
      if (typeof delta.content === "string") piece = delta.content;
      // Reasoning and tool-call deltas are generated tokens too; a role-only delta is not.
      const reasoning = delta.reasoning_content ?? delta.reasoning;
      if (typeof reasoning === "string" && reasoning !== "") generated = true;
      if (Array.isArray(delta.tool_calls) && delta.tool_calls.length > 0) {
        generated = true;
        if (index === 0) info.toolCalls += toolCallPieces(delta.tool_calls);
      }
    }
    if (piece !== "") generated = true;
    if ((choice.index ?? 0) === 0) info.text += piece;
    const ids = Array.isArray(choice.token_ids) ? choice.token_ids.filter((t) => typeof t === "number") : [];
    if (ids.length > 0) {
      generated = true;
      info.tokens.push(...(ids as number[]));
      info.tokenCount += ids.length;
    } else if (generated) {
      // Without token ids, each delta of a streaming engine carries one token (more with speculative decoding).
      info.tokenCount += 1;
    }
    if (generated) info.generated = true;
    const finish = mapFinish(choice.finish_reason);
    if (finish) {
      info.finish = finish;
      info.finishedChoices.push(index);
    }
  }
  info.usageOnly = choices.length === 0 && info.usage !== undefined;
  return info;
}

/**
 * A streamed tool-call delta as pieces of `name␁arguments` (ids left out): a call's first delta
 * names its function, later ones append to its arguments; each call after the first is preceded
 * by `␂`, so the pieces of a whole stream join into what `toolCallsText` makes of the message.
 */
function toolCallPieces(calls: unknown[]): string {
  let out = "";
  for (const call of calls) {
    if (!isRecord(call)) continue;
    const fn = isRecord(call.function) ? call.function : undefined;
    const position = typeof call.index === "number" ? call.index : 0;
    if (typeof fn?.name === "string") out += `${position > 0 ? "\u0002" : ""}${fn.name}\u0001`;
    if (typeof fn?.arguments === "string") out += fn.arguments;
  }
  return out;
}

/** Whether the client itself asked for the usage event (sluice asks the upstream for it anyway). */
export function clientAskedForUsage(call: EngineCall): boolean {
  const options = call.body?.stream_options;
  return isRecord(options) && options.include_usage === true;
}
