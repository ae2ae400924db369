/**
 * @module The NATS adapter's public surface: the service (docs/nats.md), the
 * shared state of scale-out on JetStream KV, and the entry point
 * `sluice serve --nats URL` loads.
 */

import type { LaneClass } from "../../src/types.js";
import { connectNatsFrontend, type NatsFrontend, type NatsFrontendOptions } from "./frontend.js";
import {
  type NatsService,
  type NatsServiceOptions,
  type NatsServiceScheduler,
  startNatsService as startServiceOnConnection,
} from "./service.js";
import type { WindowScheduler } from "./window-authority.js";

export {
  connectNatsFrontend,
  defaultFrontendId,
  type NatsFrontend,
  type NatsFrontendOptions,
} from "./frontend.js";
export {
  type FleetSessionScheduler,
  type FleetSessionsOptions,
  fleetSessionsFetch,
} from "./http-sessions.js";
export {
  BATCHES_BUCKET,
  FILE_OBJECTS,
  FILES_BUCKET,
  JetStreamJobStore,
  type JetStreamJobsBackendOptions,
  JetStreamWorkQueue,
  JOB_SUBJECTS,
  JOBS_BUCKET,
  JOBS_STREAM,
  LINES_BUCKET,
  openJetStreamJobs,
} from "./jetstream-jobs.js";
export { IDEMPOTENCY_BUCKET, KvIdempotencyKeys, type KvIdempotencyOptions } from "./kv-idempotency.js";
export {
  freePort,
  type NatsServerOptions,
  type NatsServerProcess,
  startNatsServer,
} from "./nats-server-process.js";
export * from "./protocol.js";
export type {
  NatsService,
  NatsServiceOptions,
  NatsServiceScheduler,
  SessionRoute,
  SessionRouter,
} from "./service.js";
export {
  type Handover,
  KvSessionDirectory,
  type KvSessionDirectoryOptions,
  SESSIONS_BUCKET,
  type SessionRecordValue,
  type TakeoverAnswer,
} from "./session-directory.js";
export {
  type ClaimRecord,
  isRevisionConflict,
  KvWindowAuthority,
  type KvWindowAuthorityOptions,
  type ShareView,
  WINDOWS_BUCKET,
  type WindowEntry,
  type WindowScheduler,
} from "./window-authority.js";

/** How `sluice serve --nats URL` starts the NATS side for a scheduler it built. */
export interface ServeNatsOptions {
  url: string;
  scheduler: NatsServiceScheduler & WindowScheduler;
  metrics?: { recordRefusal(e: { reason: string; lane: LaneClass | undefined; status: number }): void };
  log?: (line: string) => void;
  /** API keys: NATS requests then carry `Authorization: Bearer KEY`, and sessions are their tenant's. */
  keys?: NatsServiceOptions["keys"];
  /**
   * A frontend connected before the scheduler was built (so the scheduler
   * got its window authority and session directory). Without it, this
   * connects now and the frontend's windows stay its own.
   */
  frontend?: NatsFrontend;
  /** Further frontend options when connecting here. */
  frontendOptions?: Omit<NatsFrontendOptions, "servers" | "log">;
}

/** The NATS side of `sluice serve --nats URL`. */
export interface ServedNats {
  frontend: NatsFrontend;
  /** Stops taking NATS calls now and lets running ones finish for up to `timeoutMs` (see `NatsService.drain`). */
  drain(timeoutMs: number): Promise<void>;
  /** Resolves once this frontend left the queue group and the NATS calls delivered here reached the scheduler. */
  leave(): Promise<void>;
  close(): Promise<void>;
}

/**
 * Starts the NATS service. Given a connection (`nc`), it serves the
 * scheduler on it (`service.ts`); given a `url`, it connects as a frontend
 * (shared session directory and hand-over of session steps included) and
 * `close()` tears it all down.
 */
export function startNatsService(options: NatsServiceOptions): Promise<NatsService>;
export function startNatsService(options: ServeNatsOptions): Promise<ServedNats>;
export async function startNatsService(
  options: NatsServiceOptions | ServeNatsOptions,
): Promise<NatsService | ServedNats> {
  if ("nc" in options) return startServiceOnConnection(options);
  const log = options.log ?? (() => {});
  const frontend =
    options.frontend ??
    (await connectNatsFrontend({
      servers: options.url,
      log,
      ...options.frontendOptions,
      // The scheduler was built without the authority: windows stay its own, sessions are still shared.
      sharedWindows: false,
    }));
  try {
    await frontend.attach(options.scheduler, {
      ...(options.metrics ? { onRefusal: (e) => options.metrics?.recordRefusal(e) } : {}),
      ...(options.keys ? { keys: options.keys } : {}),
    });
  } catch (err) {
    await frontend.close();
    throw err;
  }
  log(
    `sluice NATS API on ${options.url} as frontend ${frontend.frontendId}` +
      (frontend.windowAuthority
        ? " (shared windows and sessions on JetStream KV)"
        : frontend.sessionDirectory
          ? " (shared sessions on JetStream KV)"
          : ""),
  );
  return {
    frontend,
    drain: (timeoutMs) => frontend.drain(timeoutMs),
    leave: () => frontend.leave(),
    close: () => frontend.close(),
  };
}
