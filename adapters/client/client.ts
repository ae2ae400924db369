/**
 * @module A small client for agent frameworks: open a session, run steps
 * (whole or streamed) over HTTP or NATS, close it. Refusals that say "later"
 * (429, 503, 529) are retried after `Retry-After` plus randomized
 * exponential backoff, up to an absolute deadline; a 413 and every other 4xx
 * is never retried. A stream is retried only before its first chunk.
 */

import type { Cancel, Clock } from "../../src/clock.js";
import {
  type ChatChunk,
  type ChatCompletion,
  type ChatRequest,
  type SessionInfo,
  SluiceError,
  type SluiceTransport,
  type TransportCall,
} from "./types.js";

/** Wall time with real timers: deadlines given to the client are `Date.now()` milliseconds. */
export const wallClock: Clock = {
  now: () => Date.now(),
  setTimeout(fn: () => void, ms: number): Cancel {
    const handle = setTimeout(fn, Math.max(0, ms));
    return () => clearTimeout(handle);
  },
};

/** Retry policy. */
export interface RetryOptions {
  /** Most attempts of one call, first included. Default 8. */
  maxAttempts?: number;
  /** Backoff base, ms: attempt k (from 0) backs off around `baseDelayMs · 2^k`. Default 250. */
  baseDelayMs?: number;
  /** Cap of the exponential part, ms. Default 30000. */
  maxDelayMs?: number;
}

/** Options of {@link SluiceClient}. */
export interface SluiceClientOptions {
  transport: SluiceTransport;
  retry?: RetryOptions;
  /** Longest one attempt may take, ms (sluice cancels the call after it). Default 300000. */
  attemptTimeoutMs?: number;
  /** Time source for deadlines and backoff; default wall time (`Date.now()`). */
  clock?: Clock;
  /** Uniform random numbers in [0, 1) for the jitter; default `Math.random`. */
  random?: () => number;
  /** Request ids; default `req-<uuid>`. */
  newRequestId?: () => string;
  /** Idempotency keys, one per call and reused by its retries; default a random UUID. */
  newIdempotencyKey?: () => string;
}

/** Per-call options. */
export interface CallOptions {
  /** Absolute deadline in the client clock's ms (default clock: `Date.now()`); no attempt starts or waits past it. */
  deadline?: number;
  /** Relative form of `deadline`: this many ms from now. */
  withinMs?: number;
  signal?: AbortSignal;
  requestId?: string;
  /**
   * `Idempotency-Key` sent with every attempt of a POST (a step, opening a session), so a retry after
   * a lost answer is not run twice; default a new random key per call.
   */
  idempotencyKey?: string;
}

/** Per-step options. */
export interface StepOptions extends CallOptions {
  lane?: "interactive" | "bulk";
  /** Time-to-first-token deadline sent to sluice (`Sluice-Deadline-Ms` / `x-sluice-deadline-ms`), ms. */
  ttftDeadlineMs?: number;
}

/** What one attempt gets: its time limit, the call's request id and idempotency key, the caller's signal. */
interface AttemptContext {
  timeoutMs: number;
  signal?: AbortSignal;
  requestId: string;
  idempotencyKey: string;
}

function positive(name: string, value: number): number {
  if (!(Number.isFinite(value) && value > 0))
    throw new RangeError(`${name} must be a positive number, got ${value}`);
  return value;
}

function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("the call was aborted", "AbortError");
}

/**
 * The client. Every method resolves with sluice's answer or rejects with a
 * `SluiceError` (after retries, with `attempts` set) or the signal's reason.
 */
export class SluiceClient {
  readonly transport: SluiceTransport;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly maxAttempts: number;
  private readonly baseDelayMs: number;
  private readonly maxDelayMs: number;
  private readonly attemptTimeoutMs: number;
  private readonly newRequestId: () => string;
  private readonly newIdempotencyKey: () => string;

  constructor(options: SluiceClientOptions) {
    this.transport = options.transport;
    this.clock = options.clock ?? wallClock;
    this.random = options.random ?? Math.random;
    const retry = options.retry ?? {};
    this.maxAttempts = retry.maxAttempts ?? 8;
    if (!(Number.isInteger(this.maxAttempts) && this.maxAttempts >= 1)) {
      throw new RangeError(`retry.maxAttempts must be a positive integer, got ${this.maxAttempts}`);
    }
    this.baseDelayMs = positive("retry.baseDelayMs", retry.baseDelayMs ?? 250);
    this.maxDelayMs = positive("retry.maxDelayMs", retry.maxDelayMs ?? 30_000);
    this.attemptTimeoutMs = positive("attemptTimeoutMs", options.attemptTimeoutMs ?? 300_000);
    this.newRequestId = options.newRequestId ?? (() => `req-${globalThis.crypto.randomUUID()}`);
    this.newIdempotencyKey = options.newIdempotencyKey ?? (() => globalThis.crypto.randomUUID());
  }

  /** Opens a session (`id` optional: sluice makes one). */
  openSession(
    init: { id?: string; lane?: "interactive" | "bulk"; metadata?: Record<string, unknown> } = {},
    options: CallOptions = {},
  ): Promise<SessionInfo> {
    return this.withRetries(options, (ctx) => this.transport.openSession(init, ctx));
  }

  getSession(id: string, options: CallOptions = {}): Promise<SessionInfo> {
    return this.withRetries(options, (ctx) => this.transport.getSession(id, ctx));
  }

  /** Closes a session, freeing its window slot. */
  closeSession(id: string, options: CallOptions = {}): Promise<void> {
    return this.withRetries(options, (ctx) => this.transport.closeSession(id, ctx));
  }

  /** One step of a session (or a one-off call when `sessionId` is undefined), answered whole. */
  step(sessionId: string | undefined, body: ChatRequest, options: StepOptions = {}): Promise<ChatCompletion> {
    return this.withRetries(options, (ctx) =>
      this.transport.chat(this.callOf(sessionId, body, options, ctx)),
    );
  }

  /**
   * One step, streamed. Refusals before the first chunk are retried like
   * `step`; once a chunk arrived a failure ends the iteration with its error.
   */
  async *stream(
    sessionId: string | undefined,
    body: ChatRequest,
    options: StepOptions = {},
  ): AsyncGenerator<ChatChunk> {
    let iterator: AsyncIterator<ChatChunk> | undefined;
    const first = await this.withRetries(options, async (ctx) => {
      const it = this.transport
        .chatStream(this.callOf(sessionId, body, options, ctx))
        [Symbol.asyncIterator]();
      try {
        const next = await it.next();
        iterator = it;
        return next;
      } catch (err) {
        await it.return?.().catch(() => {});
        throw err;
      }
    });
    if (first.done || !iterator) return;
    try {
      yield first.value;
      for (;;) {
        const next = await iterator.next();
        if (next.done) return;
        yield next.value;
      }
    } finally {
      await iterator.return?.().catch(() => {});
    }
  }

  /** The wait before attempt `attempt + 1` (from 0): at least `Retry-After`, plus jittered exponential backoff, ms. */
  backoffMs(attempt: number, retryAfterSeconds: number | undefined): number {
    const exponential = Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** attempt);
    // Equal jitter: half fixed so waits grow, half random so clients refused together do not return together.
    const jittered = exponential / 2 + (this.random() * exponential) / 2;
    return (retryAfterSeconds ?? 0) * 1000 + jittered;
  }

  private callOf(
    sessionId: string | undefined,
    body: ChatRequest,
    options: StepOptions,
    ctx: AttemptContext,
  ): TransportCall {
    const call: TransportCall = {
      body,
      requestId: ctx.requestId,
      timeoutMs: ctx.timeoutMs,
      idempotencyKey: ctx.idempotencyKey,
    };
    if (ctx.signal) call.signal = ctx.signal;
    if (sessionId !== undefined) call.sessionId = sessionId;
    if (options.lane !== undefined) call.lane = options.lane;
    if (options.ttftDeadlineMs !== undefined) call.deadlineMs = options.ttftDeadlineMs;
    return call;
  }

  private async withRetries<T>(
    options: CallOptions,
    attempt: (ctx: AttemptContext) => Promise<T>,
  ): Promise<T> {
    const start = this.clock.now();
    const deadline = Math.min(
      options.deadline ?? Number.POSITIVE_INFINITY,
      options.withinMs === undefined ? Number.POSITIVE_INFINITY : start + options.withinMs,
    );
    const requestId = options.requestId ?? this.newRequestId();
    // One key for every attempt: a retry of a call whose answer was lost gets that answer, not a second run.
    const idempotencyKey = options.idempotencyKey ?? this.newIdempotencyKey();
    const signal = options.signal;
    for (let n = 0; ; n++) {
      signal?.throwIfAborted();
      const left = deadline - this.clock.now();
      if (left <= 0) {
        throw new SluiceError("the call's deadline passed before it could be sent", {
          status: 504,
          code: "timeout",
          transportFailure: true,
          requestId,
        });
      }
      const timeoutMs = Math.max(1, Math.min(this.attemptTimeoutMs, left));
      try {
        return await attempt({ timeoutMs, requestId, idempotencyKey, ...(signal ? { signal } : {}) });
      } catch (err) {
        if (signal?.aborted) throw abortError(signal);
        if (!(err instanceof SluiceError)) throw err;
        err.attempts = n + 1;
        if (!err.retryable || n + 1 >= this.maxAttempts) throw err;
        const wait = this.backoffMs(n, err.retryAfterSeconds);
        // A retry that could only start after the deadline is not worth waiting for.
        if (this.clock.now() + wait >= deadline) throw err;
        await this.sleep(wait, signal);
      }
    }
  }

  private sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(abortError(signal));
      const onAbort = () => {
        cancel();
        reject(abortError(signal!));
      };
      const cancel = this.clock.setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}
