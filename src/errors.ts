/** @module One `Refusal` type for every "no" sluice says, and its rendering as an OpenAI-style error. */

/** Every machine-readable reason sluice refuses a call with (docs/http-api.md). */
export type RefusalReason =
  | "invalid_request"
  | "unauthorized"
  | "model_not_found"
  | "session_not_found"
  | "response_state_lost"
  | "context_limit"
  | "overflow"
  | "body_too_large"
  | "queue_full"
  | "queue_timeout"
  | "token_budget_exhausted"
  | "decode_budget_exhausted"
  | "deadline_infeasible"
  | "session_queue_full"
  | "rate_limited"
  | "worker_overloaded"
  | "unavailable"
  | "idempotency_in_progress"
  | "idempotency_key_reused"
  | "batch_not_found"
  | "file_not_found"
  | "job_not_found";

/** OpenAI-style error `type` field. */
export type ErrorType =
  | "overloaded_error"
  | "invalid_request_error"
  | "authentication_error"
  | "not_found_error"
  | "unavailable_error";

/** Token limits that explain a refusal, in tokens. */
export interface RefusalLimits {
  max_input_tokens?: number;
  max_total_tokens?: number;
  max_output_tokens?: number;
}

/** Where a refusal applies: one rank, the whole worker, one lane, or the whole fleet. */
export type RefusalScope = "rank" | "worker" | "lane" | "fleet" | "request";

export interface RefusalInit {
  status?: number;
  scope?: RefusalScope;
  rank?: number;
  lane?: "interactive" | "bulk" | "overflow";
  /** Whole seconds, ≥ 1; only meaningful on 429, 529 and 503. */
  retryAfterSeconds?: number;
  limits?: RefusalLimits;
  /** The offending request parameter, for `invalid_request`. */
  param?: string | null;
  cause?: unknown;
}

/** The HTTP status docs/http-api.md gives each reason (`worker_overloaded`: 529 unless configured otherwise). */
export const REFUSAL_STATUS: Readonly<Record<RefusalReason, number>> = {
  invalid_request: 400,
  unauthorized: 401,
  model_not_found: 404,
  session_not_found: 404,
  // The replica that holds a `previous_response_id`'s state is gone, or no longer holds it.
  response_state_lost: 409,
  context_limit: 413,
  overflow: 413,
  body_too_large: 413,
  queue_full: 429,
  queue_timeout: 429,
  token_budget_exhausted: 429,
  // A disaggregated fleet's decode pool is predicted to have no room when the call's KV would arrive.
  decode_budget_exhausted: 429,
  deadline_infeasible: 429,
  session_queue_full: 429,
  rate_limited: 429,
  worker_overloaded: 529,
  unavailable: 503,
  // An Idempotency-Key whose first request still runs (409, with Retry-After), or that came back with another body (422).
  idempotency_in_progress: 409,
  idempotency_key_reused: 422,
  batch_not_found: 404,
  file_not_found: 404,
  job_not_found: 404,
};

/** The HTTP status docs/http-api.md gives a reason (529 for `worker_overloaded` unless configured otherwise). */
export function defaultStatus(reason: RefusalReason): number {
  return REFUSAL_STATUS[reason];
}

/** Whether a string is one of the documented reasons. */
export function isRefusalReason(reason: string): reason is RefusalReason {
  return Object.hasOwn(REFUSAL_STATUS, reason);
}

/**
 * Statuses that tell a client to come back later, and so carry `Retry-After`: 429, 503 and 529. An
 * internal error (500) is not one: nothing says waiting would help.
 */
export function isRetryableStatus(status: number): boolean {
  return status === 429 || status === 503 || status === 529;
}

/** Whether a refusal says "not now, later": a retryable status, or a gate rejection at whatever status it is configured. */
export function tellsToComeBackLater(refusal: Pick<Refusal, "reason" | "status">): boolean {
  return isRetryableStatus(refusal.status) || refusal.reason === "worker_overloaded";
}

/** Whether a refusal tells the client when to come back: every come-back-later refusal, and a key still in progress. */
function carriesRetryAfter(reason: RefusalReason, status: number): boolean {
  return tellsToComeBackLater({ reason, status }) || reason === "idempotency_in_progress";
}

/**
 * A refusal: sluice will not run this call (now). Thrown by the core, mapped
 * to a response in exactly one place per adapter via `renderRefusal`.
 */
export class Refusal extends Error {
  readonly reason: RefusalReason;
  readonly status: number;
  readonly scope: RefusalScope | undefined;
  readonly rank: number | undefined;
  readonly lane: "interactive" | "bulk" | "overflow" | undefined;
  readonly retryAfterSeconds: number | undefined;
  readonly limits: RefusalLimits | undefined;
  readonly param: string | null;

  constructor(reason: RefusalReason, message: string, init: RefusalInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "Refusal";
    this.reason = reason;
    this.status = init.status ?? REFUSAL_STATUS[reason];
    this.scope = init.scope;
    this.rank = init.rank;
    this.lane = init.lane;
    this.limits = init.limits;
    this.param = init.param ?? null;
    this.retryAfterSeconds = carriesRetryAfter(reason, this.status)
      ? wholeSecondsAtLeastOne(init.retryAfterSeconds ?? 1)
      : undefined;
  }

  /**
   * The same refusal (same class: a `GateRejection` stays one) with fields an
   * outer layer knows filled in (lane, status, Retry-After).
   */
  with(init: RefusalInit): this {
    const copy = Object.create(Object.getPrototypeOf(this), Object.getOwnPropertyDescriptors(this)) as this;
    const fields = copy as unknown as Record<string, unknown>;
    for (const key of ["status", "scope", "rank", "lane", "limits", "param"] as const) {
      if (init[key] !== undefined) fields[key] = init[key];
    }
    if (init.retryAfterSeconds !== undefined || init.status !== undefined) {
      fields.retryAfterSeconds = carriesRetryAfter(copy.reason, copy.status)
        ? wholeSecondsAtLeastOne(init.retryAfterSeconds ?? this.retryAfterSeconds ?? 1)
        : undefined;
    }
    return copy;
  }

  /** The OpenAI error `type` for this refusal. */
  get type(): ErrorType {
    return errorTypeOf(this.reason, this.status);
  }
}

/** Rounds a duration in seconds up to whole seconds, never below 1. */
export function wholeSecondsAtLeastOne(seconds: number): number {
  if (!Number.isFinite(seconds)) return 3600;
  return Math.max(1, Math.ceil(seconds - 1e-9));
}

function errorTypeOf(reason: RefusalReason, status: number): ErrorType {
  if (reason === "unauthorized") return "authentication_error";
  if (reason.endsWith("_not_found")) return "not_found_error";
  if (reason === "unavailable") return "unavailable_error";
  if (status === 429 || status >= 500) return "overloaded_error";
  return "invalid_request_error";
}

/** The docs/http-api.md error envelope body. */
export interface ErrorEnvelope {
  error: {
    message: string;
    type: ErrorType;
    code: RefusalReason;
    param: string | null;
    request_id: string;
    lane: "interactive" | "bulk" | "overflow" | null;
    limits: RefusalLimits | null;
  };
}

/** A refusal rendered for any transport: status, headers and the JSON envelope. */
export interface RenderedRefusal {
  status: number;
  headers: Record<string, string>;
  body: ErrorEnvelope;
}

/** Renders a refusal as the documented OpenAI-style envelope with its headers (`Retry-After` where due). */
export function renderRefusal(refusal: Refusal, requestId: string): RenderedRefusal {
  const headers: Record<string, string> = { "content-type": "application/json", "x-request-id": requestId };
  if (refusal.retryAfterSeconds !== undefined) headers["retry-after"] = String(refusal.retryAfterSeconds);
  if (refusal.lane && refusal.lane !== "overflow") headers["x-sluice-lane"] = refusal.lane;
  return {
    status: refusal.status,
    headers,
    body: {
      error: {
        message: refusal.message,
        type: refusal.type,
        code: refusal.reason,
        param: refusal.param,
        request_id: requestId,
        lane: refusal.lane ?? null,
        limits: refusal.limits ?? null,
      },
    },
  };
}

/** An engine failed after the call was admitted (connection lost, upstream error mid-stream). */
export class EngineError extends Error {
  constructor(
    message: string,
    readonly upstreamStatus?: number,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "EngineError";
  }
}

/**
 * Any failure as a `Refusal`, so each transport maps everything through one
 * renderer: an engine failure and a call cancelled before it ran are 503
 * `unavailable` (docs/http-api.md gives that reason one status); anything else is a 500.
 */
export function toRefusal(err: unknown): Refusal {
  if (err instanceof Refusal) return err;
  if (err instanceof Error && err.name === "EngineError") {
    return new Refusal("unavailable", `engine failed: ${err.message}`, { status: 503, cause: err });
  }
  if (err instanceof Error && (err.name === "AbortError" || err.name === "TimeoutError")) {
    return new Refusal(
      "unavailable",
      "the call was cancelled before it could run (client gone, timeout or shutdown)",
      {
        status: 503,
        cause: err,
      },
    );
  }
  const message = err instanceof Error ? err.message : String(err);
  return new Refusal("unavailable", `internal error: ${message}`, { status: 500, cause: err });
}
