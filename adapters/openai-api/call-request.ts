/**
 * @module A call as every transport hands it to the scheduler (docs/http-api.md, docs/nats.md,
 * docs/jobs.md): the validated body of a chat, completions or Responses API call, the options a
 * transport read beside it, and the `CallRequest` and response context built from them. HTTP,
 * NATS and batch lines each read their own headers; what the call is follows from here alone.
 */

import type { CallEndpoint } from "../../src/engine.js";
import type { CallInput, CallRequest, Lane } from "../../src/types.js";
import { chatInput, completionInput } from "./call-input.js";
import type { ResponseContext } from "./openai-format.js";
import { conversationKeyOf, responsesMessages } from "./responses-input.js";
import {
  type ChatBody,
  type CompletionBody,
  chatBodySchema,
  completionBodySchema,
  parseBody,
  responsesBodySchema,
} from "./schemas.js";
import type { SessionKeyRead } from "./session-key.js";

/** What sluice reads from a validated body of each endpoint. */
export interface CallBody {
  body: Record<string, unknown>;
  input: CallInput;
  model: string | undefined;
  maxTokens: number | undefined;
  stream: boolean;
  includeUsage: boolean;
  /** Responses API: the response this call continues. */
  previousResponseId?: string;
  /** Responses API: the `conversation` it names, a session key. */
  conversation?: string;
}

/** Validates the body of a chat, completions or Responses API call and reads what sluice needs from it. */
export function callBodyOf(endpoint: CallEndpoint, json: unknown): CallBody {
  if (endpoint === "responses") {
    const body = parseBody(responsesBodySchema, json);
    const shape: CallBody = {
      body,
      input: { kind: "chat", messages: responsesMessages(body) },
      model: body.model,
      maxTokens: body.max_output_tokens ?? undefined,
      stream: body.stream === true,
      includeUsage: false,
    };
    if (typeof body.previous_response_id === "string") shape.previousResponseId = body.previous_response_id;
    const conversation = conversationKeyOf(body);
    if (conversation !== undefined) shape.conversation = conversation;
    return shape;
  }
  const body = endpoint === "chat" ? parseBody(chatBodySchema, json) : parseBody(completionBodySchema, json);
  return {
    body,
    input: endpoint === "chat" ? chatInput(body as ChatBody) : completionInput(body as CompletionBody),
    model: body.model,
    maxTokens:
      (endpoint === "chat" ? (body as ChatBody).max_completion_tokens : undefined) ??
      body.max_tokens ??
      undefined,
    stream: body.stream === true,
    includeUsage: body.stream_options?.include_usage === true,
  };
}

/** The per-call options a transport reads beside the body (`x-sluice-*` headers, `Sluice-*` NATS headers, a batch line's). */
export interface CallOptions {
  declaredLane?: Lane | undefined;
  deadlineMs?: number | undefined;
  expectedIdleMs?: number | undefined;
  queueTtlMs?: number | undefined;
}

/** Everything a call request is built from. */
export interface CallParts {
  requestId: string;
  endpoint: CallEndpoint;
  shape: CallBody;
  signal: AbortSignal;
  /** Whether the engine streams to sluice (a transport may stream on a header as well as the body's `stream`). */
  stream: boolean;
  /** The body forwarded to the engine, when it differs from the validated one (a batch line's, unstreamed). */
  forwardedBody?: Record<string, unknown>;
  /** The session key the call is counted in (the path's, else what `named` read). */
  sessionId?: string | undefined;
  /** What the call said about its session beside the key: parent, final step, cache hint. */
  named?: Pick<SessionKeyRead, "parent" | "final" | "cacheHint">;
  options?: CallOptions;
  tenant?: string | undefined;
  priority?: number | undefined;
}

/** The scheduler's view of a call, whichever transport brought it. */
export function buildCallRequest(parts: CallParts): CallRequest {
  const { shape, named, options } = parts;
  const req: CallRequest = {
    requestId: parts.requestId,
    endpoint: parts.endpoint,
    input: shape.input,
    stream: parts.stream,
    body: parts.forwardedBody ?? shape.body,
    signal: parts.signal,
  };
  if (shape.model !== undefined) req.model = shape.model;
  if (shape.previousResponseId !== undefined) req.previousResponseId = shape.previousResponseId;
  if (shape.maxTokens !== undefined) req.maxTokens = shape.maxTokens;
  if (parts.sessionId !== undefined) req.sessionId = parts.sessionId;
  if (named?.parent !== undefined) req.parentSessionId = named.parent;
  if (named?.final) req.finalStep = true;
  if (named?.cacheHint !== undefined) req.cacheHint = named.cacheHint;
  if (options?.declaredLane !== undefined) req.declaredLane = options.declaredLane;
  if (options?.deadlineMs !== undefined) req.deadlineMs = options.deadlineMs;
  if (options?.expectedIdleMs !== undefined) req.expectedIdleMs = options.expectedIdleMs;
  if (parts.priority !== undefined) req.priority = parts.priority;
  if (parts.tenant !== undefined) req.tenant = parts.tenant;
  if (options?.queueTtlMs !== undefined) req.queueTtlMs = options.queueTtlMs;
  return req;
}

/** Id prefix of each endpoint's response object, as OpenAI's APIs spell them. */
const RESPONSE_ID_PREFIX: Record<CallEndpoint, string> = {
  chat: "chatcmpl",
  completions: "cmpl",
  responses: "resp",
};

/** The context a call's response is written in: its id, creation time and model. */
export function responseContextOf(endpoint: CallEndpoint, requestId: string, model: string): ResponseContext {
  return {
    id: `${RESPONSE_ID_PREFIX[endpoint]}-${requestId}`,
    created: Math.floor(Date.now() / 1000),
    model,
    endpoint,
  };
}
