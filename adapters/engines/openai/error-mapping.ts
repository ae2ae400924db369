/** @module How an upstream's failures become sluice's: error answers to refusals, error events to `EngineError`s. */

import type { EngineCall } from "../../../src/engine.js";
import { Refusal, type RefusalReason } from "../../../src/errors.js";
import type { SseEvent } from "./sse.js";
import type { UpstreamResponse } from "./transport.js";
import { isRecord, retryAfterOf } from "./upstream-http.js";

/** Reasons another sluice (a gate sidecar) may answer with; kept as they are. */
const KNOWN_REASONS: ReadonlySet<string> = new Set<RefusalReason>([
  "invalid_request",
  "unauthorized",
  "model_not_found",
  "session_not_found",
  "response_state_lost",
  "context_limit",
  "overflow",
  "body_too_large",
  "queue_full",
  "queue_timeout",
  "token_budget_exhausted",
  "decode_budget_exhausted",
  "deadline_infeasible",
  "session_queue_full",
  "rate_limited",
  "worker_overloaded",
  "unavailable",
]);

/**
 * The message (and code) of an OpenAI-style, FastAPI-style, TGI-style (`{"error": "…",
 * "error_type": "…"}`) or plain-text error body. llama.cpp's numeric `code` is its HTTP status;
 * its `type` names the failure.
 */
export function upstreamMessage(text: string): { message: string; code?: string } {
  try {
    const body = JSON.parse(text) as Record<string, unknown>;
    if (typeof body.error === "string") {
      return {
        message: body.error,
        ...(typeof body.error_type === "string" ? { code: body.error_type } : {}),
      };
    }
    const error = isRecord(body.error) ? body.error : body;
    const message = error.message ?? body.detail ?? body.message;
    const code = typeof error.code === "string" ? error.code : error.type;
    return {
      message: typeof message === "string" ? message : JSON.stringify(message ?? body),
      ...(typeof code === "string" ? { code } : {}),
    };
  } catch {
    return { message: text.trim().slice(0, 500) };
  }
}

/**
 * Maps an upstream error answer (before any output) to a refusal the client can act on. A
 * Responses API call continuing a previous response that the engine answers 404 (vLLM: "Response
 * with id '…' not found.") names state this replica does not hold (restarted, or never had it):
 * 409 `response_state_lost`, never `model_not_found`.
 */
export function refusalFor(
  response: UpstreamResponse,
  text: string,
  replica: string,
  call?: Pick<EngineCall, "endpoint" | "body">,
): Refusal {
  const status = response.status;
  const { message, code } = upstreamMessage(text);
  const retryAfterSeconds = retryAfterOf(response);
  const detail = `replica ${replica} answered ${status}${message ? `: ${message}` : ""}`;
  const retry = retryAfterSeconds === undefined ? {} : { retryAfterSeconds };
  // Another sluice (a gate sidecar) already speaks our reasons: keep them.
  if (code !== undefined && KNOWN_REASONS.has(code)) {
    return new Refusal(code as RefusalReason, detail, { status, ...retry });
  }
  if (status === 429 || status === 529) {
    return new Refusal("worker_overloaded", detail, { scope: "worker", ...retry });
  }
  if (
    status === 404 &&
    call?.endpoint === "responses" &&
    typeof call.body?.previous_response_id === "string"
  ) {
    return new Refusal("response_state_lost", detail, { param: "previous_response_id" });
  }
  if (status === 404) return new Refusal("model_not_found", detail);
  if (
    // llama.cpp: the prompt does not fit its slot's context (400; 500 before it was typed).
    code === "exceed_context_size_error" ||
    // TGI: "Input validation error: `inputs` tokens + `max_new_tokens` must be <= N. Given: …" (422).
    (status === 422 && /tokens.*must be <=|`inputs` must have less than \d+ tokens/i.test(message)) ||
    status === 413 ||
    // vLLM's Responses API words it "The engine prompt length N exceeds the max_model_len M." (serving_responses.py).
    (status === 400 &&
      /context length|context window|context size|too long|maximum.*tokens|exceeds the max_model_len/i.test(
        message,
      ))
  ) {
    return new Refusal("context_limit", detail);
  }
  if (status === 401 || status === 403) {
    // The client cannot fix sluice's upstream credentials; to it the replica is unavailable.
    return new Refusal("unavailable", detail, { status: 503, scope: "worker", ...retry });
  }
  // TGI answers 424 when generation failed on the replica: not the client's request.
  if (status >= 400 && status < 500 && status !== 424) {
    return new Refusal("invalid_request", detail, { status: 400 });
  }
  return new Refusal("unavailable", detail, { status: 503, scope: "worker", ...retry });
}

/** The failure an event (or a whole JSON answer) reports, or undefined when it reports none. */
export function upstreamErrorOf(
  event: SseEvent,
  payload: Record<string, unknown> | undefined,
): string | undefined {
  if (event.event === "error") {
    return payload
      ? upstreamMessage(JSON.stringify(payload)).message
      : (event.data ?? "upstream error event");
  }
  if (!payload) return undefined;
  if (isRecord(payload.error)) return upstreamMessage(JSON.stringify(payload)).message;
  if (payload.object === "error")
    return typeof payload.message === "string" ? payload.message : "upstream error";
  return undefined;
}
