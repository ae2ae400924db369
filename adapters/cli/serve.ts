/** @module `sluice serve`: the composition root — engines, scheduler, metrics, HTTP server, graceful shutdown. */

import type { AddressInfo } from "node:net";
import { serve as serveHono } from "@hono/node-server";
import { Registry } from "prom-client";
import { z } from "zod";
import { realClock } from "../../src/clock.js";
import { ConfigError } from "../../src/config/config-error.js";
import type { SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import { checkSchedulerSettings, SCHEDULER_SETTINGS } from "../../src/config/scheduler-settings.js";
import { defineSetting, type Setting } from "../../src/config/settings.js";
import type { Engine } from "../../src/engine.js";
import { Scheduler, type SchedulerOptions } from "../../src/scheduler.js";
import { OpenAIUpstreamEngine } from "../engines/openai/upstream-engine.js";
import {
  describeUpstream,
  parseEngineProfileSpecs,
  parseKvCapacitySpecs,
  parseUpstreamSpec,
  resolveUpstreams,
  splitUpstreamItems,
  UpstreamSpecError,
} from "../engines/openai/upstream-spec.js";
import { simPdFleet } from "../engines/sim/pd-fleet.js";
import { DEFAULT_PRESET, PRESETS, type PresetName, type PresetOverrides } from "../engines/sim/presets.js";
import { SimEngine } from "../engines/sim/sim-engine.js";
import { ApiKeys } from "../http/api-keys.js";
import { createApp, DEFAULT_STREAM_STALL_TIMEOUT_MS } from "../http/app.js";
import { CallTracker } from "../http/call-tracker.js";
import { answerClientErrors } from "../http/client-error.js";
import { DEFAULT_BODY_LIMIT_BYTES } from "../http/read-body.js";
import { DEFAULT_DATA_DIR, Jobs, type JobsBackend } from "../jobs/index.js";
import { createLogger, LOG_LEVELS, type Logger, type LogLevel } from "../log/logger.js";
import { logStartup } from "../log/operations-log.js";
import { createMetrics, type SluiceMetrics } from "../metrics/metrics.js";
import { createTokenizer } from "../tokenizers/index.js";
import { type CommandSpec, parseCommandLine, renderHelp } from "./command-line.js";
import { describeError } from "./error-cause.js";
import { runServerCommand } from "./server-command.js";
import { loadTenantsFile } from "./tenants-file.js";

/** A running NATS front end; `adapters/nats` provides it (loaded only when `--nats` is given). */
export interface NatsService {
  /** Stops taking NATS calls (the queue group routes them elsewhere) and lets running ones finish. */
  drain?(timeoutMs: number): Promise<void>;
  /** Resolves once no new NATS call reaches this instance and those delivered reached the scheduler. */
  leave?(): Promise<void>;
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
  /** The API keys HTTP checks; NATS requests then carry one too. */
  keys?: ApiKeys;
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
  /** Profiles to read upstreams' metrics with: `PROFILE` for all, `NAME=PROFILE` for one; default detected. */
  engineProfiles?: string[];
  /** Engines to serve as they are (tests, embedding); wins over `upstreams` and the simulator. */
  engines?: Engine[];
  /** Simulated replicas when there is no upstream. Default 2. */
  simReplicas?: number;
  /**
   * A disaggregated simulated fleet instead: this many `prefill` replicas
   * beside `simDecodeReplicas` `decode` ones (both ≥ 1 when either is given;
   * `simReplicas` is then ignored).
   */
  simPrefillReplicas?: number;
  simDecodeReplicas?: number;
  /** Preset (or overrides) of the simulated replicas. Default `h100-llama3-8b`. */
  simPreset?: PresetName | PresetOverrides;
  /** Host-memory KV tier of each simulated rank, tokens; 0 or absent: none. */
  simHostKvTokens?: number;
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
  /** A request header naming the tenant, for deployments behind a trusted gateway (docs/tenants.md). */
  tenantHeader?: string;
  /** How long a shutdown lets running calls finish before cancelling them, ms. Default 30000. */
  drainTimeoutMs?: number;
  /** A streaming client that reads nothing for this long loses its call, ms; 0 never. Default 60000. */
  streamStallTimeoutMs?: number;
  /** NATS server URL; serves the NATS API too. */
  nats?: string;
  /** Dashboard polling period, ms. Default 1000. */
  dashboardPollMs?: number;
  /** Where log lines go (start-up, warnings, shutdown, access). Default stderr. */
  log?: (line: string) => void;
  /** Where batches, files and idempotency records live; omitted: a temporary directory (`sluice serve`: ./.sluice-data). */
  dataDir?: string;
  /** The structured logger; built from `logLevel` and `log` when omitted. */
  logger?: Logger;
  /** Lowest level logged. Default `info`. */
  logLevel?: LogLevel;
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

/** Defaults of the server's own settings (the scheduler's live in its schema). */
const DEFAULTS = {
  port: 8080,
  host: "0.0.0.0",
  simReplicas: 2,
  simPreset: DEFAULT_PRESET,
  drainTimeoutMs: 30_000,
  tokenizer: "o200k",
};

const stderrLog = (line: string) => process.stderr.write(`${line}\n`);

async function buildEngines(
  options: ServeOptions,
  log: (line: string) => void,
): Promise<{ engines: Engine[]; description: string }> {
  if (options.engines && options.engines.length > 0) {
    return { engines: options.engines, description: `${options.engines.length} given engine(s)` };
  }
  const upstreams = resolveUpstreams(
    options.upstreams ?? [],
    options.kvCapacityTokens ?? [],
    options.engineProfiles ?? [],
  );
  if (upstreams.length > 0) {
    const engines = upstreams.map(
      (spec) =>
        new OpenAIUpstreamEngine({
          baseUrl: spec.url,
          id: spec.name,
          ...(spec.role !== undefined ? { role: spec.role } : {}),
          ...(spec.pd !== undefined ? { pd: spec.pd } : {}),
          ...(spec.bootstrapPort !== undefined ? { bootstrapPort: spec.bootstrapPort } : {}),
          ...(spec.kvCapacityTokens !== undefined ? { kvCapacityTokens: spec.kvCapacityTokens } : {}),
          ...(spec.profile !== undefined ? { profile: spec.profile } : {}),
        }),
    );
    // The first scrape and `/v1/models` settle (never reject) before serving, so the first call knows the models.
    await Promise.all(engines.map((engine) => engine.start()));
    // What each engine's metrics said, and a warning for every budget that must stay off.
    for (const [i, engine] of engines.entries()) {
      const { line, warning } = describeUpstream(engine.id, upstreams[i]!.url, engine.signals());
      log(line);
      if (warning) log(warning);
      const mode = engine.disaggregationMode();
      if (mode !== undefined && mode !== engine.role) {
        log(
          `sluice: warning: upstream ${engine.id} is configured role=${engine.role},pd=sglang but states disaggregation_mode ${mode}`,
        );
      }
    }
    return {
      engines,
      description: `upstream ${upstreams.map((u) => `${u.name}=${u.url}`).join(", ")}`,
    };
  }
  const count = options.simReplicas ?? DEFAULTS.simReplicas;
  if (!(Number.isInteger(count) && count >= 1)) throw new RangeError(`simReplicas must be ≥ 1, got ${count}`);
  const chosen = options.simPreset ?? DEFAULTS.simPreset;
  const preset: PresetName | PresetOverrides = options.simHostKvTokens
    ? {
        ...(typeof chosen === "string" ? { base: chosen } : chosen),
        hostKvTokens: options.simHostKvTokens,
      }
    : chosen;
  const presetName =
    typeof preset === "string" ? preset : `${preset.base ?? DEFAULTS.simPreset} (overridden)`;
  if (options.simPrefillReplicas !== undefined || options.simDecodeReplicas !== undefined) {
    const engines = simPdFleet(options.simPrefillReplicas ?? 0, options.simDecodeReplicas ?? 0, (spec) => {
      return new SimEngine({ ...spec, clock: realClock, preset });
    });
    return {
      engines,
      description: `${options.simPrefillReplicas} prefill + ${options.simDecodeReplicas} decode simulated replica(s) ${presetName}`,
    };
  }
  const engines = Array.from(
    { length: count },
    (_, i) => new SimEngine({ id: `sim-${i}`, clock: realClock, preset }) as Engine,
  );
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
  frontend: {
    /** The connection, which jobs on JetStream share. */
    nc: unknown;
    close(): Promise<void>;
    /** One holder per session fleet-wide, whichever frontend an HTTP request reaches. */
    wrapFetch?<F extends (request: Request) => Response | Promise<Response>>(
      fetch: F,
      scheduler: Scheduler,
      tenantOf?: (request: Request) => string | undefined,
      bodyLimitBytes?: number,
    ): F;
  };
  schedulerPorts: Pick<SchedulerOptions, "windowAuthority" | "sessionDirectory">;
  /** Jobs on JetStream over the frontend's connection (shared by every frontend). */
  openJobs(): Promise<JobsBackend>;
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
    openJetStreamJobs?: (options: { nc: unknown }) => Promise<JobsBackend>;
  };
  if (typeof module.connectNatsFrontend !== "function") {
    throw new ConfigError("--nats: adapters/nats does not export connectNatsFrontend", { flag: "--nats" });
  }
  const frontend = await module.connectNatsFrontend({ servers: url, log }).catch((err: Error) => {
    throw new ConfigError(`--nats: cannot connect to ${url} (${describeError(err)})`, {
      flag: "--nats",
      value: url,
    });
  });
  const schedulerPorts: NatsScaleOut["schedulerPorts"] = {};
  if (frontend.windowAuthority) schedulerPorts.windowAuthority = frontend.windowAuthority;
  if (frontend.sessionDirectory) schedulerPorts.sessionDirectory = frontend.sessionDirectory;
  const openJetStreamJobs = module.openJetStreamJobs;
  return {
    frontend,
    schedulerPorts,
    openJobs: async () => {
      if (typeof openJetStreamJobs !== "function")
        throw new Error("adapters/nats does not export openJetStreamJobs");
      return openJetStreamJobs({ nc: frontend.nc });
    },
  };
}

/**
 * Where jobs live: with `--nats`, in JetStream, shared by every frontend; without it (or when
 * JetStream cannot hold them), in the embedded store under the data directory.
 */
async function openJobsBackend(
  natsScaleOut: NatsScaleOut | undefined,
  log: (line: string) => void,
): Promise<JobsBackend | undefined> {
  if (!natsScaleOut) return undefined;
  try {
    const backend = await natsScaleOut.openJobs();
    log(`sluice: jobs and files on ${backend.store.location}, shared by every frontend`);
    return backend;
  } catch (err) {
    log(
      `sluice: jobs cannot live in JetStream (${describeError(err)}); they are kept in this frontend's data directory`,
    );
    return undefined;
  }
}

// -------------------------------------------------------------------------------------------------

/**
 * Starts sluice: engines, scheduler (control loops on the real clock),
 * metrics, the HTTP API on `host:port`, and NATS when asked for.
 */
export async function startServer(options: ServeOptions = {}): Promise<RunningServer> {
  const logger =
    options.logger ??
    createLogger({ level: options.logLevel ?? "info", ...(options.log ? { write: options.log } : {}) });
  // Plain lines (warnings, shutdown) keep their form for an embedder that passed `log`; the CLI logs them structured.
  const log = options.log ?? ((line: string) => logger.info(line));
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
  const jobsBackend = await openJobsBackend(natsScaleOut, log);
  const jobs = await Jobs.open({
    scheduler,
    log,
    registry,
    ...(jobsBackend ? { backend: jobsBackend } : options.dataDir ? { dataDir: options.dataDir } : {}),
  });
  const app = createApp({
    plugins: [jobs],
    scheduler,
    metrics,
    tracker,
    logger,
    bodyLimitBytes: options.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES,
    ...(options.streamStallTimeoutMs !== undefined
      ? { streamStallTimeoutMs: options.streamStallTimeoutMs }
      : {}),
    ...(options.dashboardPollMs ? { dashboardPollMs: options.dashboardPollMs } : {}),
    ...(options.keys ? { keys: options.keys } : {}),
    ...(options.adminKey ? { adminKey: options.adminKey } : {}),
    ...(options.tenantHeader ? { tenantHeader: options.tenantHeader } : {}),
    ...(options.corsOrigins && options.corsOrigins.length > 0
      ? { cors: { origins: options.corsOrigins.includes("*") ? "*" : options.corsOrigins } }
      : {}),
  });
  scheduler.start();
  await jobs.start();

  const keys = options.keys;
  // Sessions are their tenant's across frontends too: the fleet's session routing scopes keys by the caller's key.
  const tenantOf =
    keys && keys.size > 0
      ? (request: Request) => {
          const bearer = /^Bearer\s+(.+)$/i.exec(request.headers.get("authorization")?.trim() ?? "")?.[1];
          const presented = bearer?.trim() || request.headers.get("x-api-key")?.trim();
          return presented ? keys.lookup(presented)?.tenant : undefined;
        }
      : undefined;
  const fetch =
    natsScaleOut?.frontend.wrapFetch?.(
      app.fetch,
      scheduler,
      tenantOf,
      options.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES,
    ) ?? app.fetch;
  const server = serveHono({ fetch, port, hostname: host });
  answerClientErrors(server);
  try {
    await new Promise<void>((resolve, reject) => {
      if (server.listening) return resolve();
      server.once("listening", resolve);
      server.once("error", reject);
    });
  } catch (err) {
    await jobs.close();
    app.close();
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
        ...(options.keys ? { keys: options.keys } : {}),
      });
    } catch (err) {
      server.close();
      (server as { closeAllConnections?: () => void }).closeAllConnections?.();
      await jobs.close();
      app.close();
      await scheduler.stop();
      await Promise.allSettled(engines.map((engine) => engine.close?.()));
      throw err;
    }
  }
  const state = scheduler.state();
  logStartup(logger, {
    url,
    policy: scheduler.policy,
    upstreams: description,
    models: scheduler.models(),
    replicas: state.replicas.map((r) => ({
      id: r.id,
      // What the engine's /metrics looked like (vllm, sglang); the simulator is vLLM-named.
      engine:
        (
          engines.find((e) => e.id === r.id) as { flavor?: () => string | undefined } | undefined
        )?.flavor?.() ?? (engines.find((e) => e.id === r.id) instanceof SimEngine ? "sim" : "unknown"),
      kvCapacityTokens: r.signals.kvCapacityTokens,
      maxNumSeqs: r.signals.maxNumSeqs,
      dataParallelSize: r.signals.dataParallelSize,
      gate: r.gate.limits,
      tokenCeiling: r.budget.ceilingTokens,
    })),
    limits: { bodyLimitBytes: options.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES, drainTimeoutMs },
    nats: options.nats,
  });

  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= (async () => {
      // NATS calls drain like HTTP ones, side by side.
      const natsDrained = nats?.drain?.(drainTimeoutMs);
      tracker.drain();
      // NATS calls delivered before this instance left the queue group are served, not refused.
      await nats?.leave?.();
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
      await natsDrained;
      // Lines in flight stop unrecorded and run again at the next start (or, on JetStream, at once on
      // another frontend): before the connection closes, so the work taken goes back to the queue.
      await jobs.close();
      await nats?.close();
      app.close();
      await scheduler.stop();
      await Promise.allSettled(engines.map((engine) => engine.close?.()));
    })();
    return closing;
  };
  return { url, scheduler, metrics, tracker, close };
}

// --- command line ------------------------------------------------------------------------------

const SERVER = "Server";
const ENGINES = "Engines";
const ACCESS = "Access";

/** Whether `read` accepts its text (the upstream parsers throw on bad input). */
function parses(read: () => unknown): boolean {
  try {
    read();
    return true;
  } catch {
    return false;
  }
}

const milliseconds = z.number().int().nonnegative();

/**
 * Every setting of `sluice serve`: server settings here, the scheduler's from
 * `SCHEDULER_SETTINGS`. `--help`, the `SLUICE_*` variables and
 * docs/configuration.md come from this list.
 */
export const SERVE_SETTINGS: readonly Setting[] = [
  defineSetting({
    flag: "port",
    path: "port",
    topic: SERVER,
    schema: z.number().int().min(0).max(65535).default(DEFAULTS.port),
    help: "TCP port; 0 picks a free one",
  }),
  defineSetting({
    flag: "host",
    path: "host",
    topic: SERVER,
    schema: z.string().default(DEFAULTS.host),
    placeholder: "<address>",
    expects: "an interface address",
    help: "interface to listen on (0.0.0.0: every interface)",
  }),
  defineSetting({
    flag: "body-limit-bytes",
    path: "bodyLimitBytes",
    topic: SERVER,
    schema: z.number().int().positive().default(DEFAULT_BODY_LIMIT_BYTES),
    help: "largest request body, bytes",
  }),
  defineSetting({
    flag: "stream-stall-timeout-ms",
    path: "streamStallTimeoutMs",
    topic: SERVER,
    schema: milliseconds.default(DEFAULT_STREAM_STALL_TIMEOUT_MS),
    help: "a streaming client that reads nothing this long loses its call (its engine slot is freed), ms; 0: never",
  }),
  defineSetting({
    flag: "drain-timeout-ms",
    path: "drainTimeoutMs",
    topic: SERVER,
    schema: milliseconds.default(DEFAULTS.drainTimeoutMs),
    help: "on SIGINT/SIGTERM, how long running calls may finish, ms",
  }),
  defineSetting({
    flag: "nats",
    path: "nats",
    topic: SERVER,
    schema: z.string(),
    placeholder: "<url>",
    expects: "a NATS server URL",
    help: "NATS server URL: also serve the NATS API, share sessions and windows, and keep jobs in JetStream",
  }),
  defineSetting({
    flag: "upstream",
    path: "upstreams",
    topic: ENGINES,
    schema: z.array(z.string().refine((text) => parses(() => parseUpstreamSpec(text)))),
    splitItems: splitUpstreamItems,
    placeholder: "<[name=]url|role=…,name=…,url=…>",
    expects:
      "an http(s) URL, optionally as NAME=URL or role=prefill|decode|both,name=NAME,url=URL[,pd=vllm|sglang][,bootstrap_port=N][,profile=PROFILE]",
    help: "OpenAI-compatible engine; NAME is the replica id (default host:port); role=prefill|decode makes a disaggregated fleet speaking vLLM's request flow, or SGLang's PD mode with pd=sglang (docs/disaggregated.md); none: simulated replicas",
  }),
  defineSetting({
    flag: "kv-capacity-tokens",
    path: "kvCapacityTokens",
    topic: ENGINES,
    schema: z.array(z.string().refine((text) => parses(() => parseKvCapacitySpecs([text])))),
    placeholder: "<[name=]int>",
    expects: "a positive number of tokens, N or NAME=N",
    help: "KV capacity for an upstream whose engine states none, N (all) or NAME=N; without it that upstream's token budget is off",
  }),
  defineSetting({
    flag: "engine-profile",
    path: "engineProfiles",
    topic: ENGINES,
    schema: z.array(z.string().refine((text) => parses(() => parseEngineProfileSpecs([text])))),
    placeholder: "<[name=]profile>",
    expects: "auto, vllm, sglang, nim, llamacpp, tgi or unknown, as PROFILE or NAME=PROFILE",
    help: "read an upstream's metrics as this engine's, PROFILE (all) or NAME=PROFILE (also profile= in --upstream's key form); default auto: detected from the page; unknown: read no metrics, serve it on /health (docs/engines.md)",
  }),
  defineSetting({
    flag: "log-level",
    path: "logLevel",
    topic: SERVER,
    schema: z.enum(LOG_LEVELS).default("info"),
    placeholder: `<${LOG_LEVELS.join("|")}>`,
    help: "lowest level logged (JSON lines when not a terminal)",
  }),
  defineSetting({
    flag: "data-dir",
    path: "dataDir",
    topic: SERVER,
    schema: z.string().min(1).default(DEFAULT_DATA_DIR),
    placeholder: "<path>",
    expects: "a directory path",
    help: "directory for batches, files and idempotency records (kept across restarts); with --nats they live in JetStream instead",
  }),
  defineSetting({
    flag: "sim-replicas",
    path: "simReplicas",
    topic: ENGINES,
    schema: z.number().int().positive().default(DEFAULTS.simReplicas),
    help: "simulated replicas when there is no upstream",
  }),
  defineSetting({
    flag: "sim-prefill-replicas",
    path: "simPrefillReplicas",
    topic: ENGINES,
    schema: z.number().int().positive(),
    defaultText: "none: one pool",
    help: "simulated prefill replicas of a disaggregated fleet, beside --sim-decode-replicas (docs/disaggregated.md)",
  }),
  defineSetting({
    flag: "sim-decode-replicas",
    path: "simDecodeReplicas",
    topic: ENGINES,
    schema: z.number().int().positive(),
    defaultText: "none: one pool",
    help: "simulated decode replicas of a disaggregated fleet, beside --sim-prefill-replicas",
  }),
  defineSetting({
    flag: "sim-host-kv-tokens",
    path: "simHostKvTokens",
    topic: ENGINES,
    schema: z.number().int().nonnegative(),
    defaultText: "0: none",
    help: "host-memory KV tier of each simulated rank, tokens (docs/tiers.md)",
  }),
  defineSetting({
    flag: "sim-preset",
    path: "simPreset",
    topic: ENGINES,
    schema: z.enum(Object.keys(PRESETS) as [PresetName, ...PresetName[]]).default(DEFAULTS.simPreset),
    placeholder: "<preset>",
    help: "preset of the simulated replicas",
  }),
  defineSetting({
    flag: "tokenizer",
    path: "tokenizer",
    topic: ENGINES,
    schema: z.string().default(DEFAULTS.tokenizer),
    placeholder: "<o200k|path>",
    expects: "o200k or the path of a tokenizer.json",
    help: "tokenizer: o200k, or the path of a tokenizer.json",
  }),
  ...SCHEDULER_SETTINGS,
  defineSetting({
    flag: "api-keys",
    path: "apiKeys",
    topic: ACCESS,
    schema: z.string(),
    placeholder: "<path>",
    expects: "the path of an API key file",
    help: "API key file (JSON: key → { tenant, priority, rps, burst, admin }); the variable may hold the JSON itself",
  }),
  defineSetting({
    flag: "admin-key",
    path: "adminKey",
    topic: ACCESS,
    schema: z.string().min(8),
    placeholder: "<key>",
    expects: "at least 8 characters",
    secret: true,
    help: "key for /v1/admin/* and /dashboard (Bearer, or ?key= on /dashboard)",
  }),
  defineSetting({
    flag: "tenants",
    path: "tenantsFile",
    topic: ACCESS,
    schema: z.string(),
    placeholder: "<path>",
    expects: "the path of a tenants file",
    help: 'tenants file (JSON: tenant → { weight, band, max_share }); e.g. { "batch": { "band": "sheddable" } }',
  }),
  defineSetting({
    flag: "tenant-header",
    path: "tenantHeader",
    topic: ACCESS,
    schema: z.string().regex(/^[A-Za-z0-9-]+$/),
    placeholder: "<name>",
    expects: "a header name",
    help: "request header naming the tenant; only behind a trusted gateway (clients could set it)",
  }),
  defineSetting({
    flag: "cors-origin",
    path: "corsOrigins",
    topic: ACCESS,
    schema: z.array(z.string()),
    placeholder: "<origin>",
    help: "allowed CORS origin (* for any); off by default",
  }),
];

/** `sluice serve` for help and the parser. */
export const SERVE_COMMAND: CommandSpec = {
  name: "serve",
  usage: "sluice serve [flags]",
  summary:
    "Runs the scheduler: the OpenAI API, /metrics, /healthz, /readyz, the dashboard. With no --upstream it\n" +
    "serves --sim-replicas simulated replicas in-process. Runs until SIGINT or SIGTERM, then drains.",
  settings: SERVE_SETTINGS,
  footer:
    "exit status: 0 after a signal and an orderly close, 1 could not start, 2 bad flags or configuration",
};

/** The `--help` text. */
export function serveHelp(): string {
  return renderHelp(SERVE_COMMAND);
}

/**
 * Turns `sluice serve` flags (and `SLUICE_*` variables) into `startServer`
 * options, holding only what was set (defaults stay with `startServer` and
 * the scheduler's schema). Throws `ConfigError` naming the flag and the value
 * for anything invalid; an invalid variable only warns (docs/configuration.md).
 */
export async function serveOptionsFromArgs(
  argv: string[],
  env: Record<string, string | undefined> = process.env,
  warn: (message: string) => void = stderrLog,
): Promise<ServeOptions> {
  const line = parseCommandLine(SERVE_COMMAND, argv, env, warn);
  if (line.kind !== "run") return {};
  const { apiKeys, tenantsFile, ...options } = line.values as ServeOptions & {
    apiKeys?: string;
    tenantsFile?: string;
  };
  if (tenantsFile !== undefined) {
    const flag = line.sources.tenants === "env" ? "SLUICE_TENANTS" : "--tenants";
    try {
      options.config = { ...options.config, tenants: await loadTenantsFile(tenantsFile) };
    } catch (err) {
      throw new ConfigError(`${flag} ${tenantsFile}: ${(err as Error).message}`, {
        flag,
        value: tenantsFile,
      });
    }
  }
  if (options.tokenizer !== undefined) {
    try {
      createTokenizer(options.tokenizer);
    } catch (err) {
      throw new ConfigError(`--tokenizer: ${(err as Error).message}`, {
        flag: "--tokenizer",
        value: options.tokenizer,
      });
    }
  }
  checkSchedulerSettings(options.config ?? {});
  try {
    // Names distinct, capacities given to names that exist: rules between values.
    resolveUpstreams(options.upstreams ?? [], options.kvCapacityTokens ?? [], options.engineProfiles ?? []);
  } catch (err) {
    if (err instanceof UpstreamSpecError)
      throw new ConfigError(err.message, { flag: err.setting, value: err.value });
    throw err;
  }
  let keys: ApiKeys | undefined;
  if (apiKeys !== undefined) {
    const fromEnv = line.sources["api-keys"] === "env";
    try {
      keys = fromEnv ? await ApiKeys.fromEnv({ SLUICE_API_KEYS: apiKeys }) : await ApiKeys.fromFile(apiKeys);
    } catch (err) {
      throw new ConfigError(`${fromEnv ? "SLUICE_API_KEYS" : "--api-keys"}: ${(err as Error).message}`, {
        value: apiKeys,
      });
    }
  }
  // `sluice serve` keeps jobs in ./.sluice-data unless told otherwise; the library's default is a temporary directory.
  return {
    ...options,
    dataDir: options.dataDir ?? DEFAULT_DATA_DIR,
    config: options.config ?? {},
    ...(keys ? { keys } : {}),
  };
}

/** `sluice serve`: runs until SIGINT or SIGTERM, then shuts down gracefully and returns 0. */
export function run(argv: string[]): Promise<number> {
  return runServerCommand<ServeOptions, RunningServer>(
    {
      spec: SERVE_COMMAND,
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
