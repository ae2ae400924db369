/**
 * @module One sluice frontend on NATS: the connection, the shared state of
 * scale-out (window authority and session directory on JetStream KV) and the
 * NATS service, wired together. `sluice serve --nats URL` uses it; so do the
 * tests and the benchmark.
 *
 * Order matters: the scheduler takes the authority and directory at
 * construction, so connect first, build the scheduler, then `attach` it.
 */

import { hostname } from "node:os";
import { type ConnectionOptions, connect, Events, type KV, type NatsConnection } from "nats";
import type { Clock } from "../../src/clock.js";
import { type FleetSessionScheduler, fleetSessionsFetch } from "./http-sessions.js";
import type { NatsService, NatsServiceOptions, NatsServiceScheduler } from "./service.js";
import { startNatsService } from "./service.js";
import { KvSessionDirectory, SESSIONS_BUCKET } from "./session-directory.js";
import { KvWindowAuthority, WINDOWS_BUCKET, type WindowScheduler } from "./window-authority.js";

/** Options of {@link connectNatsFrontend}. */
/** Longest an orderly NATS shutdown (service stop, drain) may take before the connection is closed outright, ms. */
const CLOSE_TIMEOUT_MS = 3000;

export interface NatsFrontendOptions {
  /** NATS server URL(s), e.g. `nats://127.0.0.1:4222`. */
  servers: string | string[];
  /** This frontend's id, `[-_a-zA-Z0-9]+`, unique among frontends. Default `<host>-<pid>-<random>`. */
  frontendId?: string;
  /** Service name. Default "sluice". */
  name?: string;
  /** Queue group. Default "sluice". */
  queue?: string;
  /**
   * Share session windows and the session directory with other frontends on
   * JetStream KV. Default true; without JetStream on the server it falls back
   * to local windows with a warning.
   */
  scaleOut?: boolean;
  /**
   * With scale-out, share session windows too (needs the scheduler built with
   * `windowAuthority`). Default true; false keeps only the session directory.
   */
  sharedWindows?: boolean;
  /** Time source of lease and claim expiry. Default real time. */
  clock?: Clock;
  /** Extra connection options (credentials, TLS, …). */
  connection?: Partial<ConnectionOptions>;
  /** Lease, claim and spare-slot settings of the shared windows (see `KvWindowAuthority`). */
  window?: { leaseMs?: number; claimTtlMs?: number; heartbeatMs?: number; spareSlots?: number };
  /** How long a session's directory record outlives its last write, ms. Default 24 h. */
  sessionRecordTtlMs?: number;
  /** NATS service settings (call timeout, probe interval, body limit). */
  service?: Pick<
    NatsServiceOptions,
    "callTimeoutMs" | "probeIntervalMs" | "bodyLimitBytes" | "version" | "onRefusal" | "keys"
  >;
  /** Receives one line per notable event (connection lost, fallback to local windows). */
  log?: (line: string) => void;
}

/** A connected frontend. */
export interface NatsFrontend {
  readonly nc: NatsConnection;
  readonly frontendId: string;
  /** Pass to `new Scheduler({ windowAuthority })`; undefined without scale-out. */
  readonly windowAuthority: KvWindowAuthority | undefined;
  /** Pass to `new Scheduler({ sessionDirectory })`; undefined without scale-out. */
  readonly sessionDirectory: KvSessionDirectory | undefined;
  /** Whether the connection is up right now. */
  readonly connected: boolean;
  /** The service, once attached. */
  readonly service: NatsService | undefined;
  /** Wires the scheduler's events into the shared state and starts the NATS service for it. */
  attach(
    scheduler: NatsServiceScheduler & WindowScheduler,
    service?: NatsFrontendOptions["service"],
  ): Promise<NatsService>;
  /**
   * Wraps the HTTP app's `fetch` so a session has one holder fleet-wide
   * whichever frontend a request reaches (`http-sessions.ts`); unchanged
   * without a session directory.
   */
  wrapFetch<F extends (request: Request, ...rest: never[]) => Response | Promise<Response>>(
    fetch: F,
    scheduler: FleetSessionScheduler,
    /** The tenant of a request (its API key's); sessions are scoped by it. */
    tenantOf?: (request: Request) => string | undefined,
    /** The app's body limit: a body read to find its session key is read within it. */
    bodyLimitBytes?: number,
  ): F;
  /**
   * Graceful stop of the NATS calls: leaves the queue group now (new calls go
   * to the other frontends), lets running calls finish for up to `timeoutMs`,
   * then cancels the rest, each answered with an error. `close` after it.
   */
  drain(timeoutMs: number): Promise<void>;
  /** Leaves the queue group; resolves once the NATS calls delivered here reached the scheduler. */
  leave(): Promise<void>;
  /** Stops the service, gives back claims and leases, writes pending records, and closes the connection. */
  close(): Promise<void>;
}

/** A frontend id for this process: host, pid and a random suffix, in KV-key characters. */
export function defaultFrontendId(): string {
  const host = hostname()
    .replace(/[^-_a-zA-Z0-9]/g, "_")
    .slice(0, 40);
  return `${host}-${process.pid}-${globalThis.crypto.randomUUID().slice(0, 8)}`;
}

/** Connects to NATS and prepares the shared state (buckets `sluice-windows` and `sluice-sessions`). */
export async function connectNatsFrontend(options: NatsFrontendOptions): Promise<NatsFrontend> {
  const frontendId = options.frontendId ?? defaultFrontendId();
  if (!/^[-_a-zA-Z0-9]+$/.test(frontendId)) {
    throw new RangeError(`frontendId must match [-_a-zA-Z0-9]+, got ${JSON.stringify(frontendId)}`);
  }
  const log = options.log ?? (() => {});
  const sessionRecordTtlMs = options.sessionRecordTtlMs ?? 24 * 3600_000;
  if (!(Number.isFinite(sessionRecordTtlMs) && sessionRecordTtlMs >= 1000)) {
    throw new RangeError(`sessionRecordTtlMs must be at least 1000 ms, got ${sessionRecordTtlMs}`);
  }
  const nc = await connect({
    servers: options.servers,
    name: `sluice-${frontendId}`,
    // A frontend outlives NATS outages: it keeps serving active sessions and reconnects for ever.
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    pingInterval: 5000,
    ...options.connection,
  });
  let connected = true;
  let closing = false;
  let windowAuthority: KvWindowAuthority | undefined;
  let sessionDirectory: KvSessionDirectory | undefined;
  let service: NatsService | undefined;

  if (options.scaleOut ?? true) {
    let windows: KV | undefined;
    let sessions: KV | undefined;
    try {
      const js = nc.jetstream();
      windows = await js.views.kv(WINDOWS_BUCKET, { history: 1 });
      sessions = await js.views.kv(SESSIONS_BUCKET, { history: 1, ttl: sessionRecordTtlMs });
    } catch (err) {
      log(
        `NATS JetStream is not available (${(err as Error).message}); session windows stay local to this frontend`,
      );
    }
    if (windows && sessions) {
      const onError = (err: unknown) => {
        if (connected) log(`shared state: ${(err as Error)?.message ?? String(err)}`);
      };
      if (options.sharedWindows ?? true) {
        windowAuthority = new KvWindowAuthority({
          kv: windows,
          frontendId,
          ...(options.clock ? { clock: options.clock } : {}),
          ...options.window,
          onError,
        });
      }
      sessionDirectory = new KvSessionDirectory({
        kv: sessions,
        nc,
        frontendId,
        isConnected: () => connected,
        onError,
      });
    }
  }

  // Connection state drives admission: while NATS is away no frontend can prove a window slot is free.
  void (async () => {
    for await (const status of nc.status()) {
      if (closing) return;
      if (status.type === Events.Disconnect) {
        connected = false;
        windowAuthority?.setConnected(false);
        log(`NATS connection lost (${String(status.data)}); new sessions are refused until it is back`);
      } else if (status.type === Events.Reconnect) {
        connected = true;
        windowAuthority?.setConnected(true);
        sessionDirectory?.reconnected();
        log(`NATS connection back (${String(status.data)})`);
      }
    }
  })().catch(() => {});

  return {
    nc,
    frontendId,
    windowAuthority,
    sessionDirectory,
    get connected() {
      return connected;
    },
    get service() {
      return service;
    },
    async attach(scheduler, serviceOptions) {
      if (service) return service;
      windowAuthority?.bind(scheduler);
      windowAuthority?.startWatch();
      sessionDirectory?.bind(scheduler);
      service = await startNatsService({
        nc,
        scheduler,
        frontendId,
        ...(options.name ? { name: options.name } : {}),
        ...(options.queue ? { queue: options.queue } : {}),
        ...(sessionDirectory ? { router: sessionDirectory } : {}),
        ...options.service,
        ...serviceOptions,
      });
      return service;
    },
    wrapFetch(fetch, scheduler, tenantOf, bodyLimitBytes) {
      if (!sessionDirectory) return fetch;
      return fleetSessionsFetch(fetch, {
        scheduler,
        ...(tenantOf ? { tenantOf } : {}),
        ...(bodyLimitBytes !== undefined ? { bodyLimitBytes } : {}),
        directory: sessionDirectory,
        nc,
        // The moved step claims its place now rather than at the next control tick: once it waits
        // (after tokenizing), the shared window sees the demand; a second look covers a slow step.
        onAdopted: () => {
          for (const ms of [20, 150]) setTimeout(() => void windowAuthority?.syncAll(), ms).unref();
        },
      });
    },
    async drain(timeoutMs) {
      await service?.drain(timeoutMs);
    },
    async leave() {
      await service?.leave();
    },
    async close() {
      closing = true;
      const orderly = (async () => {
        await service?.stop();
        await windowAuthority?.close();
        await sessionDirectory?.close();
        if (!nc.isClosed()) await nc.drain();
      })().catch(() => undefined);
      // A connection caught mid-reconnect can leave a drain waiting forever; shutdown must not.
      let timer: NodeJS.Timeout | undefined;
      const bounded = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, CLOSE_TIMEOUT_MS);
        timer.unref();
      });
      await Promise.race([orderly, bounded]);
      clearTimeout(timer);
      if (!nc.isClosed()) await nc.close().catch(() => undefined);
    },
  };
}
