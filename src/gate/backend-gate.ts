/** @module The per-rank backend gate (docs/how-it-works.md#per-rank-gate) with optional interactive/bulk lanes inside it (docs/how-it-works.md#token-budget-and-feasibility). */

import { type Cancel, type Clock, realClock } from "../clock.js";
import { DEFAULT_OVERLOAD_STATUS } from "../config/defaults.js";
import { Refusal } from "../errors.js";
import type { Lane } from "../types.js";
import { DrainEstimator } from "./drain-estimator.js";
import { GateCancelled, GateRejection, type GateRejectionScope } from "./gate-errors.js";
import { type LaneIndex, ShareWindow } from "./share-window.js";

export { GateCancelled, GateRejection, type GateRejectionScope } from "./gate-errors.js";

/** Queue settings of one lane. */
export interface LaneQueueOptions {
  /** Calls this lane may hold queued, over all ranks; default the gate's combined queue limit. */
  queueLimit?: number;
  /** Longest a call may wait in this lane, ms; beyond it is refused with `queue_timeout`. */
  maxResidenceMs?: number;
}

/** Lanes inside the gate (docs/how-it-works.md#token-budget-and-feasibility). */
export interface LaneOptions {
  /** Default residence 10 000 ms. */
  interactive?: LaneQueueOptions;
  /** Default residence 300 000 ms. */
  bulk?: LaneQueueOptions;
  /** Share (0–1) of admitted prefill tokens bulk is guaranteed while interactive waits. Default 0.1. */
  bulkFloorShare?: number;
  /** Share (0–1) of admitted prefill tokens bulk is held at while interactive waits. Default 0.5. */
  bulkMaxShare?: number;
  /** Sliding window the shares are measured over, ms. Default 60 000. */
  shareWindowMs?: number;
}

export interface BackendGateOptions {
  /** Admitted calls per rank, integer ≥ 1. */
  engineRequestLimit: number;
  /** Admitted calls per rank before their first token, integer ≥ 1. */
  engineRequestWaitingLimit: number;
  /** Queued calls per rank, integer ≥ 0 (0: no queue). */
  requestQueueLimit: number;
  /** Data-parallel size. Omitted: one rank assumed and every call unranked until `setRanks`. */
  ranks?: number;
  /** Interactive and bulk lanes; omitted: one FIFO lane and no residence limit. */
  lanes?: LaneOptions;
  /** Time source; default real time. */
  clock?: Clock;
  /** HTTP status of a gate rejection (`--overload-status`). Default 529. */
  overloadStatus?: number;
  /** Window the completion rate behind `Retry-After` is measured over, ms. Default 30 000. */
  drainWindowMs?: number;
  /**
   * The replica's one drain estimate, shared with whoever else answers
   * Retry-After for it (the scheduler's token budget and session queue), so
   * every refusal from one replica is timed by one rate. The gate records
   * every call that ends. Default: its own.
   */
  drain?: DrainEstimator;
}

export interface AcquireRequest {
  /** Data-parallel rank; absent, unknown or not yet reported ranks: the call is unranked. */
  rank?: number;
  /** Lane; default `interactive` when lanes are on. */
  lane?: Lane;
  /** Aborting it while queued withdraws the call; aborted already, nothing is reserved. */
  signal?: AbortSignal;
  /** Prefill tokens this call will compute (share accounting between lanes). Default 1. */
  prefillTokens?: number;
}

/** What an admitted call holds. Release it when the response stream ends, however it ends. */
export interface Permit {
  /** `direct`: admitted on arrival; `queue`: admitted after waiting. */
  readonly source: "direct" | "queue";
  /** Time spent queued, ms (0 when direct). */
  readonly queueMs: number;
  /** The rank whose limits it counts against; undefined for an unranked call. */
  readonly rank: number | undefined;
  /** The lane it was admitted in (undefined when lanes are off and none was given). */
  readonly lane: Lane | undefined;
  /** Ends the waiting part (first generated token). Idempotent. */
  firstToken(): void;
  /** Ends the call, and the waiting part if still held. Idempotent. */
  release(): void;
}

/** Occupancy of one rank, or of the unranked calls. */
export interface GateOccupancy {
  requests: number;
  waiting: number;
  queued: number;
}

export interface LaneQueueSnapshot {
  queued: number;
  /** Age of the oldest queued call, ms (0 when none). */
  oldestAgeMs: number;
}

export interface GateSnapshot extends GateOccupancy {
  ranks: Array<GateOccupancy & { rank: number }>;
  unranked: GateOccupancy;
  /** Per-lane queues; present only when lanes are on (otherwise there is one FIFO). */
  lanes?: Record<Lane, LaneQueueSnapshot>;
}

export interface GateCounters {
  received: number;
  admittedDirect: number;
  admittedQueue: number;
  /** Gate rejections, lane `queue_full` and `queue_timeout` refusals. */
  rejected: number;
  cancelled: number;
}

/** Cumulative counters of one rank (`"unspecified"`: unranked calls), rejections split by scope. */
export interface RankCounters {
  rank: number | "unspecified";
  received: number;
  admittedDirect: number;
  admittedQueue: number;
  rejected: { worker: number; rank: number; lane: number };
  cancelled: number;
}

/** The gate's per-rank limits. */
export interface GateLimitValues {
  engineRequestLimit: number;
  engineRequestWaitingLimit: number;
  requestQueueLimit: number;
}

const INTERACTIVE = 0;
const BULK = 1;
const LANE_NAMES: readonly [Lane, Lane] = ["interactive", "bulk"];
const DEFAULT_RESIDENCE_MS: readonly [number, number] = [10_000, 300_000];

// Symbol-keyed so permits and waiters can reach the gate's bookkeeping without it being API.
const END_WAITING = Symbol("endWaiting");
const END_CALL = Symbol("endCall");
const ABORT = Symbol("abort");
const EXPIRE = Symbol("expire");

interface SlotStats {
  received: number;
  admittedDirect: number;
  admittedQueue: number;
  rejectedWorker: number;
  rejectedRank: number;
  rejectedLane: number;
  cancelled: number;
}

/** One rank (or the unranked calls): what it holds, and its queue as one FIFO list per lane. */
class Slot {
  requests = 0;
  waiting = 0;
  queued = 0;
  readonly heads: [Waiter | undefined, Waiter | undefined] = [undefined, undefined];
  readonly tails: [Waiter | undefined, Waiter | undefined] = [undefined, undefined];
  readonly stats: SlotStats = {
    received: 0,
    admittedDirect: 0,
    admittedQueue: 0,
    rejectedWorker: 0,
    rejectedRank: 0,
    rejectedLane: 0,
    cancelled: 0,
  };

  constructor(readonly rank: number | undefined) {}

  /** The oldest queued call of this slot, over both lanes. */
  oldestHead(): Waiter | undefined {
    const a = this.heads[0];
    const b = this.heads[1];
    if (a === undefined) return b;
    if (b === undefined) return a;
    return a.seq < b.seq ? a : b;
  }

  push(w: Waiter): void {
    const tail = this.tails[w.lane];
    w.prev = tail;
    w.next = undefined;
    if (tail === undefined) this.heads[w.lane] = w;
    else tail.next = w;
    this.tails[w.lane] = w;
  }

  unlink(w: Waiter): void {
    if (w.prev === undefined) this.heads[w.lane] = w.next;
    else w.prev.next = w.next;
    if (w.next === undefined) this.tails[w.lane] = w.prev;
    else w.next.prev = w.prev;
    w.prev = w.next = undefined;
  }
}

/** A queued call. It is its own abort listener, so queueing allocates no closure for the signal. */
class Waiter {
  prev: Waiter | undefined = undefined;
  next: Waiter | undefined = undefined;
  queued = true;
  cancelTimer: Cancel | undefined = undefined;
  resolve!: (permit: Permit) => void;
  reject!: (error: unknown) => void;

  constructor(
    readonly gate: BackendGate,
    public slot: Slot,
    readonly stats: SlotStats,
    readonly seq: number,
    readonly lane: LaneIndex,
    readonly laneName: Lane | undefined,
    readonly tokens: number,
    readonly arrivedAt: number,
    readonly signal: AbortSignal | undefined,
  ) {}

  handleEvent(): void {
    this.gate[ABORT](this);
  }
}

class GatePermit implements Permit {
  /** 2: requests and waiting held; 1: requests only; 0: released. */
  private held: 0 | 1 | 2 = 2;
  readonly rank: number | undefined;

  constructor(
    private readonly gate: BackendGate,
    private readonly slot: Slot,
    readonly source: "direct" | "queue",
    readonly queueMs: number,
    readonly lane: Lane | undefined,
  ) {
    this.rank = slot.rank;
  }

  firstToken(): void {
    if (this.held !== 2) return;
    this.held = 1;
    this.gate[END_WAITING](this.slot);
  }

  release(): void {
    if (this.held === 0) return;
    const waiting = this.held === 2;
    this.held = 0;
    this.gate[END_CALL](this.slot, waiting);
  }
}

interface ResolvedLanes {
  queueLimit: [number | undefined, number | undefined];
  residenceMs: [number, number];
  floor: number;
  max: number;
  windowMs: number;
}

function checkInteger(name: string, value: unknown, min: number): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < min) {
    throw new RangeError(`${name} must be an integer ≥ ${min}, got ${String(value)}`);
  }
  return value;
}

function checkShare(name: string, value: unknown): number {
  if (typeof value !== "number" || !(value >= 0 && value <= 1)) {
    throw new RangeError(`${name} must be a number between 0 and 1, got ${String(value)}`);
  }
  return value;
}

function resolveLanes(lanes: LaneOptions): ResolvedLanes {
  if (typeof lanes !== "object" || lanes === null) {
    throw new RangeError(`lanes must be an object, got ${String(lanes)}`);
  }
  const queueLimit: [number | undefined, number | undefined] = [undefined, undefined];
  const residenceMs: [number, number] = [DEFAULT_RESIDENCE_MS[0], DEFAULT_RESIDENCE_MS[1]];
  for (const index of [INTERACTIVE, BULK] as const) {
    const name = LANE_NAMES[index];
    const lane = lanes[name];
    if (lane === undefined) continue;
    if (lane.queueLimit !== undefined)
      queueLimit[index] = checkInteger(`lanes.${name}.queueLimit`, lane.queueLimit, 0);
    if (lane.maxResidenceMs !== undefined) {
      const ms = lane.maxResidenceMs;
      if (typeof ms !== "number" || !(ms > 0)) {
        throw new RangeError(
          `lanes.${name}.maxResidenceMs must be a positive number of ms, got ${String(ms)}`,
        );
      }
      residenceMs[index] = ms;
    }
  }
  const floor = checkShare("lanes.bulkFloorShare", lanes.bulkFloorShare ?? 0.1);
  const max = checkShare("lanes.bulkMaxShare", lanes.bulkMaxShare ?? 0.5);
  if (floor > max) {
    throw new RangeError(`lanes.bulkFloorShare (${floor}) must not exceed lanes.bulkMaxShare (${max})`);
  }
  const windowMs = lanes.shareWindowMs ?? 60_000;
  if (typeof windowMs !== "number" || !(windowMs > 0 && Number.isFinite(windowMs))) {
    throw new RangeError(`lanes.shareWindowMs must be a positive number of ms, got ${String(windowMs)}`);
  }
  return { queueLimit, residenceMs, floor, max, windowMs };
}

/**
 * The per-rank backend gate. Each rank has two engine limits (admitted calls,
 * and admitted calls before their first token) and a bounded FIFO queue; calls
 * without a (known) rank share one queue and draw on the combined capacity
 * only. A newcomer never overtakes a queued call; freed capacity goes to the
 * oldest queued call that fits. With lanes, interactive goes first, bulk keeps
 * a floor share of admitted prefill tokens and is capped while interactive
 * waits, and each lane bounds how long a call may wait.
 *
 * Invariant: once idle, `received = admittedDirect + admittedQueue + rejected + cancelled`.
 */
export class BackendGate {
  private readonly clock: Clock;
  private readonly overloadStatus: number;
  private readonly completions: DrainEstimator;
  private readonly lanes: ResolvedLanes | undefined;
  private readonly shares: ShareWindow | undefined;

  private engineRequestLimit: number;
  private engineRequestWaitingLimit: number;
  private requestQueueLimit: number;
  private rankCountValue: number;
  private ranksKnownValue: boolean;
  private combinedRequests = 0;
  private combinedWaiting = 0;
  private combinedQueue = 0;

  /** Every rank slot ever created (a rank dropped by `setRanks` keeps what it still holds). */
  private readonly slots: Slot[] = [];
  private readonly unranked = new Slot(undefined);
  /** The slots calls can be queued in: ranks below the rank count, and the unranked slot. */
  private active: Slot[] = [];

  private totalRequests = 0;
  private totalWaiting = 0;
  private totalQueued = 0;
  private readonly laneQueued: [number, number] = [0, 0];
  private seq = 0;
  private recheck: Cancel | undefined = undefined;

  constructor(options: BackendGateOptions) {
    if (typeof options !== "object" || options === null) {
      throw new RangeError(`BackendGate takes an options object, got ${String(options)}`);
    }
    this.engineRequestLimit = checkInteger("engineRequestLimit", options.engineRequestLimit, 1);
    this.engineRequestWaitingLimit = checkInteger(
      "engineRequestWaitingLimit",
      options.engineRequestWaitingLimit,
      1,
    );
    this.requestQueueLimit = checkInteger("requestQueueLimit", options.requestQueueLimit, 0);
    this.ranksKnownValue = options.ranks !== undefined;
    this.rankCountValue = options.ranks === undefined ? 1 : checkInteger("ranks", options.ranks, 1);
    this.overloadStatus = checkInteger(
      "overloadStatus",
      options.overloadStatus ?? DEFAULT_OVERLOAD_STATUS,
      400,
    );
    if (this.overloadStatus > 599)
      throw new RangeError(`overloadStatus must be ≤ 599, got ${this.overloadStatus}`);
    this.clock = options.clock ?? realClock;
    this.completions =
      options.drain ?? new DrainEstimator({ clock: this.clock, windowMs: options.drainWindowMs ?? 30_000 });
    if (options.lanes !== undefined) {
      this.lanes = resolveLanes(options.lanes);
      this.shares = new ShareWindow(this.lanes.windowMs);
    }
    for (let r = 0; r < this.rankCountValue; r++) this.slots.push(new Slot(r));
    this.recompute();
  }

  /** Data-parallel size the gate works with (1 until reported when not given). */
  get rankCount(): number {
    return this.rankCountValue;
  }

  /** Whether the ranks are known (given as an option or reported through `setRanks`). */
  get ranksKnown(): boolean {
    return this.ranksKnownValue;
  }

  /** Whether lanes are on. */
  get lanesEnabled(): boolean {
    return this.lanes !== undefined;
  }

  /**
   * Asks for a permit. Resolves at once when the call may enter, later when it
   * waited in a queue; rejects with `GateRejection` when it can neither enter
   * nor queue, with a `queue_full` / `queue_timeout` `Refusal` from its lane,
   * with `GateCancelled` when its signal aborts first, and with `RangeError`
   * for an invalid request (not counted).
   */
  acquire(req?: AcquireRequest): Promise<Permit> {
    const slot = this.slotFor(req?.rank);
    const laneName = req?.lane;
    if (laneName !== undefined && laneName !== "interactive" && laneName !== "bulk") {
      return Promise.reject(new RangeError(`lane must be "interactive" or "bulk", got ${String(laneName)}`));
    }
    const tokens = req?.prefillTokens ?? 1;
    if (typeof tokens !== "number" || !(tokens >= 0 && Number.isFinite(tokens))) {
      return Promise.reject(
        new RangeError(`prefillTokens must be a finite number ≥ 0, got ${String(tokens)}`),
      );
    }
    const signal = req?.signal;
    const stats = slot.stats;
    stats.received++;
    if (signal?.aborted) {
      stats.cancelled++;
      return Promise.reject(new GateCancelled(signal.reason));
    }
    const lane: LaneIndex = laneName === "bulk" ? BULK : INTERACTIVE;
    if (this.lanes === undefined) {
      if (slot.queued === 0 && this.fits(slot)) {
        this.take(slot);
        stats.admittedDirect++;
        return Promise.resolve(new GatePermit(this, slot, "direct", 0, laneName));
      }
      return this.enqueue(slot, lane, laneName, tokens, signal);
    }
    const name = LANE_NAMES[lane];
    const now = this.clock.now();
    // Interactive goes first: a bulk newcomer also waits behind queued interactive calls and for its cap.
    if (
      slot.heads[lane] === undefined &&
      this.fits(slot) &&
      (lane === INTERACTIVE || (slot.heads[INTERACTIVE] === undefined && this.bulkEligible(now)))
    ) {
      this.take(slot);
      stats.admittedDirect++;
      this.shares!.record(now, lane, tokens, this.laneQueued[lane ^ 1]! > 0);
      return Promise.resolve(new GatePermit(this, slot, "direct", 0, name));
    }
    return this.enqueue(slot, lane, name, tokens, signal);
  }

  /** The engine reported its data-parallel size. Calls queued for ranks that no longer exist become unranked. */
  setRanks(n: number): void {
    checkInteger("setRanks(n)", n, 1);
    if (this.ranksKnownValue && n === this.rankCountValue) return;
    const previous = this.ranksKnownValue ? this.rankCountValue : 0;
    while (this.slots.length < n) this.slots.push(new Slot(this.slots.length));
    for (let r = n; r < previous; r++) this.moveToUnranked(this.slots[r]!);
    this.ranksKnownValue = true;
    this.rankCountValue = n;
    this.recompute();
    this.drain();
  }

  /** Current per-rank limits. */
  limits(): GateLimitValues {
    return {
      engineRequestLimit: this.engineRequestLimit,
      engineRequestWaitingLimit: this.engineRequestWaitingLimit,
      requestQueueLimit: this.requestQueueLimit,
    };
  }

  /**
   * The engine reported new capacity. Applies to future admissions and may
   * admit queued calls now; never preempts or drops what was admitted or queued.
   */
  setLimits(limits: Partial<GateLimitValues>): void {
    const next = {
      engineRequestLimit: checkInteger(
        "engineRequestLimit",
        limits.engineRequestLimit ?? this.engineRequestLimit,
        1,
      ),
      engineRequestWaitingLimit: checkInteger(
        "engineRequestWaitingLimit",
        limits.engineRequestWaitingLimit ?? this.engineRequestWaitingLimit,
        1,
      ),
      requestQueueLimit: checkInteger(
        "requestQueueLimit",
        limits.requestQueueLimit ?? this.requestQueueLimit,
        0,
      ),
    };
    this.engineRequestLimit = next.engineRequestLimit;
    this.engineRequestWaitingLimit = next.engineRequestWaitingLimit;
    this.requestQueueLimit = next.requestQueueLimit;
    this.recompute();
    this.drain();
  }

  /** What the gate holds now, per rank and for unranked calls, and per lane when lanes are on. */
  snapshot(): GateSnapshot {
    const ranks: GateSnapshot["ranks"] = [];
    for (const slot of this.slots) {
      const live = slot.rank! < this.rankCountValue;
      if (live || slot.requests > 0 || slot.waiting > 0 || slot.queued > 0) {
        ranks.push({ rank: slot.rank!, requests: slot.requests, waiting: slot.waiting, queued: slot.queued });
      }
    }
    const u = this.unranked;
    const snapshot: GateSnapshot = {
      requests: this.totalRequests,
      waiting: this.totalWaiting,
      queued: this.totalQueued,
      ranks,
      unranked: { requests: u.requests, waiting: u.waiting, queued: u.queued },
    };
    if (this.lanes !== undefined) {
      snapshot.lanes = {
        interactive: {
          queued: this.laneQueued[INTERACTIVE],
          oldestAgeMs: this.oldestQueuedAgeMs("interactive"),
        },
        bulk: { queued: this.laneQueued[BULK], oldestAgeMs: this.oldestQueuedAgeMs("bulk") },
      };
    }
    return snapshot;
  }

  /** Cumulative counters of the whole gate. */
  counters(): GateCounters {
    const total: GateCounters = {
      received: 0,
      admittedDirect: 0,
      admittedQueue: 0,
      rejected: 0,
      cancelled: 0,
    };
    for (const { stats } of [...this.slots, this.unranked]) {
      total.received += stats.received;
      total.admittedDirect += stats.admittedDirect;
      total.admittedQueue += stats.admittedQueue;
      total.rejected += stats.rejectedWorker + stats.rejectedRank + stats.rejectedLane;
      total.cancelled += stats.cancelled;
    }
    return total;
  }

  /** Cumulative counters per rank, then `"unspecified"` for unranked calls; each call counts where it arrived. */
  rankCounters(): RankCounters[] {
    return [...this.slots, this.unranked].map(({ rank, stats }) => ({
      rank: rank ?? "unspecified",
      received: stats.received,
      admittedDirect: stats.admittedDirect,
      admittedQueue: stats.admittedQueue,
      rejected: { worker: stats.rejectedWorker, rank: stats.rejectedRank, lane: stats.rejectedLane },
      cancelled: stats.cancelled,
    }));
  }

  /** Age of the oldest queued call (of `lane`, or of any), ms; 0 when none is queued. */
  oldestQueuedAgeMs(lane?: Lane): number {
    if (this.totalQueued === 0) return 0;
    let oldest = Number.POSITIVE_INFINITY;
    for (const slot of this.active) {
      for (const index of [INTERACTIVE, BULK] as const) {
        if (lane !== undefined && LANE_NAMES[index] !== lane) continue;
        const head = slot.heads[index];
        if (head !== undefined && head.arrivedAt < oldest) oldest = head.arrivedAt;
      }
    }
    return oldest === Number.POSITIVE_INFINITY ? 0 : Math.max(0, this.clock.now() - oldest);
  }

  /** Calls queued (in `lane`, or in all). Without lanes, a call counts in the lane it declared (default interactive). */
  queuedCount(lane?: Lane): number {
    if (lane === undefined) return this.totalQueued;
    return this.laneQueued[lane === "bulk" ? BULK : INTERACTIVE];
  }

  /** Bulk's share (0–1) of prefill tokens admitted in the share window; 0 without lanes. */
  bulkShare(): number {
    return this.shares?.bulkShare(this.clock.now()) ?? 0;
  }

  /** @internal Ends the waiting part of a permit. */
  [END_WAITING](slot: Slot): void {
    slot.waiting--;
    this.totalWaiting--;
    if (this.totalQueued > 0) this.drain();
  }

  /** @internal Ends a permit. */
  [END_CALL](slot: Slot, waiting: boolean): void {
    slot.requests--;
    this.totalRequests--;
    if (waiting) {
      slot.waiting--;
      this.totalWaiting--;
    }
    this.completions.record();
    if (this.totalQueued > 0) this.drain();
  }

  /** @internal A queued call's signal aborted. */
  [ABORT](w: Waiter): void {
    if (!w.queued) return;
    this.unqueue(w);
    w.stats.cancelled++;
    w.reject(new GateCancelled(w.signal?.reason));
    // Without lanes a withdrawn call never unblocks another; with lanes it may lift bulk's cap.
    if (this.lanes !== undefined) this.drain();
  }

  /** @internal A queued call outlived its lane's residence time. */
  [EXPIRE](w: Waiter): void {
    if (!w.queued) return;
    w.cancelTimer = undefined;
    this.unqueue(w);
    w.stats.rejectedLane++;
    const lane = LANE_NAMES[w.lane];
    const waited = this.clock.now() - w.arrivedAt;
    w.reject(
      new Refusal(
        "queue_timeout",
        `the call waited ${Math.round(waited)} ms in the ${lane} queue (limit ${this.lanes!.residenceMs[w.lane]} ms)`,
        {
          status: 429,
          scope: "lane",
          lane,
          rank: w.slot.rank,
          retryAfterSeconds: this.completions.retryAfterSeconds(this.laneQueued[w.lane] + 1),
        },
      ),
    );
    this.drain();
  }

  private slotFor(rank: number | undefined): Slot {
    if (rank === undefined || !this.ranksKnownValue) return this.unranked;
    if (Number.isInteger(rank) && rank >= 0 && rank < this.rankCountValue) return this.slots[rank]!;
    return this.unranked;
  }

  private recompute(): void {
    const n = this.rankCountValue;
    this.combinedRequests = n * this.engineRequestLimit;
    this.combinedWaiting = n * this.engineRequestWaitingLimit;
    this.combinedQueue = n * this.requestQueueLimit;
    this.active = this.ranksKnownValue ? [...this.slots.slice(0, n), this.unranked] : [this.unranked];
  }

  /** Whether `slot` could take one more admitted call now (ignoring its queue). */
  private fits(slot: Slot): boolean {
    if (this.totalRequests >= this.combinedRequests || this.totalWaiting >= this.combinedWaiting)
      return false;
    return (
      slot.rank === undefined ||
      (slot.requests < this.engineRequestLimit && slot.waiting < this.engineRequestWaitingLimit)
    );
  }

  /** Whether `slot`'s queue (and the combined queue) has a free place. */
  private queueRoom(slot: Slot): boolean {
    if (this.totalQueued >= this.combinedQueue) return false;
    return slot.rank === undefined || slot.queued < this.requestQueueLimit;
  }

  private laneQueueLimit(lane: LaneIndex): number {
    return this.lanes!.queueLimit[lane] ?? this.combinedQueue;
  }

  private take(slot: Slot): void {
    slot.requests++;
    slot.waiting++;
    this.totalRequests++;
    this.totalWaiting++;
  }

  private enqueue(
    slot: Slot,
    lane: LaneIndex,
    laneName: Lane | undefined,
    tokens: number,
    signal: AbortSignal | undefined,
  ): Promise<Permit> {
    const stats = slot.stats;
    if (!this.queueRoom(slot)) return this.rejectOverloaded(slot, laneName);
    if (this.lanes !== undefined && this.laneQueued[lane]! >= this.laneQueueLimit(lane)) {
      stats.rejectedLane++;
      const name = LANE_NAMES[lane];
      return Promise.reject(
        new Refusal("queue_full", `the ${name} queue is full (${this.laneQueued[lane]} queued)`, {
          status: 429,
          scope: "lane",
          lane: name,
          rank: slot.rank,
          retryAfterSeconds: this.completions.retryAfterSeconds(this.laneQueued[lane]! + 1),
        }),
      );
    }
    const w = new Waiter(this, slot, stats, this.seq++, lane, laneName, tokens, this.clock.now(), signal);
    const promise = new Promise<Permit>((resolve, reject) => {
      w.resolve = resolve;
      w.reject = reject;
    });
    slot.push(w);
    slot.queued++;
    this.totalQueued++;
    this.laneQueued[lane]++;
    if (signal !== undefined) signal.addEventListener("abort", w);
    if (this.lanes !== undefined) {
      const residence = this.lanes.residenceMs[lane];
      if (Number.isFinite(residence)) w.cancelTimer = this.clock.setTimeout(() => this[EXPIRE](w), residence);
      // A bulk call that fits but is held at its cap needs the share re-checked as the window slides.
      if (lane === BULK && this.fits(slot)) this.drain();
    }
    return promise;
  }

  private rejectOverloaded(slot: Slot, laneName: Lane | undefined): Promise<never> {
    const scope: GateRejectionScope =
      slot.rank !== undefined && this.couldAcceptOther(slot) ? "rank" : "worker";
    if (scope === "rank") slot.stats.rejectedRank++;
    else slot.stats.rejectedWorker++;
    const where =
      slot.rank === undefined
        ? `replica full: ${this.totalRequests}/${this.combinedRequests} requests, ` +
          `${this.totalWaiting}/${this.combinedWaiting} waiting, ${this.totalQueued}/${this.combinedQueue} queued`
        : `rank ${slot.rank} full: ${slot.requests}/${this.engineRequestLimit} requests, ` +
          `${slot.waiting}/${this.engineRequestWaitingLimit} waiting, ${slot.queued}/${this.requestQueueLimit} queued` +
          (scope === "worker" ? "; no other rank can take a call" : "");
    return Promise.reject(
      new GateRejection(`worker overloaded (${where})`, {
        status: this.overloadStatus,
        scope,
        rank: slot.rank,
        lane: this.lanes === undefined ? undefined : laneName,
        retryAfterSeconds: this.completions.retryAfterSeconds(this.totalQueued + 1),
      }),
    );
  }

  /** Whether some call other than one for `excluded` could still be admitted or queued. */
  private couldAcceptOther(excluded: Slot): boolean {
    for (const slot of this.active) {
      if (slot === excluded) continue;
      if ((slot.queued === 0 && this.fits(slot)) || this.queueRoom(slot)) return true;
    }
    return false;
  }

  private unqueue(w: Waiter): void {
    const slot = w.slot;
    slot.unlink(w);
    slot.queued--;
    this.totalQueued--;
    this.laneQueued[w.lane]--;
    w.queued = false;
    if (w.signal !== undefined) w.signal.removeEventListener("abort", w);
    if (w.cancelTimer !== undefined) {
      w.cancelTimer();
      w.cancelTimer = undefined;
    }
  }

  private admitQueued(w: Waiter, now: number): void {
    const slot = w.slot;
    this.unqueue(w);
    this.take(slot);
    w.stats.admittedQueue++;
    if (this.shares !== undefined)
      this.shares.record(now, w.lane, w.tokens, this.laneQueued[w.lane ^ 1]! > 0);
    w.resolve(new GatePermit(this, slot, "queue", Math.max(0, now - w.arrivedAt), w.laneName));
  }

  private hasRoom(): boolean {
    return this.totalRequests < this.combinedRequests && this.totalWaiting < this.combinedWaiting;
  }

  /** Admits queued calls while any fits: the oldest head that fits, across queues. */
  private drain(): void {
    if (this.lanes !== undefined) {
      this.drainLanes();
      return;
    }
    let now: number | undefined;
    while (this.totalQueued > 0 && this.hasRoom()) {
      let best: Waiter | undefined;
      for (const slot of this.active) {
        if (slot.queued === 0 || !this.fits(slot)) continue;
        const head = slot.oldestHead()!;
        if (best === undefined || head.seq < best.seq) best = head;
      }
      if (best === undefined) return;
      now ??= this.clock.now();
      this.admitQueued(best, now);
    }
  }

  /** The oldest queued call of `lane` that fits, across queues. */
  private oldestFitting(lane: LaneIndex): Waiter | undefined {
    if (this.laneQueued[lane] === 0) return undefined;
    let best: Waiter | undefined;
    for (const slot of this.active) {
      const head = slot.heads[lane];
      if (head === undefined || (best !== undefined && head.seq > best.seq) || !this.fits(slot)) continue;
      best = head;
    }
    return best;
  }

  /** Bulk may take capacity unless interactive calls wait and bulk is at its cap. */
  private bulkEligible(now: number): boolean {
    const lanes = this.lanes!;
    return this.laneQueued[INTERACTIVE] === 0 || lanes.max >= 1 || this.shares!.bulkShare(now) < lanes.max;
  }

  /**
   * Whether bulk is below its floor: its share of the tokens admitted while
   * both lanes had calls waiting. Admissions when bulk was not waiting do not
   * count against it, so a bulk call arriving after a quiet spell does not jump
   * ahead of interactive calls.
   */
  private bulkBelowFloor(now: number): boolean {
    const share = this.shares!.contendedBulkShare(now);
    return share !== undefined && share < this.lanes!.floor;
  }

  private drainLanes(): void {
    let held = false;
    while (this.totalQueued > 0 && this.hasRoom()) {
      const interactive = this.oldestFitting(INTERACTIVE);
      const bulk = this.oldestFitting(BULK);
      if (interactive === undefined && bulk === undefined) break;
      const now = this.clock.now();
      const bulkOk = bulk !== undefined && this.bulkEligible(now);
      let pick: Waiter;
      if (interactive !== undefined && bulkOk && this.bulkBelowFloor(now)) pick = bulk;
      else if (interactive !== undefined) pick = interactive;
      else if (bulkOk) pick = bulk;
      else {
        held = true;
        break;
      }
      this.admitQueued(pick, now);
    }
    if (held) this.scheduleRecheck();
    else if (this.recheck !== undefined) {
      this.recheck();
      this.recheck = undefined;
    }
  }

  /** Bulk is held at its cap: look again when the oldest admission leaves the share window. */
  private scheduleRecheck(): void {
    if (this.recheck !== undefined) return;
    const now = this.clock.now();
    const at = this.shares!.nextExpiryAt(now);
    if (at === undefined) return;
    this.recheck = this.clock.setTimeout(() => {
      this.recheck = undefined;
      this.drain();
    }, at - now);
  }

  private moveToUnranked(slot: Slot): void {
    if (slot.queued === 0) return;
    const target = this.unranked;
    for (const lane of [INTERACTIVE, BULK] as const) {
      // Both lists are in arrival order; merge so the shared queue stays FIFO.
      let a = target.heads[lane];
      let b = slot.heads[lane];
      if (b === undefined) continue;
      let head: Waiter | undefined;
      let tail: Waiter | undefined;
      while (a !== undefined || b !== undefined) {
        let next: Waiter;
        if (b === undefined || (a !== undefined && a.seq < b.seq)) {
          next = a!;
          a = a!.next;
        } else {
          next = b;
          b = b.next;
          next.slot = target;
        }
        next.prev = tail;
        next.next = undefined;
        if (tail === undefined) head = next;
        else tail.next = next;
        tail = next;
      }
      target.heads[lane] = head;
      target.tails[lane] = tail;
      slot.heads[lane] = slot.tails[lane] = undefined;
    }
    target.queued += slot.queued;
    slot.queued = 0;
  }
}
