/** @module `sluice serve`: the composition root — engines, scheduler, metrics, HTTP server, graceful shutdown. */

import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import { serve as serveHono } from "@hono/node-server";
import { Registry } from "prom-client";
import { realClock } from "../../src/clock.js";
import { ConfigError } from "../../src/config/config-error.js";
import { resolveGateLimitsWithSources } from "../../src/config/gate-limits.js";
import { POLICIES, type Policy, type SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import type { Engine } from "../../src/engine.js";
import { Scheduler, type SchedulerOptions } from "../../src/scheduler.js";
import { OpenAIUpstreamEngine } from "../engines/openai/upstream-engine.js";
import { describeUpstream, resolveUpstreams, UpstreamSpecError } from "../engines/openai/upstream-spec.js";
import { isPresetName, type PresetName, type PresetOverrides } from "../engines/sim/presets.js";
import { SimEngine } from "../engines/sim/sim-engine.js";
import { ApiKeys } from "../http/api-keys.js";
import { createApp, DEFAULT_STREAM_STALL_TIMEOUT_MS } from "../http/app.js";
import { CallTracker } from "../http/call-tracker.js";
import { answerClientErrors } from "../http/client-error.js";
import { DEFAULT_BODY_LIMIT_BYTES } from "../http/read-body.js";
import { createMetrics, type SluiceMetrics } from "../metrics/metrics.js";
import { createTokenizer } from "../tokenizers/index.js";
import { runServerCommand } from "./server-command.js";

/** A running NATS front end; `adapters/nats` provides it (loaded only when `--nats` is given). */
export interface NatsService {
  close(): Promise<void>;
}

/** What `adapters/nats/index.ts` must export for `--nats URL` to work. */
export type StartNatsService = (options: {
  url: string;
  scheduler: Scheduler;
  metrics: SluiceMetrics;
  log: (line: string) => void;
  /** The frontend `connectNatsScaleOut` connected before the scheduler was built (opaque here). */
  frontend?: unknown;
}) => Promise<NatsService>;

/** Options of `startServer`; every field has a default. */
export interface ServeOptions {
  /** TCP port; 0 picks a free one. Default 8080. */
  port?: number;
  /** Interface to listen on. Default `0.0.0.0` (every interface, as vLLM and SGLang do). */
  host?: string;
  /** OpenAI-compatible upstreams, `URL` or `NAME=URL` (the replica id; default host:port); none → simulated replicas. */
  upstreams?: string[];
  /** KV capacity for upstreams whose engine states none: `N` for all, `NAME=N` for one. */
  kvCapacityTokens?: string[];
  /** Engines to serve as they are (tests, embedding); wins over `upstreams` and the simulator. */
  engines?: Engine[];
  /** Simulated replicas when there is no upstream. Default 2. */
  simReplicas?: number;
  /** Preset (or overrides) of the simulated replicas. Default `h100-llama3-8b`. */
  simPreset?: PresetName | PresetOverrides;
  /** Scheduler configuration (policy, windows, lanes, gate limits …). */
  config?: SchedulerConfigInput;
  /** Tokenizer spec: `o200k` (default) or the path of a `tokenizer.json`. */
  tokenizer?: string;
  keys?: ApiKeys;
  adminKey?: string;
  /** Largest request body, bytes. Default 4 MiB. */
  bodyLimitBytes?: number;
  /** CORS origins (`*` for any); off when omitted. */
  corsOrigins?: string[];
  /** How long a shutdown lets running calls finish before cancelling them, ms. Default 30000. */
  drainTimeoutMs?: number;
  /** A streaming client that reads nothing for this long loses its call, ms; 0 never. Default 60000. */
  streamStallTimeoutMs?: number;
  /** NATS server URL; serves the NATS API too. */
  nats?: string;
  /** Dashboard polling period, ms. Default 1000. */
  dashboardPollMs?: number;
  /** Line logger (start-up, warnings, shutdown). Default stderr. */
  log?: (line: string) => void;
}

/** A running server. */
export interface RunningServer {
  /** Base URL, e.g. `http://127.0.0.1:8080` (loopback shown when listening on every interface). */
  url: string;
  scheduler: Scheduler;
  metrics: SluiceMetrics;
  tracker: CallTracker;
  /** Graceful stop: refuse new calls, let running ones finish up to the drain timeout, cancel the rest. */
  close(): Promise<void>;
}

const DEFAULTS = {
  port: 8080,
  host: "0.0.0.0",
  simReplicas: 2,
  simPreset: "h100-llama3-8b" as PresetName,
  drainTimeoutMs: 30_000,
};

const stderrLog = (line: string) => process.stderr.write(`${line}\n`);

async function buildEngines(
  options: ServeOptions,
  log: (line: string) => void,
): Promise<{ engines: Engine[]; description: string }> {
  if (options.engines && options.engines.length > 0) {
    return { engines: options.engines, description: `${options.engines.length} given engine(s)` };
  }
  const upstreams = resolveUpstreams(options.upstreams ?? [], options.kvCapacityTokens ?? []);
  if (upstreams.length > 0) {
    const engines = upstreams.map(
      (spec) =>
        new OpenAIUpstreamEngine({
          baseUrl: spec.url,
          id: spec.name,
          ...(spec.kvCapacityTokens !== undefined ? { kvCapacityTokens: spec.kvCapacityTokens } : {}),
        }),
    );
    // The first scrape and `/v1/models` settle (never reject) before serving, so the first call knows the models.
    await Promise.all(engines.map((engine) => engine.start()));
    // What each engine's metrics said, and a warning for every budget that must stay off.
    for (const [i, engine] of engines.entries()) {
      const { line, warning } = describeUpstream(engine.id, upstreams[i]!.url, engine.signals());
      log(line);
      if (warning) log(warning);
    }
    return {
      engines,
      description: `upstream ${upstreams.map((u) => `${u.name}=${u.url}`).join(", ")}`,
    };
  }
  const count = options.simReplicas ?? DEFAULTS.simReplicas;
  if (!(Number.isInteger(count) && count >= 1)) throw new RangeError(`simReplicas must be ≥ 1, got ${count}`);
  const preset = options.simPreset ?? DEFAULTS.simPreset;
  const engines = Array.from(
    { length: count },
    (_, i) => new SimEngine({ id: `sim-${i}`, clock: realClock, preset }) as Engine,
  );
  const presetName =
    typeof preset === "string" ? preset : `${preset.base ?? DEFAULTS.simPreset} (overridden)`;
  return { engines, description: `${count} simulated replica(s) ${presetName}` };
}

async function loadNats(): Promise<StartNatsService> {
  // A variable specifier: the NATS adapter is optional at build time and loaded only when asked for.
  const specifier = "../nats/index.js";
  let module: { startNatsService?: StartNatsService };
  try {
    module = (await import(specifier)) as { startNatsService?: StartNatsService };
  } catch (err) {
    throw new ConfigError(`--nats: the NATS adapter could not be loaded (${(err as Error).message})`, {
      flag: "--nats",
    });
  }
  if (typeof module.startNatsService !== "function") {
    throw new ConfigError("--nats: adapters/nats does not export startNatsService", { flag: "--nats" });
  }
  return module.startNatsService;
}

// --- NATS scale-out hook (adapters/nats) ---------------------------------------------------------

/** What the scheduler takes from NATS when it is built: the shared window authority and session directory. */
interface NatsScaleOut {
  frontend: { close(): Promise<void> };
  schedulerPorts: Pick<SchedulerOptions, "windowAuthority" | "sessionDirectory">;
}

/**
 * Connects this frontend to NATS before the scheduler exists, so the
 * scheduler can share session windows with other frontends (JetStream KV).
 */
async function connectNatsScaleOut(url: string, log: (line: string) => void): Promise<NatsScaleOut> {
  const specifier = "../nats/index.js";
  const module = (await import(specifier).catch((err: Error) => {
    throw new ConfigError(`--nats: the NATS adapter could not be loaded (${err.message})`, {
      flag: "--nats",
    });
  })) as {
    connectNatsFrontend?: (options: {
      servers: string;
      log: (line: string) => void;
    }) => Promise<NatsScaleOut["frontend"] & NatsScaleOut["schedulerPorts"]>;
  };
  if (typeof module.connectNatsFrontend !== "function") {
    throw new ConfigError("--nats: adapters/nats does not export connectNatsFrontend", { flag: "--nats" });
  }
  const frontend = await module.connectNatsFrontend({ servers: url, log }).catch((err: Error) => {
    throw new ConfigError(`--nats: cannot connect to ${url} (${err.message})`, {
      flag: "--nats",
      value: url,
    });
  });
  const schedulerPorts: NatsScaleOut["schedulerPorts"] = {};
  if (frontend.windowAuthority) schedulerPorts.windowAuthority = frontend.windowAuthority;
  if (frontend.sessionDirectory) schedulerPorts.sessionDirectory = frontend.sessionDirectory;
  return { frontend, schedulerPorts };
}

// -------------------------------------------------------------------------------------------------

/**
 * Starts sluice: engines, scheduler (control loops on the real clock),
 * metrics, the HTTP API on `host:port`, and NATS when asked for.
 */
export async function startServer(options: ServeOptions = {}): Promise<RunningServer> {
  const log = options.log ?? stderrLog;
  const drainTimeoutMs = options.drainTimeoutMs ?? DEFAULTS.drainTimeoutMs;
  if (!(Number.isFinite(drainTimeoutMs) && drainTimeoutMs >= 0)) {
    throw new RangeError(`drainTimeoutMs must be ≥ 0, got ${drainTimeoutMs}`);
  }
  const port = options.port ?? DEFAULTS.port;
  if (!(Number.isInteger(port) && port >= 0 && port <= 65535))
    throw new RangeError(`port must be 0–65535, got ${port}`);
  const host = options.host ?? DEFAULTS.host;

  const { engines, description } = await buildEngines(options, log);
  const natsScaleOut = options.nats ? await connectNatsScaleOut(options.nats, log) : undefined;
  const scheduler = new Scheduler({
    engines,
    clock: realClock,
    tokenizer: createTokenizer(options.tokenizer),
    ...(options.config ? { config: options.config } : {}),
    ...natsScaleOut?.schedulerPorts,
  });
  const registry = new Registry();
  const metrics = createMetrics(registry, scheduler);
  const tracker = new CallTracker();
  const app = createApp({
    scheduler,
    metrics,
    tracker,
    bodyLimitBytes: options.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES,
    ...(options.streamStallTimeoutMs !== undefined
      ? { streamStallTimeoutMs: options.streamStallTimeoutMs }
      : {}),
    ...(options.dashboardPollMs ? { dashboardPollMs: options.dashboardPollMs } : {}),
    ...(options.keys ? { keys: options.keys } : {}),
    ...(options.adminKey ? { adminKey: options.adminKey } : {}),
    ...(options.corsOrigins && options.corsOrigins.length > 0
      ? { cors: { origins: options.corsOrigins.includes("*") ? "*" : options.corsOrigins } }
      : {}),
  });
  scheduler.start();

  const server = serveHono({ fetch: app.fetch, port, hostname: host });
  answerClientErrors(server);
  try {
    await new Promise<void>((resolve, reject) => {
      if (server.listening) return resolve();
      server.once("listening", resolve);
      server.once("error", reject);
    });
  } catch (err) {
    await scheduler.stop();
    await natsScaleOut?.frontend.close();
    await Promise.allSettled(engines.map((engine) => engine.close?.()));
    throw err;
  }
  const address = server.address() as AddressInfo;
  const shownHost =
    host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host.includes(":") ? `[${host}]` : host;
  const url = `http://${shownHost}:${address.port}`;

  let nats: NatsService | undefined;
  if (options.nats) {
    try {
      const start = await loadNats();
      nats = await start({
        url: options.nats,
        scheduler,
        metrics,
        log,
        ...(natsScaleOut ? { frontend: natsScaleOut.frontend } : {}),
      });
    } catch (err) {
      server.close();
      (server as { closeAllConnections?: () => void }).closeAllConnections?.();
      await scheduler.stop();
      await Promise.allSettled(engines.map((engine) => engine.close?.()));
      throw err;
    }
  }
  log(
    `sluice listening on http://${host.includes(":") ? `[${host}]` : host}:${address.port} ` +
      `(policy ${scheduler.policy}; ${description}${options.nats ? `; NATS ${options.nats}` : ""})`,
  );

  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= (async () => {
      tracker.drain();
      scheduler.drain();
      const serverClosed = new Promise<void>((resolve) => server.close(() => resolve()));
      // Idle keep-alive connections would hold `close` open; calls in flight keep theirs.
      (server as { closeIdleConnections?: () => void }).closeIdleConnections?.();
      if (tracker.size > 0) {
        log(`sluice: draining ${tracker.size} call(s), up to ${drainTimeoutMs} ms`);
        await tracker.idle(AbortSignal.timeout(drainTimeoutMs));
      }
      if (tracker.size > 0) log(`sluice: cancelling ${tracker.size} call(s) still running`);
      tracker.cancelAll();
      (server as { closeAllConnections?: () => void }).closeAllConnections?.();
      await serverClosed;
      await nats?.close();
      await scheduler.stop();
      await Promise.allSettled(engines.map((engine) => engine.close?.()));
    })();
    return closing;
  };
  return { url, scheduler, metrics, tracker, close };
}

// --- command line ------------------------------------------------------------------------------

interface FlagSpec {
  /** Environment variable read when the flag is absent. */
  env?: string;
  multiple?: boolean;
  boolean?: boolean;
  default?: string;
  help: string;
}

/** Every flag of `sluice serve`, with its variable and default (the `--help` text is built from this). */
export const SERVE_FLAGS: Record<string, FlagSpec> = {
  port: { env: "SLUICE_PORT", default: "8080", help: "TCP port" },
  host: { env: "SLUICE_HOST", default: "0.0.0.0", help: "interface to listen on (0.0.0.0: every interface)" },
  upstream: {
    env: "SLUICE_UPSTREAM",
    multiple: true,
    help: "OpenAI-compatible engine, URL or NAME=URL (NAME: the replica id, default host:port), repeatable (env: comma-separated); none: simulated replicas",
  },
  "kv-capacity-tokens": {
    env: "SLUICE_KV_CAPACITY_TOKENS",
    multiple: true,
    help: "KV capacity for an upstream whose engine states none, N (all) or NAME=N, repeatable; without it the token budget of such an upstream is off",
  },
  "sim-replicas": {
    env: "SLUICE_SIM_REPLICAS",
    default: "2",
    help: "simulated replicas when there is no upstream",
  },
  "sim-preset": {
    env: "SLUICE_SIM_PRESET",
    default: "h100-llama3-8b",
    help: "preset of the simulated replicas",
  },
  "sim-host-kv-tokens": {
    env: "SLUICE_SIM_HOST_KV_TOKENS",
    help: "host-memory KV tier of each simulated rank, tokens (default 0: none; see docs/tiers.md)",
  },
  nats: { env: "SLUICE_NATS", help: "NATS server URL: also serve the NATS API" },
  policy: { env: "SLUICE_POLICY", default: "sluice", help: `admission policy: ${POLICIES.join(" | ")}` },
  "block-size": { env: "SLUICE_BLOCK_SIZE", default: "64", help: "router block size, tokens" },
  "default-max-tokens": {
    env: "SLUICE_DEFAULT_MAX_TOKENS",
    default: "1024",
    help: "max_tokens of a call that sets none",
  },
  "context-window": {
    env: "SLUICE_CONTEXT_WINDOW",
    help: "context window override, tokens (default: what the engine reports)",
  },
  "engine-request-limit": {
    env: "SLUICE_ENGINE_REQUEST_LIMIT",
    help: "gate: calls per rank (alias env DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT; default engine max_num_seqs)",
  },
  "engine-request-waiting-limit": {
    env: "SLUICE_ENGINE_REQUEST_WAITING_LIMIT",
    help: "gate: calls per rank before their first token (alias env DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT; default max_num_seqs)",
  },
  "request-queue-limit": {
    env: "SLUICE_REQUEST_QUEUE_LIMIT",
    help: "gate: queued calls per rank, 0 = no queue (alias env DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT; default 2 × max_num_seqs)",
  },
  "overload-status": {
    env: "SLUICE_OVERLOAD_STATUS",
    default: "529",
    help: "HTTP status of a gate rejection",
  },
  "bulk-max-total-tokens": {
    env: "SLUICE_BULK_MAX_TOTAL_TOKENS",
    help: "largest input + max_tokens of a call, beyond: 413 overflow (default: the context window)",
  },
  "affinity-break-kv": {
    env: "SLUICE_AFFINITY_BREAK_KV",
    default: "0.85",
    help: "KV usage (0-1) at which a pinned replica loses its session",
  },
  "affinity-break-ms": {
    env: "SLUICE_AFFINITY_BREAK_MS",
    default: "5000",
    help: "predicted TTFT margin over the best alternative that breaks a pin, ms",
  },
  "stale-signals": {
    env: "SLUICE_STALE_SIGNALS",
    default: "closed",
    help: "closed: stale signals refuse new sessions; open: admit anyway",
  },
  "control-interval-ms": {
    env: "SLUICE_CONTROL_INTERVAL_MS",
    default: "2000",
    help: "window control interval, ms",
  },
  "window-initial": {
    env: "SLUICE_WINDOW_INITIAL",
    default: "8",
    help: "session window before the first control step",
  },
  "window-min": { env: "SLUICE_WINDOW_MIN", default: "1", help: "smallest session window (W_min)" },
  "window-max": { env: "SLUICE_WINDOW_MAX", default: "1024", help: "largest session window (W_max)" },
  "window-increase": {
    env: "SLUICE_WINDOW_INCREASE",
    default: "2",
    help: "sessions added per control step while KV usage is low (α)",
  },
  "window-decrease": {
    env: "SLUICE_WINDOW_DECREASE",
    default: "0.5",
    help: "factor the window is cut by on thrash (β, between 0 and 1)",
  },
  "window-kv-low": {
    env: "SLUICE_WINDOW_KV_LOW",
    default: "0.2",
    help: "KV usage (0-1) below which the window grows (U_low)",
  },
  "window-kv-high": {
    env: "SLUICE_WINDOW_KV_HIGH",
    default: "0.5",
    help: "KV usage (0-1) above which a low hit rate shrinks the window (U_high)",
  },
  "window-hit-low": {
    env: "SLUICE_WINDOW_HIT_LOW",
    default: "0.2",
    help: "prefix-cache hit rate (0-1) under which high KV usage shrinks the window (H_low)",
  },
  "idle-timeout-ms": {
    env: "SLUICE_IDLE_TIMEOUT_MS",
    default: "120000",
    help: "a session idle this long is closed, ms",
  },
  "session-queue-limit": {
    env: "SLUICE_SESSION_QUEUE_LIMIT",
    default: "1024",
    help: "sessions waiting for a window, beyond: 429 session_queue_full",
  },
  "api-keys": {
    env: "SLUICE_API_KEYS",
    help: "API key file (JSON: key → { tenant, priority, rps, burst, admin }); env may also hold the JSON itself",
  },
  "admin-key": {
    env: "SLUICE_ADMIN_KEY",
    help: "key for /v1/admin/*, /dashboard (Bearer, or ?key= on /dashboard)",
  },
  "body-limit-bytes": {
    env: "SLUICE_BODY_LIMIT_BYTES",
    default: String(DEFAULT_BODY_LIMIT_BYTES),
    help: "largest request body, bytes",
  },
  "stream-stall-timeout-ms": {
    env: "SLUICE_STREAM_STALL_TIMEOUT_MS",
    default: String(DEFAULT_STREAM_STALL_TIMEOUT_MS),
    help: "a streaming client that reads nothing this long loses its call (its engine slot is freed), ms; 0 never",
  },
  "drain-timeout-ms": {
    env: "SLUICE_DRAIN_TIMEOUT_MS",
    default: "30000",
    help: "on SIGINT/SIGTERM, how long running calls may finish, ms",
  },
  tokenizer: { env: "SLUICE_TOKENIZER", default: "o200k", help: "o200k, or the path of a tokenizer.json" },
  "cors-origin": {
    env: "SLUICE_CORS_ORIGIN",
    multiple: true,
    help: "allowed CORS origin, repeatable (* for any); off by default",
  },
  help: { boolean: true, help: "print this help" },
};

/** The `--help` text. */
export function serveHelp(): string {
  const lines = ["usage: sluice serve [flags]", "", "Flags win over environment variables.", ""];
  for (const [name, spec] of Object.entries(SERVE_FLAGS)) {
    const head = `  --${name}${spec.boolean ? "" : spec.multiple ? " VALUE…" : " VALUE"}`;
    const tail = [
      spec.default !== undefined ? `default ${spec.default}` : "",
      spec.env ? `env ${spec.env}` : "",
    ]
      .filter(Boolean)
      .join("; ");
    lines.push(head, `      ${spec.help}${tail ? ` (${tail})` : ""}`);
  }
  return lines.join("\n");
}

type RawFlags = Record<string, string | string[] | boolean | undefined>;

/** A flag's value, else its variable's, else undefined; records which so errors can name the source. */
function lookupSetting(
  raw: RawFlags,
  env: Record<string, string | undefined>,
  name: string,
): { value: string; source: string } | undefined {
  const flag = raw[name];
  if (typeof flag === "string") return { value: flag, source: `--${name}` };
  const variable = SERVE_FLAGS[name]?.env;
  const fromEnv = variable ? env[variable] : undefined;
  if (fromEnv !== undefined && fromEnv.trim() !== "") return { value: fromEnv, source: variable! };
  return undefined;
}

function invalid(source: string, expected: string, value: string): ConfigError {
  return new ConfigError(`${source} takes ${expected}, got ${JSON.stringify(value)}`, {
    ...(source.startsWith("--") ? { flag: source } : { variable: source }),
    value,
  });
}

function integer(
  raw: RawFlags,
  env: Record<string, string | undefined>,
  name: string,
  min: number,
): number | undefined {
  const found = lookupSetting(raw, env, name);
  if (!found) return undefined;
  const text = found.value.trim();
  const value = Number(text);
  if (!/^[0-9]+$/.test(text) || !Number.isSafeInteger(value) || value < min) {
    throw invalid(found.source, min >= 1 ? "a positive integer" : "a non-negative integer", found.value);
  }
  return value;
}

function number(
  raw: RawFlags,
  env: Record<string, string | undefined>,
  name: string,
  range: [number, number],
): number | undefined {
  const found = lookupSetting(raw, env, name);
  if (!found) return undefined;
  const text = found.value.trim();
  const value = Number(text);
  if (text === "" || !Number.isFinite(value) || value < range[0] || value > range[1]) {
    throw invalid(found.source, `a number from ${range[0]} to ${range[1]}`, found.value);
  }
  return value;
}

function choice<T extends string>(
  raw: RawFlags,
  env: Record<string, string | undefined>,
  name: string,
  choices: readonly T[],
): T | undefined {
  const found = lookupSetting(raw, env, name);
  if (!found) return undefined;
  const value = found.value.trim();
  if (!(choices as readonly string[]).includes(value))
    throw invalid(found.source, choices.join(" | "), found.value);
  return value as T;
}

function list(raw: RawFlags, env: Record<string, string | undefined>, name: string): string[] {
  const flag = raw[name];
  if (Array.isArray(flag) && flag.length > 0) return flag.map((v) => v.trim()).filter(Boolean);
  const variable = SERVE_FLAGS[name]?.env;
  const fromEnv = variable ? env[variable] : undefined;
  return fromEnv
    ? fromEnv
        .split(",")
        .map((v) => v.trim())
        .filter(Boolean)
    : [];
}

/**
 * Turns `sluice serve` flags (and `SLUICE_*` variables) into `startServer`
 * options. Throws `ConfigError` naming the flag and the value for anything
 * invalid; gate limits follow SPEC 9 (an invalid variable only warns).
 */
export async function serveOptionsFromArgs(
  argv: string[],
  env: Record<string, string | undefined> = process.env,
  warn: (message: string) => void = stderrLog,
): Promise<ServeOptions> {
  const parseOptions: Record<string, { type: "string" | "boolean"; multiple?: boolean }> = {};
  for (const [name, spec] of Object.entries(SERVE_FLAGS)) {
    parseOptions[name] = {
      type: spec.boolean ? "boolean" : "string",
      ...(spec.multiple ? { multiple: true } : {}),
    };
  }
  let raw: RawFlags;
  try {
    raw = parseArgs({ args: argv, options: parseOptions, strict: true, allowPositionals: false })
      .values as RawFlags;
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }

  const gate = resolveGateLimitsWithSources({
    flags: {
      ...(typeof raw["engine-request-limit"] === "string"
        ? { engineRequestLimit: raw["engine-request-limit"] }
        : {}),
      ...(typeof raw["engine-request-waiting-limit"] === "string"
        ? { engineRequestWaitingLimit: raw["engine-request-waiting-limit"] }
        : {}),
      ...(typeof raw["request-queue-limit"] === "string"
        ? { requestQueueLimit: raw["request-queue-limit"] }
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

  const policy = choice<Policy>(raw, env, "policy", POLICIES);
  const staleSignals = choice(raw, env, "stale-signals", ["closed", "open"] as const);
  const blockSize = integer(raw, env, "block-size", 1);
  const defaultMaxTokens = integer(raw, env, "default-max-tokens", 1);
  const contextWindow = integer(raw, env, "context-window", 1);
  const overloadStatus = integer(raw, env, "overload-status", 400);
  if (overloadStatus !== undefined && overloadStatus > 599) {
    throw invalid(
      lookupSetting(raw, env, "overload-status")!.source,
      "an HTTP status from 400 to 599",
      String(overloadStatus),
    );
  }
  const bulkMaxTotalTokens = integer(raw, env, "bulk-max-total-tokens", 1);
  const affinityBreakKv = number(raw, env, "affinity-break-kv", [0, 1]);
  const affinityBreakMs = number(raw, env, "affinity-break-ms", [0, Number.MAX_SAFE_INTEGER]);
  const controlIntervalMs = integer(raw, env, "control-interval-ms", 1);
  const idleTimeoutMs = integer(raw, env, "idle-timeout-ms", 1);
  const sessionQueueLimit = integer(raw, env, "session-queue-limit", 0);
  const window: NonNullable<SchedulerConfigInput["window"]> = {};
  const windowInitial = integer(raw, env, "window-initial", 1);
  if (windowInitial !== undefined) window.initial = windowInitial;
  const windowMin = integer(raw, env, "window-min", 1);
  if (windowMin !== undefined) window.min = windowMin;
  const windowMax = integer(raw, env, "window-max", 1);
  if (windowMax !== undefined) window.max = windowMax;
  const windowIncrease = integer(raw, env, "window-increase", 1);
  if (windowIncrease !== undefined) window.increase = windowIncrease;
  const windowDecrease = number(raw, env, "window-decrease", [0, 1]);
  if (windowDecrease !== undefined) {
    if (windowDecrease <= 0 || windowDecrease >= 1) {
      const found = lookupSetting(raw, env, "window-decrease")!;
      throw invalid(found.source, "a number between 0 and 1 (exclusive)", found.value);
    }
    window.decrease = windowDecrease;
  }
  const windowKvLow = number(raw, env, "window-kv-low", [0, 1]);
  if (windowKvLow !== undefined) window.kvLow = windowKvLow;
  const windowKvHigh = number(raw, env, "window-kv-high", [0, 1]);
  if (windowKvHigh !== undefined) window.kvHigh = windowKvHigh;
  const windowHitLow = number(raw, env, "window-hit-low", [0, 1]);
  if (windowHitLow !== undefined) window.hitLow = windowHitLow;

  const config: SchedulerConfigInput = {
    ...(policy ? { policy } : {}),
    ...(blockSize !== undefined ? { blockSize } : {}),
    ...(defaultMaxTokens !== undefined ? { defaultMaxTokens } : {}),
    ...(contextWindow !== undefined ? { contextWindowTokens: contextWindow } : {}),
    gate: {
      ...explicit("engineRequestLimit"),
      ...explicit("engineRequestWaitingLimit"),
      ...explicit("requestQueueLimit"),
      ...(overloadStatus !== undefined ? { overloadStatus } : {}),
    },
    lanes: bulkMaxTotalTokens !== undefined ? { bulkMaxTotalTokens } : {},
    routing: {
      ...(affinityBreakKv !== undefined ? { affinityBreakKv } : {}),
      ...(affinityBreakMs !== undefined ? { affinityBreakMs } : {}),
    },
    ...(Object.keys(window).length > 0 ? { window } : {}),
    sessions: {
      ...(staleSignals ? { staleSignals } : {}),
      ...(controlIntervalMs !== undefined ? { controlIntervalMs } : {}),
      ...(idleTimeoutMs !== undefined ? { idleTimeoutMs } : {}),
      ...(sessionQueueLimit !== undefined ? { queueLimit: sessionQueueLimit } : {}),
    },
  };

  const presetValue = lookupSetting(raw, env, "sim-preset");
  let simPreset: PresetName | undefined;
  if (presetValue) {
    const name = presetValue.value.trim();
    if (!isPresetName(name)) throw invalid(presetValue.source, "a simulator preset name", presetValue.value);
    simPreset = name;
  }

  const upstreams = list(raw, env, "upstream");
  const kvCapacityTokens = list(raw, env, "kv-capacity-tokens");
  try {
    resolveUpstreams(upstreams, kvCapacityTokens);
  } catch (err) {
    if (err instanceof UpstreamSpecError) throw invalid(err.setting, err.expected, err.value);
    throw err;
  }

  const keysSource = lookupSetting(raw, env, "api-keys");
  let keys: ApiKeys | undefined;
  if (keysSource) {
    try {
      keys =
        keysSource.source === "SLUICE_API_KEYS"
          ? await ApiKeys.fromEnv({ SLUICE_API_KEYS: keysSource.value })
          : await ApiKeys.fromFile(keysSource.value.trim());
    } catch (err) {
      throw new ConfigError(`${keysSource.source}: ${(err as Error).message}`, { value: keysSource.value });
    }
  }
  const adminKey = lookupSetting(raw, env, "admin-key")?.value.trim();
  if (adminKey !== undefined && adminKey.length < 8)
    throw invalid("--admin-key", "at least 8 characters", "…");

  const port = integer(raw, env, "port", 0);
  if (port !== undefined && port > 65535)
    throw invalid(lookupSetting(raw, env, "port")!.source, "a port 0–65535", String(port));
  const simReplicas = integer(raw, env, "sim-replicas", 1);
  const simHostKvTokens = integer(raw, env, "sim-host-kv-tokens", 0);
  const bodyLimitBytes = integer(raw, env, "body-limit-bytes", 1);
  const drainTimeoutMs = integer(raw, env, "drain-timeout-ms", 0);
  const streamStallTimeoutMs = integer(raw, env, "stream-stall-timeout-ms", 0);
  const host = lookupSetting(raw, env, "host")?.value.trim();
  const nats = lookupSetting(raw, env, "nats")?.value.trim();
  const tokenizer = lookupSetting(raw, env, "tokenizer")?.value.trim();
  if (tokenizer !== undefined) {
    try {
      createTokenizer(tokenizer);
    } catch (err) {
      throw new ConfigError(`--tokenizer: ${(err as Error).message}`, {
        flag: "--tokenizer",
        value: tokenizer,
      });
    }
  }
  const corsOrigins = list(raw, env, "cors-origin");

  return {
    config,
    ...(port !== undefined ? { port } : {}),
    ...(host ? { host } : {}),
    ...(upstreams.length > 0 ? { upstreams } : {}),
    ...(kvCapacityTokens.length > 0 ? { kvCapacityTokens } : {}),
    ...(simReplicas !== undefined ? { simReplicas } : {}),
    ...(simHostKvTokens
      ? { simPreset: { base: simPreset ?? "h100-llama3-8b", hostKvTokens: simHostKvTokens } }
      : simPreset
        ? { simPreset }
        : {}),
    ...(keys ? { keys } : {}),
    ...(adminKey ? { adminKey } : {}),
    ...(bodyLimitBytes !== undefined ? { bodyLimitBytes } : {}),
    ...(drainTimeoutMs !== undefined ? { drainTimeoutMs } : {}),
    ...(streamStallTimeoutMs !== undefined ? { streamStallTimeoutMs } : {}),
    ...(nats ? { nats } : {}),
    ...(tokenizer ? { tokenizer } : {}),
    ...(corsOrigins.length > 0 ? { corsOrigins } : {}),
  };
}

/** `sluice serve`: runs until SIGINT or SIGTERM, then shuts down gracefully and returns 0. */
export function run(argv: string[]): Promise<number> {
  return runServerCommand<ServeOptions, RunningServer>(
    {
      name: "serve",
      help: serveHelp,
      parse: serveOptionsFromArgs,
      start: startServer,
      close: (server) => server.close(),
      // A second signal skips the drain.
      force: (server) => server.tracker.cancelAll(),
      stopped(server) {
        // What the scheduler still holds at exit: anything but zero permits, reservations and queue places is a leak.
        const held = server.scheduler.idleCheck();
        return (
          `stopped (permits ${held.permits}, reservations ${held.reservations}, ` +
          `window slots ${held.windowSlots}, queued ${held.queued})`
        );
      },
    },
    argv,
  );
}
