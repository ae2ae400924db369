/** @module Durable asynchronous work: OpenAI's Batch API, `Prefer: respond-async` calls and Idempotency-Key, over one store. */

import type { Hono } from "hono";
import type { Registry } from "prom-client";
import type { AppEnv, AppPlugin, AppPluginContext } from "../http/plugin.js";
import type { HttpScheduler } from "../http/scheduler-port.js";
import { IdempotencyKeys, type IdempotencyLedger, idempotencyMiddleware } from "./idempotency.js";
import type { JobStore, WorkQueue } from "./job-store.js";
import { LocalWorkQueue } from "./local-work-queue.js";
import { NO_JOB_EVENTS, registerJobMetrics } from "./metrics.js";
import { mountJobRoutes } from "./routes.js";
import { JobRunner } from "./runner.js";
import { LmdbJobStore } from "./store.js";

export { parseBatchInput } from "./batch-input.js";
export {
  IdempotencyKeys,
  type IdempotencyLedger,
  idempotencyMiddleware,
  isFinalStatus,
  type KeyState,
} from "./idempotency.js";
export type { JobStore, RecordChange, TakenWork, WorkItem, WorkQueue } from "./job-store.js";
export { LocalWorkQueue } from "./local-work-queue.js";
export { JobRunner } from "./runner.js";
export { DEFAULT_DATA_DIR, LmdbJobStore, newId } from "./store.js";
export type * from "./types.js";

/** Default largest uploaded file: 200 MiB (OpenAI's limit for a batch input file). */
export const DEFAULT_FILE_LIMIT_BYTES = 200 * 1024 * 1024;

/**
 * Where jobs live when not in the embedded store: a store, the queue runners take work from and the
 * ledger of Idempotency-Keys, shared by every frontend (JetStream with `--nats`). `close` ends them.
 */
export interface JobsBackend {
  store: JobStore;
  queue: WorkQueue;
  idempotency: IdempotencyLedger;
  close(): Promise<void>;
}

/** Options of {@link Jobs.open}. */
export interface JobsOptions {
  scheduler: HttpScheduler;
  /** Where jobs and files live; omitted: a temporary directory (nothing survives a restart). Unused with `backend`. */
  dataDir?: string;
  /** A shared backend instead of the embedded store in `dataDir`. */
  backend?: JobsBackend;
  /** Lines and asynchronous calls running at once. Default 32. */
  concurrency?: number;
  /** Largest uploaded file, bytes. Default 200 MiB. */
  fileLimitBytes?: number;
  /** How long a response is kept for its Idempotency-Key, ms. Default 24 h. Embedded store only (a `backend` has its own ledger). */
  idempotencyTtlMs?: number;
  /** Most responses kept for Idempotency-Keys. Default 10000. Embedded store only. */
  idempotencyMaxRecords?: number;
  /** How long a finished batch, its results and output files are kept, ms. Default 30 days. */
  batchRetentionMs?: number;
  /** Poll interval a pending asynchronous call advertises (Retry-After), s. Default 1. */
  pollSeconds?: number;
  /** Wall clock, ms since the epoch. */
  now?: () => number;
  log?: (line: string) => void;
  /** Registry for the job metrics (`sluice_job_*`, `sluice_batches_active`, `sluice_idempotency_keys`); none when omitted. */
  registry?: Registry;
}

/** The job store, its runner and its routes, opened and closed together; an app plugin (`createApp({ plugins: [jobs] })`). */
export class Jobs implements AppPlugin {
  readonly store: JobStore;
  readonly runner: JobRunner;
  readonly idempotency: IdempotencyLedger;
  private readonly backend: JobsBackend;
  private readonly options: JobsOptions;
  private sweep: ReturnType<typeof setInterval> | undefined;

  private constructor(backend: JobsBackend, options: JobsOptions) {
    this.backend = backend;
    this.store = backend.store;
    this.idempotency = backend.idempotency;
    this.options = options;
    // The gauges read the runner and the keys at scrape time, after both exist.
    const events = options.registry
      ? registerJobMetrics(options.registry, {
          running: () => this.runner.running,
          activeBatches: () => this.runner.activeBatches,
          idempotencyKeys: () => ({ running: this.idempotency.inProgress, stored: this.idempotency.size }),
        })
      : NO_JOB_EVENTS;
    this.runner = new JobRunner({
      events,
      store: backend.store,
      queue: backend.queue,
      scheduler: options.scheduler,
      ...(options.concurrency !== undefined ? { concurrency: options.concurrency } : {}),
      ...(options.batchRetentionMs !== undefined ? { batchRetentionMs: options.batchRetentionMs } : {}),
      ...(options.now ? { now: options.now } : {}),
      ...(options.log ? { log: options.log } : {}),
    });
  }

  /** Opens the store (the backend given, or the embedded one taking `dataDir`); call `start()` once the scheduler runs. */
  static async open(options: JobsOptions): Promise<Jobs> {
    return new Jobs(options.backend ?? (await Jobs.embedded(options)), options);
  }

  /** The embedded backend: LMDB in the data directory, one runner. */
  private static async embedded(options: JobsOptions): Promise<JobsBackend> {
    const store = await LmdbJobStore.open({
      ...(options.dataDir !== undefined ? { dataDir: options.dataDir } : {}),
      ...(options.log ? { log: options.log } : {}),
    });
    const queue = await LocalWorkQueue.open(store);
    const idempotency = new IdempotencyKeys({
      store,
      ...(options.idempotencyTtlMs !== undefined ? { ttlMs: options.idempotencyTtlMs } : {}),
      ...(options.idempotencyMaxRecords !== undefined ? { maxRecords: options.idempotencyMaxRecords } : {}),
      ...(options.now ? { now: options.now } : {}),
    });
    return {
      store,
      queue,
      idempotency,
      close: async () => {
        await queue.close();
        await store.close();
      },
    };
  }

  mount(app: Hono<AppEnv>, ctx: AppPluginContext): void {
    const fileLimitBytes = this.options.fileLimitBytes ?? DEFAULT_FILE_LIMIT_BYTES;
    app.use(
      "*",
      idempotencyMiddleware({
        keys: this.idempotency,
        apiKeys: ctx.keys,
        bodyLimitOf: (path) => (path === "/v1/files" ? fileLimitBytes : ctx.bodyLimitBytes),
      }),
    );
    mountJobRoutes(app, ctx, {
      store: this.store,
      runner: this.runner,
      scheduler: this.options.scheduler,
      fileLimitBytes,
      pollSeconds: this.options.pollSeconds ?? 1,
      now: this.options.now ?? Date.now,
    });
  }

  /** Resumes unfinished batches and calls (after a restart or a crash). */
  async start(): Promise<void> {
    await this.runner.start();
    this.sweep = setInterval(() => this.idempotency.sweep(), 60_000);
    this.sweep.unref();
  }

  /** Stops running work (it runs again after a restart) and closes the store. */
  async close(): Promise<void> {
    if (this.sweep) clearInterval(this.sweep);
    await this.runner.close();
    await this.backend.close();
  }
}
