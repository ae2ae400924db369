/** @module Runs batches and asynchronous calls from the job store: bounded concurrency, the bulk lane, refusals waited out, results recorded once. */

import type { HttpScheduler } from "../http/scheduler-port.js";
import { type BatchLine, parseBatchInput } from "./batch-input.js";
import { type CallOutcome, executeCall } from "./call-executor.js";
import type { JobStore, TakenWork, WorkItem, WorkQueue } from "./job-store.js";
import { type JobEvents, NO_JOB_EVENTS } from "./metrics.js";
import { newId } from "./store.js";
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
  /** Where batches and calls wait to be taken (the embedded queue, or JetStream's shared one). */
  queue: WorkQueue;
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
  /** Period of the expiry sweep, of the look for cancels made elsewhere and of `working` signals, ms. Default 1000. */
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

/** A batch's counts from its recorded answers: completed are the 2xx ones. */
function countsOf(results: Iterable<LineResult>): { completed: number; failed: number } {
  let completed = 0;
  let failed = 0;
  for (const result of results) {
    if (result.response && result.response.status_code < 300) completed++;
    else failed++;
  }
  return { completed, failed };
}

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
  private readonly queue: WorkQueue;
  /**
   * Records of the unfinished batches this runner holds, the one copy every step changes (a cancel
   * may come while a batch validates). With a shared queue, other runners hold the others.
   */
  private readonly live = new Map<string, BatchRecord>();
  /** The queue's hold on each batch in `live`. */
  private readonly held = new Map<string, TakenWork>();
  /** Per batch, the write in progress and the one waiting behind it (see `persist`). */
  private readonly writes = new Map<string, { tail: Promise<void>; waiting: Promise<void> | undefined }>();
  private readonly batches = new Map<string, BatchWork>();
  /** Batch ids in the order they take turns. */
  private turn: string[] = [];
  private readonly asyncQueue: string[] = [];
  private readonly asyncRunning = new Map<string, AbortController>();
  /** The queue's hold on each call taken and not yet answered. */
  private readonly asyncTaken = new Map<string, TakenWork>();
  /** Pull loops waiting for room to take more work. */
  private roomWaiters: (() => void)[] = [];
  /** Aborted at close: ends the pull loops. */
  private readonly stopping = new AbortController();
  private readonly pulls: Promise<void>[] = [];
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
    this.queue = options.queue;
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

  /** Starts taking work from the queue (after a restart, what was unfinished first) and starts the sweep. */
  async start(): Promise<void> {
    this.tick = setInterval(() => this.sweep(), this.tickMs);
    this.tick.unref();
    this.pulls.push(this.pull("call"), this.pull("batch"));
  }

  private hasRoom(kind: WorkItem["kind"]): boolean {
    if (kind === "call") return this.asyncQueue.length + this.asyncRunning.size < this.concurrency;
    return this.live.size < this.queue.batchesPerRunner;
  }

  /** Takes work of one kind while there is room for it. */
  private async pull(kind: WorkItem["kind"]): Promise<void> {
    while (!this.closed) {
      if (!this.hasRoom(kind)) {
        await new Promise<void>((resolve) => this.roomWaiters.push(resolve));
        continue;
      }
      let taken: TakenWork | undefined;
      try {
        taken = await this.queue.take(kind, this.stopping.signal);
      } catch (err) {
        if (this.closed) return;
        this.log(`sluice: jobs: could not take work: ${(err as Error).message}`);
        await new Promise((resolve) => setTimeout(resolve, this.tickMs).unref());
        continue;
      }
      if (!taken) continue;
      if (this.closed) {
        taken.release();
        return;
      }
      if (kind === "call") {
        this.asyncTaken.set(taken.item.id, taken);
        this.asyncQueue.push(taken.item.id);
        this.pump();
      } else {
        this.background(this.accept(taken));
      }
    }
  }

  /** Starts on a batch taken from the queue, unless it has ended meanwhile (then the queue forgets it). */
  private async accept(taken: TakenWork): Promise<void> {
    const id = taken.item.id;
    if (this.live.has(id)) {
      // Delivered again to the runner that holds it (its word that it works came late): only the
      // newest delivery can be acknowledged, so it becomes the hold.
      this.held.set(id, taken);
      return;
    }
    const record = await this.store.getBatch(id);
    if (this.closed) {
      taken.release();
      return;
    }
    if (!record || TERMINAL_BATCH_STATUSES.has(record.batch.status)) {
      await taken.done();
      return;
    }
    this.live.set(id, record);
    this.held.set(id, taken);
    await this.resume(record);
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

  /** Stores a new batch (status `validating`) and puts it up for a runner to take. */
  async createBatch(record: BatchRecord): Promise<BatchObject> {
    await this.store.createBatch(record);
    await this.queue.offer({ kind: "batch", id: record.batch.id });
    return record.batch;
  }

  /** Asks a batch to stop: `cancelling` at once, `cancelled` once its running lines have ended. */
  async cancelBatch(id: string): Promise<BatchObject | undefined> {
    const record = this.live.get(id);
    if (!record) {
      // Another runner holds it (or none yet): the stored status says so, and its runner sees it.
      const stored = await this.store.updateBatch(id, (current) => {
        const status = current?.batch.status;
        if (!current || (status !== "validating" && status !== "in_progress")) return undefined;
        current.batch.status = "cancelling";
        current.batch.cancelling_at = seconds(this.now());
        return current;
      });
      return stored?.batch;
    }
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

  /**
   * Writes a batch's record as it is in memory. Writes of one batch go one at a time, and a write
   * asked for while another runs waits behind it and carries every change made meanwhile, so a
   * burst of answered lines costs two writes, not one each.
   */
  private persist(record: BatchRecord): Promise<void> {
    const id = record.batch.id;
    const slot = this.writes.get(id) ?? { tail: Promise.resolve(), waiting: undefined };
    this.writes.set(id, slot);
    if (slot.waiting) return slot.waiting;
    const write = slot.tail
      .catch(() => {})
      .then(() => {
        slot.waiting = undefined;
        return this.writeBatch(record);
      });
    slot.waiting = write;
    slot.tail = write;
    return write;
  }

  /** One write of a batch. A cancel stored meanwhile by another frontend wins over this runner's status. */
  private async writeBatch(record: BatchRecord): Promise<void> {
    let cancelledElsewhere = false;
    await this.store.updateBatch(record.batch.id, (stored) => {
      const status = record.batch.status;
      if (
        stored?.batch.status === "cancelling" &&
        status !== "cancelling" &&
        !TERMINAL_BATCH_STATUSES.has(status)
      ) {
        record.batch.status = "cancelling";
        record.batch.cancelling_at = stored.batch.cancelling_at;
        cancelledElsewhere = true;
      }
      return structuredClone(record);
    });
    const work = this.batches.get(record.batch.id);
    if (cancelledElsewhere && work) this.stop(work, "batch_cancelled");
  }

  /** Validates (when not yet done), loads the lines and finds which still need an answer. */
  private async resume(record: BatchRecord): Promise<void> {
    const batch = record.batch;
    let text: string;
    try {
      text = new TextDecoder().decode(await this.store.readFileBody(batch.input_file_id));
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
      await this.end(record);
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
    const done = await this.store.lineResults(batch.id);
    if (this.closed) return;
    batch.request_counts = { total: lines.length, ...countsOf(done.values()) };
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
    await this.end(record);
  }

  /**
   * Ends a batch whose record holds its final status: off this runner's books first (whoever reads
   * the final status finds it held nowhere), then the record written, then the queue told it is done.
   * If the write fails, the batch goes back to the queue to be ended again.
   */
  private async end(record: BatchRecord): Promise<void> {
    const id = record.batch.id;
    const taken = this.held.get(id);
    this.batches.delete(id);
    this.live.delete(id);
    this.held.delete(id);
    this.turn = this.turn.filter((turnId) => turnId !== id);
    this.pump();
    try {
      await this.persist(record);
    } catch (err) {
      taken?.release();
      throw err;
    } finally {
      this.writes.delete(id);
    }
    await taken?.done();
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
      // Another runner may have answered it first (its batch came back to the queue): never count it twice.
      if (await this.store.recordLine(batchId, index, result)) {
        const counts = work.record.batch.request_counts;
        if (outcome.status < 300) counts.completed++;
        else counts.failed++;
        // The answer is recorded: counts written late are rebuilt from the answers at the next start.
        this.background(this.persist(work.record));
      }
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
      // A cancel made elsewhere may have been adopted by that write.
      if (batch.status === "cancelling") work.stopping ??= "batch_cancelled";
      const results = await this.store.lineResults(batch.id);
      const outputLines: string[] = [];
      const errorLines: string[] = [];
      let completed = 0;
      let failed = 0;
      for (let i = 0; i < work.lines.length; i++) {
        const result = results.get(i);
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
      const writeFile = async (suffix: string, rows: string[]) => {
        if (rows.length === 0) return null;
        const id = `file-${batch.id}-${suffix}`;
        const text = `${rows.join("\n")}\n`;
        const file: FileRecord = {
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
        };
        await this.store.putFile(file, text);
        return id;
      };
      batch.output_file_id = await writeFile("output", outputLines);
      batch.error_file_id = await writeFile("error", errorLines);
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
      await this.end(record);
    } catch (err) {
      work.finalizing = false;
      this.log(`sluice: batch ${batch.id} could not be finalized: ${(err as Error).message}`);
    }
  }

  // --- asynchronous single calls --------------------------------------------------------------------

  /** Stores a call answered `202 Accepted` and puts it up for a runner to take. */
  async createAsyncJob(record: AsyncJobRecord): Promise<AsyncJobRecord> {
    await this.store.createJob(record);
    await this.queue.offer({ kind: "call", id: record.id });
    return record;
  }

  /** Cancels a queued or running asynchronous call, whichever runner holds it; its record stays, `cancelled`. */
  async cancelAsyncJob(id: string): Promise<AsyncJobRecord | undefined> {
    const record = await this.store.updateJob(id, (current) => {
      if (!current || (current.status !== "queued" && current.status !== "in_progress")) return undefined;
      current.status = "cancelled";
      current.completed_at = seconds(this.now());
      return current;
    });
    this.asyncRunning.get(id)?.abort(new Stopped("cancelled"));
    return record;
  }

  private async runAsync(id: string): Promise<void> {
    const controller = new AbortController();
    this.asyncRunning.set(id, controller);
    let finished = false;
    try {
      const record = await this.store.updateJob(id, (current) => {
        if (!current || (current.status !== "queued" && current.status !== "in_progress")) return undefined;
        current.status = "in_progress";
        current.started_at ??= seconds(this.now());
        return current;
      });
      if (record?.status !== "in_progress") {
        finished = true;
        return;
      }
      const outcome = await this.runToAnswer("async", record.request, controller.signal, undefined, {
        tenant: record.tenant,
        priority: record.priority,
      });
      // A cancel stored meanwhile (from any frontend) stands: the answer is dropped.
      await this.store.updateJob(id, (current) => {
        if (current?.status !== "in_progress") return undefined;
        current.status = outcome.status < 300 ? "completed" : "failed";
        current.completed_at = seconds(this.now());
        current.response = { status: outcome.status, headers: outcome.headers, body: outcome.body };
        return current;
      });
      finished = true;
    } catch (err) {
      if (err instanceof Stopped) finished = true;
      else if (!(err instanceof Shutdown)) {
        this.log(`sluice: job ${id}: ${(err as Error).message}`);
        if (!this.closed) {
          this.asyncQueue.push(id);
          return;
        }
      }
    } finally {
      this.asyncRunning.delete(id);
    }
    const taken = this.asyncTaken.get(id);
    this.asyncTaken.delete(id);
    if (finished) await taken?.done();
    else taken?.release();
  }

  // --- scheduling -----------------------------------------------------------------------------------

  /** Starts runs while there is room: asynchronous calls first (one caller waits on each), then batches in turn. */
  private pump(): void {
    for (const wake of this.roomWaiters.splice(0)) wake();
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

  /**
   * Expires batches past their window, stops work cancelled by another frontend, tells the queue this
   * runner still works on what it holds, and forgets old jobs and batches once a minute.
   */
  private sweep(): void {
    const now = this.now();
    for (const taken of this.held.values()) taken.working();
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
    for (const taken of this.asyncTaken.values()) taken.working();
    this.background(this.adoptCancels());
    // Finished work ages in hours and days: a scan of the store once a minute is plenty.
    if (now - this.lastPurgeAt >= 60_000) {
      this.lastPurgeAt = now;
      this.background(this.purgeOldJobs(seconds(now - this.jobRetentionMs)));
      this.background(this.purgeFinishedBatches(seconds(now - this.batchRetentionMs)));
    }
  }

  /** Stops batches and calls this runner holds that were cancelled through another frontend. */
  private async adoptCancels(): Promise<void> {
    for (const work of [...this.batches.values()]) {
      if (work.stopping || work.record.batch.status !== "in_progress") continue;
      const stored = await this.store.getBatch(work.record.batch.id);
      if (stored?.batch.status === "cancelling" && !work.stopping) {
        work.record.batch.status = "cancelling";
        work.record.batch.cancelling_at = stored.batch.cancelling_at;
        this.stop(work, "batch_cancelled");
      }
    }
    for (const [id, controller] of [...this.asyncRunning]) {
      if ((await this.store.getJob(id))?.status === "cancelled") controller.abort(new Stopped("cancelled"));
    }
  }

  private async purgeOldJobs(cutoff: number): Promise<void> {
    const expired: string[] = [];
    for await (const job of this.store.listJobs()) {
      if (job.completed_at !== null && job.completed_at < cutoff) expired.push(job.id);
    }
    if (expired.length > 0) await this.store.removeJobs(expired);
  }

  /** Forgets batches that finished before `cutoff` (Unix s): the record, its line results, its output and error files. */
  private async purgeFinishedBatches(cutoff: number): Promise<void> {
    const old: BatchRecord[] = [];
    for await (const value of this.store.listBatches()) {
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
    // Files first: a batch already gone never leaves its output readable, and a stop between the two
    // steps leaves the batch record (forgotten at the next pass), never an orphaned file.
    for (const { batch } of old) {
      for (const id of [batch.output_file_id, batch.error_file_id])
        if (id !== null) await this.store.deleteFile(id);
    }
    await this.store.removeBatches(old.map(({ batch }) => batch.id));
  }

  /** Stops every run without recording it (each runs again after a restart) and waits for them to end. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopping.abort();
    for (const wake of this.roomWaiters.splice(0)) wake();
    if (this.tick) clearInterval(this.tick);
    for (const work of this.batches.values()) {
      for (const controller of work.running.values()) controller.abort(new Shutdown("sluice is stopping"));
    }
    for (const controller of this.asyncRunning.values()) controller.abort(new Shutdown("sluice is stopping"));
    while (this.runs.size > 0 || this.tasks.size > 0) {
      await Promise.allSettled([...this.runs, ...this.tasks]);
    }
    await Promise.allSettled(this.pulls);
    // What this runner held and did not finish goes back for another runner (or the next start).
    for (const taken of this.held.values()) taken.release();
    for (const taken of this.asyncTaken.values()) taken.release();
  }
}
