/**
 * @module An `Engine` over an OpenAI-compatible HTTP upstream (vLLM, SGLang, llama.cpp, TGI, any other).
 * It composes the parts that live beside it: `scraper.ts` (signals and
 * health), `call-start.ts` (starting a call, refusals before output),
 * `upstream-stream.ts` (the running call), `event-interpretation.ts` and
 * `error-mapping.ts` (what the upstream's events and errors mean).
 */

import { type Clock, realClock } from "../../../src/clock.js";
import type { Engine, EngineCall, EngineSignals, EngineStream, ReplicaRole } from "../../../src/engine.js";
import { type CallContext, startUpstreamCall } from "./call-start.js";
import { CallStop } from "./call-stop.js";
import type { EngineFlavor, EngineProfileName } from "./engine-profiles.js";
import {
  bootstrapHostOf,
  type PdProtocol,
  SGLANG_DEFAULT_BOOTSTRAP_PORT,
  type SglangBootstrap,
  sglangBootstrapRoom,
} from "./pd-protocol.js";
import { type UpstreamModel, UpstreamScraper } from "./scraper.js";
import { fetchTransport, type UpstreamTransport, undiciTransport } from "./transport.js";

export type { UpstreamModel } from "./scraper.js";
export type { UpstreamChunk } from "./upstream-stream.js";

/** Options of `OpenAIUpstreamEngine`. */
export interface OpenAIUpstreamOptions {
  /** Replica id (the `replica`/`worker` label); default: the base URL's host:port. */
  id?: string;
  /** The upstream's root URL, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is accepted and dropped). */
  baseUrl: string;
  /** Time source for scrape timers and timeouts; default real time. */
  clock?: Clock;
  /** Interval between `/metrics` scrapes, ms (default 1000). */
  scrapeIntervalMs?: number;
  /** A scrape (or `/v1/models` fetch) that takes longer fails, ms (default 2000). */
  scrapeTimeoutMs?: number;
  /** A call whose upstream has not answered with headers within this many ms is refused `unavailable`; default none. */
  requestTimeoutMs?: number;
  /** Sent as `Authorization: Bearer …` to the upstream. */
  apiKey?: string;
  /** A WHATWG `fetch` to use instead of undici's pooled `request` (tests inject faults through it). */
  fetch?: typeof globalThis.fetch;
  /** Model names to report until `/v1/models` answered. */
  models?: readonly string[];
  /** Largest `/metrics` or error body read, bytes (default 16 MiB). */
  maxScrapeBytes?: number;
  /** KV capacity in tokens to use when the engine states none (`--kv-capacity-tokens`); the engine's own figure wins. */
  kvCapacityTokens?: number;
  /**
   * The profile to read its metrics with (`--engine-profile`): default `auto` (detected from the
   * page); `unknown` reads no metrics and serves it on its health alone.
   */
  profile?: EngineProfileName;
  /** Its role in a disaggregated fleet (`--upstream role=…`); default `both`. */
  role?: ReplicaRole;
  /** The request flow it speaks in that role (`--upstream pd=…`, `pd-protocol.ts`); default `vllm`. */
  pd?: PdProtocol;
  /**
   * SGLang prefill server: the port of its bootstrap server. Default: the
   * `disaggregation_bootstrap_port` its server info states at `start()`, else SGLang's 8998.
   */
  bootstrapPort?: number;
}

function positive(name: string, value: number): number {
  if (!(Number.isFinite(value) && value > 0)) {
    throw new RangeError(`OpenAIUpstreamEngine: ${name} must be a positive number of ms, got ${value}`);
  }
  return value;
}

function normalizeBaseUrl(raw: string): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new TypeError(
      `OpenAIUpstreamEngine: baseUrl must be an absolute http(s) URL, got ${JSON.stringify(raw)}`,
    );
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new TypeError(`OpenAIUpstreamEngine: baseUrl must use http or https, got ${JSON.stringify(raw)}`);
  }
  url.pathname = url.pathname.replace(/\/+$/, "").replace(/\/v1$/, "");
  url.search = "";
  url.hash = "";
  return url;
}

/**
 * An OpenAI-compatible replica reached over HTTP.
 *
 * Calls are always streamed from the upstream so the first generated token is
 * seen when it happens; a streaming client gets the upstream's SSE events
 * byte for byte (`chunk.raw`, one chunk per event; the closing `[DONE]` is not
 * forwarded, the transport writes its own), a non-streaming client gets text
 * chunks. Signals come from a periodic `/metrics` scrape (vLLM, SGLang, NIM,
 * llama.cpp or TGI names, see `engine-profiles.ts`; an engine whose page
 * cannot be read is served on its health, its signals unknown); a refused connection marks the replica
 * unhealthy until the next good scrape, while a scrape that hangs or returns
 * garbage only lets the signals go stale.
 */
export class OpenAIUpstreamEngine implements Engine {
  readonly id: string;
  readonly role: ReplicaRole;
  readonly pd: PdProtocol;
  readonly baseUrl: string;
  /** SGLang prefill server: where its decode servers join it (undefined: not known yet). */
  private bootstrapPort: number | undefined;
  /** SGLang's `disaggregation_mode` as its server info states it, once it answered. */
  private statedMode: string | undefined;
  private serverInfoRead = false;
  /** The server info being read, while it is. */
  private readingServerInfo: Promise<void> | undefined;
  private readonly transport: UpstreamTransport;
  private readonly presetModels: readonly string[];
  private readonly apiKey: string | undefined;
  /** Aborted once by `close()`: every scrape and call in flight runs under a signal that follows it. */
  private readonly closing = new AbortController();
  private readonly scraper: UpstreamScraper;
  private readonly callContext: CallContext;
  private calls = 0;

  constructor(options: OpenAIUpstreamOptions) {
    if (options === null || typeof options !== "object") {
      throw new TypeError(`OpenAIUpstreamEngine: options must be an object, got ${String(options)}`);
    }
    const url = normalizeBaseUrl(options.baseUrl);
    this.baseUrl = url.href.replace(/\/$/, "");
    this.id = options.id ?? url.host;
    this.role = options.role ?? "both";
    this.pd = options.pd ?? "vllm";
    const bootstrapPort = options.bootstrapPort;
    if (
      bootstrapPort !== undefined &&
      !(Number.isInteger(bootstrapPort) && bootstrapPort > 0 && bootstrapPort < 65536)
    ) {
      throw new RangeError(`OpenAIUpstreamEngine: bootstrapPort must be a TCP port, got ${bootstrapPort}`);
    }
    this.bootstrapPort = bootstrapPort;
    const clock = options.clock ?? realClock;
    const scrapeIntervalMs = positive("scrapeIntervalMs", options.scrapeIntervalMs ?? 1000);
    const scrapeTimeoutMs = positive("scrapeTimeoutMs", options.scrapeTimeoutMs ?? 2000);
    const requestTimeoutMs =
      options.requestTimeoutMs === undefined
        ? undefined
        : positive("requestTimeoutMs", options.requestTimeoutMs);
    this.apiKey = options.apiKey;
    this.transport = options.fetch ? fetchTransport(options.fetch) : undiciTransport();
    this.presetModels = [...(options.models ?? [])];
    const maxScrapeBytes = options.maxScrapeBytes ?? 16 * 1024 * 1024;
    if (!(Number.isInteger(maxScrapeBytes) && maxScrapeBytes > 0)) {
      throw new RangeError(
        `OpenAIUpstreamEngine: maxScrapeBytes must be a positive integer, got ${maxScrapeBytes}`,
      );
    }
    const kvCapacityTokens = options.kvCapacityTokens;
    if (kvCapacityTokens !== undefined && !(Number.isInteger(kvCapacityTokens) && kvCapacityTokens > 0)) {
      throw new RangeError(
        `OpenAIUpstreamEngine: kvCapacityTokens must be a positive integer, got ${kvCapacityTokens}`,
      );
    }
    const headers = (extra: Record<string, string>) => this.headers(extra);
    this.scraper = new UpstreamScraper({
      baseUrl: this.baseUrl,
      transport: this.transport,
      clock,
      scrapeIntervalMs,
      scrapeTimeoutMs,
      maxScrapeBytes,
      closing: this.closing.signal,
      headers,
      replicaId: this.id,
      ...(kvCapacityTokens !== undefined ? { kvCapacityTokens } : {}),
      ...(options.profile !== undefined ? { profile: options.profile } : {}),
    });
    this.callContext = {
      replicaId: this.id,
      role: this.role,
      baseUrl: this.baseUrl,
      transport: this.transport,
      clock,
      headers,
      closing: this.closing.signal,
      requestTimeoutMs,
      errorBodyTimeoutMs: scrapeTimeoutMs,
      unreachableRetryAfterSeconds: scrapeIntervalMs / 1000,
      markUnreachable: () => this.scraper.markUnreachable(),
      began: () => {
        this.calls++;
      },
      ended: () => {
        this.calls--;
      },
      observeUsage: (usage) => this.scraper.observeUsage(usage),
    };
  }

  /**
   * Starts periodic scraping and fetches `/v1/models`. Resolves after the
   * first scrape and models fetch finished, whether or not they succeeded
   * (`signals().healthy` tells); never rejects. Idempotent.
   */
  start(): Promise<void> {
    return Promise.all([this.scraper.start(), this.readServerInfo()]).then(() => undefined);
  }

  /**
   * An SGLang server in PD mode states its mode and, on the prefill side, its
   * bootstrap port in its server info (its `server_args`). Read at start, and
   * again by calls while the server has not answered.
   */
  private readServerInfo(): Promise<void> {
    if (this.pd !== "sglang" || this.serverInfoRead) return Promise.resolve();
    this.readingServerInfo ??= this.scraper.readServerInfo().then((info) => {
      this.readingServerInfo = undefined;
      if (!info) return;
      this.serverInfoRead = true;
      if (typeof info.disaggregation_mode === "string") this.statedMode = info.disaggregation_mode;
      if (this.role !== "prefill" || this.bootstrapPort !== undefined) return;
      // A server info without the port: SGLang's default.
      const port = info.disaggregation_bootstrap_port;
      const stated = typeof port === "number" && Number.isInteger(port) && port > 0 && port < 65536;
      this.bootstrapPort = stated ? port : SGLANG_DEFAULT_BOOTSTRAP_PORT;
    });
    return this.readingServerInfo;
  }

  /** SGLang's PD mode: the `disaggregation_mode` the server states (`prefill`, `decode`, `null`), once it answered. */
  disaggregationMode(): string | undefined {
    return this.statedMode;
  }

  /**
   * SGLang's PD mode, on a prefill server: a fresh pairing for one call — this
   * server's host and bootstrap port, and a new room — which its prefill and
   * decode calls both carry. Undefined for vLLM's flow.
   */
  pairedKvTransfer(): SglangBootstrap | undefined {
    if (this.pd !== "sglang" || this.role !== "prefill") return undefined;
    // Until the server says otherwise, SGLang's default port.
    if (this.bootstrapPort === undefined) void this.readServerInfo();
    return {
      bootstrap_host: bootstrapHostOf(this.baseUrl),
      bootstrap_port: this.bootstrapPort ?? SGLANG_DEFAULT_BOOTSTRAP_PORT,
      bootstrap_room: sglangBootstrapRoom(),
    };
  }

  /** Stops scraping and aborts every running call (their iteration throws `EngineError`). */
  async close(): Promise<void> {
    if (this.closing.signal.aborted) return;
    this.closing.abort(new CallStop("closed"));
    await this.scraper.stop();
    await this.transport.close();
  }

  /** Model names, from `/v1/models` once it answered (else the `models` option). */
  models(): readonly string[] {
    const list = this.scraper.models();
    return list ? list.map((m) => m.id) : this.presetModels;
  }

  /** What `/v1/models` reported, or undefined before it answered. */
  modelInfo(): readonly UpstreamModel[] | undefined {
    return this.scraper.models();
  }

  /**
   * Context window of `model` (default: the first model) in tokens, from `max_model_len`, else
   * what the engine states elsewhere (llama.cpp's slot context, TGI's `max_total_tokens`);
   * undefined when not stated.
   */
  contextWindow(model?: string): number | undefined {
    const list = this.scraper.models() ?? [];
    const found = model === undefined ? list[0] : list.find((m) => m.id === model);
    return found?.maxModelLen ?? this.scraper.statedContextTokens();
  }

  /** Calls started and not yet ended (a call ends when its result settles or its iteration ends). */
  inFlight(): number {
    return this.calls;
  }

  /** Which engine the last good scrape looked like, once known. */
  flavor(): EngineFlavor | undefined {
    return this.scraper.flavor();
  }

  signals(): EngineSignals {
    return this.scraper.signals();
  }

  /** Scrapes `/metrics` once now and returns the resulting signals; never rejects (see `UpstreamScraper.scrape`). */
  scrape(): Promise<EngineSignals> {
    return this.scraper.scrape();
  }

  /** Fetches `/v1/models` now; keeps the previous list on failure. Never rejects. */
  refreshModels(): Promise<readonly UpstreamModel[] | undefined> {
    return this.scraper.refreshModels();
  }

  /**
   * Starts a call at the upstream. Resolves when the upstream answered 2xx;
   * rejects with a `Refusal` when it answered an error status or could not be
   * reached (`unavailable`, and the replica is marked unhealthy), or with the
   * signal's reason when `call.signal` aborted first.
   */
  generate(call: EngineCall): Promise<EngineStream> {
    return startUpstreamCall(this.callContext, call);
  }

  private headers(extra: Record<string, string>): Record<string, string> {
    const headers: Record<string, string> = { "accept-encoding": "identity", ...extra };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    return headers;
  }
}
