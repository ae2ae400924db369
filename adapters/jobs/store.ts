/** @module The embedded job store: batches, line results, asynchronous calls and idempotency records in LMDB; file bodies on disk. */

import { randomBytes } from "node:crypto";
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  writeSync,
} from "node:fs";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { type Database, open, type RootDatabase } from "lmdb";
import type { JobStore, RecordChange } from "./job-store.js";
import type { AsyncJobRecord, BatchRecord, FileRecord, IdempotencyRecord, LineResult } from "./types.js";

/** Default data directory of `sluice serve` (relative to the working directory). */
export const DEFAULT_DATA_DIR = "./.sluice-data";

/** Options of {@link LmdbJobStore.open}. */
export interface JobStoreOptions {
  /** Directory that holds the database and the files; created when missing. Omitted: a temporary one, removed on close. */
  dataDir?: string;
  /** Warnings (a data directory held by another running sluice). */
  log?: (line: string) => void;
}

/** Directories this process holds, so two servers in one process never share one. */
const heldHere = new Set<string>();

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Takes the data directory for this process. A lock left by a process that no longer runs (a crash)
 * is taken over; one held by a live process is not, because two runners over one store would run
 * every pending line twice.
 */
function lockDataDir(dir: string): boolean {
  const lockPath = join(dir, "LOCK");
  if (heldHere.has(dir)) return false;
  try {
    const held = Number(readFileSync(lockPath, "utf8").trim());
    if (Number.isInteger(held) && held > 0 && held !== process.pid && pidAlive(held)) return false;
  } catch {
    // no lock yet
  }
  writeFileDurably(lockPath, `${process.pid}\n`);
  heldHere.add(dir);
  return true;
}

/** Writes a file so that a crash leaves either the old file or the whole new one (temporary file, fsync, rename). */
export function writeFileDurably(path: string, data: string | Uint8Array): void {
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
  const fd = openSync(tmp, "w");
  try {
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    let offset = 0;
    while (offset < bytes.byteLength) offset += writeSync(fd, bytes, offset, bytes.byteLength - offset);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
}

/** A time-ordered id: lexical order is creation order, so listings walk the database in key order. */
export function newId(prefix: string, nowMs: number = Date.now()): string {
  return `${prefix}${nowMs.toString(36).padStart(9, "0")}${randomBytes(8).toString("hex")}`;
}

/** Time-ordered ids newest first, from just after `after`: the order of every listing. */
function* newestFirst<R>(db: Database<R, string>, after: string | undefined): Iterable<R> {
  for (const { key, value } of db.getRange({ reverse: true, ...(after ? { start: after } : {}) })) {
    if (key !== after) yield value;
  }
}

/**
 * The embedded store: everything jobs need to survive a restart or a crash, in LMDB under the data
 * directory, file bodies beside it. Writes are LMDB transactions, and a line's answer is written only
 * when none is, in the same transaction that looks: after a crash a line is recorded once or not at
 * all (and then runs again).
 */
export class LmdbJobStore implements JobStore {
  /** Where the store lives; a temporary directory when none was given or the given one was held. */
  readonly dataDir: string;
  readonly durable: boolean;
  private readonly root: RootDatabase;
  private readonly batches: Database<BatchRecord, string>;
  private readonly results: Database<LineResult, [string, number]>;
  private readonly files: Database<FileRecord, string>;
  private readonly jobs: Database<AsyncJobRecord, string>;
  /** Responses kept for Idempotency-Keys, by tenant and key (`IdempotencyKeys` reads and writes them). */
  readonly idempotency: Database<IdempotencyRecord, [string, string]>;
  private readonly filesDir: string;
  private readonly temporary: boolean;
  private closed = false;

  private constructor(dataDir: string, durable: boolean, temporary: boolean) {
    this.dataDir = dataDir;
    this.durable = durable;
    this.temporary = temporary;
    this.filesDir = join(dataDir, "files");
    mkdirSync(this.filesDir, { recursive: true });
    this.root = open({ path: join(dataDir, "jobs.lmdb"), maxDbs: 8, compression: false });
    this.batches = this.root.openDB<BatchRecord, string>({ name: "batches" });
    this.results = this.root.openDB<LineResult, [string, number]>({ name: "results" });
    this.files = this.root.openDB<FileRecord, string>({ name: "files" });
    this.jobs = this.root.openDB<AsyncJobRecord, string>({ name: "jobs" });
    this.idempotency = this.root.openDB<IdempotencyRecord, [string, string]>({ name: "idempotency" });
  }

  get location(): string {
    return this.durable ? this.dataDir : `${this.dataDir} (temporary)`;
  }

  /**
   * Opens the store in `dataDir`. When another live sluice holds that directory the store falls back to
   * a temporary one (and says so): serving without durability beats refusing to start, or running
   * the other instance's jobs a second time.
   */
  static async open(options: JobStoreOptions = {}): Promise<LmdbJobStore> {
    if (options.dataDir !== undefined) {
      const dir = resolve(options.dataDir);
      let problem: string;
      try {
        mkdirSync(dir, { recursive: true });
        if (lockDataDir(dir)) return new LmdbJobStore(dir, true, false);
        problem = "is in use by another running sluice";
      } catch (err) {
        // A directory that cannot be written (read-only, no permission) must not stop sluice from serving.
        heldHere.delete(dir);
        problem = `cannot be used (${(err as Error).message})`;
      }
      options.log?.(
        `sluice: data directory ${dir} ${problem}; jobs and files are kept in a temporary directory and do not survive a restart`,
      );
    }
    const dir = await mkdtemp(join(tmpdir(), "sluice-jobs-"));
    heldHere.add(dir);
    return new LmdbJobStore(dir, false, true);
  }

  /** Runs writes as one transaction; resolves once committed (durable against a process crash). */
  commit(action: () => void): Promise<unknown> {
    return this.root.transaction(action);
  }

  private async update<K extends string, R>(
    db: Database<R, K>,
    key: K,
    change: RecordChange<R>,
  ): Promise<R | undefined> {
    let stored: R | undefined;
    await this.commit(() => {
      const current = db.get(key);
      const next = change(current === undefined ? undefined : structuredClone(current));
      if (next === undefined) stored = current;
      else {
        stored = next;
        db.put(key, next);
      }
    });
    return stored;
  }

  async getBatch(id: string): Promise<BatchRecord | undefined> {
    return this.batches.get(id);
  }

  async createBatch(record: BatchRecord): Promise<void> {
    await this.commit(() => this.batches.put(record.batch.id, record));
  }

  updateBatch(id: string, change: RecordChange<BatchRecord>): Promise<BatchRecord | undefined> {
    return this.update(this.batches, id, change);
  }

  async *listBatches(after?: string): AsyncIterable<BatchRecord> {
    yield* newestFirst(this.batches, after);
  }

  async removeBatches(ids: readonly string[]): Promise<void> {
    await this.commit(() => {
      for (const id of ids) {
        this.batches.remove(id);
        for (const { key } of this.results.getRange({ start: [id, 0], end: [id, Number.MAX_SAFE_INTEGER] })) {
          this.results.remove(key);
        }
      }
    });
  }

  async recordLine(batchId: string, index: number, result: LineResult): Promise<boolean> {
    let recorded = false;
    await this.commit(() => {
      if (this.results.doesExist([batchId, index])) return;
      this.results.put([batchId, index], result);
      recorded = true;
    });
    return recorded;
  }

  async lineResults(batchId: string): Promise<Map<number, LineResult>> {
    const results = new Map<number, LineResult>();
    for (const { key, value } of this.results.getRange({
      start: [batchId, 0],
      end: [batchId, Number.MAX_SAFE_INTEGER],
    })) {
      results.set(key[1], value);
    }
    return results;
  }

  async getFile(id: string): Promise<FileRecord | undefined> {
    return this.files.get(id);
  }

  async putFile(record: FileRecord, body: string | Uint8Array): Promise<void> {
    writeFileDurably(this.filePath(record.file.id), body);
    await this.commit(() => this.files.put(record.file.id, record));
  }

  async deleteFile(id: string): Promise<void> {
    await this.commit(() => this.files.remove(id));
    rmSync(this.filePath(id), { force: true });
  }

  async *listFiles(after?: string): AsyncIterable<FileRecord> {
    yield* newestFirst(this.files, after);
  }

  async getJob(id: string): Promise<AsyncJobRecord | undefined> {
    return this.jobs.get(id);
  }

  async createJob(record: AsyncJobRecord): Promise<void> {
    await this.commit(() => this.jobs.put(record.id, record));
  }

  updateJob(id: string, change: RecordChange<AsyncJobRecord>): Promise<AsyncJobRecord | undefined> {
    return this.update(this.jobs, id, change);
  }

  async *listJobs(): AsyncIterable<AsyncJobRecord> {
    for (const { value } of this.jobs.getRange()) yield value;
  }

  async removeJobs(ids: readonly string[]): Promise<void> {
    await this.commit(() => {
      for (const id of ids) this.jobs.remove(id);
    });
  }

  private filePath(id: string): string {
    if (!/^[A-Za-z0-9_-]+$/.test(id)) throw new Error(`bad file id ${JSON.stringify(id)}`);
    return join(this.filesDir, id);
  }

  async readFileBody(id: string): Promise<Uint8Array> {
    return readFile(this.filePath(id));
  }

  /** Closes the database; a temporary store is removed. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.root.close();
    heldHere.delete(this.dataDir);
    if (this.temporary) rmSync(this.dataDir, { recursive: true, force: true });
    else rmSync(join(this.dataDir, "LOCK"), { force: true });
  }
}
