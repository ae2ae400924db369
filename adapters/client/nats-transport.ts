/**
 * @module The client's NATS transport (docs/nats.md): requests to `sluice.v1.*`,
 * streamed steps on a private inbox ending at the `Sluice-Done` marker,
 * service errors turned back into `SluiceError`. While the connection is
 * down, calls fail at once with 503 `unavailable` (and calls in flight are
 * failed too) instead of waiting for a reply that cannot come.
 */

import {
  headers as createHeaders,
  createInbox,
  ErrorCode,
  Events,
  type Msg,
  type MsgHdrs,
  type NatsConnection,
  type NatsError,
} from "nats";
import { HEADERS, SUBJECTS } from "../nats/protocol.js";
import {
  type ChatChunk,
  type ChatCompletion,
  type SessionInfo,
  SluiceError,
  type SluiceTransport,
  type TransportCall,
  type TransportContext,
} from "./types.js";

/** Options of {@link NatsTransport}. */
export interface NatsTransportOptions {
  /** A connection the caller owns (the transport never closes it). */
  nc: NatsConnection;
  /**
   * Chat calls ask sluice for a heartbeat this often while they run, ms (0:
   * none, plain request/reply). Default 1000.
   */
  heartbeatMs?: number;
  /**
   * A chat call that hears nothing (no heartbeat, chunk or reply) for this
   * long fails with 503 `unavailable`: the frontend serving it is gone. Default
   * five heartbeats.
   */
  deadAfterMs?: number;
}

const encoder = new TextEncoder();

function unavailable(message: string, requestId: string, cause?: unknown): SluiceError {
  return new SluiceError(message, {
    status: 503,
    code: "unavailable",
    retryAfterSeconds: 1,
    transportFailure: true,
    requestId,
    ...(cause === undefined ? {} : { cause }),
  });
}

function timedOut(ms: number, requestId: string, cause?: unknown): SluiceError {
  return new SluiceError(`sluice did not answer within ${ms} ms`, {
    status: 504,
    code: "timeout",
    transportFailure: true,
    requestId,
    ...(cause === undefined ? {} : { cause }),
  });
}

/** A service error (or a no-responders status) carried by a reply, as a `SluiceError`; undefined for a normal reply. */
function errorOf(msg: Msg, requestId: string): SluiceError | undefined {
  const h = msg.headers;
  if (!h) return undefined;
  if (h.code === 503 && msg.data.byteLength === 0) {
    return unavailable("no sluice instance is listening on NATS", requestId);
  }
  const code = h.get(HEADERS.serviceErrorCode);
  if (code === "") return undefined;
  let envelope: unknown;
  try {
    envelope = msg.json();
  } catch {
    envelope = { error: { code: h.get(HEADERS.serviceError), message: h.get(HEADERS.serviceError) } };
  }
  return SluiceError.fromEnvelope(Number(code), envelope, {
    retryAfter: h.get(HEADERS.retryAfter) || undefined,
    requestId: h.get(HEADERS.requestId) || requestId,
  });
}

/** Talks to sluice over NATS. */
export class NatsTransport implements SluiceTransport {
  readonly kind = "nats" as const;
  private readonly nc: NatsConnection;
  private down = false;
  /** Calls waiting for a reply; each fails itself with the reason given when the connection drops. */
  private readonly inFlight = new Set<(reason: string) => void>();
  private stopped = false;
  private readonly heartbeatMs: number;
  private readonly deadAfterMs: number;

  constructor(options: NatsTransportOptions) {
    this.nc = options.nc;
    this.heartbeatMs = options.heartbeatMs ?? 1000;
    if (!(Number.isFinite(this.heartbeatMs) && this.heartbeatMs >= 0)) {
      throw new RangeError(`heartbeatMs must be ≥ 0, got ${this.heartbeatMs}`);
    }
    this.deadAfterMs = options.deadAfterMs ?? this.heartbeatMs * 5;
    if (this.heartbeatMs > 0 && !(Number.isFinite(this.deadAfterMs) && this.deadAfterMs > this.heartbeatMs)) {
      throw new RangeError(
        `deadAfterMs must exceed heartbeatMs (${this.heartbeatMs}), got ${this.deadAfterMs}`,
      );
    }
    void this.watchStatus();
  }

  /**
   * Whether the connection is up. nats.js v2 has no public flag for it: its
   * protocol handler's `connected` is read when present (a transport made
   * during an outage has seen no disconnect event), else the status events.
   */
  get connected(): boolean {
    if (this.nc.isClosed()) return false;
    const internal = (this.nc as unknown as { protocol?: { connected?: unknown } }).protocol?.connected;
    if (typeof internal === "boolean") return internal && !this.down;
    return !this.down;
  }

  async chat(call: TransportCall): Promise<ChatCompletion> {
    if (this.heartbeatMs === 0) {
      const reply = await this.request(SUBJECTS.chat, call.body, this.callHeaders(call, false), call);
      return reply.json<ChatCompletion>();
    }
    for await (const msg of this.exchange(call, false)) return msg.json<ChatCompletion>();
    throw unavailable("sluice ended the call without a reply", call.requestId);
  }

  async *chatStream(call: TransportCall): AsyncGenerator<ChatChunk> {
    for await (const msg of this.exchange(call, true)) {
      if (msg.headers?.get(HEADERS.done) === "true") return;
      yield msg.json<ChatChunk>();
    }
    throw unavailable("the stream ended without its done marker", call.requestId);
  }

  /**
   * One chat call on a private inbox: yields every message but heartbeats,
   * throws the service error a message carries. Ends the wait with a
   * `SluiceError` when the call's time is up, the caller aborts, the
   * connection drops, or (heartbeats on) the serving frontend falls silent.
   */
  private async *exchange(call: TransportCall, stream: boolean): AsyncGenerator<Msg> {
    this.checkUp(call.requestId);
    call.signal?.throwIfAborted();
    const inbox = createInbox();
    const sub = this.nc.subscribe(inbox);
    let failure: unknown;
    const fail = (err: unknown) => {
      if (failure === undefined) failure = err;
      sub.unsubscribe();
    };
    const timer = setTimeout(() => fail(timedOut(call.timeoutMs, call.requestId)), call.timeoutMs);
    let silence: ReturnType<typeof setTimeout> | undefined;
    const listen = () => {
      if (this.heartbeatMs === 0) return;
      clearTimeout(silence);
      silence = setTimeout(
        () =>
          fail(
            unavailable(
              `the sluice frontend serving this call fell silent for ${this.deadAfterMs} ms (no heartbeat); retry it`,
              call.requestId,
            ),
          ),
        this.deadAfterMs,
      );
    };
    const onAbort = () => fail(call.signal?.reason);
    call.signal?.addEventListener("abort", onAbort, { once: true });
    const lost = (reason: string) => fail(unavailable(reason, call.requestId));
    this.inFlight.add(lost);
    try {
      const headers = this.callHeaders(call, stream);
      if (this.heartbeatMs > 0) headers.set(HEADERS.heartbeatMs, String(Math.ceil(this.heartbeatMs)));
      listen();
      this.nc.publish(SUBJECTS.chat, encoder.encode(JSON.stringify(call.body)), { reply: inbox, headers });
      for await (const msg of sub) {
        listen();
        if (msg.headers?.get(HEADERS.heartbeat) === "true") continue;
        const error = errorOf(msg, call.requestId);
        if (error) throw error;
        yield msg;
      }
      if (failure !== undefined) throw failure;
    } finally {
      clearTimeout(timer);
      clearTimeout(silence);
      call.signal?.removeEventListener("abort", onAbort);
      this.inFlight.delete(lost);
      sub.unsubscribe();
    }
  }

  async openSession(
    init: { id?: string; lane?: "interactive" | "bulk"; metadata?: Record<string, unknown> },
    ctx: TransportContext,
  ): Promise<SessionInfo> {
    const reply = await this.request(SUBJECTS.sessionsOpen, init, this.baseHeaders(ctx.requestId), ctx);
    return reply.json<SessionInfo>();
  }

  async getSession(id: string, ctx: TransportContext): Promise<SessionInfo> {
    const reply = await this.request(SUBJECTS.sessionsGet, { id }, this.baseHeaders(ctx.requestId), ctx);
    return reply.json<SessionInfo>();
  }

  async closeSession(id: string, ctx: TransportContext): Promise<void> {
    await this.request(SUBJECTS.sessionsClose, { id }, this.baseHeaders(ctx.requestId), ctx);
  }

  async close(): Promise<void> {
    this.stopped = true;
  }

  private baseHeaders(requestId: string): MsgHdrs {
    const h = createHeaders();
    h.set(HEADERS.requestId, requestId);
    return h;
  }

  private callHeaders(call: TransportCall, stream: boolean): MsgHdrs {
    const h = this.baseHeaders(call.requestId);
    if (call.sessionId !== undefined) h.set(HEADERS.session, call.sessionId);
    if (call.lane !== undefined) h.set(HEADERS.lane, call.lane);
    if (call.deadlineMs !== undefined) h.set(HEADERS.deadlineMs, String(call.deadlineMs));
    h.set(HEADERS.timeoutMs, String(Math.ceil(call.timeoutMs)));
    if (stream) h.set(HEADERS.stream, "true");
    return h;
  }

  private checkUp(requestId: string): void {
    if (this.nc.isClosed()) throw unavailable("the NATS connection is closed", requestId);
    if (!this.connected)
      throw unavailable("the NATS connection is down; sluice cannot be reached", requestId);
  }

  /** One request/reply, failed early when the connection drops or the caller aborts. */
  private async request(
    subject: string,
    body: unknown,
    headers: MsgHdrs,
    ctx: { timeoutMs: number; signal?: AbortSignal; requestId: string },
  ): Promise<Msg> {
    this.checkUp(ctx.requestId);
    ctx.signal?.throwIfAborted();
    let fail!: (err: unknown) => void;
    const failed = new Promise<never>((_, reject) => {
      fail = reject;
    });
    failed.catch(() => {});
    const onAbort = () => fail(ctx.signal?.reason);
    ctx.signal?.addEventListener("abort", onAbort, { once: true });
    const lost = (reason: string) => fail(unavailable(reason, ctx.requestId));
    this.inFlight.add(lost);
    try {
      const reply = await Promise.race([
        this.nc.request(subject, encoder.encode(JSON.stringify(body)), { timeout: ctx.timeoutMs, headers }),
        failed,
      ]);
      const error = errorOf(reply, ctx.requestId);
      if (error) throw error;
      return reply;
    } catch (err) {
      if (err instanceof SluiceError || ctx.signal?.aborted) throw err;
      const code = (err as NatsError)?.code;
      if (code === ErrorCode.NoResponders)
        throw unavailable("no sluice instance is listening on NATS", ctx.requestId, err);
      if (code === ErrorCode.Timeout) throw timedOut(ctx.timeoutMs, ctx.requestId, err);
      throw unavailable(`NATS request failed: ${(err as Error)?.message ?? String(err)}`, ctx.requestId, err);
    } finally {
      ctx.signal?.removeEventListener("abort", onAbort);
      this.inFlight.delete(lost);
    }
  }

  private async watchStatus(): Promise<void> {
    try {
      for await (const status of this.nc.status()) {
        if (this.stopped) return;
        if (status.type === Events.Disconnect) {
          this.down = true;
          // Replies to calls in flight are lost with the connection: fail them now rather than at their timeout.
          for (const lost of [...this.inFlight]) lost("the NATS connection was lost during the call");
        } else if (status.type === Events.Reconnect) {
          this.down = false;
        }
      }
    } catch {
      // The status iterator ends with the connection.
    }
  }
}
