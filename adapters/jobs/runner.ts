/** @module Runs batches and asynchronous calls from the job store: bounded concurrency, the bulk lane, refusals waited out, results recorded once. */

import type { HttpScheduler } from "../http/app.js";
import { type BatchLine, parseBatchInput } from "./batch-input.js";
import { type CallOutcome, executeCall } from "./call-executor.js";
import { type JobEvents, NO_JOB_EVENTS } from "./metrics.js";
import { type JobStore, newId } from "./store.js";
import {
  type AsyncJobRecord,
  type BatchObject,
  type BatchRecord,
  type BatchValidationError,
  type FileRecord,
  type LineResult,
  TERMINAL_BATCH_STATUSES,
} from "./types.js";

/** Options of {@link JobRunner}. */
export interface JobRunnerOptions {
  store: JobStore;
  scheduler: HttpScheduler;
  /** Lines and asynchronous calls running at once, all batches together. Default 32. */
  concurrency?: number;
  /** Runs of one line whose engine failed mid-way before its failure is its answer. Default 3. */
  maxEngineAttempts?: number;
  /** How long a finished asynchronous call's response is kept, ms. Default 24 h. */
  jobRetentionMs?: number;
  /**
   * How long a finished batch (completed, failed, expired or cancelled) is kept with its results and its
   * output and error files, ms. Default 30 days. Input files are the client's: they stay until deleted.
   */
  batchRetentionMs?: number;
  /** Period of the expiry and retention sweep, ms. Default 1000. */
  tickMs?: number;
  /** Wall clock, ms since the epoch (batch times are Unix seconds). */
  now?: () => number;
  log?: (line: string) => void;
  /** Metrics hooks. */
  events?: JobEvents;
}

/** A batch the runner works on: its record, its lines, which are left and which run. */
interface BatchWork {
  record: BatchRecord;
  lines: BatchLine[];
  /** Line indexes not yet answered nor running, in file order. */
  pending: number[];
  running: Map<number, AbortController>;
  /** Set when the batch stops early: the lines without an answer are reported with this code. */
  stopping: "batch_cancelled" | "batch_expired" | undefined;
  finalizing: boolean;
}

/** Aborts a run because sluice stops: nothing is recorded and the work runs again after a restart. */
class Shutdown extends Error {
  override name = "AbortError";
}

/** Aborts a run because its batch or job was cancelled or expired. */
class Stopped extends Error {
  override name = "AbortError";
}

const seconds = (ms: number) => Math.floor(ms / 1000);

/**
 * The one place jobs run. Every line and every asynchronous call goes through the scheduler like an
 * HTTP call (batch lines declared `bulk`, so interactive work goes first and bulk fills what it leaves).
 * A refusal (429, 529, 503) is not an answer: the run waits its Retry-After and tries again, holding
 * its place. An answer is committed with its batch's counts in one transaction, so a crash loses
 * at most the runs in flight, and those run again after the restart.
 */
export class JobRunner {
  private readonly store: JobStore;
  private readonly scheduler: HttpScheduler;
  private readonly concurrency: number;
  private readonly maxEngineAttempts: number;
  private readonly jobRetentionMs: number;
  private readonly batchRetentionMs: number;
  private lastPurgeAt = Number.NEGATIVE_INFINITY;
  private readonly now: () => number;
  private readonly log: (line: string) => void;
  private readonly tickMs: number;
  private readonly events: JobEvents;
  /** Unfinished batches' records, the one copy every step changes (a cancel may come while a batch validates). */
  private readonly live = new Map<string, BatchRecord>();
  private readonly batches = new Map<string, BatchWork>();
  /** Batch ids in the order they take turns. */
  private turn: string[] = [];
  private readonly asyncQueue: string[] = [];
  private readonly asyncRunning = new Map<string, AbortController>();
  private readonly runs = new Set<Promise<void>>();
  /** Validations, finalizations and sweeps under way, so `close` waits for them before the store closes. */
  private readonly tasks = new Set<Promise<unknown>>();
  /** Refused runs waiting to try again, oldest first. */
  private readonly sleepers: (() => void)[] = [];
  private inflight = 0;
  private tick: ReturnType<typeof setInterval> | undefined;
  private closed = false;

  constructor(options: JobRunnerOptions) {
    this.store = options.store;
    this.scheduler = options.scheduler;
    this.concurrency = options.concurrency ?? 32;
    if (!(Number.isInteger(this.concurrency) && this.concurrency >= 1)) {
      throw new RangeError(`concurrency must be a positive integer, got ${options.concurrency}`);
    }
    this.maxEngineAttempts = options.maxEngineAttempts ?? 3;
    this.jobRetentionMs = options.jobRetentionMs ?? 24 * 3600_000;
    this.batchRetentionMs = options.batchRetentionMs ?? 30 * 24 * 3600_000;
    this.tickMs = options.tickMs ?? 1000;
    this.now = options.now ?? Date.now;
    this.log = options.log ?? (() => {});
    this.events = options.events ?? NO_JOB_EVENTS;
  }

  /** Picks up whatever the store holds unfinished (after a restart or a crash) and starts the sweep. */
  async start(): Promise<void> {
    for (const { value } of this.store.batches.getRange()) {
      if (!TERMINAL_BATCH_STATUSES.has(value.batch.status)) {
        this.live.set(value.batch.id, value);
        await this.resume(value);
      }
    }
    for (const { value } of this.store.jobs.getRange()) {
      if (value.status === "queued" || value.status === "in_progress") this.asyncQueue.push(value.id);
    }
    this.tick = setInterval(() => this.sweep(), this.tickMs);
    this.tick.unref();
    this.pump();
  }

  private background(task: Promise<unknown>): void {
    const tracked = task
      .catch((err: unknown) => {
        if (!this.closed) this.log(`sluice: jobs: ${(err as Error).message}`);
      })
      .finally(() => this.tasks.delete(tracked));
    this.tasks.add(tracked);
  }

  /** Lines and calls running now. */
  get running(): number {
    return this.inflight;
  }

  /** Batches not yet ended (validating, in progress, finalizing, cancelling). */
  get activeBatches(): number {
    return this.live.size;
  }

  // --- batches ------------------------------------------------------------------------------------

  /** Stores a new batch (status `validating`) and starts on it. */
  async createBatch(record: BatchRecord): Promise<BatchObject> {
    await this.store.commit(() => this.store.batches.put(record.batch.id, record));
    this.live.set(record.batch.id, record);
    this.background(this.resume(record));
    return record.batch;
  }

  /** Asks a batch to stop: `cancelling` at once, `cancelled` once its running lines have ended. */
  async cancelBatch(id: string): Promise<BatchObject | undefined> {
    const record = this.live.get(id);
    if (!record) return this.store.batches.get(id)?.batch;
    const batch = record.batch;
    const work = this.batches.get(id);
    if (batch.status !== "validating" && batch.status !== "in_progress") return batch;
    if (work?.finalizing) return batch;
    batch.status = "cancelling";
    batch.cancelling_at = seconds(this.now());
    await this.persist(record);
    // A batch still validating has no work yet: it stops as soon as its lines are read.
    if (work) this.stop(work, "batch_cancelled");
    return batch;
  }

  private stop(work: BatchWork, code: "batch_cancelled" | "batch_expired"): void {
    work.stopping ??= code;
    work.pending = [];
    for (const controller of work.running.values()) controller.abort(new Stopped(code));
    if (work.running.size === 0) this.background(this.finalize(work));
  }

  private persist(record: BatchRecord): Promise<unknown> {
    const snapshot = structuredClone(record);
    return this.store.commit(() => this.store.batches.put(snapshot.batch.id, snapshot));
  }

  /** Validates (when not yet done), loads the lines and finds which still need an answer. */
  private async resume(record: BatchRecord): Promise<void> {
    const batch = record.batch;
    let text: string;
    try {
      text = (await this.store.readFileBody(batch.input_file_id)).toString("utf8");
    } catch {
      await this.fail(record, [
        {
          code: "file_not_found",
          message: `input file ${batch.input_file_id} is gone`,
          param: "input_file_id",
          line: null,
        },
      ]);
      return;
    }
    if (this.closed) return;
    const { lines, errors } = parseBatchInput(text, batch.endpoint);
    if (batch.status === "cancelling" && errors.length > 0 && batch.in_progress_at === null) {
      // Cancelled before its lines were read, and they could not have run anyway.
      batch.status = "cancelled";
      batch.cancelled_at = seconds(this.now());
      await this.persist(record);
      this.live.delete(batch.id);
      return;
    }
    if (batch.status === "validating") {
      if (errors.length > 0) {
        await this.fail(record, errors);
        return;
      }
      batch.status = "in_progress";
      batch.in_progress_at = seconds(this.now());
      batch.request_counts = { total: lines.length, completed: 0, failed: 0 };
      await this.persist(record);
      if (this.closed) return;
    }
    // Counts are rebuilt from the recorded answers, the one source of truth after a crash.
    const done = new Set<number>();
    let completed = 0;
    let failed = 0;
    for (const { key, value } of this.store.results.getRange({
      start: [batch.id, 0],
      end: [batch.id, Number.MAX_SAFE_INTEGER],
    })) {
      done.add(key[1]);
      if (value.response && value.response.status_code < 300) completed++;
      else failed++;
    }
    batch.request_counts = { total: lines.length, completed, failed };
    const work: BatchWork = {
      record,
      lines,
      pending: [],
      running: new Map(),
      stopping: undefined,
      finalizing: false,
    };
    this.batches.set(batch.id, work);
    this.turn.push(batch.id);
    if (batch.status === "in_progress") {
      for (let i = 0; i < lines.length; i++) if (!done.has(i)) work.pending.push(i);
      if (work.pending.length === 0) this.background(this.finalize(work));
      else this.pump();
    } else if (batch.status === "cancelling") {
      this.stop(work, "batch_cancelled");
    } else {
      // finalizing: the crash came while the output files were written; write them again.
      this.background(this.finalize(work));
    }
  }

  private async fail(record: BatchRecord, errors: BatchValidationError[]): Promise<void> {
    const batch = record.batch;
    batch.status = "failed";
    batch.failed_at = seconds(this.now());
    batch.errors = { object: "list", data: errors };
    await this.persist(record);
    this.live.delete(batch.id);
  }

  private async runLine(work: BatchWork, index: number): Promise<void> {
    const line = work.lines[index]!;
    const controller = new AbortController();
    work.running.set(index, controller);
    const batchId = work.record.batch.id;
    try {
      const outcome = await this.runToAnswer("line", line.call, controller.signal, "bulk", {
        tenant: work.record.tenant,
        priority: work.record.priority,
      });
      const result: LineResult = {
        id: newId("batch_req_"),
        custom_id: line.customId,
        response: { status_code: outcome.status, request_id: outcome.requestId, body: outcome.body },
        error: null,
      };
      const counts = work.record.batch.request_counts;
      if (outcome.status < 300) counts.completed++;
      else counts.failed++;
      const snapshot = structuredClone(work.record);
      await this.store.commit(() => {
        this.store.results.put([batchId, index], result);
        this.store.batches.put(batchId, snapshot);
      });
    } catch (err) {
      if (!(err instanceof Shutdown || err instanceof Stopped)) {
        // Unexpected (a store failure): the line goes back to wait its turn rather than be lost.
        this.log(`sluice: batch ${batchId} line ${index + 1}: ${(err as Error).message}`);
        if (!work.stopping && !this.closed) work.pending.push(index);
      }
    } finally {
      work.running.delete(index);
      if (work.running.size === 0 && work.pending.length === 0 && !this.closed)
        this.background(this.finalize(work));
    }
  }

  /** Runs a call until it has an answer: refusals are waited out, engine failures retried a few times. */
  private async runToAnswer(
    kind: "line" | "async",
    call: BatchLine["call"],
    signal: AbortSignal,
    lane: "bulk" | undefined,
    owner: { tenant: string; priority: number },
  ): Promise<CallOutcome & { kind: "answered" }> {
    let engineFailures = 0;
    for (;;) {
      const outcome = await executeCall(this.scheduler, call, {
        requestId: newId("req_"),
        owner,
        ...(lane ? { lane } : {}),
        signal,
      });
      if (outcome.kind === "answered") return this.answered(kind, outcome);
      if (outcome.engineFailure && ++engineFailures >= this.maxEngineAttempts) {
        return this.answered(kind, outcome.answer);
      }
      const code = (outcome.answer.body as { error?: { code?: string } }).error?.code;
      this.events.retried(typeof code === "string" ? code : "unavailable");
      await this.waitToRetry(outcome.afterMs, signal);
    }
  }

  private answered(
    kind: "line" | "async",
    outcome: CallOutcome & { kind: "answered" },
  ): CallOutcome & { kind: "answered" } {
    this.events.answered(kind, outcome.status < 300 ? "completed" : "failed");
    this.wakeOne();
    return outcome;
  }

  /**
   * Waits a refusal's Retry-After, or less: when one of the runner's own calls ends, the capacity it
   * held is free, so the longest-waiting refused run tries again at once rather than leave it idle.
   */
  private waitToRetry(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      if (signal.aborted) return reject(signal.reason);
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        const at = this.sleepers.indexOf(wake);
        if (at >= 0) this.sleepers.splice(at, 1);
      };
      const wake = () => {
        done();
        resolve();
      };
      const onAbort = () => {
        done();
        reject(signal.reason);
      };
      const timer = setTimeout(wake, ms);
      signal.addEventListener("abort", onAbort, { once: true });
      this.sleepers.push(wake);
    });
  }

  private wakeOne(): void {
    this.sleepers[0]?.();
  }

  /** Writes the output and error files and ends the batch; safe to run again after a crash mid-way. */
  private async finalize(work: BatchWork): Promise<void> {
    if (work.finalizing || this.closed) return;
    work.finalizing = true;
    const record = work.record;
    const batch = record.batch;
    try {
      if (!work.stopping && batch.status !== "finalizing") {
        batch.status = "finalizing";
        batch.finalizing_at = seconds(this.now());
        await this.persist(record);
      }
      const outputLines: string[] = [];
      const errorLines: string[] = [];
      let completed = 0;
      let failed = 0;
      for (let i = 0; i < work.lines.length; i++) {
        const result = this.store.results.get([batch.id, i]);
        if (result) {
          if (result.response && result.response.status_code < 300) {
            completed++;
            outputLines.push(JSON.stringify(result));
          } else {
            failed++;
            errorLines.push(JSON.stringify(result));
          }
        } else {
          // Only a batch stopped early has lines without an answer.
          failed++;
          const code = work.stopping ?? "batch_cancelled";
          const unanswered: LineResult = {
            id: `batch_req_${batch.id}_${i}`,
            custom_id: work.lines[i]!.customId,
            response: null,
            error: {
              code,
              message:
                code === "batch_expired"
                  ? "the batch expired before this request ran"
                  : "the batch was cancelled before this request ran",
            },
          };
          errorLines.push(JSON.stringify(unanswered));
        }
      }
      const created = seconds(this.now());
      const files: FileRecord[] = [];
      const writeFile = (suffix: string, rows: string[]) => {
        if (rows.length === 0) return null;
        const id = `file-${batch.id}-${suffix}`;
        const text = `${rows.join("\n")}\n`;
        this.store.writeFileBody(id, text);
        files.push({
          tenant: record.tenant,
          file: {
            id,
            object: "file",
            bytes: Buffer.byteLength(text),
            created_at: created,
            filename: `${batch.id}_${suffix}.jsonl`,
            purpose: "batch_output",
            status: "processed",
            status_details: null,
            expires_at: null,
          },
        });
        return id;
      };
      batch.output_file_id = writeFile("output", outputLines);
      batch.error_file_id = writeFile("error", errorLines);
      batch.request_counts = { total: work.lines.length, completed, failed };
      if (work.stopping === "batch_expired") {
        batch.status = "expired";
        batch.expired_at = created;
      } else if (work.stopping === "batch_cancelled") {
        batch.status = "cancelled";
        batch.cancelled_at = created;
      } else {
        batch.status = "completed";
        batch.completed_at = created;
      }
      const snapshot = structuredClone(record);
      await this.store.commit(() => {
        for (const file of files) this.store.files.put(file.file.id, file);
        this.store.batches.put(batch.id, snapshot);
      });
      this.batches.delete(batch.id);
      this.live.delete(batch.id);
      this.turn = this.turn.filter((id) => id !== batch.id);
    } catch (err) {
      work.finalizing = false;
      this.log(`sluice: batch ${batch.id} could not be finalized: ${(err as Error).message}`);
    }
  }

  // --- asynchronous single calls --------------------------------------------------------------------

  /** Stores a call answered `202 Accepted` and queues it. */
  async createAsyncJob(record: AsyncJobRecord): Promise<AsyncJobRecord> {
    await this.store.commit(() => this.store.jobs.put(record.id, record));
    this.asyncQueue.push(record.id);
    this.pump();
    return record;
  }

  /** Cancels a queued or running asynchronous call; its record stays, `cancelled`. */
  async cancelAsyncJob(id: string): Promise<AsyncJobRecord | undefined> {
    const record = this.store.jobs.get(id);
    if (!record) return undefined;
    if (record.status !== "queued" && record.status !== "in_progress") return record;
    const queued = this.asyncQueue.indexOf(id);
    if (queued >= 0) this.asyncQueue.splice(queued, 1);
    this.asyncRunning.get(id)?.abort(new Stopped("cancelled"));
    record.status = "cancelled";
    record.completed_at = seconds(this.now());
    await this.store.commit(() => this.store.jobs.put(id, record));
    return record;
  }

  private async runAsync(id: string): Promise<void> {
    const record = this.store.jobs.get(id);
    if (!record || (record.status !== "queued" && record.status !== "in_progress")) return;
    const controller = new AbortController();
    this.asyncRunning.set(id, controller);
    try {
      record.status = "in_progress";
      record.started_at ??= seconds(this.now());
      await this.store.commit(() => this.store.jobs.put(id, record));
      const outcome = await this.runToAnswer("async", record.request, controller.signal, undefined, {
        tenant: record.tenant,
        priority: record.priority,
      });
      record.status = outcome.status < 300 ? "completed" : "failed";
      record.completed_at = seconds(this.now());
      record.response = { status: outcome.status, headers: outcome.headers, body: outcome.body };
      await this.store.commit(() => this.store.jobs.put(id, record));
    } catch (err) {
      if (!(err instanceof Shutdown || err instanceof Stopped)) {
        this.log(`sluice: job ${id}: ${(err as Error).message}`);
        if (!this.closed) this.asyncQueue.push(id);
      }
    } finally {
      this.asyncRunning.delete(id);
    }
  }

  // --- scheduling -----------------------------------------------------------------------------------

  /** Starts runs while there is room: asynchronous calls first (one caller waits on each), then batches in turn. */
  private pump(): void {
    while (!this.closed && this.inflight < this.concurrency) {
      const next = this.next();
      if (!next) return;
      this.inflight++;
      const run = next().finally(() => {
        this.inflight--;
        this.runs.delete(run);
        this.pump();
      });
      this.runs.add(run);
    }
  }

  private next(): (() => Promise<void>) | undefined {
    const asyncId = this.asyncQueue.shift();
    if (asyncId !== undefined) return () => this.runAsync(asyncId);
    for (let k = 0; k < this.turn.length; k++) {
      const id = this.turn.shift()!;
      this.turn.push(id);
      const work = this.batches.get(id);
      if (!work || work.stopping || work.record.batch.status !== "in_progress") continue;
      const index = work.pending.shift();
      if (index !== undefined) return () => this.runLine(work, index);
    }
    return undefined;
  }

  /** Expires batches past their window and forgets asynchronous responses past their retention. */
  private sweep(): void {
    const now = this.now();
    for (const work of this.batches.values()) {
      const expiresAt = work.record.batch.expires_at;
      if (
        expiresAt !== null &&
        expiresAt * 1000 <= now &&
        !work.stopping &&
        work.record.batch.status === "in_progress"
      ) {
        this.stop(work, "batch_expired");
      }
    }
    const cutoff = seconds(now - this.jobRetentionMs);
    const expired: string[] = [];
    for (const { value } of this.store.jobs.getRange()) {
      if (value.completed_at !== null && value.completed_at < cutoff) expired.push(value.id);
    }
    if (expired.length > 0) {
      this.background(
        this.store.commit(() => {
          for (const id of expired) this.store.jobs.remove(id);
        }),
      );
    }
    // Finished batches age in days: a scan of the store once a minute is plenty.
    if (now - this.lastPurgeAt >= 60_000) {
      this.lastPurgeAt = now;
      this.purgeFinishedBatches(seconds(now - this.batchRetentionMs));
    }
  }

  /** Forgets batches that finished before `cutoff` (Unix s): the record, its line results, its output and error files. */
  private purgeFinishedBatches(cutoff: number): void {
    const old: BatchRecord[] = [];
    for (const { value } of this.store.batches.getRange()) {
      const b = value.batch;
      const endedAt = b.completed_at ?? b.failed_at ?? b.expired_at ?? b.cancelled_at;
      if (
        TERMINAL_BATCH_STATUSES.has(b.status) &&
        endedAt !== null &&
        endedAt < cutoff &&
        !this.batches.has(b.id)
      ) {
        old.push(value);
      }
    }
    if (old.length === 0) return;
    const files = old.flatMap(({ batch }) =>
      [batch.output_file_id, batch.error_file_id].filter((id): id is string => id !== null),
    );
    this.background(
      this.store
        .commit(() => {
          for (const { batch } of old) {
            this.store.batches.remove(batch.id);
            for (const { key } of this.store.results.getRange({
              start: [batch.id, 0],
              end: [batch.id, Number.MAX_SAFE_INTEGER],
            })) {
              this.store.results.remove(key);
            }
          }
          for (const id of files) this.store.files.remove(id);
        })
        // A body goes after its record: a record never points at a missing body.
        .then(() => {
          for (const id of files) this.store.removeFileBody(id);
        }),
    );
  }

  /** Stops every run without recording it (each runs again after a restart) and waits for them to end. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.tick) clearInterval(this.tick);
    for (const work of this.batches.values()) {
      for (const controller of work.running.values()) controller.abort(new Shutdown("sluice is stopping"));
    }
    for (const controller of this.asyncRunning.values()) controller.abort(new Shutdown("sluice is stopping"));
    while (this.runs.size > 0 || this.tasks.size > 0) {
      await Promise.allSettled([...this.runs, ...this.tasks]);
    }
  }
}
