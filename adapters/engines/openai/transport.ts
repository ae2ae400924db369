/**
 * @module How the upstream engine speaks HTTP: one small request/response shape with two implementations —
 * undici's `request` on a keep-alive connection pool (the default), and any WHATWG `fetch` (tests inject faults
 * through it). On Node 20, `fetch` costs several times more CPU per call than `request` (Request, Headers and
 * web-stream objects for every call); on a proxy that forwards every call, that is most of its own overhead.
 */

import { Agent, interceptors, request } from "undici";

/** What a request sends. */
export interface UpstreamRequestInit {
  method: "GET" | "POST";
  headers: Record<string, string>;
  body?: string;
  /** Aborts the request, or the reading of its body once it answered. */
  signal: AbortSignal;
}

/** An upstream's answer once its headers arrived. */
export interface UpstreamResponse {
  readonly status: number;
  /** A response header, by lower-case name; the first value when repeated. */
  header(name: string): string | undefined;
  /** The body chunk by chunk; iteration throws when the connection fails or the signal aborts. Read once. */
  readonly body: AsyncIterable<Uint8Array>;
  /** Stops reading the body and closes the connection. Idempotent; never throws. */
  cancel(): void;
  /** Reads out what little is left of a body no longer wanted, so the connection can be reused. Never throws. */
  release(): void;
}

/** Sends one request; resolves once the headers arrived, rejects when it could not be sent or was aborted. */
export interface UpstreamTransport {
  send(url: string, init: UpstreamRequestInit): Promise<UpstreamResponse>;
  /** Closes the connections (without waiting); requests in flight are ended by their signals. */
  close(): Promise<void>;
}

/**
 * undici's `request` over a keep-alive pool. Its own header and body
 * timeouts are off: a model may think for minutes between two tokens, and
 * the engine bounds what needs bounding (time to headers, scrapes) itself.
 */
export function undiciTransport(): UpstreamTransport {
  // Idle connections are dropped after 4 s, before the 5 s after which uvicorn (vLLM, SGLang) and
  // Node servers close them: reusing a connection the server is closing would fail a call.
  const dispatcher = new Agent({ headersTimeout: 0, bodyTimeout: 0, keepAliveTimeout: 4_000 });
  // Reads (`/metrics`, `/v1/models`) follow redirects as fetch did: a server may send `/metrics` to
  // `/metrics/`. A call is never re-sent to another address.
  const following = dispatcher.compose(interceptors.redirect({ maxRedirections: 3 }));
  return {
    async send(url, init) {
      const answer = await request(url, {
        method: init.method,
        headers: init.headers,
        ...(init.body !== undefined ? { body: init.body } : {}),
        signal: init.signal,
        dispatcher: init.method === "GET" ? following : dispatcher,
      });
      const { body, headers } = answer;
      return {
        status: answer.statusCode,
        header(name) {
          const value = headers[name];
          return Array.isArray(value) ? value[0] : value;
        },
        body,
        cancel() {
          if (!body.destroyed) body.destroy();
        },
        release() {
          // A bounded read to the end keeps the connection in the pool; past the bound it is closed.
          if (!body.destroyed) body.dump({ limit: 64 * 1024 }).catch(() => undefined);
        },
      };
    },
    async close() {
      // Calls in flight were aborted by the engine already; what is left are idle keep-alive sockets.
      void dispatcher.destroy().catch(() => undefined);
    },
  };
}

/** Any WHATWG `fetch` as a transport. */
export function fetchTransport(fetchImpl: typeof globalThis.fetch): UpstreamTransport {
  return {
    async send(url, init) {
      const response = await fetchImpl(url, {
        method: init.method,
        headers: init.headers,
        ...(init.body !== undefined ? { body: init.body } : {}),
        signal: init.signal,
      });
      const stream = response.body;
      let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
      let cancelled = false;
      const cancel = () => {
        if (cancelled) return;
        cancelled = true;
        (reader ? reader.cancel() : stream?.cancel())?.catch(() => undefined);
      };
      return {
        status: response.status,
        header: (name) => response.headers.get(name) ?? undefined,
        body: {
          async *[Symbol.asyncIterator]() {
            if (!stream || cancelled) return;
            reader = stream.getReader();
            try {
              for (;;) {
                const { done, value } = await reader.read();
                if (done) return;
                yield value;
              }
            } finally {
              cancel();
            }
          },
        },
        cancel,
        release: cancel,
      };
    },
    async close() {},
  };
}
