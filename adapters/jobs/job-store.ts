/**
 * @module The ports of jobs: where batches, line results, files, asynchronous calls and idempotency
 * records are kept (`JobStore`), and where work waits for a runner to take it (`WorkQueue`). Two
 * implementations of each: embedded (LMDB under `--data-dir`, `store.ts`) and JetStream with `--nats`
 * (`adapters/nats/jetstream-jobs.ts`), chosen at the composition root.
 */

import type { AsyncJobRecord, BatchRecord, FileRecord, LineResult } from "./types.js";

/**
 * A change of a record read just before: returns the record to write, or undefined to leave it as it
 * is. It may run more than once (a store that compares and sets runs it again on a conflict), so it
 * must depend only on what it is given.
 */
export type RecordChange<R> = (current: R | undefined) => R | undefined;

/** Everything jobs keep. Every method is asynchronous: a store may be across the network. */
export interface JobStore {
  /** Whether what is kept outlives this process. */
  readonly durable: boolean;
  /** Where it lives, for the log ("/var/lib/sluice", "JetStream at nats://…"). */
  readonly location: string;

  getBatch(id: string): Promise<BatchRecord | undefined>;
  /** Writes a new batch. */
  createBatch(record: BatchRecord): Promise<void>;
  /** Reads, changes and writes a batch so that no write in between is lost; resolves to what is stored. */
  updateBatch(id: string, change: RecordChange<BatchRecord>): Promise<BatchRecord | undefined>;
  /** Batches newest first (ids are time-ordered), from just after `after` when given. */
  listBatches(after?: string): AsyncIterable<BatchRecord>;
  /** Forgets batches with their line results (their output files go with `deleteFile`). */
  removeBatches(ids: readonly string[]): Promise<void>;

  /**
   * Records a line's answer unless one is recorded already: the one point that makes a line answered
   * exactly once, however many runners ran it (a run caught by a crash, a batch redelivered).
   * Resolves true when this answer is the one recorded.
   */
  recordLine(batchId: string, index: number, result: LineResult): Promise<boolean>;
  /** The recorded answers of a batch, by line index. */
  lineResults(batchId: string): Promise<Map<number, LineResult>>;

  getFile(id: string): Promise<FileRecord | undefined>;
  /** Writes a file's bytes, then its record (a record never points at a missing body); overwrites a file of that id. */
  putFile(record: FileRecord, body: string | Uint8Array): Promise<void>;
  readFileBody(id: string): Promise<Uint8Array>;
  /** Forgets a file's record, then its body. */
  deleteFile(id: string): Promise<void>;
  /** Files newest first, from just after `after` when given. */
  listFiles(after?: string): AsyncIterable<FileRecord>;

  getJob(id: string): Promise<AsyncJobRecord | undefined>;
  createJob(record: AsyncJobRecord): Promise<void>;
  updateJob(id: string, change: RecordChange<AsyncJobRecord>): Promise<AsyncJobRecord | undefined>;
  listJobs(): AsyncIterable<AsyncJobRecord>;
  removeJobs(ids: readonly string[]): Promise<void>;

  close(): Promise<void>;
}

/** A unit of work: a whole batch, or one asynchronous call. */
export interface WorkItem {
  kind: "batch" | "call";
  /** The batch's or the job's id. */
  id: string;
}

/** An item a runner took: it is its runner's until `done` or `release`, or until the runner stops saying `working`. */
export interface TakenWork {
  readonly item: WorkItem;
  /** Says the runner still works on it (a queue that redelivers work of a silent runner waits longer). */
  working(): void;
  /** The item is finished: it is never delivered again. */
  done(): Promise<void>;
  /** The runner stops (a graceful shutdown): the item goes back for another runner to take at once. */
  release(): void;
}

/** Where work waits to be taken. */
export interface WorkQueue {
  /** Puts an item up for a runner to take (after its record is stored). */
  offer(item: WorkItem): Promise<void>;
  /**
   * The next item of a kind. Resolves undefined when none came for a while, or once `signal` is
   * aborted; the caller asks again when it still has room.
   */
  take(kind: WorkItem["kind"], signal: AbortSignal): Promise<TakenWork | undefined>;
  /**
   * How many batches one runner holds at once. The embedded queue has one runner, which takes every
   * batch and lets them take turns; a shared queue keeps some for the other runners.
   */
  readonly batchesPerRunner: number;
  close(): Promise<void>;
}
