/** @module An `Engine` over an OpenAI-compatible HTTP upstream (vLLM, SGLang): forwards calls, scrapes `/metrics`. */

import { type Cancel, type Clock, realClock } from "../../../src/clock.js";
import {
  type Engine,
  type EngineCall,
  type EngineChunk,
  type EngineResult,
  type EngineSignals,
  type EngineStream,
  type FinishReason,
  unknownSignals,
} from "../../../src/engine.js";
import { EngineError, Refusal, type RefusalReason } from "../../../src/errors.js";
import { type EngineFlavor, parseEngineMetrics, type ScrapedSignals } from "./metrics-parser.js";
import { type SseEvent, SseSplitter } from "./sse.js";
import {
  fetchTransport,
  type UpstreamResponse,
  type UpstreamTransport,
  undiciTransport,
} from "./transport.js";

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
}

/** What `/v1/models` said about one model. */
export interface UpstreamModel {
  id: string;
  /** Context window in tokens (vLLM and SGLang `max_model_len`), when the upstream states it. */
  maxModelLen?: number;
}

/** A chunk as this engine yields it: the port's chunk plus the upstream's parsed event, for transports that need more than text. */
export interface UpstreamChunk extends EngineChunk {
  /** The parsed JSON of the upstream event (tool-call deltas, logprobs, …); absent for comments. */
  event?: Record<string, unknown>;
}

const KNOWN_REASONS: ReadonlySet<string> = new Set<RefusalReason>([
  "invalid_request",
  "unauthorized",
  "model_not_found",
  "session_not_found",
  "context_limit",
  "overflow",
  "body_too_large",
  "queue_full",
  "queue_timeout",
  "token_budget_exhausted",
  "deadline_infeasible",
  "session_queue_full",
  "rate_limited",
  "worker_overloaded",
  "unavailable",
]);

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

/** Why a call's controller was aborted; decides how the failure is reported. */
type AbortCause =
  | { kind: "client" }
  | { kind: "consumer" }
  | { kind: "closed" }
  | { kind: "timeout"; ms: number };

/**
 * An OpenAI-compatible replica reached over HTTP.
 *
 * Calls are always streamed from the upstream so the first generated token is
 * seen when it happens; a streaming client gets the upstream's SSE events
 * byte for byte (`chunk.raw`, one chunk per event; the closing `[DONE]` is not
 * forwarded, the transport writes its own), a non-streaming client gets text
 * chunks. Signals come from a periodic `/metrics` scrape (vLLM or SGLang
 * names, see `metrics-parser.ts`); a refused connection marks the replica
 * unhealthy until the next good scrape, while a scrape that hangs or returns
 * garbage only lets the signals go stale.
 */
export class OpenAIUpstreamEngine implements Engine {
  readonly id: string;
  readonly baseUrl: string;
  private readonly clock: Clock;
  private readonly scrapeIntervalMs: number;
  private readonly scrapeTimeoutMs: number;
  private readonly requestTimeoutMs: number | undefined;
  private readonly apiKey: string | undefined;
  private readonly transport: UpstreamTransport;
  private readonly presetModels: readonly string[];
  private readonly maxScrapeBytes: number;

  private last: ScrapedSignals | undefined;
  private lastReadAtMs = Number.NEGATIVE_INFINITY;
  private healthy = false;
  private upstreamFlavor: EngineFlavor | undefined;
  private modelList: UpstreamModel[] | undefined;
  private started: Promise<void> | undefined;
  private closed = false;
  private cancelTick: Cancel | undefined;
  private scraping: Promise<EngineSignals> | undefined;
  private readonly background = new Set<AbortController>();
  private readonly running = new Set<(cause: AbortCause) => void>();

  constructor(options: OpenAIUpstreamOptions) {
    if (options === null || typeof options !== "object") {
      throw new TypeError(`OpenAIUpstreamEngine: options must be an object, got ${String(options)}`);
    }
    const url = normalizeBaseUrl(options.baseUrl);
    this.baseUrl = url.href.replace(/\/$/, "");
    this.id = options.id ?? url.host;
    this.clock = options.clock ?? realClock;
    this.scrapeIntervalMs = positive("scrapeIntervalMs", options.scrapeIntervalMs ?? 1000);
    this.scrapeTimeoutMs = positive("scrapeTimeoutMs", options.scrapeTimeoutMs ?? 2000);
    this.requestTimeoutMs =
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
    this.maxScrapeBytes = maxScrapeBytes;
  }

  /**
   * Starts periodic scraping and fetches `/v1/models`. Resolves after the
   * first scrape and models fetch finished, whether or not they succeeded
   * (`signals().healthy` tells); never rejects. Idempotent.
   */
  start(): Promise<void> {
    if (this.started) return this.started;
    this.started = Promise.all([this.refreshModels(), this.scrape()]).then(() => {
      this.scheduleTick();
    });
    return this.started;
  }

  /** Stops scraping and aborts every running call (their iteration throws `EngineError`). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.healthy = false;
    this.cancelTick?.();
    for (const controller of this.background) controller.abort();
    for (const abort of [...this.running]) abort({ kind: "closed" });
    await this.scraping?.catch(() => undefined);
    await this.transport.close();
  }

  /** Model names, from `/v1/models` once it answered (else the `models` option). */
  models(): readonly string[] {
    return this.modelList ? this.modelList.map((m) => m.id) : this.presetModels;
  }

  /** What `/v1/models` reported, or undefined before it answered. */
  modelInfo(): readonly UpstreamModel[] | undefined {
    return this.modelList;
  }

  /** Context window of `model` (default: the first model) in tokens, from `max_model_len`; undefined when not stated. */
  contextWindow(model?: string): number | undefined {
    const list = this.modelList ?? [];
    const found = model === undefined ? list[0] : list.find((m) => m.id === model);
    return found?.maxModelLen;
  }

  /** Calls started and not yet ended (a call ends when its result settles or its iteration ends). */
  inFlight(): number {
    return this.running.size;
  }

  /** Which engine the last good scrape looked like, once known. */
  flavor(): EngineFlavor | undefined {
    return this.upstreamFlavor;
  }

  signals(): EngineSignals {
    const base = this.last ? stripFlavor(this.last) : unknownSignals();
    return { ...base, readAtMs: this.lastReadAtMs, healthy: this.healthy && !this.closed };
  }

  /**
   * Scrapes `/metrics` once now (the periodic loop calls this too) and
   * returns the resulting signals. Never rejects: a failure, a timeout or a
   * page without engine metrics keeps the last good values and their
   * `readAtMs`, so their age shows; an unreachable replica is also marked
   * unhealthy.
   */
  scrape(): Promise<EngineSignals> {
    if (this.scraping) return this.scraping;
    this.scraping = this.scrapeOnce().finally(() => {
      this.scraping = undefined;
    });
    return this.scraping;
  }

  private async scrapeOnce(): Promise<EngineSignals> {
    if (this.closed) return this.signals();
    try {
      const text = await this.getText("/metrics");
      const parsed = parseEngineMetrics(text);
      if (!parsed) throw new Error("the page carries no vLLM or SGLang engine metrics");
      if (this.closed) return this.signals();
      this.last = parsed;
      this.upstreamFlavor = parsed.flavor;
      this.lastReadAtMs = this.clock.now();
      this.healthy = true;
    } catch (error) {
      // Only a replica that cannot be reached at all is unhealthy. A /metrics page that hangs, errs or
      // carries garbage leaves the last signals in place to age: stale signals fail closed for new
      // sessions (SPEC 6) while active sessions, and the gate, go on.
      if (isUnreachable(error)) this.healthy = false;
    }
    return this.signals();
  }

  /** Fetches `/v1/models` now; keeps the previous list on failure. Never rejects. */
  async refreshModels(): Promise<readonly UpstreamModel[] | undefined> {
    if (this.closed) return this.modelList;
    try {
      const body = JSON.parse(await this.getText("/v1/models")) as { data?: unknown };
      if (!Array.isArray(body.data)) return this.modelList;
      const list: UpstreamModel[] = [];
      for (const entry of body.data as Record<string, unknown>[]) {
        if (typeof entry?.id !== "string") continue;
        const len = entry.max_model_len ?? entry.context_length ?? entry.max_context_length;
        const model: UpstreamModel = { id: entry.id };
        if (typeof len === "number" && Number.isFinite(len) && len > 0) model.maxModelLen = Math.floor(len);
        list.push(model);
      }
      this.modelList = list;
    } catch {
      // An upstream without /v1/models keeps the configured names; the next tick tries again.
    }
    return this.modelList;
  }

  private scheduleTick(): void {
    if (this.closed) return;
    this.cancelTick = this.clock.setTimeout(() => {
      this.cancelTick = undefined;
      const work = this.modelList === undefined ? [this.refreshModels(), this.scrape()] : [this.scrape()];
      void Promise.all(work).then(() => this.scheduleTick());
    }, this.scrapeIntervalMs);
  }

  /** GET a small text resource under the scrape timeout and size cap; throws on any failure. */
  private async getText(path: string): Promise<string> {
    const controller = new AbortController();
    this.background.add(controller);
    const cancelTimer = this.clock.setTimeout(() => controller.abort(), this.scrapeTimeoutMs);
    try {
      const response = await this.transport.send(this.baseUrl + path, {
        method: "GET",
        headers: this.headers({ accept: "text/plain, application/json;q=0.9, */*;q=0.1" }),
        signal: controller.signal,
      });
      const text = await readText(response, this.maxScrapeBytes, controller.signal);
      if (!isSuccess(response)) throw new Error(`GET ${path} answered ${response.status}`);
      return text;
    } finally {
      cancelTimer();
      this.background.delete(controller);
    }
  }

  private headers(extra: Record<string, string>): Record<string, string> {
    const headers: Record<string, string> = { "accept-encoding": "identity", ...extra };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    return headers;
  }

  /**
   * Starts a call at the upstream. Resolves when the upstream answered 2xx;
   * rejects with a `Refusal` when it answered an error status or could not be
   * reached (`unavailable`, and the replica is marked unhealthy), or with the
   * signal's reason when `call.signal` aborted first.
   */
  async generate(call: EngineCall): Promise<EngineStream> {
    call.signal.throwIfAborted();
    if (this.closed) {
      throw new Refusal("unavailable", `replica ${this.id} is closed`, { status: 503, scope: "worker" });
    }
    const controller = new AbortController();
    let cause: AbortCause | undefined;
    let onAbort: ((why: AbortCause) => void) | undefined;
    const abort = (why: AbortCause): void => {
      if (cause) return;
      cause = why;
      controller.abort(why.kind === "client" ? call.signal.reason : undefined);
      onAbort?.(why);
    };
    const onClientAbort = (): void => abort({ kind: "client" });
    call.signal.addEventListener("abort", onClientAbort, { once: true });
    this.running.add(abort);
    const detach = (): void => {
      call.signal.removeEventListener("abort", onClientAbort);
      this.running.delete(abort);
    };
    const timeoutMs = this.requestTimeoutMs;
    let cancelTimer: Cancel | undefined =
      timeoutMs === undefined
        ? undefined
        : this.clock.setTimeout(() => abort({ kind: "timeout", ms: timeoutMs }), timeoutMs);

    let response: UpstreamResponse;
    try {
      response = await this.transport.send(
        `${this.baseUrl}/v1/${call.endpoint === "chat" ? "chat/completions" : "completions"}`,
        {
          method: "POST",
          headers: this.callHeaders(call),
          body: JSON.stringify(upstreamBody(call)),
          signal: controller.signal,
        },
      );
    } catch (error) {
      cancelTimer?.();
      detach();
      throw this.failureBeforeHeaders(call, cause, error);
    }

    if (!isSuccess(response)) {
      // The error body is small; bound its read so a stalled upstream cannot hold the caller.
      cancelTimer?.();
      const bodyTimer = this.clock.setTimeout(
        () => abort({ kind: "timeout", ms: this.scrapeTimeoutMs }),
        this.scrapeTimeoutMs,
      );
      const text = await readText(response, 64 * 1024, controller.signal).catch(() => "");
      bodyTimer();
      detach();
      if (cause?.kind === "client") throw call.signal.reason;
      throw refusalFor(response, text, this.id);
    }
    cancelTimer?.();
    cancelTimer = undefined;

    const stream = new UpstreamStream(call, response, controller.signal, () => cause, abort, detach);
    onAbort = (why) => stream.aborted(why);
    if (cause) stream.aborted(cause); // aborted between the headers and here
    return stream;
  }

  private callHeaders(call: EngineCall): Record<string, string> {
    const headers = this.headers({
      "content-type": "application/json",
      accept: "text/event-stream, application/json;q=0.5",
      "x-request-id": call.requestId,
    });
    // vLLM's data-parallel routing header: the gate bound the call to this rank.
    if (call.rank !== undefined) headers["x-data-parallel-rank"] = String(call.rank);
    return headers;
  }

  private failureBeforeHeaders(call: EngineCall, cause: AbortCause | undefined, error: unknown): unknown {
    if (cause?.kind === "client") return call.signal.reason ?? error;
    if (cause?.kind === "closed") {
      return new Refusal("unavailable", `replica ${this.id} is closed`, {
        status: 503,
        scope: "worker",
        cause: error,
      });
    }
    // Unreachable or silent upstream: nothing ran, so the call can be refused cleanly and retried elsewhere.
    this.healthy = false;
    const what =
      cause?.kind === "timeout"
        ? `did not answer within ${cause.ms} ms`
        : `could not be reached (${describeNetworkError(error)})`;
    return new Refusal("unavailable", `replica ${this.id} ${what}`, {
      status: 503,
      scope: "worker",
      retryAfterSeconds: this.scrapeIntervalMs / 1000,
      cause: error,
    });
  }
}

function stripFlavor(signals: ScrapedSignals): Omit<EngineSignals, "readAtMs" | "healthy"> {
  const { flavor: _flavor, ...rest } = signals;
  return rest;
}

/** The body sent upstream: the client's, with the admitted model and output cap; streamed when the client streams. */
function upstreamBody(call: EngineCall): Record<string, unknown> {
  const body: Record<string, unknown> = { ...(call.body ?? {}) };
  body.model = call.model;
  if (body.max_completion_tokens !== undefined) {
    body.max_completion_tokens = call.maxTokens;
    delete body.max_tokens;
  } else body.max_tokens = call.maxTokens;
  if (body.prompt === undefined && body.messages === undefined) {
    if (call.endpoint === "completions") body.prompt = [...call.promptTokens];
  }
  if (!call.stream) {
    // A client that does not stream gets one JSON answer: asking the upstream for the same is cheaper than
    // parsing its events, and the permit's waiting part then ends at completion, as SPEC 4 allows.
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

function clientAskedForUsage(call: EngineCall): boolean {
  const options = call.body?.stream_options;
  return isRecord(options) && options.include_usage === true;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function isSuccess(response: UpstreamResponse): boolean {
  return response.status >= 200 && response.status < 300;
}

/** Reads a body as text up to `limit` bytes; throws when larger or aborted. */
async function readText(response: UpstreamResponse, limit: number, signal: AbortSignal): Promise<string> {
  const parts: Uint8Array[] = [];
  let size = 0;
  try {
    for await (const part of response.body) {
      size += part.byteLength;
      if (size > limit) throw new Error(`body larger than ${limit} bytes`);
      parts.push(part);
    }
  } catch (error) {
    response.cancel();
    throw signal.aborted ? new Error("aborted", { cause: error }) : error;
  }
  return Buffer.concat(parts).toString("utf8");
}

/** Connection-level failures: nothing listens there (or the host is gone), as opposed to a slow or bad answer. */
const UNREACHABLE_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
]);

function isUnreachable(error: unknown): boolean {
  return UNREACHABLE_CODES.has(describeNetworkError(error));
}

function describeNetworkError(error: unknown): string {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && current instanceof Error; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = current.cause;
  }
  return error instanceof Error ? error.message : String(error);
}

/** Retry-After from the upstream: delta seconds or an HTTP date. */
function retryAfterOf(response: UpstreamResponse): number | undefined {
  const header = response.header("retry-after")?.trim();
  if (!header) return undefined;
  if (/^\d+(\.\d+)?$/.test(header)) return Number(header);
  const at = Date.parse(header);
  if (Number.isNaN(at)) return undefined;
  // An HTTP date is wall-clock time by definition; only this edge adapter reads it.
  return Math.max(1, (at - Date.now()) / 1000);
}

function upstreamMessage(text: string): { message: string; code?: string } {
  try {
    const body = JSON.parse(text) as Record<string, unknown>;
    const error = isRecord(body.error) ? body.error : body;
    const message = error.message ?? body.detail ?? body.message;
    const code = error.code ?? error.type;
    return {
      message: typeof message === "string" ? message : JSON.stringify(message ?? body),
      ...(typeof code === "string" ? { code } : {}),
    };
  } catch {
    return { message: text.trim().slice(0, 500) };
  }
}

/** Maps an upstream error answer (before any output) to a refusal the client can act on. */
function refusalFor(response: UpstreamResponse, text: string, replica: string): Refusal {
  const status = response.status;
  const { message, code } = upstreamMessage(text);
  const retryAfterSeconds = retryAfterOf(response);
  const detail = `replica ${replica} answered ${status}${message ? `: ${message}` : ""}`;
  const retry = retryAfterSeconds === undefined ? {} : { retryAfterSeconds };
  // Another sluice (a gate sidecar) already speaks our reasons: keep them.
  if (code !== undefined && KNOWN_REASONS.has(code)) {
    return new Refusal(code as RefusalReason, detail, { status, ...retry });
  }
  if (status === 429 || status === 529) {
    return new Refusal("worker_overloaded", detail, { scope: "worker", ...retry });
  }
  if (status === 404) return new Refusal("model_not_found", detail);
  if (
    status === 413 ||
    (status === 400 && /context length|context window|too long|maximum.*tokens/i.test(message))
  ) {
    return new Refusal("context_limit", detail);
  }
  if (status === 401 || status === 403) {
    // The client cannot fix sluice's upstream credentials; to it the replica is unavailable.
    return new Refusal("unavailable", detail, { status: 503, scope: "worker", ...retry });
  }
  if (status >= 400 && status < 500) return new Refusal("invalid_request", detail, { status: 400 });
  return new Refusal("unavailable", detail, { status: 503, scope: "worker", ...retry });
}

function mapFinish(reason: unknown): FinishReason | undefined {
  if (reason === null || reason === undefined) return undefined;
  if (reason === "length") return "length";
  if (reason === "abort") return "abort";
  if (reason === "error") return "error";
  return "stop";
}

interface Usage {
  prompt: number;
  completion: number;
  cached: number;
}

function usageOf(value: unknown): Usage | undefined {
  if (!isRecord(value)) return undefined;
  const prompt = value.prompt_tokens;
  const completion = value.completion_tokens;
  if (typeof prompt !== "number" || typeof completion !== "number") return undefined;
  const details = value.prompt_tokens_details;
  const cached = isRecord(details) && typeof details.cached_tokens === "number" ? details.cached_tokens : 0;
  return { prompt, completion, cached };
}

/** What one parsed event says about generation. */
interface EventInfo {
  text: string;
  tokens: number[];
  tokenCount: number;
  generated: boolean;
  finish: FinishReason | undefined;
  finishedChoices: number[];
  usage: Usage | undefined;
  usageOnly: boolean;
}

function inspect(payload: Record<string, unknown>): EventInfo {
  const info: EventInfo = {
    text: "",
    tokens: [],
    tokenCount: 0,
    generated: false,
    finish: undefined,
    finishedChoices: [],
    usage: usageOf(payload.usage),
    usageOnly: false,
  };
  const choices = Array.isArray(payload.choices) ? payload.choices : [];
  for (const choice of choices) {
    if (!isRecord(choice)) continue;
    const delta = isRecord(choice.delta) ? choice.delta : undefined;
    let piece = "";
    let generated = false;
    if (typeof choice.text === "string") piece = choice.text;
    else if (delta) {
      if (typeof delta.content === "string") piece = delta.content;
      // Reasoning and tool-call deltas are generated tokens too; a role-only delta is not.
      const reasoning = delta.reasoning_content ?? delta.reasoning;
      if (typeof reasoning === "string" && reasoning !== "") generated = true;
      if (Array.isArray(delta.tool_calls) && delta.tool_calls.length > 0) generated = true;
    }
    if (piece !== "") generated = true;
    if ((choice.index ?? 0) === 0) info.text += piece;
    const ids = Array.isArray(choice.token_ids) ? choice.token_ids.filter((t) => typeof t === "number") : [];
    if (ids.length > 0) {
      generated = true;
      info.tokens.push(...(ids as number[]));
      info.tokenCount += ids.length;
    } else if (generated) {
      // Without token ids, each delta of a streaming engine carries one token (more with speculative decoding).
      info.tokenCount += 1;
    }
    if (generated) info.generated = true;
    const finish = mapFinish(choice.finish_reason);
    if (finish) {
      info.finish = finish;
      info.finishedChoices.push(typeof choice.index === "number" ? choice.index : 0);
    }
  }
  info.usageOnly = choices.length === 0 && info.usage !== undefined;
  return info;
}

function upstreamErrorOf(event: SseEvent, payload: Record<string, unknown> | undefined): string | undefined {
  if (event.event === "error") {
    return payload
      ? upstreamMessage(JSON.stringify(payload)).message
      : (event.data ?? "upstream error event");
  }
  if (!payload) return undefined;
  if (isRecord(payload.error)) return upstreamMessage(JSON.stringify(payload)).message;
  if (payload.object === "error")
    return typeof payload.message === "string" ? payload.message : "upstream error";
  return undefined;
}

/** The running call: iterated once by its consumer; settles `result` exactly once. */
class UpstreamStream implements EngineStream {
  readonly firstToken: Promise<void>;
  readonly result: Promise<EngineResult>;
  private resolveFirst!: () => void;
  private resolveResult!: (result: EngineResult) => void;
  private rejectResult!: (error: unknown) => void;
  private settled = false;
  /** The failure `result` rejected with, rethrown by iteration after an abort. */
  private failure: EngineError | undefined;
  private iterated = false;
  private counted = 0;
  private readonly outputTokens: number[] = [];
  private usage: Usage | undefined;
  private finish: FinishReason | undefined;
  private readonly seenChoices = new Set<number>();
  private readonly finishedChoices = new Set<number>();
  private readonly wantsUsageEvents: boolean;

  constructor(
    private readonly call: EngineCall,
    private readonly response: UpstreamResponse,
    private readonly signal: AbortSignal,
    private readonly causeOf: () => AbortCause | undefined,
    private readonly abort: (cause: AbortCause) => void,
    private readonly detach: () => void,
  ) {
    this.firstToken = new Promise((resolve) => {
      this.resolveFirst = resolve;
    });
    this.result = new Promise((resolve, reject) => {
      this.resolveResult = resolve;
      this.rejectResult = reject;
    });
    // A failure is reported through iteration too; the result must never surface as unhandled.
    this.result.catch(() => undefined);
    this.wantsUsageEvents = clientAskedForUsage(call);
  }

  /** The call's controller fired: settle now, even if nobody iterates, and release the connection. */
  aborted(cause: AbortCause): void {
    if (cause.kind === "closed")
      this.fail(new EngineError(`replica closed while call ${this.call.requestId} ran`));
    else if (cause.kind === "timeout") this.fail(new EngineError(`upstream timed out after ${cause.ms} ms`));
    else this.succeed("abort");
    if (!this.iterated) this.response.cancel();
  }

  /**
   * The iterator's `return()` aborts the upstream at once: an async
   * generator would queue it behind a pending `next()`, i.e. until the
   * upstream's next event, which may be far off.
   */
  [Symbol.asyncIterator](): AsyncIterator<UpstreamChunk> {
    if (this.iterated) throw new Error(`call ${this.call.requestId} can be iterated only once`);
    this.iterated = true;
    const generator = this.iterate();
    return {
      next: () => generator.next(),
      return: (value?: unknown) => {
        this.stopByConsumer();
        return generator.return(value as undefined);
      },
      throw: (error?: unknown) => {
        this.stopByConsumer();
        return generator.throw(error);
      },
    };
  }

  private stopByConsumer(): void {
    if (!this.settled && !this.causeOf()) this.abort({ kind: "consumer" });
  }

  private async *iterate(): AsyncGenerator<UpstreamChunk, void, undefined> {
    try {
      const contentType = this.response.header("content-type") ?? "";
      if (!contentType.includes("text/event-stream") && contentType.includes("json")) {
        yield* this.wholeJson();
      } else {
        yield* this.events();
      }
    } finally {
      // Reached on normal end, failure, and `break`; a `break` before the end cancels the upstream call.
      this.stopByConsumer();
      this.detach();
    }
  }

  private async *events(): AsyncGenerator<UpstreamChunk, void, undefined> {
    const reader = this.response.body[Symbol.asyncIterator]();
    const splitter = new SseSplitter();
    let sawDone = false;
    try {
      while (!sawDone) {
        let read: IteratorResult<Uint8Array>;
        try {
          read = await reader.next();
        } catch (error) {
          this.throwUnlessConsumerStopped(error);
          return;
        }
        if (read.done) break;
        for (const event of splitter.push(read.value)) {
          if (event.data === "[DONE]") {
            sawDone = true;
            break;
          }
          const chunk = this.chunkOf(event);
          if (chunk) yield chunk;
        }
      }
      if (this.causeOf()) {
        this.throwUnlessConsumerStopped(undefined);
        return;
      }
      if (!sawDone && !this.finishedAll()) {
        throw this.fail(new EngineError("upstream ended the stream before the call finished"));
      }
      this.succeed(this.finish ?? "stop");
    } finally {
      // After `[DONE]` nothing more is wanted and the connection can be reused; otherwise it is closed.
      if (sawDone) this.response.release();
      else this.response.cancel();
    }
  }

  /**
   * After a read failed or the controller fired: a consumer that stopped
   * just ends (the result says `abort`); anything else throws — the client's
   * abort reason, or the `EngineError` the result rejected with.
   */
  private throwUnlessConsumerStopped(error: unknown): void {
    const cause = this.causeOf();
    if (!cause) {
      throw this.fail(
        new EngineError(`upstream connection lost mid-stream (${describeNetworkError(error)})`, undefined, {
          cause: error,
        }),
      );
    }
    this.aborted(cause);
    if (cause.kind === "consumer") return;
    if (cause.kind === "client") {
      throw this.call.signal.reason ?? new DOMException("This operation was aborted", "AbortError");
    }
    throw this.failure ?? new EngineError("upstream call aborted");
  }

  private finishedAll(): boolean {
    if (this.finishedChoices.size === 0) return false;
    for (const index of this.seenChoices) if (!this.finishedChoices.has(index)) return false;
    return true;
  }

  /** Turns one event into a chunk to yield, or undefined when it carries nothing the consumer needs. */
  private chunkOf(event: SseEvent): UpstreamChunk | undefined {
    let payload: Record<string, unknown> | undefined;
    if (event.data !== undefined) {
      try {
        const parsed: unknown = JSON.parse(event.data);
        if (isRecord(parsed)) payload = parsed;
      } catch {
        // Not JSON: forwarded untouched below; it carries no token we can count.
      }
    }
    const upstreamError = upstreamErrorOf(event, payload);
    if (upstreamError !== undefined) {
      throw this.fail(new EngineError(`upstream failed mid-stream: ${upstreamError}`));
    }
    const raw = this.call.stream ? event.raw : undefined;
    if (!payload) return raw ? { tokens: [], tokenCount: 0, text: "", raw } : undefined;
    const info = inspect(payload);
    if (info.usage) this.usage = info.usage;
    if (Array.isArray(payload.choices)) {
      for (const choice of payload.choices) {
        if (isRecord(choice)) this.seenChoices.add(typeof choice.index === "number" ? choice.index : 0);
      }
    }
    for (const index of info.finishedChoices) this.finishedChoices.add(index);
    if (info.finish) this.finish = info.finish;
    this.counted += info.tokenCount;
    this.outputTokens.push(...info.tokens);
    if (info.generated) this.resolveFirst();
    // Usage was requested on the client's behalf; a client that did not ask never sees that event.
    if (info.usageOnly && !this.wantsUsageEvents) return undefined;
    const chunk: UpstreamChunk = {
      tokens: info.tokens,
      tokenCount: info.tokenCount,
      text: info.text,
      event: payload,
    };
    if (raw) chunk.raw = raw;
    else if (!info.generated && info.finish === undefined) return undefined;
    return chunk;
  }

  /** A 2xx JSON answer (an upstream that ignored `stream: true`): one chunk with the whole output. */
  private async *wholeJson(): AsyncGenerator<UpstreamChunk, void, undefined> {
    let text: string;
    try {
      text = await readText(this.response, 64 * 1024 * 1024, this.signal);
    } catch (error) {
      this.throwUnlessConsumerStopped(error);
      return;
    }
    let payload: Record<string, unknown>;
    try {
      const parsed: unknown = JSON.parse(text);
      if (!isRecord(parsed)) throw new Error("not a JSON object");
      payload = parsed;
    } catch (error) {
      throw this.fail(new EngineError("upstream answered unreadable JSON", undefined, { cause: error }));
    }
    const upstreamError = upstreamErrorOf({ raw: new Uint8Array(0), data: text, event: undefined }, payload);
    if (upstreamError !== undefined) throw this.fail(new EngineError(`upstream failed: ${upstreamError}`));
    const choices = Array.isArray(payload.choices) ? payload.choices.filter(isRecord) : [];
    const first = choices[0];
    const message = first && isRecord(first.message) ? first.message : undefined;
    const out =
      typeof first?.text === "string"
        ? first.text
        : typeof message?.content === "string"
          ? message.content
          : "";
    this.usage = usageOf(payload.usage);
    this.finish = mapFinish(first?.finish_reason);
    const tokenCount = this.usage?.completion ?? (out === "" ? 0 : 1);
    this.counted = tokenCount;
    this.resolveFirst();
    yield { tokens: [], tokenCount, text: out, event: payload };
    this.succeed(this.finish ?? "stop");
  }

  private succeed(finishReason: FinishReason): void {
    if (this.settled) return;
    this.settled = true;
    this.detach();
    this.resolveFirst();
    const usage = this.usage;
    const result: EngineResult = {
      promptTokens: usage?.prompt ?? this.call.promptTokens.length,
      completionTokens: usage
        ? Math.max(usage.completion, finishReason === "abort" ? this.counted : 0)
        : this.counted,
      cachedTokens: usage?.cached ?? 0,
      finishReason,
    };
    if (this.outputTokens.length > 0) result.outputTokens = this.outputTokens;
    this.resolveResult(result);
  }

  /** Settles `result` with the failure (first settlement wins) and returns the error iteration should throw. */
  private fail(error: EngineError): EngineError {
    if (!this.settled) {
      this.settled = true;
      this.failure = error;
      this.detach();
      this.resolveFirst();
      this.rejectResult(error);
    }
    return error;
  }
}
