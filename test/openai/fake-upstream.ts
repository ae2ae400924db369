/** @module A tiny scripted OpenAI-compatible upstream on loopback, for fault tests the simulator cannot stage. */

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** One request the fake upstream received. */
export interface SeenRequest {
  method: string;
  path: string;
  headers: IncomingMessage["headers"];
  body: string;
  /** The client's port: the same for calls that reused a keep-alive connection. */
  remotePort: number | undefined;
  /** Settles when the connection to the client closed before the response finished (the client aborted). */
  aborted: Promise<void>;
  /** Whether the client closed the connection before the response finished. */
  wasAborted(): boolean;
}

export type Handler = (req: SeenRequest, res: ServerResponse) => void | Promise<void>;

export interface FakeUpstream {
  url: string;
  port: number;
  requests: SeenRequest[];
  /** Resolves at the `n`-th request (1-based) to `path`. */
  nextRequest(path: string, n?: number): Promise<SeenRequest>;
  close(): Promise<void>;
}

/** A promise with its resolver, for handlers that wait for the test to allow the next step. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** Starts a loopback server that routes every request to `routes[path]` (404 otherwise). */
export async function startFakeUpstream(routes: Record<string, Handler>): Promise<FakeUpstream> {
  const requests: SeenRequest[] = [];
  const waiters: { path: string; n: number; resolve: (r: SeenRequest) => void }[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const closed = deferred();
      let aborted = false;
      res.on("close", () => {
        if (!res.writableFinished) {
          aborted = true;
          closed.resolve();
        }
      });
      const seen: SeenRequest = {
        method: req.method ?? "",
        path: (req.url ?? "").split("?")[0] ?? "",
        headers: req.headers,
        body: Buffer.concat(chunks).toString("utf8"),
        remotePort: req.socket.remotePort,
        aborted: closed.promise,
        wasAborted: () => aborted,
      };
      requests.push(seen);
      const count = requests.filter((r) => r.path === seen.path).length;
      for (const w of waiters.filter((w) => w.path === seen.path && w.n === count)) w.resolve(seen);
      const handler = routes[seen.path];
      if (!handler) {
        res.writeHead(404, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: `no route ${seen.path}` } }));
        return;
      }
      Promise.resolve(handler(seen, res)).catch(() => res.destroy());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    nextRequest(path, n) {
      const target = n ?? requests.filter((r) => r.path === path).length + 1;
      const already = requests.filter((r) => r.path === path)[target - 1];
      if (already) return Promise.resolve(already);
      return new Promise((resolve) => waiters.push({ path, n: target, resolve }));
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Writes one SSE `data:` event. */
export function sse(res: ServerResponse, payload: unknown): string {
  const text = `data: ${typeof payload === "string" ? payload : JSON.stringify(payload)}\n\n`;
  res.write(text);
  return text;
}

/** A chat-completion chunk as vLLM streams it. */
export function chatChunk(
  delta: Record<string, unknown>,
  finish: string | null = null,
): Record<string, unknown> {
  return {
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    created: 1,
    model: "m",
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  };
}

/** The usage-only chunk vLLM sends last when `stream_options.include_usage` is set. */
export function usageChunk(prompt: number, completion: number, cached?: number): Record<string, unknown> {
  return {
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    created: 1,
    model: "m",
    choices: [],
    usage: {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
      ...(cached === undefined ? {} : { prompt_tokens_details: { cached_tokens: cached } }),
    },
  };
}

export function startSse(res: ServerResponse): void {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  res.flushHeaders();
}

/** A vLLM V1 `/metrics` page (new names) with the given gauges. */
export function vllmPage(o: {
  kv: number;
  running: number;
  waiting: number;
  queries: number;
  hits: number;
}): string {
  return [
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
    "# TYPE vllm:kv_cache_usage_perc gauge",
    `vllm:kv_cache_usage_perc{engine="0",model_name="m"} ${o.kv}`,
    "# TYPE vllm:num_requests_running gauge",
    `vllm:num_requests_running{engine="0",model_name="m"} ${o.running}`,
    "# TYPE vllm:num_requests_waiting gauge",
    `vllm:num_requests_waiting{engine="0",model_name="m"} ${o.waiting}`,
    "# TYPE vllm:prefix_cache_queries counter",
    `vllm:prefix_cache_queries_total{engine="0",model_name="m"} ${o.queries}`,
    "# TYPE vllm:prefix_cache_hits counter",
    `vllm:prefix_cache_hits_total{engine="0",model_name="m"} ${o.hits}`,
    "# TYPE vllm:num_preemptions counter",
    'vllm:num_preemptions_total{engine="0",model_name="m"} 3',
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1',
    "",
  ].join("\n");
}
