/** @module Runs one stored call through the scheduler, the path an HTTP call takes, and says whether it answered or must wait. */

import { type Refusal, renderRefusal, tellsToComeBackLater, toRefusal } from "../../src/errors.js";
import type { AdmittedCall, CallRequest, Lane } from "../../src/types.js";
import type { HttpScheduler } from "../http/scheduler-port.js";
import { chatInput, completionInput } from "../openai-api/call-input.js";
import { collectCall } from "../openai-api/call-response.js";
import {
  type ChatBody,
  type CompletionBody,
  chatBodySchema,
  checkServedModel,
  completionBodySchema,
  parseBody,
} from "../openai-api/schemas.js";
import { readSessionKey } from "../openai-api/session-key.js";
import type { StoredCall } from "./types.js";

/** What a run of a call came to. */
export type CallOutcome =
  /** The call has its final answer (a completion, or a refusal that trying again would not change). */
  | {
      kind: "answered";
      status: number;
      requestId: string;
      body: unknown;
      headers: Record<string, string>;
    }
  /** Refused for now (429, 529, 503) or the engine failed mid-way: run it again after `afterMs`. */
  | { kind: "later"; afterMs: number; engineFailure: boolean; answer: CallOutcome & { kind: "answered" } };

/** Who asked: the API key's tenant and priority (kept with the job, never a secret). */
export interface CallOwner {
  tenant: string;
  priority: number;
}

/**
 * Checks a body as the HTTP route does (schema, served model). Throws the same `Refusal` the route
 * would, so a job is refused at creation rather than failing later.
 */
export function checkCallBody(scheduler: HttpScheduler, call: StoredCall): void {
  const body =
    call.endpoint === "chat"
      ? parseBody(chatBodySchema, call.body)
      : parseBody(completionBodySchema, call.body);
  checkServedModel(scheduler.models(), body.model);
}

/**
 * The session a stored call names, read as HTTP reads it (`docs/clients.md`): its `headers` (any
 * case; the same names in the same order), then `alsoHeaders` (a batch line's session headers
 * written inside its body), then the body's `metadata.session_id`. An odd key throws the 400 the
 * HTTP route would, naming the header.
 */
export function sessionOfCall(
  headers: Record<string, unknown> | undefined,
  body: Record<string, unknown>,
  alsoHeaders?: Record<string, unknown>,
): Pick<StoredCall, "sessionId" | "parentSessionId" | "finalStep"> {
  const readerOf = (source: Record<string, unknown> | undefined) => {
    const lower = new Map<string, string>();
    for (const [name, value] of Object.entries(source ?? {})) {
      // A value that is not a string is present and odd: refused as a key would be, not skipped.
      lower.set(name.toLowerCase(), typeof value === "string" ? value : "");
    }
    return (name: string) => lower.get(name);
  };
  let named = readSessionKey(readerOf(headers));
  if (named.key === undefined) named = readSessionKey(readerOf(alsoHeaders), { body });
  const session: Pick<StoredCall, "sessionId" | "parentSessionId" | "finalStep"> = {};
  if (named.key !== undefined) session.sessionId = named.key;
  if (named.parent !== undefined) session.parentSessionId = named.parent;
  if (named.final) session.finalStep = true;
  return session;
}

function answered(status: number, requestId: string, body: unknown, headers: Record<string, string> = {}) {
  return { kind: "answered" as const, status, requestId, body, headers };
}

/**
 * Runs `call` once: validate, submit to the scheduler (session admission, routing, budget, gate),
 * read the whole answer. A refusal that says "later" (429, 529, 503, with Retry-After) and an engine
 * failure come back as `later`, with the answer to report should the caller give up; an abort
 * (shutdown, cancel) throws. The response is always non-streaming: nobody reads a job's stream.
 */
export async function executeCall(
  scheduler: HttpScheduler,
  call: StoredCall,
  options: { requestId: string; owner: CallOwner; lane?: Lane; signal: AbortSignal },
): Promise<CallOutcome> {
  const { requestId, signal } = options;
  signal.throwIfAborted();
  let body: ChatBody | CompletionBody;
  try {
    checkCallBody(scheduler, call);
    body =
      call.endpoint === "chat"
        ? parseBody(chatBodySchema, call.body)
        : parseBody(completionBodySchema, call.body);
  } catch (err) {
    const rendered = renderRefusal(toRefusal(err), requestId);
    return answered(rendered.status, requestId, rendered.body);
  }
  const forwarded: Record<string, unknown> = { ...(body as Record<string, unknown>), stream: false };
  delete forwarded.stream_options;
  const maxTokens =
    (call.endpoint === "chat" ? (body as ChatBody).max_completion_tokens : undefined) ??
    body.max_tokens ??
    undefined;
  const req: CallRequest = {
    requestId,
    endpoint: call.endpoint,
    input: call.endpoint === "chat" ? chatInput(body as ChatBody) : completionInput(body as CompletionBody),
    stream: false,
    body: forwarded,
    signal,
    priority: options.owner.priority,
    tenant: options.owner.tenant,
  };
  if (body.model !== undefined) req.model = body.model;
  if (maxTokens !== undefined) req.maxTokens = maxTokens;
  if (call.sessionId !== undefined) req.sessionId = call.sessionId;
  if (call.parentSessionId !== undefined) req.parentSessionId = call.parentSessionId;
  if (call.finalStep) req.finalStep = true;
  const cacheHint = (body as { prompt_cache_key?: unknown }).prompt_cache_key;
  if (typeof cacheHint === "string" && cacheHint !== "" && cacheHint.length <= 1024)
    req.cacheHint = cacheHint;
  const lane = options.lane ?? call.declaredLane;
  if (lane !== undefined) req.declaredLane = lane;
  if (call.deadlineMs !== undefined) req.deadlineMs = call.deadlineMs;

  let admitted: AdmittedCall;
  try {
    admitted = await scheduler.submit(req);
  } catch (err) {
    if (signal.aborted) throw signal.reason ?? err;
    return refusedOutcome(toRefusal(err), requestId, false);
  }
  const onAbort = () => admitted.cancel();
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    const payload = await collectCall({
      call: admitted,
      ctx: {
        id: `${call.endpoint === "chat" ? "chatcmpl" : "cmpl"}-${requestId}`,
        created: Math.floor(Date.now() / 1000),
        model: body.model ?? scheduler.models()[0] ?? "unknown",
        endpoint: call.endpoint,
      },
    });
    // A call cancelled mid-answer (shutdown, cancel) may end without an error: its text is partial, not an answer.
    if (signal.aborted) throw signal.reason;
    return answered(200, requestId, payload, {
      "x-sluice-lane": admitted.lane,
      "x-sluice-replica": admitted.replica,
      "x-sluice-queue-ms": String(Math.round(admitted.queueMs)),
    });
  } catch (err) {
    if (signal.aborted) throw signal.reason ?? err;
    return refusedOutcome(toRefusal(err).with({ lane: admitted.lane }), requestId, true);
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

function refusedOutcome(refusal: Refusal, requestId: string, engineFailure: boolean): CallOutcome {
  const rendered = renderRefusal(refusal, requestId);
  const answer = answered(rendered.status, requestId, rendered.body);
  if (tellsToComeBackLater(refusal)) {
    return { kind: "later", afterMs: (refusal.retryAfterSeconds ?? 1) * 1000, engineFailure, answer };
  }
  return answer;
}
