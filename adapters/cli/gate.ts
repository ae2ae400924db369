/**
 * @module `sluice gate --upstream URL`: the per-rank backend gate (docs/how-it-works.md#per-rank-gate) as
 * a sidecar in front of one engine. It serves the OpenAI API (the same app as
 * `sluice serve`, with policy `gate` over one upstream) and a `/metrics` that
 * carries both its own gate metrics and the engine's, so frontends can put the
 * sidecar where the engine was: they scrape it for the engine's signals and
 * respect its 529s (a worker-wide refusal marks the replica busy).
 */

import type { AddressInfo } from "node:net";
import { serve as serveHono } from "@hono/node-server";
import { Hono } from "hono";
import { Registry } from "prom-client";
import { z } from "zod";
import { realClock } from "../../src/clock.js";
import { ConfigError } from "../../src/config/config-error.js";
import type { SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import {
  checkSchedulerSettings,
  DEFAULT_MAX_TOKENS_SETTING,
  GATE_LIMIT_SETTINGS,
  OVERLOAD_STATUS_SETTING,
} from "../../src/config/scheduler-settings.js";
import { defineSetting, type Setting } from "../../src/config/settings.js";
import { Scheduler } from "../../src/scheduler.js";
import { OpenAIUpstreamEngine } from "../engines/openai/upstream-engine.js";
import { createApp } from "../http/app.js";
import { CallTracker } from "../http/call-tracker.js";
import { createMetrics } from "../metrics/metrics.js";
import { createTokenizer } from "../tokenizers/index.js";
import { type CommandSpec, httpUrl, parseCommandLine } from "./command-line.js";
import { runServerCommand } from "./server-command.js";

/** Options of {@link startGateServer}. */
export interface GateServerOptions {
  /** The engine's base URL (vLLM, SGLang, `sluice sim`). */
  upstream: string;
  /** Port; 0 picks a free one. Default 8081. */
  port?: number;
  /** Interface. Default `0.0.0.0`. */
  host?: string;
  /** Replica id in metrics; default the upstream's host:port. */
  id?: string;
  /** Gate limits, overload status, default max tokens, context window (policy is always `gate`). */
  config?: Omit<SchedulerConfigInput, "policy">;
  /** Tokenizer spec (`o200k` or a tokenizer.json path) for context-limit checks. */
  tokenizer?: string;
  /** Engine `/metrics` scrape interval, ms. Default 1000. */
  scrapeIntervalMs?: number;
  /** How long a shutdown lets running calls finish, ms. Default 30000. */
  drainTimeoutMs?: number;
  log?: (line: string) => void;
}

/** A running gate sidecar. */
export interface GateServer {
  url: string;
  scheduler: Scheduler;
  engine: OpenAIUpstreamEngine;
  close(): Promise<void>;
}

/** Defaults of the sidecar's own settings. */
const GATE_DEFAULTS = { port: 8081, host: "0.0.0.0", drainTimeoutMs: 30_000 };

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const FAMILY_SUFFIX = /_(bucket|sum|count|total|created|info)$/;

/**
 * The engine's exposition without the families the gate already exports
 * (both sides may export `process_*`; a name twice is an invalid page).
 */
export function mergeExpositions(own: string, upstream: string): string {
  const ownFamilies = new Set<string>();
  for (const line of own.split("\n")) {
    const match = /^# (?:TYPE|HELP) (\S+)/.exec(line);
    if (match) ownFamilies.add(match[1]!);
  }
  const kept: string[] = [];
  for (const line of upstream.split("\n")) {
    if (line.trim() === "") continue;
    const name = line.startsWith("#")
      ? /^# (?:TYPE|HELP) (\S+)/.exec(line)?.[1]
      : METRIC_NAME.exec(line)?.[0];
    if (name !== undefined && (ownFamilies.has(name) || ownFamilies.has(name.replace(FAMILY_SUFFIX, ""))))
      continue;
    kept.push(line);
  }
  const head = own.endsWith("\n") ? own : `${own}\n`;
  return kept.length > 0 ? `${head}${kept.join("\n")}\n` : head;
}

/** Starts the sidecar: one upstream engine, a `gate`-policy scheduler, the OpenAI API and merged `/metrics`. */
export async function startGateServer(options: GateServerOptions): Promise<GateServer> {
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const port = options.port ?? GATE_DEFAULTS.port;
  if (!(Number.isInteger(port) && port >= 0 && port <= 65535))
    throw new RangeError(`port must be 0–65535, got ${port}`);
  const host = options.host ?? GATE_DEFAULTS.host;
  const drainTimeoutMs = options.drainTimeoutMs ?? GATE_DEFAULTS.drainTimeoutMs;
  const engine = new OpenAIUpstreamEngine({
    baseUrl: options.upstream,
    ...(options.id ? { id: options.id } : {}),
    ...(options.scrapeIntervalMs ? { scrapeIntervalMs: options.scrapeIntervalMs } : {}),
  });
  await engine.start();
  if (!engine.signals().healthy)
    log(`sluice gate: ${engine.baseUrl} is not answering yet; it stays unready until it does`);
  const scheduler = new Scheduler({
    engines: [engine],
    clock: realClock,
    tokenizer: createTokenizer(options.tokenizer),
    config: { ...options.config, policy: "gate" },
  });
  // No process metrics of its own: the engine's page (merged below) has the process that matters.
  const registry = new Registry();
  const metrics = createMetrics(registry, scheduler, { defaultMetrics: false });
  const tracker = new CallTracker();
  const api = createApp({ scheduler, metrics, tracker });
  const app = new Hono();
  app.get("/metrics", async function mergedMetrics() {
    const own = await registry.metrics();
    let upstream = "";
    try {
      const response = await fetch(`${engine.baseUrl}/metrics`, { signal: AbortSignal.timeout(2000) });
      if (response.ok) upstream = await response.text();
    } catch {
      // The engine's half is missing from this scrape; the gate's half still tells the story.
    }
    return new Response(mergeExpositions(own, upstream), {
      headers: { "content-type": registry.contentType },
    });
  });
  app.all("*", (c) => api.fetch(c.req.raw, c.env));
  scheduler.start();

  const server = serveHono({ fetch: app.fetch, port, hostname: host });
  try {
    await new Promise<void>((resolve, reject) => {
      if (server.listening) return resolve();
      server.once("listening", resolve);
      server.once("error", reject);
    });
  } catch (err) {
    api.close();
    await scheduler.stop();
    await engine.close();
    throw err;
  }
  const address = server.address() as AddressInfo;
  const shownHost = host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host;
  const url = `http://${shownHost}:${address.port}`;
  const limits = scheduler.state().replicas[0]?.gate.limits;
  log(
    `sluice gate on ${url} in front of ${engine.baseUrl}` +
      (limits
        ? ` (per rank: ${limits.engineRequestLimit} calls, ${limits.engineRequestWaitingLimit} waiting, queue ${limits.requestQueueLimit})`
        : ""),
  );

  let closing: Promise<void> | undefined;
  return {
    url,
    scheduler,
    engine,
    close() {
      closing ??= (async () => {
        tracker.drain();
        scheduler.drain();
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        (server as { closeIdleConnections?: () => void }).closeIdleConnections?.();
        if (tracker.size > 0) await tracker.idle(AbortSignal.timeout(drainTimeoutMs));
        tracker.cancelAll();
        (server as { closeAllConnections?: () => void }).closeAllConnections?.();
        await closed;
        api.close();
        await scheduler.stop();
        await engine.close();
      })();
      return closing;
    },
  };
}

const SIDECAR = "Sidecar";

/** Every setting of `sluice gate`; help, variables and docs come from this list. */
export const GATE_SETTINGS: readonly Setting[] = [
  defineSetting({
    flag: "upstream",
    path: "upstream",
    topic: SIDECAR,
    schema: httpUrl,
    placeholder: "<url>",
    expects: "an http(s) URL",
    help: "the engine's base URL (required)",
  }),
  defineSetting({
    flag: "port",
    path: "port",
    topic: SIDECAR,
    schema: z.number().int().min(0).max(65535).default(GATE_DEFAULTS.port),
    help: "TCP port; 0 picks a free one",
  }),
  defineSetting({
    flag: "host",
    path: "host",
    topic: SIDECAR,
    schema: z.string().default(GATE_DEFAULTS.host),
    placeholder: "<address>",
    expects: "an interface address",
    help: "interface to listen on",
  }),
  defineSetting({
    flag: "id",
    path: "id",
    topic: SIDECAR,
    schema: z.string(),
    env: null,
    placeholder: "<name>",
    defaultText: "the upstream's host:port",
    help: "replica id in metrics",
  }),
  defineSetting({
    flag: "tokenizer",
    path: "tokenizer",
    topic: SIDECAR,
    schema: z.string().default("o200k"),
    placeholder: "<o200k|path>",
    expects: "o200k or the path of a tokenizer.json",
    help: "tokenizer for context-limit checks: o200k, or the path of a tokenizer.json",
  }),
  defineSetting({
    flag: "drain-timeout-ms",
    path: "drainTimeoutMs",
    topic: SIDECAR,
    schema: z.number().int().nonnegative().default(GATE_DEFAULTS.drainTimeoutMs),
    help: "on SIGINT/SIGTERM, how long running calls may finish, ms",
  }),
  GATE_LIMIT_SETTINGS.engineRequestLimit,
  GATE_LIMIT_SETTINGS.engineRequestWaitingLimit,
  GATE_LIMIT_SETTINGS.requestQueueLimit,
  OVERLOAD_STATUS_SETTING,
  DEFAULT_MAX_TOKENS_SETTING,
];

/** `sluice gate` for help and the parser. */
export const GATE_COMMAND: CommandSpec = {
  name: "gate",
  usage: "sluice gate --upstream <url> [flags]",
  summary:
    "Runs the per-rank gate as a sidecar in front of one engine: the OpenAI API, /metrics (the gate's and\n" +
    "the engine's), /healthz, /readyz, /v1/admin/state. Runs until SIGINT or SIGTERM, then drains.",
  settings: GATE_SETTINGS,
  footer:
    "exit status: 0 after a signal and an orderly close, 1 could not start, 2 bad flags or configuration",
};

/** Turns `sluice gate` flags into `startGateServer` options; throws `ConfigError` naming the flag and value. */
export function gateOptionsFromArgs(
  argv: string[],
  env: Record<string, string | undefined> = process.env,
  warn: (message: string) => void = (m) => process.stderr.write(`${m}\n`),
): GateServerOptions {
  const line = parseCommandLine(GATE_COMMAND, argv, env, warn);
  const options = (line.kind === "run" ? line.values : {}) as Partial<GateServerOptions>;
  if (!options.upstream)
    throw new ConfigError("--upstream <url> is required: the engine this gate stands in front of", {
      flag: "--upstream",
    });
  const config = { gate: {}, ...options.config };
  checkSchedulerSettings(config);
  return { ...options, upstream: options.upstream, config };
}

/** `sluice gate`: runs until SIGINT or SIGTERM, then drains and returns 0; invalid flags return 2. */
export function run(argv: string[]): Promise<number> {
  return runServerCommand<GateServerOptions, GateServer>(
    {
      spec: GATE_COMMAND,
      parse: gateOptionsFromArgs,
      start: startGateServer,
      close: (server) => server.close(),
    },
    argv,
  );
}
