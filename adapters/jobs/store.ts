/** @module The durable job store: batches, line results, asynchronous calls and idempotency records in LMDB; file bodies on disk. */

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
import type { AsyncJobRecord, BatchRecord, FileRecord, IdempotencyRecord, LineResult } from "./types.js";

/** Default data directory of `sluice serve` (relative to the working directory). */
export const DEFAULT_DATA_DIR = "./.sluice-data";

/** Options of {@link JobStore.open}. */
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

/**
 * Everything jobs need to survive a restart or a crash. Writes are LMDB
 * transactions: a line's result and its batch's counts commit together, so
 * after a crash a line is either recorded once or not at all (and then runs again).
 */
export class JobStore {
  /** Where the store lives; a temporary directory when none was given or the given one was held. */
  readonly dataDir: string;
  /** Whether the store outlives this process. */
  readonly durable: boolean;
  private readonly root: RootDatabase;
  readonly batches: Database<BatchRecord, string>;
  readonly results: Database<LineResult, [string, number]>;
  readonly files: Database<FileRecord, string>;
  readonly jobs: Database<AsyncJobRecord, string>;
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

  /**
   * Opens the store in `dataDir`. When another live sluice holds that directory the store falls back to
   * a temporary one (and says so): serving without durability beats refusing to start, or running
   * the other instance's jobs a second time.
   */
  static async open(options: JobStoreOptions = {}): Promise<JobStore> {
    if (options.dataDir !== undefined) {
      const dir = resolve(options.dataDir);
      let problem: string;
      try {
        mkdirSync(dir, { recursive: true });
        if (lockDataDir(dir)) return new JobStore(dir, true, false);
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
    return new JobStore(dir, false, true);
  }

  /** Runs writes as one transaction; resolves once committed (durable against a process crash). */
  commit(action: () => void): Promise<unknown> {
    return this.root.transaction(action);
  }

  private filePath(id: string): string {
    if (!/^[A-Za-z0-9_-]+$/.test(id)) throw new Error(`bad file id ${JSON.stringify(id)}`);
    return join(this.filesDir, id);
  }

  /** Writes a file's bytes durably, before its record is committed (a record never points at a missing body). */
  writeFileBody(id: string, data: string | Uint8Array): void {
    writeFileDurably(this.filePath(id), data);
  }

  readFileBody(id: string): Promise<Buffer> {
    return readFile(this.filePath(id));
  }

  removeFileBody(id: string): void {
    rmSync(this.filePath(id), { force: true });
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
