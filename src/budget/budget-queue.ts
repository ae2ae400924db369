/**
 * @module The budget queue: a call that does not fit its replica's token budget waits there, lane by
 * lane, instead of being refused at once (docs/how-it-works.md, "Token budget").
 */

import type { Cancel, Clock } from "../clock.js";
import { Refusal } from "../errors.js";
import type { Lane } from "../types.js";
import { type BudgetOrderKey, type BudgetWaiterView, orderedLane } from "./budget-order.js";
import type { Reservation, ReserveOptions, TokenBudget } from "./token-budget.js";

/** Default waiters per replica's budget queue. */
export const DEFAULT_BUDGET_QUEUE_LIMIT = 256;
/** Default wait after which the head of a lane holds its place, ms. */
export const DEFAULT_BUDGET_HEAD_RESERVE_MS = 2000;

/** Options of a `BudgetQueue`. */
export interface BudgetQueueOptions {
  clock: Clock;
  /** Waiters the queue holds; beyond: 429 `token_budget_exhausted` at once. 0 is no queue at all. Default 256. */
  limit?: number;
  /** A lane's head that waited this long holds its place: no later call takes budget it needs, ms. Default 2000. */
  headReserveMs?: number;
  /**
   * Share (0–1) of the budget's granted tokens over `shareWindowMs` bulk is guaranteed: while bulk's
   * share is below it, a bulk head holding its place is served ahead of interactive calls too. Default 0.1.
   */
  bulkFloorShare?: number;
  /** Sliding window of that share, ms. Default 60 000. */
  shareWindowMs?: number;
  /** Order within a lane; default arrival order. */
  orderKey?: BudgetOrderKey;
  /**
   * Which waiters give way when the queue is full: an arrival of a lower rank displaces the latest
   * waiter of the highest rank above its own (refused as the arrival would have been). Default:
   * none, the arrival is refused.
   */
  shedRank?: (waiter: BudgetWaiterView) => number;
  /**
   * Retry-After of a refusal, seconds, given the tokens that must be freed before the call could be
   * granted (those of the calls waiting ahead of it, plus its own, less what is available). Default 1.
   */
  retryAfterSeconds?: (deficitTokens: number) => number;
}

/** A call's wait for budget. */
export interface BudgetWaitRequest {
  /** Tokens to reserve. */
  tokens: number;
  lane: Lane;
  tenant?: string;
  /** The longest it may wait, ms: its lane's residence time, or less. 0: it may not wait. */
  maxWaitMs: number;
  /** Aborting it while waiting withdraws the call; nothing is then held. */
  signal?: AbortSignal;
  /** How the reservation is taken (`queued: true` while the call still faces the gate). */
  reserve?: ReserveOptions;
}

/** Plain-JSON view of a budget queue. */
export interface BudgetQueueSnapshot {
  limit: number;
  waiting: { interactive: number; bulk: number };
  waitingTokens: number;
  /** Age of the oldest waiter, ms; 0 when none waits. */
  oldestWaitMs: number;
  /** Lanes whose head holds its place now. */
  heldHeads: Lane[];
  granted: number;
  timedOut: number;
  full: number;
  cancelled: number;
}

/** Thrown to a waiter whose signal aborted before it got its budget. */
export class BudgetWaitCancelled extends Error {
  constructor(reason?: unknown) {
    super(
      "the call was cancelled while it waited for token budget",
      reason === undefined ? undefined : { cause: reason },
    );
    this.name = "AbortError";
  }
}

const LANE_RANK: Record<Lane, 0 | 1> = { interactive: 0, bulk: 1 };

interface Waiter extends BudgetWaiterView {
  readonly reserve: ReserveOptions;
  readonly maxWaitMs: number;
  readonly signal: AbortSignal | undefined;
  resolve(reservation: Reservation): void;
  reject(error: unknown): void;
  cancelTimer: Cancel | undefined;
  onAbort: (() => void) | undefined;
  /** Only goes from "waiting" to one end, once. */
  state: "waiting" | "granted" | "timed_out" | "cancelled" | "displaced";
}

interface Grant {
  at: number;
  bulk: boolean;
  tokens: number;
}

function checkNonNegative(what: string, value: number, integer: boolean): void {
  if (
    !(
      typeof value === "number" &&
      value >= 0 &&
      (integer ? Number.isSafeInteger(value) : Number.isFinite(value))
    )
  ) {
    throw new RangeError(
      `${what} should be a non-negative ${integer ? "whole number" : "number"}, got ${String(value)}`,
    );
  }
}

/**
 * One replica's budget queue, in front of its `TokenBudget`.
 *
 * Decisions: waiters are served interactive first, then bulk, each lane in its key's order; a waiter
 * is granted when its tokens fit what is available less what the held heads ahead of it need. A
 * lane's head holds its place once it has waited `headReserveMs`: later calls of its lane and of
 * lower lanes may then take only budget beside it (a held interactive head holds bulk back; a held
 * bulk head holds back bulk, and interactive only while bulk is below its floor share). Calls that
 * wait but do not hold block nobody: an arrival that fits is granted at once, as it would be with no
 * queue, so a fleet where nobody waits long behaves exactly as without one.
 *
 * Invariant (checked by the property test after every operation): every waiter is in exactly one
 * of `interactive` or `bulk` while its state is "waiting", and in neither after; its timer and abort
 * listener live exactly as long; `size` is the sum of the two lanes.
 */
export class BudgetQueue {
  readonly limit: number;
  readonly headReserveMs: number;
  private readonly clock: Clock;
  private readonly bulkFloorShare: number;
  private readonly shareWindowMs: number;
  private readonly orderKey: BudgetOrderKey | undefined;
  private readonly shedRank: ((waiter: BudgetWaiterView) => number) | undefined;
  private readonly retryAfter: (deficitTokens: number) => number;
  private readonly lanes: [Waiter[], Waiter[]] = [[], []];
  private seq = 0;
  private draining = false;
  private readonly grants: Grant[] = [];
  private grantHead = 0;
  private grantedTokens = [0, 0];
  private readonly counts = { granted: 0, timedOut: 0, full: 0, cancelled: 0 };
  private readonly unsubscribe: () => void;

  constructor(
    private readonly budget: TokenBudget,
    options: BudgetQueueOptions,
  ) {
    if (options === null || typeof options !== "object" || !options.clock) {
      throw new TypeError("BudgetQueue takes a budget and an options object with a clock");
    }
    const limit = options.limit ?? DEFAULT_BUDGET_QUEUE_LIMIT;
    checkNonNegative("limit", limit, true);
    const headReserveMs = options.headReserveMs ?? DEFAULT_BUDGET_HEAD_RESERVE_MS;
    checkNonNegative("headReserveMs", headReserveMs, false);
    const floor = options.bulkFloorShare ?? 0.1;
    if (!(floor >= 0 && floor <= 1)) throw new RangeError(`bulkFloorShare should be in [0, 1], got ${floor}`);
    const windowMs = options.shareWindowMs ?? 60_000;
    if (!(windowMs > 0))
      throw new RangeError(`shareWindowMs should be a positive number of ms, got ${windowMs}`);
    this.limit = limit;
    this.headReserveMs = headReserveMs;
    this.clock = options.clock;
    this.bulkFloorShare = floor;
    this.shareWindowMs = windowMs;
    this.orderKey = options.orderKey;
    this.shedRank = options.shedRank;
    this.retryAfter = options.retryAfterSeconds ?? (() => 1);
    this.unsubscribe = budget.onRelease(() => this.drain());
  }

  /** Calls waiting now. */
  get size(): number {
    return this.lanes[0].length + this.lanes[1].length;
  }

  /**
   * Reserves `tokens` now when they fit beside every held head that blocks the call's lane, else
   * waits in the queue. Rejects with 429 `token_budget_exhausted` when the queue is full or the wait
   * outlives `maxWaitMs`, with `BudgetWaitCancelled` when the signal aborts first. The caller checks
   * the 413 (a call the budget could never hold) before it asks.
   */
  reserve(req: BudgetWaitRequest): Promise<Reservation> {
    const { tokens, lane } = req;
    checkNonNegative("tokens", tokens, true);
    checkNonNegative("maxWaitMs", req.maxWaitMs, false);
    if (lane !== "interactive" && lane !== "bulk") {
      return Promise.reject(new RangeError(`lane must be "interactive" or "bulk", got ${String(lane)}`));
    }
    if (req.signal?.aborted) {
      this.counts.cancelled++;
      return Promise.reject(new BudgetWaitCancelled(req.signal.reason));
    }
    const reserveOptions = req.reserve ?? {};
    const now = this.clock.now();
    if (tokens <= this.budget.available() + credit(reserveOptions) - this.heldAhead(lane, now)) {
      const reservation = this.budget.tryReserve(tokens, reserveOptions);
      if (reservation) {
        this.granted(lane, tokens, now);
        return Promise.resolve(reservation);
      }
    }
    if (this.size >= this.limit && req.maxWaitMs > 0) this.displaceFor(req, now);
    if (this.size >= this.limit || req.maxWaitMs <= 0) {
      const full = this.size >= this.limit;
      if (full) this.counts.full++;
      else this.counts.timedOut++;
      return Promise.reject(
        this.refusal(
          lane,
          this.tokensAhead(lane, undefined) + tokens,
          full
            ? `the call needs ${tokens} tokens of new KV (uncached input + max_tokens), only ${this.budget.available()} are available and the budget queue is full (${this.limit} calls)`
            : `the call needs ${tokens} tokens of new KV (uncached input + max_tokens) but only ${this.budget.available()} are available now, and it may not wait`,
        ),
      );
    }
    return new Promise<Reservation>((resolve, reject) => {
      const waiter: Waiter = {
        tokens,
        lane,
        tenant: req.tenant,
        seq: this.seq++,
        enqueuedAtMs: now,
        reserve: reserveOptions,
        maxWaitMs: req.maxWaitMs,
        signal: req.signal,
        resolve,
        reject,
        cancelTimer: undefined,
        onAbort: undefined,
        state: "waiting",
      };
      this.lanes[LANE_RANK[lane]].push(waiter);
      if (Number.isFinite(req.maxWaitMs)) {
        waiter.cancelTimer = this.clock.setTimeout(() => this.expire(waiter), req.maxWaitMs);
      }
      if (req.signal) {
        const signal = req.signal;
        waiter.onAbort = () => this.cancel(waiter);
        signal.addEventListener("abort", waiter.onAbort, { once: true });
      }
    });
  }

  /** Grants every waiter that may take budget now, in the queue's order; runs on every release. */
  drain(): void {
    if (this.draining || this.size === 0) return;
    this.draining = true;
    try {
      const now = this.clock.now();
      let held = 0;
      // A lane's head is its first waiter not granted in this pass.
      const headSeen = [false, false];
      for (const w of this.order(now)) {
        const rank = LANE_RANK[w.lane];
        const isHead = !headSeen[rank];
        if (w.tokens <= this.budget.available() + credit(w.reserve) - held) {
          const reservation = this.budget.tryReserve(w.tokens, w.reserve);
          if (reservation) {
            this.leave(w, "granted");
            this.granted(w.lane, w.tokens, now);
            w.resolve(reservation);
            continue;
          }
        }
        headSeen[rank] = true;
        if (isHead && now - w.enqueuedAtMs >= this.headReserveMs) held += w.tokens;
      }
    } finally {
      this.draining = false;
    }
  }

  /** Plain-JSON view. */
  snapshot(): BudgetQueueSnapshot {
    const now = this.clock.now();
    let oldest = Number.POSITIVE_INFINITY;
    let tokens = 0;
    const heldHeads: Lane[] = [];
    for (const lane of this.lanes) {
      for (const w of lane) {
        oldest = Math.min(oldest, w.enqueuedAtMs);
        tokens += w.tokens;
      }
      const head = this.headOf(lane);
      if (head && this.holds(head, now)) heldHeads.push(head.lane);
    }
    return {
      limit: this.limit,
      waiting: { interactive: this.lanes[0].length, bulk: this.lanes[1].length },
      waitingTokens: tokens,
      oldestWaitMs: Number.isFinite(oldest) ? now - oldest : 0,
      heldHeads,
      ...this.counts,
    };
  }

  toJSON(): BudgetQueueSnapshot {
    return this.snapshot();
  }

  /** Stops following the budget's releases (the replica is gone); waiters stay until they end. */
  close(): void {
    this.unsubscribe();
  }

  /** The order of one decision: interactive then bulk, unless bulk's held head is owed its floor. */
  private order(now: number): Waiter[] {
    const interactive = this.sorted(this.lanes[0]);
    const bulk = this.sorted(this.lanes[1]);
    const bulkHead = bulk[0];
    if (bulkHead && this.holds(bulkHead, now) && this.bulkBelowFloor(now)) {
      return [bulkHead, ...interactive, ...bulk.slice(1)];
    }
    return [...interactive, ...bulk];
  }

  private sorted(lane: Waiter[]): Waiter[] {
    return orderedLane(lane, this.orderKey);
  }

  private headOf(lane: Waiter[]): Waiter | undefined {
    if (lane.length === 0) return undefined;
    if (this.orderKey === undefined) return lane[0];
    return this.sorted(lane)[0];
  }

  /** A lane's head that waited at least `headReserveMs` holds its place. */
  private holds(w: Waiter, now: number): boolean {
    return now - w.enqueuedAtMs >= this.headReserveMs && this.headOf(this.lanes[LANE_RANK[w.lane]]) === w;
  }

  /** Tokens held heads keep from an arrival of `lane`. */
  private heldAhead(lane: Lane, now: number): number {
    let held = 0;
    const interactiveHead = this.headOf(this.lanes[0]);
    if (interactiveHead && this.holds(interactiveHead, now)) held += interactiveHead.tokens;
    const bulkHead = this.headOf(this.lanes[1]);
    if (bulkHead && this.holds(bulkHead, now) && (lane === "bulk" || this.bulkBelowFloor(now))) {
      held += bulkHead.tokens;
    }
    return held;
  }

  /** Tokens of the waiters a call of `lane` would wait behind (`self` excluded), for its Retry-After. */
  private tokensAhead(lane: Lane, self: Waiter | undefined): number {
    let tokens = 0;
    for (const w of this.order(this.clock.now())) {
      if (w === self) break;
      if (LANE_RANK[w.lane] <= LANE_RANK[lane]) tokens += w.tokens;
    }
    return tokens;
  }

  private bulkBelowFloor(now: number): boolean {
    if (this.bulkFloorShare <= 0) return false;
    this.prune(now);
    const total = this.grantedTokens[0]! + this.grantedTokens[1]!;
    return total === 0 || this.grantedTokens[1]! / total < this.bulkFloorShare;
  }

  private granted(lane: Lane, tokens: number, now: number): void {
    this.counts.granted++;
    if (this.bulkFloorShare <= 0) return;
    const bulk = lane === "bulk";
    this.grants.push({ at: now, bulk, tokens });
    this.grantedTokens[bulk ? 1 : 0]! += tokens;
    this.prune(now);
  }

  private prune(now: number): void {
    const from = now - this.shareWindowMs;
    while (this.grantHead < this.grants.length && this.grants[this.grantHead]!.at < from) {
      const old = this.grants[this.grantHead++]!;
      this.grantedTokens[old.bulk ? 1 : 0]! -= old.tokens;
    }
    if (this.grantHead > 1024 && this.grantHead * 2 > this.grants.length) {
      this.grants.splice(0, this.grantHead);
      this.grantHead = 0;
    }
  }

  private expire(w: Waiter): void {
    if (w.state !== "waiting") return;
    const waited = this.clock.now() - w.enqueuedAtMs;
    const deficit = this.tokensAhead(w.lane, w) + w.tokens;
    this.leave(w, "timed_out");
    this.counts.timedOut++;
    w.reject(
      this.refusal(
        w.lane,
        deficit,
        `the call waited ${Math.round(waited)} ms for ${w.tokens} tokens of new KV (uncached input + max_tokens) and ${this.budget.available()} are available (limit ${Math.round(w.maxWaitMs)} ms)`,
      ),
    );
    // A head that held its place no longer holds anyone back.
    this.drain();
  }

  /** A full queue makes room for `req` by refusing the latest waiter of the highest rank above its own. */
  private displaceFor(req: BudgetWaitRequest, now: number): void {
    const rankOf = this.shedRank;
    if (rankOf === undefined) return;
    const own = rankOf({
      tokens: req.tokens,
      lane: req.lane,
      tenant: req.tenant,
      seq: this.seq,
      enqueuedAtMs: now,
    });
    let victim: Waiter | undefined;
    let victimRank = own;
    for (const lane of this.lanes) {
      for (const w of lane) {
        const rank = rankOf(w);
        if (rank > victimRank || (rank === victimRank && victim !== undefined && w.seq > victim.seq)) {
          victim = w;
          victimRank = rank;
        }
      }
    }
    if (victim === undefined) return;
    const deficit = this.tokensAhead(victim.lane, victim) + victim.tokens;
    this.leave(victim, "displaced");
    this.counts.full++;
    victim.reject(
      this.refusal(
        victim.lane,
        deficit,
        `the budget queue is full (${this.limit} calls) and a call of a higher band took this call's place`,
      ),
    );
  }

  private cancel(w: Waiter): void {
    if (w.state !== "waiting") return;
    this.leave(w, "cancelled");
    this.counts.cancelled++;
    w.reject(new BudgetWaitCancelled(w.signal?.reason));
    this.drain();
  }

  /** Takes a waiter out of its lane, its timer and listener with it; the one place a waiter ends. */
  private leave(w: Waiter, end: Exclude<Waiter["state"], "waiting">): void {
    const lane = this.lanes[LANE_RANK[w.lane]];
    const at = lane.indexOf(w);
    if (at >= 0) lane.splice(at, 1);
    w.state = end;
    w.cancelTimer?.();
    w.cancelTimer = undefined;
    if (w.onAbort && w.signal) w.signal.removeEventListener("abort", w.onAbort);
    w.onAbort = undefined;
  }

  private refusal(lane: Lane, wanted: number, message: string): Refusal {
    const deficit = Math.max(1, wanted - this.budget.available());
    return new Refusal("token_budget_exhausted", message, {
      lane,
      scope: "worker",
      retryAfterSeconds: this.retryAfter(deficit),
    });
  }
}

function credit(options: ReserveOptions): number {
  return Math.max(0, options.creditTokens ?? 0);
}
