/** @module Starting a call at the upstream: the body and headers sent, the wait for headers, and the refusals before any output. */

import type { Clock } from "../../../src/clock.js";
import type { EngineCall, ReplicaRole } from "../../../src/engine.js";
import { Refusal } from "../../../src/errors.js";
import { CallStop, stopCause } from "./call-stop.js";
import { refusalFor } from "./error-mapping.js";
import type { Usage } from "./event-interpretation.js";
import { applyKvTransfer } from "./pd-protocol.js";
import type { UpstreamResponse, UpstreamTransport } from "./transport.js";
import { describeNetworkError, isRecord, isSuccess, readText } from "./upstream-http.js";
import { UpstreamStream } from "./upstream-stream.js";

/** What starting a call needs from its engine. */
export interface CallContext {
  readonly replicaId: string;
  /** Its role in a disaggregated fleet: which leg of a call it runs. */
  readonly role: ReplicaRole;
  readonly baseUrl: string;
  readonly transport: UpstreamTransport;
  readonly clock: Clock;
  /** Headers every request carries (auth, encoding). */
  headers(extra: Record<string, string>): Record<string, string>;
  /** Aborts with `CallStop("closed")` when the engine closes. */
  readonly closing: AbortSignal;
  /** No headers within this many ms refuses the call `unavailable`; undefined: no limit. */
  readonly requestTimeoutMs: number | undefined;
  /** Bound on reading an error answer's body, ms. */
  readonly errorBodyTimeoutMs: number;
  /** Retry-After of a refusal because the replica could not be reached, s. */
  readonly unreachableRetryAfterSeconds: number;
  /** The upstream could not be reached or did not answer: the replica is unhealthy until its next good scrape. */
  markUnreachable(): void;
  /** A call began (counted until `ended`). */
  began(): void;
  ended(): void;
  /** The usage a call reported once it succeeded. */
  observeUsage?(usage: Usage): void;
}

/** Where each kind of call goes on an OpenAI-compatible server. */
const UPSTREAM_PATHS: Readonly<Record<EngineCall["endpoint"], string>> = {
  chat: "/v1/chat/completions",
  completions: "/v1/completions",
  responses: "/v1/responses",
};

/** The body sent upstream: the client's, with the admitted model and output cap; streamed when the client streams. */
export function upstreamBody(call: EngineCall, role: ReplicaRole = "both"): Record<string, unknown> {
  const body: Record<string, unknown> = { ...(call.body ?? {}) };
  body.model = call.model;
  if (call.endpoint === "responses") {
    // The Responses API caps output with `max_output_tokens` and has no usage option: its last event carries usage.
    body.max_output_tokens = call.maxTokens;
    body.stream = call.stream;
    return body;
  }
  if (body.max_completion_tokens !== undefined) {
    body.max_completion_tokens = call.maxTokens;
    delete body.max_tokens;
  } else body.max_tokens = call.maxTokens;
  if (body.prompt === undefined && body.messages === undefined) {
    if (call.endpoint === "completions") body.prompt = [...call.promptTokens];
  }
  applyKvTransfer(body, call, role);
  if (!call.stream) {
    // A client that does not stream gets one JSON answer: asking the upstream for the same is cheaper than
    // parsing its events, and the permit's waiting part then ends at completion, as docs/how-it-works.md#per-rank-gate allows.
    body.stream = false;
    delete body.stream_options;
    return body;
  }
  body.stream = true;
  const options = isRecord(body.stream_options) ? { ...body.stream_options } : {};
  options.include_usage = true;
  body.stream_options = options;
  return body;
}

function callHeaders(context: CallContext, call: EngineCall): Record<string, string> {
  const headers = context.headers({
    "content-type": "application/json",
    accept: "text/event-stream, application/json;q=0.5",
    "x-request-id": call.requestId,
  });
  // vLLM's data-parallel routing header: the gate bound the call to this rank.
  if (call.rank !== undefined) headers["x-data-parallel-rank"] = String(call.rank);
  return headers;
}

/**
 * Starts a call at the upstream. Resolves when the upstream answered 2xx;
 * rejects with a `Refusal` when it answered an error status or could not be
 * reached (`unavailable`, and the replica is marked unhealthy), or with the
 * client's abort reason when `call.signal` aborted first.
 *
 * The call runs under one signal: the client's abort and sluice's own stops
 * (the engine closing, a consumer that stopped, a timeout) combined.
 */
export async function startUpstreamCall(context: CallContext, call: EngineCall): Promise<UpstreamStream> {
  call.signal.throwIfAborted();
  if (context.closing.aborted) {
    throw new Refusal("unavailable", `replica ${context.replicaId} is closed`, {
      status: 503,
      scope: "worker",
    });
  }
  const own = new AbortController();
  const stop = (why: CallStop): void => own.abort(why);
  // The engine's closing reaches the call through `own`, by a listener removed when the call ends: a
  // long-lived signal given to AbortSignal.any keeps every signal derived from it alive (Node 20).
  const onClosing = (): void => stop(new CallStop("closed"));
  context.closing.addEventListener("abort", onClosing, { once: true });
  const signal = AbortSignal.any([call.signal, own.signal]);
  context.began();
  let ended = false;
  const end = (): void => {
    if (ended) return;
    ended = true;
    context.closing.removeEventListener("abort", onClosing);
    context.ended();
  };
  const timeoutMs = context.requestTimeoutMs;
  const cancelTimer =
    timeoutMs === undefined
      ? undefined
      : context.clock.setTimeout(() => stop(new CallStop("timeout", timeoutMs)), timeoutMs);

  let response: UpstreamResponse;
  try {
    response = await context.transport.send(`${context.baseUrl}${UPSTREAM_PATHS[call.endpoint]}`, {
      method: "POST",
      headers: callHeaders(context, call),
      body: JSON.stringify(upstreamBody(call, context.role)),
      signal,
    });
  } catch (error) {
    end();
    throw failureBeforeHeaders(context, call, signal, error);
  } finally {
    cancelTimer?.();
  }

  if (!isSuccess(response)) {
    // The error body is small; bound its read so a stalled upstream cannot hold the caller.
    const bodyTimer = context.clock.setTimeout(
      () => stop(new CallStop("timeout", context.errorBodyTimeoutMs)),
      context.errorBodyTimeoutMs,
    );
    const text = await readText(response, 64 * 1024, signal).catch(() => "");
    bodyTimer();
    end();
    if (stopCause(signal) === "client") throw call.signal.reason;
    throw refusalFor(response, text, context.replicaId, call);
  }
  const observe = context.observeUsage;
  return new UpstreamStream(
    call,
    response,
    signal,
    stop,
    end,
    observe && ((usage) => observe.call(context, usage)),
  );
}

function failureBeforeHeaders(
  context: CallContext,
  call: EngineCall,
  signal: AbortSignal,
  error: unknown,
): unknown {
  const cause = stopCause(signal);
  if (cause === "client") return call.signal.reason ?? error;
  if (cause?.kind === "closed") {
    return new Refusal("unavailable", `replica ${context.replicaId} is closed`, {
      status: 503,
      scope: "worker",
      cause: error,
    });
  }
  // Unreachable or silent upstream: nothing ran, so the call can be refused cleanly and retried elsewhere.
  context.markUnreachable();
  const what =
    cause?.kind === "timeout"
      ? `did not answer within ${cause.ms} ms`
      : `could not be reached (${describeNetworkError(error)})`;
  return new Refusal("unavailable", `replica ${context.replicaId} ${what}`, {
    status: 503,
    scope: "worker",
    retryAfterSeconds: context.unreachableRetryAfterSeconds,
    cause: error,
  });
}
