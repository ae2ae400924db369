/**
 * @module `sluice gate --upstream URL`: the per-rank backend gate (SPEC 4) as
 * a sidecar in front of one engine. It serves the OpenAI API (the same app as
 * `sluice serve`, with policy `gate` over one upstream) and a `/metrics` that
 * carries both its own gate metrics and the engine's, so frontends can put the
 * sidecar where the engine was: they scrape it for the engine's signals and
 * respect its 529s (a worker-wide refusal marks the replica busy).
 */

import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { serve as serveHono } from "@hono/node-server";
import { Hono } from "hono";
import { Registry } from "prom-client";
import { realClock } from "../../src/clock.js";
import { ConfigError } from "../../src/config/config-error.js";
import { resolveGateLimitsWithSources } from "../../src/config/gate-limits.js";
import type { SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import { Scheduler } from "../../src/scheduler.js";
import { OpenAIUpstreamEngine } from "../engines/openai/upstream-engine.js";
import { createApp } from "../http/app.js";
import { CallTracker } from "../http/call-tracker.js";
import { createMetrics } from "../metrics/metrics.js";
import { createTokenizer } from "../tokenizers/index.js";
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
  const port = options.port ?? 8081;
  if (!(Number.isInteger(port) && port >= 0 && port <= 65535))
    throw new RangeError(`port must be 0–65535, got ${port}`);
  const host = options.host ?? "0.0.0.0";
  const drainTimeoutMs = options.drainTimeoutMs ?? 30_000;
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
        await scheduler.stop();
        await engine.close();
      })();
      return closing;
    },
  };
}

const HELP = `usage: sluice gate --upstream URL [flags]

Runs the per-rank gate as a sidecar in front of one engine: the OpenAI API,
/metrics (the gate's and the engine's), /healthz, /readyz, /v1/admin/state.

  --upstream URL                      the engine's base URL (required; env SLUICE_UPSTREAM)
  --port N                            default 8081 (env SLUICE_PORT)
  --host ADDR                         default 0.0.0.0 (env SLUICE_HOST)
  --id NAME                           replica id in metrics (default: the upstream's host:port)
  --engine-request-limit N            calls per rank (default engine max_num_seqs)
  --engine-request-waiting-limit N    calls per rank before their first token (default max_num_seqs)
  --request-queue-limit N             queued calls per rank, 0 = no queue (default 2 × max_num_seqs)
  --overload-status N                 HTTP status of a gate rejection (default 529)
  --default-max-tokens N              max_tokens of a call that sets none (default 1024)
  --tokenizer SPEC                    o200k (default) or the path of a tokenizer.json
  --drain-timeout-ms N                on SIGINT/SIGTERM, how long running calls may finish (default 30000)
  --help

Gate limits also read SLUICE_* and Dynamo's DYN_BACKEND_ADMISSION_* variables (SPEC 9).`;

function integerFlag(
  name: string,
  value: string | undefined,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  const n = Number(text);
  if (!/^[0-9]+$/.test(text) || !Number.isSafeInteger(n) || n < min || n > max) {
    throw new ConfigError(`--${name} takes an integer from ${min} to ${max}, got ${JSON.stringify(value)}`, {
      flag: `--${name}`,
      value,
    });
  }
  return n;
}

/** Turns `sluice gate` flags into `startGateServer` options; throws `ConfigError` naming the flag and value. */
export function gateOptionsFromArgs(
  argv: string[],
  env: Record<string, string | undefined> = process.env,
  warn: (message: string) => void = (m) => process.stderr.write(`${m}\n`),
): GateServerOptions {
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({
      args: argv,
      strict: true,
      options: {
        upstream: { type: "string" },
        port: { type: "string" },
        host: { type: "string" },
        id: { type: "string" },
        "engine-request-limit": { type: "string" },
        "engine-request-waiting-limit": { type: "string" },
        "request-queue-limit": { type: "string" },
        "overload-status": { type: "string" },
        "default-max-tokens": { type: "string" },
        tokenizer: { type: "string" },
        "drain-timeout-ms": { type: "string" },
        help: { type: "boolean" },
      },
    }).values;
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  const upstream = ((values.upstream as string | undefined) ?? env.SLUICE_UPSTREAM)?.trim();
  if (!upstream)
    throw new ConfigError("--upstream URL is required: the engine this gate stands in front of", {
      flag: "--upstream",
    });
  let valid = false;
  try {
    const url = new URL(upstream);
    valid = url.protocol === "http:" || url.protocol === "https:";
  } catch {
    valid = false;
  }
  if (!valid)
    throw new ConfigError(`--upstream takes an http(s) URL, got ${JSON.stringify(upstream)}`, {
      flag: "--upstream",
      value: upstream,
    });
  const string = (name: string) => values[name] as string | undefined;
  const gate = resolveGateLimitsWithSources({
    flags: {
      ...(string("engine-request-limit") !== undefined
        ? { engineRequestLimit: string("engine-request-limit") }
        : {}),
      ...(string("engine-request-waiting-limit") !== undefined
        ? { engineRequestWaitingLimit: string("engine-request-waiting-limit") }
        : {}),
      ...(string("request-queue-limit") !== undefined
        ? { requestQueueLimit: string("request-queue-limit") }
        : {}),
    },
    env,
    warn,
  });
  // Only explicit settings are fixed; the rest follow the engine's reported capacity (SPEC 9).
  const explicit = (key: keyof typeof gate.limits) =>
    gate.sources[key] === "flag" || gate.sources[key] === "env" || gate.sources[key] === "alias"
      ? { [key]: gate.limits[key] }
      : {};
  const overloadStatus = integerFlag("overload-status", string("overload-status"), 400, 599);
  const defaultMaxTokens = integerFlag("default-max-tokens", string("default-max-tokens"), 1);
  const port = integerFlag("port", string("port") ?? env.SLUICE_PORT, 0, 65535);
  const drainTimeoutMs = integerFlag("drain-timeout-ms", string("drain-timeout-ms"), 0);
  const host = (string("host") ?? env.SLUICE_HOST)?.trim();
  const tokenizer = string("tokenizer")?.trim();
  const id = string("id")?.trim();
  return {
    upstream,
    config: {
      gate: {
        ...explicit("engineRequestLimit"),
        ...explicit("engineRequestWaitingLimit"),
        ...explicit("requestQueueLimit"),
        ...(overloadStatus !== undefined ? { overloadStatus } : {}),
      },
      ...(defaultMaxTokens !== undefined ? { defaultMaxTokens } : {}),
    },
    ...(port !== undefined ? { port } : {}),
    ...(host ? { host } : {}),
    ...(tokenizer ? { tokenizer } : {}),
    ...(id ? { id } : {}),
    ...(drainTimeoutMs !== undefined ? { drainTimeoutMs } : {}),
  };
}

/** `sluice gate`: runs until SIGINT or SIGTERM, then drains and returns 0; invalid flags return 2. */
export function run(argv: string[]): Promise<number> {
  return runServerCommand<GateServerOptions, GateServer>(
    {
      name: "gate",
      help: () => HELP,
      parse: gateOptionsFromArgs,
      start: startGateServer,
      close: (server) => server.close(),
    },
    argv,
  );
}
