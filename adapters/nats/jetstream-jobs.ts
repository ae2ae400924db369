/**
 * @module Jobs on JetStream (`sluice serve --nats`): batches, line results, asynchronous calls and
 * file records in KV buckets, file bodies in the object store, and a work-queue stream from which
 * every frontend takes batches and calls. A frontend that dies stops saying it works on what it
 * took, and JetStream gives that work to another frontend, which runs exactly the lines not yet
 * recorded.
 */

import {
  AckPolicy,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
  type KV,
  type KvEntry,
  type NatsConnection,
  nanos,
  type ObjectStore,
  RetentionPolicy,
  StorageType,
} from "nats";
import type { JobsBackend } from "../jobs/index.js";
import type { JobStore, RecordChange, TakenWork, WorkItem, WorkQueue } from "../jobs/job-store.js";
import type { AsyncJobRecord, BatchRecord, FileRecord, LineResult } from "../jobs/types.js";
import { KvIdempotencyKeys, type KvIdempotencyOptions } from "./kv-idempotency.js";
import { isRevisionConflict } from "./window-authority.js";

/** The work-queue stream: one message per batch or call to run, removed once a runner acknowledged it. */
export const JOBS_STREAM = "SLUICE_JOBS";
/** Subjects of the work queue, by kind of work. */
export const JOB_SUBJECTS: Record<WorkItem["kind"], string> = {
  batch: "sluice.jobs.batch",
  call: "sluice.jobs.call",
};
/** The durable consumers every frontend shares, by kind of work. */
const CONSUMERS: Record<WorkItem["kind"], string> = { batch: "sluice-batches", call: "sluice-calls" };
/** KV buckets (key = id) and the object store of file bodies. */
export const BATCHES_BUCKET = "sluice-batches";
/** Line results, key `<batch id>.<line index>`. */
export const LINES_BUCKET = "sluice-batch-lines";
export const FILES_BUCKET = "sluice-files";
export const JOBS_BUCKET = "sluice-jobs";
export const FILE_OBJECTS = "sluice-file-bodies";

/** Options of {@link openJetStreamJobs}. */
export interface JetStreamJobsOptions {
  nc: NatsConnection;
  /**
   * How long a frontend may stay silent about work it took before JetStream gives it to another
   * frontend, ms. Runners say they still work every second, so this is how long a dead frontend's
   * work waits. Default 30000.
   */
  ackWaitMs?: number;
  /** Batches one frontend runs at once; the others stay in the queue for other frontends. Default 4. */
  batchesPerRunner?: number;
  /** How long a take waits for work before asking again, ms (JetStream wants at least 1000). Default 5000. */
  takeWaitMs?: number;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function decode<T>(entry: KvEntry | null): T | undefined {
  if (entry?.operation !== "PUT" || entry.value.byteLength === 0) return undefined;
  return JSON.parse(decoder.decode(entry.value)) as T;
}

const encode = (value: unknown) => encoder.encode(JSON.stringify(value));

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const all: T[] = [];
  for await (const item of items) all.push(item);
  return all;
}

/**
 * A KV value written only from what was read at a revision: `change` runs again on what another
 * writer stored meanwhile, so no write is lost (the compare-and-set of `KV.update`).
 */
async function updateRecord<R>(kv: KV, key: string, change: RecordChange<R>): Promise<R | undefined> {
  for (;;) {
    const entry = await kv.get(key);
    const current = decode<R>(entry);
    const next = change(current);
    if (next === undefined) return current;
    try {
      if (current === undefined) await kv.create(key, encode(next));
      else await kv.update(key, encode(next), entry!.revision);
      return next;
    } catch (err) {
      if (!isRevisionConflict(err)) throw err;
    }
  }
}

/** Every record of a bucket, newest id first, from just after `after`: ids are time-ordered. */
async function* newestFirst<R>(kv: KV, after: string | undefined): AsyncIterable<R> {
  const keys = (await collect(await kv.keys())).sort().reverse();
  for (const key of keys) {
    if (after !== undefined && key >= after) continue;
    const record = decode<R>(await kv.get(key));
    if (record !== undefined) yield record;
  }
}

/** The job store on JetStream KV and the object store. */
export class JetStreamJobStore implements JobStore {
  readonly durable = true;
  readonly location: string;
  private readonly jsm: JetStreamManager;
  private readonly batches: KV;
  private readonly lines: KV;
  private readonly files: KV;
  private readonly jobs: KV;
  private readonly bodies: ObjectStore;
  /** Largest value a KV write may carry, bytes (the server's max_payload less room for headers). */
  private readonly maxValueBytes: number;

  private constructor(
    nc: NatsConnection,
    jsm: JetStreamManager,
    buckets: [KV, KV, KV, KV],
    bodies: ObjectStore,
  ) {
    this.location = `JetStream at ${nc.getServer()}`;
    this.jsm = jsm;
    [this.batches, this.lines, this.files, this.jobs] = buckets;
    this.bodies = bodies;
    this.maxValueBytes = (nc.info?.max_payload ?? 1024 * 1024) - 4096;
  }

  /** Opens (creating when missing) the buckets and the object store. */
  static async open(nc: NatsConnection): Promise<JetStreamJobStore> {
    const js = nc.jetstream();
    const jsm = await nc.jetstreamManager();
    const buckets = (await Promise.all(
      [BATCHES_BUCKET, LINES_BUCKET, FILES_BUCKET, JOBS_BUCKET].map((name) =>
        js.views.kv(name, { history: 1, storage: StorageType.File }),
      ),
    )) as [KV, KV, KV, KV];
    const bodies = await js.views.os(FILE_OBJECTS, { storage: StorageType.File });
    return new JetStreamJobStore(nc, jsm, buckets, bodies);
  }

  getBatch(id: string): Promise<BatchRecord | undefined> {
    return this.batches.get(id).then((entry) => decode<BatchRecord>(entry));
  }

  async createBatch(record: BatchRecord): Promise<void> {
    await this.batches.create(record.batch.id, encode(record));
  }

  updateBatch(id: string, change: RecordChange<BatchRecord>): Promise<BatchRecord | undefined> {
    return updateRecord(this.batches, id, change);
  }

  listBatches(after?: string): AsyncIterable<BatchRecord> {
    return newestFirst(this.batches, after);
  }

  async removeBatches(ids: readonly string[]): Promise<void> {
    for (const id of ids) {
      await this.jsm.streams.purge(`KV_${LINES_BUCKET}`, { filter: `$KV.${LINES_BUCKET}.${id}.>` });
      await this.batches.purge(id);
    }
  }

  async recordLine(batchId: string, index: number, result: LineResult): Promise<boolean> {
    let data = encode(result);
    if (data.byteLength > this.maxValueBytes) {
      // A KV value cannot exceed the server's max_payload: the line is answered, with why it is not here.
      data = encode({
        ...result,
        response: {
          status_code: 500,
          request_id: result.response?.request_id ?? "",
          body: {
            error: {
              message: `the answer (${data.byteLength} bytes) is larger than the ${this.maxValueBytes} bytes a line result can hold in JetStream`,
              type: "server_error",
              param: null,
              code: "response_too_large",
            },
          },
        },
      } satisfies LineResult);
    }
    try {
      // `create` succeeds only for a key not yet written: the one answer recorded for the line.
      await this.lines.create(`${batchId}.${index}`, data);
      return true;
    } catch (err) {
      if (isRevisionConflict(err)) return false;
      throw err;
    }
  }

  async lineResults(batchId: string): Promise<Map<number, LineResult>> {
    const results = new Map<number, LineResult>();
    const prefix = `${batchId}.`;
    for await (const entry of await this.lines.history({ key: `${prefix}>` })) {
      const result = decode<LineResult>(entry);
      if (result !== undefined) results.set(Number(entry.key.slice(prefix.length)), result);
    }
    return results;
  }

  getFile(id: string): Promise<FileRecord | undefined> {
    return this.files.get(id).then((entry) => decode<FileRecord>(entry));
  }

  async putFile(record: FileRecord, body: string | Uint8Array): Promise<void> {
    await this.bodies.putBlob(
      { name: record.file.id },
      typeof body === "string" ? encoder.encode(body) : body,
    );
    await this.files.put(record.file.id, encode(record));
  }

  async readFileBody(id: string): Promise<Uint8Array> {
    const body = await this.bodies.getBlob(id);
    if (body === null) throw new Error(`file ${id} has no body in the object store`);
    return body;
  }

  async deleteFile(id: string): Promise<void> {
    await this.files.purge(id);
    await this.bodies.delete(id).catch(() => {});
  }

  listFiles(after?: string): AsyncIterable<FileRecord> {
    return newestFirst(this.files, after);
  }

  getJob(id: string): Promise<AsyncJobRecord | undefined> {
    return this.jobs.get(id).then((entry) => decode<AsyncJobRecord>(entry));
  }

  async createJob(record: AsyncJobRecord): Promise<void> {
    await this.jobs.create(record.id, encode(record));
  }

  updateJob(id: string, change: RecordChange<AsyncJobRecord>): Promise<AsyncJobRecord | undefined> {
    return updateRecord(this.jobs, id, change);
  }

  listJobs(): AsyncIterable<AsyncJobRecord> {
    return newestFirst(this.jobs, undefined);
  }

  async removeJobs(ids: readonly string[]): Promise<void> {
    for (const id of ids) await this.jobs.purge(id);
  }

  /** The connection is the frontend's: nothing to close here. */
  async close(): Promise<void> {}
}

/**
 * The work queue every frontend takes from: a JetStream stream with work-queue retention, one shared
 * durable pull consumer per kind. A message stays with the runner that took it while the runner says
 * it works on it; acknowledged, it is gone; left silent for `ackWaitMs`, it goes to another runner.
 */
export class JetStreamWorkQueue implements WorkQueue {
  readonly batchesPerRunner: number;
  private readonly js: JetStreamClient;
  private readonly takeWaitMs: number;

  private constructor(js: JetStreamClient, batchesPerRunner: number, takeWaitMs: number) {
    this.js = js;
    this.batchesPerRunner = batchesPerRunner;
    this.takeWaitMs = takeWaitMs;
  }

  /** Creates the stream and the consumers when missing (each frontend may be the first). */
  static async open(
    nc: NatsConnection,
    options: Omit<JetStreamJobsOptions, "nc"> = {},
  ): Promise<JetStreamWorkQueue> {
    const ackWaitMs = options.ackWaitMs ?? 30_000;
    const batchesPerRunner = options.batchesPerRunner ?? 4;
    const takeWaitMs = options.takeWaitMs ?? 5000;
    for (const [name, value, min] of [
      ["ackWaitMs", ackWaitMs, 1000],
      ["batchesPerRunner", batchesPerRunner, 1],
      ["takeWaitMs", takeWaitMs, 1000],
    ] as const) {
      if (!(Number.isInteger(value) && value >= min)) {
        throw new RangeError(`${name} must be an integer of at least ${min}, got ${value}`);
      }
    }
    const jsm = await nc.jetstreamManager();
    const subjects = Object.values(JOB_SUBJECTS);
    try {
      await jsm.streams.info(JOBS_STREAM);
    } catch {
      await jsm.streams
        .add({
          name: JOBS_STREAM,
          subjects,
          retention: RetentionPolicy.Workqueue,
          storage: StorageType.File,
        })
        // Another frontend created it meanwhile.
        .catch(() => jsm.streams.info(JOBS_STREAM));
    }
    for (const kind of ["batch", "call"] as const) {
      await jsm.consumers.add(JOBS_STREAM, {
        durable_name: CONSUMERS[kind],
        filter_subject: JOB_SUBJECTS[kind],
        ack_policy: AckPolicy.Explicit,
        ack_wait: nanos(ackWaitMs),
        // Work is never dropped for having been delivered often: a batch outlives many frontends.
        max_deliver: -1,
      });
    }
    return new JetStreamWorkQueue(nc.jetstream(), batchesPerRunner, takeWaitMs);
  }

  async offer(item: WorkItem): Promise<void> {
    await this.js.publish(JOB_SUBJECTS[item.kind], encode({ id: item.id }));
  }

  async take(kind: WorkItem["kind"], signal: AbortSignal): Promise<TakenWork | undefined> {
    if (signal.aborted) return undefined;
    const consumer = await this.js.consumers.get(JOBS_STREAM, CONSUMERS[kind]);
    const messages = await consumer.fetch({ max_messages: 1, expires: this.takeWaitMs });
    const stop = () => messages.stop();
    signal.addEventListener("abort", stop, { once: true });
    try {
      for await (const msg of messages) {
        if (signal.aborted) {
          msg.nak();
          return undefined;
        }
        return takenWork(kind, msg);
      }
      return undefined;
    } finally {
      signal.removeEventListener("abort", stop);
    }
  }

  /** The consumers outlive this frontend: they are the queue's, shared by every frontend. */
  async close(): Promise<void> {}
}

function takenWork(kind: WorkItem["kind"], msg: JsMsg): TakenWork {
  const { id } = JSON.parse(decoder.decode(msg.data)) as { id: string };
  let settled = false;
  return {
    item: { kind, id },
    working: () => {
      try {
        if (!settled) msg.working();
      } catch {
        // The connection is away; if it stays away past the ack wait, another frontend takes the work.
      }
    },
    done: async () => {
      if (settled) return;
      settled = true;
      // A lost acknowledgement means a redelivery, and the record then says the work has ended.
      await msg.ackAck().catch(() => false);
    },
    release: () => {
      if (settled) return;
      settled = true;
      try {
        msg.nak();
      } catch {
        // The connection is gone: the ack wait gives the work back instead.
      }
    },
  };
}

/** Options of {@link openJetStreamJobs}. */
export interface JetStreamJobsBackendOptions extends JetStreamJobsOptions {
  /** Bounds of the shared Idempotency-Keys (see `KvIdempotencyKeys`). */
  idempotency?: Omit<KvIdempotencyOptions, "nc">;
}

/** Jobs on JetStream, for `Jobs.open({ backend })`: the store, the shared work queue and the shared keys. */
export async function openJetStreamJobs(options: JetStreamJobsBackendOptions): Promise<JobsBackend> {
  const { nc, idempotency: keyOptions, ...queueOptions } = options;
  const store = await JetStreamJobStore.open(nc);
  const queue = await JetStreamWorkQueue.open(nc, queueOptions);
  const idempotency = await KvIdempotencyKeys.open({ nc, ...keyOptions });
  return {
    store,
    queue,
    idempotency,
    close: async () => {
      idempotency.close();
      await queue.close();
      await store.close();
    },
  };
}
