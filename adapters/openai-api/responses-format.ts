/**
 * @module The Responses API's shapes, for an engine that writes them itself (the simulated replica):
 * the Response object and the streaming events of one text output, named and shaped as OpenAI's API
 * reference ("Streaming events", "The response object") and vLLM's `vllm/entrypoints/openai/responses/`
 * give them, framed as `event: <type>` + `data: <json>` with no closing `[DONE]`.
 */

import type { EngineResult } from "../../src/engine.js";

/** What every object of one response shares. */
export interface ResponseShape {
  /** `resp_…`. */
  id: string;
  /** Id of its one output message, `msg_…`. */
  messageId: string;
  /** Unix seconds. */
  createdAt: number;
  model: string;
  previousResponseId: string | null;
  instructions: string | null;
  maxOutputTokens: number | null;
  /** Whether the engine keeps the response for a later `previous_response_id`. */
  store: boolean;
}

const encoder = new TextEncoder();

/** The Response object's usage block, from an engine's result. */
export function responseUsage(result: EngineResult): Record<string, unknown> {
  return {
    input_tokens: result.promptTokens,
    input_tokens_details: { cached_tokens: result.cachedTokens },
    output_tokens: result.completionTokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: result.promptTokens + result.completionTokens,
  };
}

function outputMessage(shape: ResponseShape, text: string, status: "in_progress" | "completed") {
  return {
    id: shape.messageId,
    type: "message",
    role: "assistant",
    status,
    content: status === "in_progress" ? [] : [{ type: "output_text", text, annotations: [] }],
  };
}

/**
 * The Response object: `in_progress` with no output before generation, then `completed`, or
 * `incomplete` when the output reached its cap (`incomplete_details.reason: max_output_tokens`).
 */
export function responseObject(
  shape: ResponseShape,
  text: string | undefined,
  result: EngineResult | undefined,
): Record<string, unknown> {
  const done = result !== undefined;
  const incomplete = done && result.finishReason === "length";
  return {
    id: shape.id,
    object: "response",
    created_at: shape.createdAt,
    status: !done ? "in_progress" : incomplete ? "incomplete" : "completed",
    error: null,
    incomplete_details: incomplete ? { reason: "max_output_tokens" } : null,
    instructions: shape.instructions,
    max_output_tokens: shape.maxOutputTokens,
    model: shape.model,
    output: done ? [outputMessage(shape, text ?? "", "completed")] : [],
    parallel_tool_calls: true,
    previous_response_id: shape.previousResponseId,
    reasoning: { effort: null, summary: null },
    store: shape.store,
    temperature: 1,
    text: { format: { type: "text" } },
    tool_choice: "auto",
    tools: [],
    top_p: 1,
    truncation: "disabled",
    usage: done ? responseUsage(result) : null,
    user: null,
    metadata: {},
  };
}

/** Writes one response's streaming events, numbering them from 0 as they are written. */
export class ResponseEventWriter {
  private sequence = 0;
  private text = "";

  constructor(readonly shape: ResponseShape) {}

  private event(type: string, fields: Record<string, unknown>): string {
    const payload = { type, ...fields, sequence_number: this.sequence++ };
    return `event: ${type}\ndata: ${JSON.stringify(payload)}\n\n`;
  }

  /** `response.created`, `response.in_progress`, then the output message and its text part opened. */
  opening(): Uint8Array {
    const shape = this.shape;
    const response = responseObject(shape, undefined, undefined);
    return encoder.encode(
      this.event("response.created", { response }) +
        this.event("response.in_progress", { response }) +
        this.event("response.output_item.added", {
          output_index: 0,
          item: outputMessage(shape, "", "in_progress"),
        }) +
        this.event("response.content_part.added", {
          item_id: shape.messageId,
          output_index: 0,
          content_index: 0,
          part: { type: "output_text", text: "", annotations: [] },
        }),
    );
  }

  /** One `response.output_text.delta`. */
  delta(text: string): Uint8Array {
    this.text += text;
    return encoder.encode(
      this.event("response.output_text.delta", {
        item_id: this.shape.messageId,
        output_index: 0,
        content_index: 0,
        delta: text,
        logprobs: [],
      }),
    );
  }

  /** The text and message closed, then `response.completed` (or `response.incomplete`) with usage. */
  closing(result: EngineResult): Uint8Array {
    const shape = this.shape;
    const text = this.text;
    const part = { type: "output_text", text, annotations: [] };
    const response = responseObject(shape, text, result);
    const last = response.status === "incomplete" ? "response.incomplete" : "response.completed";
    return encoder.encode(
      this.event("response.output_text.done", {
        item_id: shape.messageId,
        output_index: 0,
        content_index: 0,
        text,
        logprobs: [],
      }) +
        this.event("response.content_part.done", {
          item_id: shape.messageId,
          output_index: 0,
          content_index: 0,
          part,
        }) +
        this.event("response.output_item.done", {
          output_index: 0,
          item: outputMessage(shape, text, "completed"),
        }) +
        this.event(last, { response }),
    );
  }
}
