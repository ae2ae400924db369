/** @module Runs one stored call through the scheduler, the path an HTTP call takes, and says whether it answered or must wait. */

import { type Refusal, renderRefusal, tellsToComeBackLater, toRefusal } from "../../src/errors.js";
import type { AdmittedCall, Lane } from "../../src/types.js";
import type { HttpScheduler } from "../http/scheduler-port.js";
import {
  buildCallRequest,
  type CallBody,
  callBodyOf,
  responseContextOf,
} from "../openai-api/call-request.js";
import { collectCall, collectRaw } from "../openai-api/call-response.js";
import { checkServedModel } from "../openai-api/schemas.js";
import { cacheHintOf, checkSessionKey, readSessionKey } from "../openai-api/session-key.js";
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
export function checkCallBody(scheduler: HttpScheduler, call: StoredCall): CallBody {
  const shape = callBodyOf(call.endpoint, call.body);
  checkServedModel(scheduler.models(), shape.model);
  // A Responses API `conversation` is a session key: an odd one is the 400 HTTP gives, naming it.
  if (shape.conversation !== undefined) checkSessionKey(shape.conversation, "conversation");
  return shape;
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
  let shape: CallBody;
  try {
    shape = checkCallBody(scheduler, call);
  } catch (err) {
    const rendered = renderRefusal(toRefusal(err), requestId);
    return answered(rendered.status, requestId, rendered.body);
  }
  const forwarded: Record<string, unknown> = { ...shape.body, stream: false };
  delete forwarded.stream_options;
  const cacheHint = cacheHintOf(shape.body);
  const req = buildCallRequest({
    requestId,
    endpoint: call.endpoint,
    shape,
    signal,
    stream: false,
    forwardedBody: forwarded,
    // A Responses API line's `conversation` is its key when it names no other.
    sessionId: call.sessionId ?? shape.conversation,
    named: {
      ...(call.parentSessionId !== undefined ? { parent: call.parentSessionId } : {}),
      final: call.finalStep === true,
      ...(cacheHint !== undefined ? { cacheHint } : {}),
    },
    options: { declaredLane: options.lane ?? call.declaredLane, deadlineMs: call.deadlineMs },
    tenant: options.owner.tenant,
    priority: options.owner.priority,
  });

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
    // A Responses API answer is the replica's own object; the others are written from the call.
    const payload =
      call.endpoint === "responses"
        ? JSON.parse(new TextDecoder().decode(await collectRaw(admitted)))
        : await collectCall({
            call: admitted,
            ctx: responseContextOf(
              call.endpoint,
              requestId,
              shape.model ?? scheduler.models()[0] ?? "unknown",
            ),
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
