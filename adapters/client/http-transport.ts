/** @module The client's HTTP transport: sluice's OpenAI-compatible API and sessions API (docs/http-api.md). */

import {
  type ChatChunk,
  type ChatCompletion,
  REASON_STATUS,
  type SessionInfo,
  SluiceError,
  type SluiceTransport,
  type TransportCall,
  type TransportContext,
} from "./types.js";

/** Options of {@link HttpTransport}. */
export interface HttpTransportOptions {
  /** sluice's base URL, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** Sent as `authorization: Bearer …` when sluice has API keys. */
  apiKey?: string;
  /** The `fetch` to use; default the global one. */
  fetch?: typeof globalThis.fetch;
}

const decoder = new TextDecoder();

/** A signal that aborts with the caller's or after `ms`; `done()` clears the timer. */
interface Limit {
  signal: AbortSignal;
  done(): void;
  timedOut(): boolean;
  /** Whether the caller's own signal aborted. */
  callerAborted(): boolean;
}

function limit(ms: number, signal: AbortSignal | undefined): Limit {
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort(new DOMException(`no answer within ${ms} ms`, "TimeoutError"));
  }, ms);
  const onAbort = () => controller.abort(signal?.reason);
  signal?.addEventListener("abort", onAbort, { once: true });
  if (signal?.aborted) onAbort();
  return {
    signal: controller.signal,
    done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    },
    timedOut: () => timedOut,
    callerAborted: () => signal?.aborted === true,
  };
}

/** Splits an SSE byte stream into events. */
async function* sseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<{ event: string; data: string }> {
  const reader = body.getReader();
  let buffer = "";
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (value) buffer += decoder.decode(value, { stream: true });
      let boundary = buffer.search(/\r?\n\r?\n/);
      while (boundary >= 0) {
        const block = buffer.slice(0, boundary);
        buffer = buffer.slice(boundary).replace(/^\r?\n\r?\n/, "");
        let event = "message";
        const data: string[] = [];
        for (const line of block.split(/\r?\n/)) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
        }
        if (data.length > 0) yield { event, data: data.join("\n") };
        boundary = buffer.search(/\r?\n\r?\n/);
      }
      if (done) return;
    }
  } finally {
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

/** Talks to sluice over HTTP. */
export class HttpTransport implements SluiceTransport {
  readonly kind = "http" as const;
  private readonly baseUrl: string;
  private readonly apiKey: string | undefined;
  private readonly fetchImpl: typeof globalThis.fetch;

  constructor(options: HttpTransportOptions) {
    let url: URL;
    try {
      url = new URL(options.baseUrl);
    } catch {
      throw new TypeError(`baseUrl must be an absolute http(s) URL, got ${JSON.stringify(options.baseUrl)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new TypeError(`baseUrl must use http or https, got ${JSON.stringify(options.baseUrl)}`);
    }
    this.baseUrl = url.href.replace(/\/+$/, "").replace(/\/v1$/, "");
    this.apiKey = options.apiKey;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  async chat(call: TransportCall): Promise<ChatCompletion> {
    const timer = limit(call.timeoutMs, call.signal);
    try {
      const response = await this.send(
        "POST",
        "/v1/chat/completions",
        call,
        { ...call.body, stream: false },
        timer,
      );
      return (await response.json()) as ChatCompletion;
    } catch (err) {
      throw this.failure(err, timer, call.requestId);
    } finally {
      timer.done();
    }
  }

  async *chatStream(call: TransportCall): AsyncGenerator<ChatChunk> {
    const timer = limit(call.timeoutMs, call.signal);
    try {
      let response: Response;
      try {
        response = await this.send(
          "POST",
          "/v1/chat/completions",
          call,
          { ...call.body, stream: true },
          timer,
        );
      } catch (err) {
        throw this.failure(err, timer, call.requestId);
      }
      if (!response.body) return;
      try {
        for await (const event of sseEvents(response.body)) {
          if (event.event === "error") {
            const envelope = JSON.parse(event.data) as { error?: { code?: string } };
            const status = REASON_STATUS[envelope.error?.code ?? ""] ?? 502;
            throw SluiceError.fromEnvelope(status, envelope, { requestId: call.requestId });
          }
          if (event.data === "[DONE]") return;
          yield JSON.parse(event.data) as ChatChunk;
        }
      } catch (err) {
        throw this.failure(err, timer, call.requestId);
      }
    } finally {
      timer.done();
    }
  }

  async openSession(
    init: { id?: string; lane?: "interactive" | "bulk"; metadata?: Record<string, unknown> },
    ctx: TransportContext,
  ): Promise<SessionInfo> {
    return this.sessionCall("POST", "/v1/sessions", init, ctx);
  }

  getSession(id: string, ctx: TransportContext): Promise<SessionInfo> {
    return this.sessionCall("GET", `/v1/sessions/${encodeURIComponent(id)}`, undefined, ctx);
  }

  async closeSession(id: string, ctx: TransportContext): Promise<void> {
    await this.sessionCall("DELETE", `/v1/sessions/${encodeURIComponent(id)}`, undefined, ctx);
  }

  private async sessionCall(
    method: string,
    path: string,
    body: unknown,
    ctx: TransportContext,
  ): Promise<SessionInfo> {
    const timer = limit(ctx.timeoutMs, ctx.signal);
    try {
      const response = await this.send(
        method,
        path,
        {
          requestId: ctx.requestId,
          ...(ctx.idempotencyKey !== undefined ? { idempotencyKey: ctx.idempotencyKey } : {}),
        },
        body,
        timer,
      );
      const text = await response.text();
      return (text === "" ? {} : JSON.parse(text)) as SessionInfo;
    } catch (err) {
      throw this.failure(err, timer, ctx.requestId);
    } finally {
      timer.done();
    }
  }

  private async send(
    method: string,
    path: string,
    call: Pick<TransportCall, "requestId"> & Partial<TransportCall>,
    body: unknown,
    timer: Limit,
  ): Promise<Response> {
    const headers: Record<string, string> = { "x-request-id": call.requestId };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    if (call.sessionId !== undefined) headers["x-session-id"] = call.sessionId;
    if (call.lane !== undefined) headers["x-sluice-lane"] = call.lane;
    if (call.deadlineMs !== undefined) headers["x-sluice-deadline-ms"] = String(call.deadlineMs);
    if (method === "POST" && call.idempotencyKey !== undefined)
      headers["idempotency-key"] = call.idempotencyKey;
    const response = await this.fetchImpl(`${this.baseUrl}${path}`, {
      method,
      headers,
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: timer.signal,
    });
    if (response.ok) return response;
    const text = await response.text().catch(() => "");
    let envelope: unknown;
    try {
      envelope = JSON.parse(text);
    } catch {
      envelope = undefined;
    }
    throw SluiceError.fromEnvelope(response.status, envelope, {
      retryAfter: response.headers.get("retry-after"),
      requestId: response.headers.get("x-request-id") ?? call.requestId,
    });
  }

  /** Maps whatever failed into a `SluiceError` (aborts by the caller pass through untouched). */
  private failure(err: unknown, timer: Limit, requestId: string): unknown {
    if (err instanceof SluiceError || timer.callerAborted()) return err;
    if (timer.timedOut()) {
      return new SluiceError("sluice did not answer in time", {
        status: 504,
        code: "timeout",
        transportFailure: true,
        requestId,
        cause: err,
      });
    }
    if (err instanceof Error && err.name === "AbortError") return err;
    if (err instanceof SyntaxError) {
      return new SluiceError(`sluice sent a body that is not JSON: ${err.message}`, {
        status: 502,
        code: "unavailable",
        requestId,
        cause: err,
      });
    }
    return new SluiceError(
      `sluice could not be reached at ${this.baseUrl}: ${(err as Error)?.message ?? String(err)}`,
      {
        status: 503,
        code: "unavailable",
        transportFailure: true,
        requestId,
        cause: err,
      },
    );
  }
}
