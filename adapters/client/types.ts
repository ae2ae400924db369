/** @module What the client speaks: OpenAI chat shapes, sluice's error, and the transport port (HTTP or NATS). */

import { REFUSAL_STATUS } from "../../src/errors.js";
import { parseRetryAfter } from "../openai-api/retry-after.js";
/** An OpenAI chat message. */
export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool" | (string & {});
  content?: string | null | unknown[];
  name?: string;
  tool_call_id?: string;
  tool_calls?: unknown[];
}

/** An OpenAI chat completion request body (unknown fields pass through). */
export interface ChatRequest {
  model?: string;
  messages: ChatMessage[];
  max_tokens?: number;
  [field: string]: unknown;
}

/** An OpenAI chat completion. */
export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  model: string;
  choices: { index: number; message: ChatMessage; finish_reason: string | null }[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  [field: string]: unknown;
}

/** An OpenAI chat completion chunk (streaming). */
export interface ChatChunk {
  id: string;
  object: "chat.completion.chunk";
  choices: { index: number; delta: Partial<ChatMessage>; finish_reason: string | null }[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  [field: string]: unknown;
}

/** A session as sluice shows it. */
export interface SessionInfo {
  id: string;
  state: "waiting" | "active" | "paused" | "closed";
  replica?: string | null;
  steps?: number;
  tokens?: number;
  [field: string]: unknown;
}

/** The docs/http-api.md error envelope. */
export interface ErrorEnvelope {
  error: {
    message: string;
    type: string;
    code: string;
    param: string | null;
    request_id?: string;
    lane?: string | null;
    limits?: Record<string, number> | null;
  };
}

/** The HTTP status docs/http-api.md gives each reason (used when a transport carries only the reason). */
export const REASON_STATUS: Readonly<Record<string, number>> = REFUSAL_STATUS;

/**
 * Every "no" the client reports: a refusal sluice sent (status, reason, the
 * envelope, `Retry-After`), or a transport failure (status 503 `unavailable`
 * when sluice could not be reached, 504 `timeout` when it did not answer in time).
 */
export class SluiceError extends Error {
  readonly status: number;
  /** The docs/http-api.md reason, or `timeout` for a call that got no answer in time. */
  readonly code: string;
  /** Seconds sluice asked the client to wait, when it said. */
  readonly retryAfterSeconds: number | undefined;
  readonly envelope: ErrorEnvelope | undefined;
  readonly requestId: string | undefined;
  /** Whether the failure happened before sluice answered (connection, no responders, timeout). */
  readonly transportFailure: boolean;
  /** Attempts made before giving up (set by the client's retry loop). */
  attempts = 1;

  constructor(
    message: string,
    init: {
      status: number;
      code: string;
      retryAfterSeconds?: number | undefined;
      envelope?: ErrorEnvelope | undefined;
      requestId?: string | undefined;
      transportFailure?: boolean;
      cause?: unknown;
    },
  ) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "SluiceError";
    this.status = init.status;
    this.code = init.code;
    this.retryAfterSeconds = init.retryAfterSeconds;
    this.envelope = init.envelope;
    this.requestId = init.requestId;
    this.transportFailure = init.transportFailure ?? false;
  }

  /**
   * Whether trying again later can succeed: 429, 503, 529 and other 5xx, and
   * transport failures. Never a 413 (the same prompt will not fit later) nor
   * any other 4xx, nor `deadline_infeasible` (the same deadline stays out of
   * reach while the replica is as busy: change the deadline or the lane first).
   */
  get retryable(): boolean {
    if (this.code === "deadline_infeasible") return false;
    if (this.status === 429) return true;
    // The same call (same Idempotency-Key) still runs: its answer is ready later.
    if (this.status === 409 && this.code === "idempotency_in_progress") return true;
    if (this.status >= 400 && this.status < 500) return false;
    return this.status >= 500 && this.status !== 501;
  }

  /** Builds the error from an envelope and status (either may be missing or malformed). */
  static fromEnvelope(
    status: number,
    envelope: unknown,
    meta: { retryAfter?: string | null | undefined; requestId?: string | undefined } = {},
  ): SluiceError {
    const error = (envelope as ErrorEnvelope | undefined)?.error;
    const code =
      typeof error?.code === "string" ? error.code : status >= 500 ? "unavailable" : "invalid_request";
    const message = typeof error?.message === "string" ? error.message : `sluice answered ${status}`;
    return new SluiceError(`${status} ${code}: ${message}`, {
      status,
      code,
      retryAfterSeconds: parseRetryAfter(meta.retryAfter),
      envelope: error ? (envelope as ErrorEnvelope) : undefined,
      requestId: typeof error?.request_id === "string" ? error.request_id : meta.requestId,
    });
  }
}

/** One attempt of a chat call, as the client hands it to a transport. */
export interface TransportCall {
  body: ChatRequest;
  sessionId?: string;
  lane?: "interactive" | "bulk";
  /** Time-to-first-token deadline sluice checks feasibility against, ms. */
  deadlineMs?: number;
  requestId: string;
  /** Sent as `Idempotency-Key`; the same for every attempt of one call. */
  idempotencyKey?: string;
  /** This attempt's time limit, ms (the transport tells sluice, which cancels the call after it). */
  timeoutMs: number;
  signal?: AbortSignal;
}

/** Per-attempt limits of the session calls. */
export interface TransportContext {
  timeoutMs: number;
  signal?: AbortSignal;
  requestId: string;
  /** Sent as `Idempotency-Key` on a POST; the same for every attempt of one call. */
  idempotencyKey?: string;
}

/** How the client reaches sluice: HTTP or NATS. Every method throws `SluiceError`. */
export interface SluiceTransport {
  readonly kind: "http" | "nats";
  chat(call: TransportCall): Promise<ChatCompletion>;
  /** Chunks as they arrive; a refusal throws before the first, an engine failure after some. */
  chatStream(call: TransportCall): AsyncIterable<ChatChunk>;
  openSession(
    init: { id?: string; lane?: "interactive" | "bulk"; metadata?: Record<string, unknown> },
    ctx: TransportContext,
  ): Promise<SessionInfo>;
  getSession(id: string, ctx: TransportContext): Promise<SessionInfo>;
  closeSession(id: string, ctx: TransportContext): Promise<void>;
  /** Releases what the transport holds (subscriptions, status watchers); not the connection it was given. */
  close?(): Promise<void>;
}
