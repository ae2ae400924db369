/** @module Scraping and health of one upstream: its metrics page on a timer, `/v1/models`, and SGLang's server info when the page lacks a capacity. */

import type { Cancel, Clock } from "../../../src/clock.js";
import { type EngineSignals, unknownSignals } from "../../../src/engine.js";
import type { EngineFlavor, ScrapedSignals } from "./engine-profiles.js";
import { parseEngineMetrics } from "./metrics-parser.js";
import type { UpstreamTransport } from "./transport.js";
import { isRecord, isSuccess, isUnreachable, readText } from "./upstream-http.js";

/** What `/v1/models` said about one model. */
export interface UpstreamModel {
  id: string;
  /** Context window in tokens (vLLM and SGLang `max_model_len`), when the upstream states it. */
  maxModelLen?: number;
}

/** What the scraper needs from its engine. */
export interface ScraperOptions {
  baseUrl: string;
  transport: UpstreamTransport;
  clock: Clock;
  scrapeIntervalMs: number;
  scrapeTimeoutMs: number;
  maxScrapeBytes: number;
  /** Aborts every request in flight when the engine closes. */
  closing: AbortSignal;
  headers(extra: Record<string, string>): Record<string, string>;
  /** KV capacity (tokens) an operator gave for when the engine states none. */
  kvCapacityTokens?: number;
}

/** SGLang's capacity facts from `/server_info` (`/get_server_info` before 0.5). */
interface ServerInfo {
  maxTotalNumTokens?: number;
  pageSize?: number;
  maxRunningRequests?: number;
}

/**
 * Where engines publish their page, in the order tried: vLLM and SGLang at
 * `/metrics`, NVIDIA NIM for LLMs at `/v1/metrics`.
 */
const METRICS_PATHS = ["/metrics", "/v1/metrics"] as const;

/** The upstream answered, with a status that is not a success. */
class StatusError extends Error {}

function positiveInteger(value: unknown): number | undefined {
  return typeof value === "number" && Number.isFinite(value) && value > 0 ? Math.floor(value) : undefined;
}

/**
 * Keeps the latest signals of one upstream. A refused connection marks the
 * replica unhealthy until the next good scrape, while a scrape that hangs or
 * returns garbage only lets the signals go stale.
 */
export class UpstreamScraper {
  private last: ScrapedSignals | undefined;
  private lastReadAtMs = Number.NEGATIVE_INFINITY;
  private reachable = false;
  private modelList: UpstreamModel[] | undefined;
  private serverInfo: ServerInfo | undefined;
  private serverInfoAsked = false;
  /** The path that served the last engine page; until one has, every path is tried in order. */
  private metricsPath: string | undefined;
  private cancelTick: Cancel | undefined;
  private scraping: Promise<EngineSignals> | undefined;
  private started: Promise<void> | undefined;

  constructor(private readonly options: ScraperOptions) {}

  /** First scrape and models fetch, then the periodic loop. Never rejects; idempotent. */
  start(): Promise<void> {
    if (this.started) return this.started;
    this.started = Promise.all([this.refreshModels(), this.scrape()]).then(() => {
      this.scheduleTick();
    });
    return this.started;
  }

  /** Stops the loop and waits for a scrape in flight (the closing signal ended its request). */
  async stop(): Promise<void> {
    this.cancelTick?.();
    this.cancelTick = undefined;
    await this.scraping?.catch(() => undefined);
  }

  /** The replica answered the last time it was asked (a scrape or a call). */
  get healthy(): boolean {
    return this.reachable && !this.options.closing.aborted;
  }

  /** A call could not reach the upstream: unhealthy until the next good scrape. */
  markUnreachable(): void {
    this.reachable = false;
  }

  flavor(): EngineFlavor | undefined {
    return this.last?.flavor;
  }

  models(): UpstreamModel[] | undefined {
    return this.modelList;
  }

  /** The latest signals, with the operator's capacity standing in for one the engine does not state. */
  signals(): EngineSignals {
    if (!this.last) return { ...unknownSignals(), healthy: this.healthy };
    const { flavor: _flavor, unknown, kvCapacitySource, ...values } = this.last;
    const signals: EngineSignals = {
      ...values,
      readAtMs: this.lastReadAtMs,
      healthy: this.healthy,
      unknown,
      kvCapacitySource,
    };
    const info = this.serverInfo;
    const missing = new Set(unknown);
    if (info && kvCapacitySource === "unknown" && info.maxTotalNumTokens !== undefined) {
      signals.kvCapacityTokens = info.maxTotalNumTokens;
      signals.kvCapacitySource = "engine";
      missing.delete("kvCapacityTokens");
    } else if (kvCapacitySource === "unknown" && this.options.kvCapacityTokens !== undefined) {
      signals.kvCapacityTokens = this.options.kvCapacityTokens;
      signals.kvCapacitySource = "configured";
      missing.delete("kvCapacityTokens");
    }
    if (info?.pageSize !== undefined && signals.blockSize === 0) {
      signals.blockSize = info.pageSize;
      missing.delete("blockSize");
    }
    if (info?.maxRunningRequests !== undefined && signals.maxNumSeqs === 0) {
      signals.maxNumSeqs = info.maxRunningRequests;
      missing.delete("maxNumSeqs");
    }
    signals.unknown = [...missing];
    return signals;
  }

  /**
   * Scrapes `/metrics` once now (the periodic loop calls this too). Never
   * rejects: a failure, a timeout or a page without engine metrics keeps the
   * last good values and their `readAtMs`, so their age shows; an
   * unreachable replica is also marked unhealthy.
   */
  scrape(): Promise<EngineSignals> {
    if (this.scraping) return this.scraping;
    this.scraping = this.scrapeOnce().finally(() => {
      this.scraping = undefined;
    });
    return this.scraping;
  }

  private async scrapeOnce(): Promise<EngineSignals> {
    if (this.options.closing.aborted) return this.signals();
    try {
      const parsed = await this.readPage();
      if (this.options.closing.aborted) return this.signals();
      this.last = parsed;
      this.lastReadAtMs = this.options.clock.now();
      this.reachable = true;
      if (parsed.flavor === "sglang" && parsed.kvCapacitySource === "unknown" && !this.serverInfoAsked) {
        // Asked once: a server without the endpoint answers 404 for good.
        this.serverInfoAsked = true;
        await this.fetchServerInfo();
      }
    } catch (error) {
      // Only a replica that cannot be reached at all is unhealthy. A /metrics page that hangs, errs or
      // carries garbage leaves the last signals in place to age: stale signals fail closed for new
      // sessions (SPEC 6) while active sessions, and the gate, go on.
      if (isUnreachable(error)) this.reachable = false;
    }
    return this.signals();
  }

  /**
   * The engine's page, parsed. Until a path has served one, a path that answers with an error
   * status or a page without engine series gives way to the next; a path that does not answer at
   * all (refused, timed out) does not, so a dead replica costs one request per scrape.
   */
  private async readPage(): Promise<ScrapedSignals> {
    const paths = this.metricsPath === undefined ? METRICS_PATHS : [this.metricsPath];
    let failure: unknown;
    for (const path of paths) {
      try {
        const parsed = parseEngineMetrics(await this.getText(path));
        if (parsed) {
          this.metricsPath = path;
          return parsed;
        }
        failure = new Error(`GET ${path}: the page carries no vLLM, SGLang or NIM engine metrics`);
      } catch (error) {
        if (!(error instanceof StatusError)) throw error;
        failure = error;
      }
    }
    throw failure;
  }

  /** SGLang's server info (its `server_args` and scheduler facts), or undefined when it answers none. Never rejects. */
  async readServerInfo(): Promise<Record<string, unknown> | undefined> {
    for (const path of ["/server_info", "/get_server_info"]) {
      try {
        const body: unknown = JSON.parse(await this.getText(path));
        if (isRecord(body)) return body;
      } catch {
        // Try the older path, then give up.
      }
    }
    return undefined;
  }

  /** SGLang states its pool size in its server info; read when its metrics do not carry it. */
  private async fetchServerInfo(): Promise<void> {
    const body = await this.readServerInfo();
    // Without it, the operator's --kv-capacity-tokens is the way left.
    if (!body) return;
    const dpSize = positiveInteger(body.dp_size) ?? 1;
    const info: ServerInfo = {};
    // With data parallelism the figure is one rank's; the metrics say how many ranks there are.
    const total = positiveInteger(body.max_total_num_tokens);
    if (total !== undefined && dpSize === 1) info.maxTotalNumTokens = total;
    const pageSize = positiveInteger(body.page_size);
    if (pageSize !== undefined) info.pageSize = pageSize;
    const maxRunning = positiveInteger(body.max_running_requests);
    if (maxRunning !== undefined) info.maxRunningRequests = maxRunning;
    this.serverInfo = info;
  }

  /** Fetches `/v1/models` now; keeps the previous list on failure. Never rejects. */
  async refreshModels(): Promise<readonly UpstreamModel[] | undefined> {
    if (this.options.closing.aborted) return this.modelList;
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
    if (this.options.closing.aborted) return;
    this.cancelTick = this.options.clock.setTimeout(() => {
      this.cancelTick = undefined;
      const work = this.modelList === undefined ? [this.refreshModels(), this.scrape()] : [this.scrape()];
      void Promise.all(work).then(() => this.scheduleTick());
    }, this.options.scrapeIntervalMs);
  }

  /** GET a small text resource under the scrape timeout and size cap; throws on any failure. */
  private async getText(path: string): Promise<string> {
    // One controller per request, aborted by the timeout or the engine closing (a listener removed
    // afterwards: a long-lived signal given to AbortSignal.any would keep every request's signal alive).
    const controller = new AbortController();
    const signal = controller.signal;
    const abort = (): void => controller.abort();
    this.options.closing.addEventListener("abort", abort, { once: true });
    const cancelTimer = this.options.clock.setTimeout(abort, this.options.scrapeTimeoutMs);
    try {
      const response = await this.options.transport.send(this.options.baseUrl + path, {
        method: "GET",
        headers: this.options.headers({ accept: "text/plain, application/json;q=0.9, */*;q=0.1" }),
        signal,
      });
      const text = await readText(response, this.options.maxScrapeBytes, signal);
      if (!isSuccess(response)) throw new StatusError(`GET ${path} answered ${response.status}`);
      return text;
    } finally {
      cancelTimer();
      this.options.closing.removeEventListener("abort", abort);
    }
  }
}
