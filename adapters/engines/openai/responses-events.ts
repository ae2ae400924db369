/**
 * @module What one Responses API streaming event (or a whole Response object) says about generation:
 * output text, the response's id, its end, usage. Event names and fields as OpenAI's API reference
 * ("Streaming events") and vLLM's `vllm/entrypoints/openai/responses/` publish them.
 */

import type { FinishReason } from "../../../src/engine.js";
import { type EventInfo, type Usage, usageOf } from "./event-interpretation.js";
import { isRecord } from "./upstream-http.js";

/** Events that end a response: the stream closes after one of them (no `[DONE]`). */
const TERMINAL_EVENTS: ReadonlySet<string> = new Set([
  "response.completed",
  "response.incomplete",
  "response.failed",
]);

/** Deltas of generated output other than text: each is at least one generated token. */
const GENERATED_DELTAS: ReadonlySet<string> = new Set([
  "response.reasoning_text.delta",
  "response.reasoning_summary_text.delta",
  "response.function_call_arguments.delta",
  "response.custom_tool_call_input.delta",
  "response.refusal.delta",
]);

/** What a Responses API event says, in the shape chat events are read in, plus the response's id. */
export interface ResponsesEventInfo extends EventInfo {
  /** The response's id, from the `response` object an event carries. */
  responseId: string | undefined;
  /** `response.failed`: the engine's message. */
  failure: string | undefined;
}

/** A Response object's usage (`input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens`). */
export function responseUsageOf(value: unknown): Usage | undefined {
  return usageOf(value, {
    prompt: "input_tokens",
    completion: "output_tokens",
    details: "input_tokens_details",
  });
}

/** How a Response object ended: `incomplete` for its output cap reads as `length`. */
export function responseFinishOf(response: Record<string, unknown>): FinishReason | undefined {
  const status = response.status;
  if (status === "completed") return "stop";
  if (status === "failed") return "error";
  if (status === "cancelled") return "abort";
  if (status === "incomplete") {
    const details = response.incomplete_details;
    const reason = isRecord(details) ? details.reason : undefined;
    return reason === "max_output_tokens" || reason === "max_tokens" ? "length" : "stop";
  }
  return undefined;
}

/** The text a Response object's output holds (its `output_text` parts, in order). */
export function responseOutputText(response: Record<string, unknown>): string {
  const output = Array.isArray(response.output) ? response.output : [];
  let text = "";
  for (const item of output) {
    if (!isRecord(item) || !Array.isArray(item.content)) continue;
    for (const part of item.content) {
      if (isRecord(part) && part.type === "output_text" && typeof part.text === "string") text += part.text;
    }
  }
  return text;
}

function errorMessageOf(response: Record<string, unknown>): string {
  const error = response.error;
  if (isRecord(error) && typeof error.message === "string") return error.message;
  return "the response failed";
}

/** Reads one parsed Responses API event. The call's one output reads as choice 0, finished at a terminal event. */
export function inspectResponsesEvent(payload: Record<string, unknown>): ResponsesEventInfo {
  const type = typeof payload.type === "string" ? payload.type : "";
  const response = isRecord(payload.response) ? payload.response : undefined;
  const info: ResponsesEventInfo = {
    text: "",
    toolCalls: "",
    tokens: [],
    tokenCount: 0,
    generated: false,
    finish: undefined,
    finishedChoices: [],
    choices: [0],
    usage: undefined,
    usageOnly: false,
    responseId: response && typeof response.id === "string" ? response.id : undefined,
    failure: undefined,
  };
  if (type === "response.output_text.delta") {
    const delta = typeof payload.delta === "string" ? payload.delta : "";
    info.text = delta;
    if (delta !== "") {
      info.generated = true;
      info.tokenCount = 1;
    }
  } else if (GENERATED_DELTAS.has(type)) {
    if (typeof payload.delta === "string" && payload.delta !== "") {
      info.generated = true;
      info.tokenCount = 1;
    }
  } else if (TERMINAL_EVENTS.has(type) && response) {
    info.usage = responseUsageOf(response.usage);
    info.finish = responseFinishOf(response) ?? "stop";
    info.finishedChoices = [0];
    if (type === "response.failed") info.failure = errorMessageOf(response);
  }
  return info;
}
