/**
 * @module Scraping and health of one upstream: its metrics page on a timer, `/v1/models`, and the
 * endpoints that state what a page lacks (SGLang's server info, llama.cpp's `/props` and `/slots`,
 * TGI's `/info`). An engine whose metrics cannot be read at all is served on its health alone
 * (`/health`, else `/v1/models`), every signal unknown (docs/engines.md).
 */

import type { Cancel, Clock } from "../../../src/clock.js";
import { type EngineSignals, unknownSignals } from "../../../src/engine.js";
import type { Usage } from "./event-interpretation.js";
import { type LlamacppProps, type LlamacppSlots, llamacppProps, llamacppSlots } from "./llamacpp-profile.js";
import { parseEngineMetrics } from "./metrics-parser.js";
import {
  type EngineFlavor,
  type EngineProfileName,
  type ScrapedSignals,
  unknownEngineSignals,
} from "./profile-types.js";
import { type TgiInfo, type TgiSignals, tgiInfo } from "./tgi-profile.js";
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
  /** The profile to read the page with (`--engine-profile`); default `auto` (detected). */
  profile?: EngineProfileName;
  /** The replica's name, for the warning an engine without readable metrics carries. */
  replicaId?: string;
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
class StatusError extends Error {
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message);
  }
}

/** Prompt tokens and their cached part, as calls reported them (cumulative). */
interface CallCacheCounters {
  promptTokens: number;
  cachedTokens: number;
}

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
  /** llama.cpp: `/props` once it answered; `/slots` as last read (undefined: not read, or switched off). */
  private llamaProps: LlamacppProps | undefined;
  private llamaSlots: LlamacppSlots | undefined;
  private slotsOff = false;
  /** TGI: `/info` once it answered. */
  private tgi: TgiInfo | undefined;
  /** Hit signal from calls (llama.cpp states cached tokens per call, not on its page). */
  private callCache: CallCacheCounters | undefined;
  /** Why the metrics could not be read, while the engine is served on its health alone. */
  private metricsFailure: string | undefined;
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

  /**
   * A call's usage, as the upstream reported it. Only llama.cpp's calls feed the hit signal: its
   * page states no prefix-cache counter, and every answer states `cached_tokens` (or `cache_n`).
   */
  observeUsage(usage: Usage): void {
    if (this.last?.flavor !== "llamacpp" || !usage.cachedStated) return;
    this.callCache ??= { promptTokens: 0, cachedTokens: 0 };
    this.callCache.promptTokens += usage.prompt;
    this.callCache.cachedTokens += Math.min(usage.cached, usage.prompt);
  }

  /** Context window the engine states outside `/v1/models` (llama.cpp's slot context, TGI's `max_total_tokens`), tokens. */
  statedContextTokens(): number | undefined {
    if (this.last?.flavor === "llamacpp") {
      const fromSlots = this.llamaSlots?.largestSlotTokens;
      return fromSlots !== undefined && fromSlots > 0 ? fromSlots : this.llamaProps?.slotContextTokens;
    }
    if (this.last?.flavor === "tgi") return this.tgi?.maxTotalTokens;
    return undefined;
  }

  /** The latest signals, with the operator's capacity standing in for one the engine does not state. */
  signals(): EngineSignals {
    if (!this.last) return { ...unknownSignals(), healthy: this.healthy };
    const { flavor, unknown, kvCapacitySource, ...values } = this.last as TgiSignals;
    const { batchMaxTokens, ...plain } = values;
    const signals: EngineSignals = {
      ...plain,
      readAtMs: this.lastReadAtMs,
      healthy: this.healthy,
      unknown,
      kvCapacitySource,
    };
    const info = this.serverInfo;
    const missing = new Set(unknown);
    if (flavor === "llamacpp") this.mergeLlamacpp(signals, missing);
    if (flavor === "tgi") this.mergeTgi(signals, missing, batchMaxTokens);
    if (info && signals.kvCapacitySource === "unknown" && info.maxTotalNumTokens !== undefined) {
      signals.kvCapacityTokens = info.maxTotalNumTokens;
      signals.kvCapacitySource = "engine";
      missing.delete("kvCapacityTokens");
    } else if (signals.kvCapacitySource === "unknown" && this.options.kvCapacityTokens !== undefined) {
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
    if (flavor === "unknown") signals.warning = this.unreadableWarning(signals);
    return signals;
  }

  /** llama.cpp: slots and capacity from `/props` and `/slots`, the hit signal from calls. */
  private mergeLlamacpp(signals: EngineSignals, missing: Set<string>): void {
    const props = this.llamaProps;
    const slots = this.llamaSlots;
    const slotCount = props?.totalSlots ?? slots?.slots;
    if (slotCount !== undefined) {
      signals.maxNumSeqs = slotCount;
      missing.delete("maxNumSeqs");
    }
    if (slots && slots.contextTokens > 0) {
      // Each slot keeps its own KV cache: the pool is their contexts added up.
      signals.kvCapacityTokens = slots.contextTokens;
      signals.kvCapacitySource = "engine";
      missing.delete("kvCapacityTokens");
    } else if (props?.totalSlots !== undefined && props.slotContextTokens !== undefined) {
      signals.kvCapacityTokens = props.totalSlots * props.slotContextTokens;
      signals.kvCapacitySource = "derived";
      missing.delete("kvCapacityTokens");
    }
    if (missing.has("running") && slots) {
      signals.running = slots.processing;
      missing.delete("running");
    }
    if (this.callCache) {
      signals.prefixQueryTokens = this.callCache.promptTokens;
      signals.prefixHitTokens = this.callCache.cachedTokens;
      missing.delete("prefixCache");
    }
  }

  /** TGI: the batch's token pool from `/info`, and the batch's share of it as its KV usage. */
  private mergeTgi(signals: EngineSignals, missing: Set<string>, batchMaxTokens: number | undefined): void {
    const info = this.tgi;
    if (info?.maxBatchTotalTokens !== undefined) {
      signals.kvCapacityTokens = info.maxBatchTotalTokens;
      signals.kvCapacitySource = "engine";
      missing.delete("kvCapacityTokens");
      if (batchMaxTokens !== undefined) {
        // TGI reserves each request's prompt and max_new_tokens in the batch: the share reserved.
        signals.kvUsage = Math.min(1, Math.max(0, batchMaxTokens / info.maxBatchTotalTokens));
        missing.delete("kvUsage");
      }
    }
    if (info?.maxBatchSize !== undefined) {
      signals.maxNumSeqs = info.maxBatchSize;
      missing.delete("maxNumSeqs");
    }
  }

  /** What an operator must know about an engine served without readable metrics, and which flags stand in. */
  private unreadableWarning(signals: EngineSignals): string {
    const name = this.options.replicaId ?? this.options.baseUrl;
    const why = this.metricsFailure ?? "metrics not read (--engine-profile unknown)";
    const budget =
      signals.kvCapacitySource === "configured"
        ? `the token budget uses --kv-capacity-tokens (${signals.kvCapacityTokens} tokens)`
        : `the token budget is off (set --kv-capacity-tokens ${name}=N)`;
    return (
      `upstream ${name}: ${why}; served while it answers /health or /v1/models. ` +
      "Unknown: KV usage, prefix-cache hit rate, running and waiting requests, preemptions, KV capacity, block size, max_num_seqs. " +
      `The session window stays at its initial size; ${budget}; gate limits come from ` +
      "--engine-request-limit, --engine-request-waiting-limit and --request-queue-limit (else their defaults). " +
      "An engine with a profile: --engine-profile vllm|sglang|nim|llamacpp|tgi."
    );
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
    if (this.options.profile === "unknown") {
      await this.probeHealth();
      return this.signals();
    }
    try {
      const parsed = await this.readPage();
      if (this.options.closing.aborted) return this.signals();
      this.last = parsed;
      this.metricsFailure = undefined;
      this.lastReadAtMs = this.options.clock.now();
      this.reachable = true;
      if (parsed.flavor === "sglang" && parsed.kvCapacitySource === "unknown" && !this.serverInfoAsked) {
        // Asked once: a server without the endpoint answers 404 for good.
        this.serverInfoAsked = true;
        await this.fetchServerInfo();
      }
      if (parsed.flavor === "llamacpp") await this.readLlamacppState();
      if (parsed.flavor === "tgi" && !this.tgi) await this.readTgiInfo();
    } catch (error) {
      // Only a replica that cannot be reached at all is unhealthy. A /metrics page that hangs, errs or
      // carries garbage leaves the last signals of an engine read before in place to age: stale
      // signals fail closed for new sessions (docs/engines.md) while active sessions, and the gate,
      // go on. An engine never read is served on its health, its signals unknown.
      if (isUnreachable(error)) this.reachable = false;
      else if (!this.last || this.last.flavor === "unknown") {
        this.metricsFailure = `its metrics cannot be read (${error instanceof Error ? error.message : String(error)})`;
        await this.probeHealth();
      }
    }
    return this.signals();
  }

  /**
   * Health of an engine whose metrics say nothing: `/health` (vLLM, SGLang, llama.cpp, TGI), else
   * `/v1/models` where there is no `/health`. A success is a fresh reading with every signal unknown.
   */
  private async probeHealth(): Promise<void> {
    for (const path of ["/health", "/v1/models"]) {
      try {
        await this.getText(path);
        if (this.options.closing.aborted) return;
        const forced = this.options.profile;
        this.last = {
          ...unknownEngineSignals(),
          ...(forced !== undefined && forced !== "auto" && forced !== "unknown" ? { profile: forced } : {}),
        };
        this.lastReadAtMs = this.options.clock.now();
        this.reachable = true;
        return;
      } catch (error) {
        // No /health at all (404, 405, 501): /v1/models decides; any other answer (503 while a
        // model loads) or silence is an engine not serving.
        const absent = error instanceof StatusError && [404, 405, 501].includes(error.status);
        if (!(path === "/health" && absent)) {
          this.reachable = false;
          return;
        }
      }
    }
  }

  /** llama.cpp: `/props` until it answered, `/slots` on every scrape unless the server switched it off. */
  private async readLlamacppState(): Promise<void> {
    if (!this.llamaProps) {
      const props = await this.readJson("/props");
      if (props !== undefined) this.llamaProps = llamacppProps(props);
    }
    if (this.slotsOff) return;
    try {
      this.llamaSlots = llamacppSlots(JSON.parse(await this.getText("/slots")));
    } catch (error) {
      // `--no-slots` answers 501; an older server 404: not asked again.
      if (error instanceof StatusError && [404, 501].includes(error.status)) this.slotsOff = true;
    }
  }

  private async readTgiInfo(): Promise<void> {
    const body = await this.readJson("/info");
    if (body !== undefined) this.tgi = tgiInfo(body);
  }

  /** A JSON resource, or undefined on any failure. Never rejects. */
  private async readJson(path: string): Promise<unknown> {
    try {
      return JSON.parse(await this.getText(path));
    } catch {
      return undefined;
    }
  }

  /**
   * The engine's page, parsed. Until a path has served one, a path that answers with an error
   * status or a page without engine series gives way to the next; a path that does not answer at
   * all (refused, timed out) does not, so a dead replica costs one request per scrape.
   */
  private async readPage(): Promise<ScrapedSignals> {
    const paths = this.metricsPath === undefined ? METRICS_PATHS : [this.metricsPath];
    const failures: string[] = [];
    for (const path of paths) {
      try {
        const parsed = parseEngineMetrics(await this.getText(path), this.options.profile);
        if (parsed) {
          this.metricsPath = path;
          return parsed;
        }
        failures.push(`GET ${path}: the page carries no vLLM, SGLang, NIM, llama.cpp or TGI engine metrics`);
      } catch (error) {
        if (!(error instanceof StatusError)) throw error;
        failures.push(error.message);
      }
    }
    throw new Error(failures.join("; "));
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
      if (!isSuccess(response))
        throw new StatusError(`GET ${path} answered ${response.status}`, response.status);
      return text;
    } finally {
      cancelTimer();
      this.options.closing.removeEventListener("abort", abort);
    }
  }
}
