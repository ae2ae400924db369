/** @module Per-replica token budget: reservations of `input + max_tokens` against the KV ceiling (docs/library.md and docs/how-it-works.md#token-budget-and-feasibility). */

import { DEFAULT_GUARD_BAND_FRACTION } from "../config/defaults.js";
import { Refusal } from "../errors.js";
import type { Lane } from "../types.js";

/** Options of a `TokenBudget`. */
export interface TokenBudgetOptions {
  /** The replica's KV capacity, tokens (num_gpu_blocks × block_size). */
  ceilingTokens: number;
  /** Share of the ceiling held back as a guard band, 0 ≤ f < 1; default 0.1. */
  guardBandFraction?: number;
}

/** Tokens a call holds in a budget; ends exactly once. */
export interface Reservation {
  /** Reserved tokens (`input + max_tokens`). */
  readonly tokens: number;
  /** True while the call waits in a queue; false once active (or released). */
  readonly queued: boolean;
  /** True once released. */
  readonly released: boolean;
  /** Moves a queued reservation to active; does nothing when already active or released. */
  activate(): void;
  /** Gives the tokens back; idempotent. */
  release(): void;
}

/** Options of `TokenBudget.tryReserve`. */
export interface ReserveOptions {
  /** Reserve for a call that still waits in a queue (counts in `reservedQueued`). Default false. */
  queued?: boolean;
  /**
   * Tokens predicted to be released before this reservation is used (a
   * disaggregated decode reserves for a call whose KV arrives later): the
   * reservation may exceed `available()` by as much. Default 0.
   */
  creditTokens?: number;
}

/** Options of `TokenBudget.reserveOrRefuse`. */
export interface ReserveOrRefuseOptions extends ReserveOptions {
  lane?: Lane;
  /** Retry-After for `token_budget_exhausted`, seconds (rounded up, at least 1). Default 1. */
  retryAfterSeconds?: number;
  /**
   * The whole call (input + max_tokens), when the reservation is less (a cached
   * prefix shared): it must still fit the ceiling less the guard band, or 413.
   * Default: the reservation.
   */
  callTokens?: number;
}

/** Plain-JSON view of a budget, for the admin state and for mirroring. */
export interface TokenBudgetSnapshot {
  ceilingTokens: number;
  guardTokens: number;
  reservedActive: number;
  reservedQueued: number;
  availableTokens: number;
  outstanding: number;
}

function checkTokens(what: string, tokens: number): void {
  if (!(typeof tokens === "number" && Number.isSafeInteger(tokens) && tokens >= 0)) {
    throw new RangeError(`${what} should be a non-negative whole number of tokens, got ${tokens}`);
  }
}

/**
 * What a call reserves on a replica (docs/how-it-works.md#token-budget-and-feasibility): what it adds to the replica's KV, its prompt less the
 * prefix already in that replica's GPU memory (a prefix loaded from host memory takes GPU blocks
 * anew), plus the output it may generate there. Placement asks whether this fits before choosing a
 * replica; the scheduler reserves it after.
 */
export function reservationTokens(
  promptTokens: number,
  gpuCachedTokens: number,
  outputTokens: number,
): number {
  return Math.max(0, promptTokens - gpuCachedTokens) + outputTokens;
}

/**
 * `available = ceiling − reserved(active) − reserved(queued) − guard band`.
 * Reservations never exceed `available` when taken; lowering the ceiling keeps
 * the reservations already held (admitted work is never revoked), so
 * `available()` reads 0 until enough of them are released.
 */
export class TokenBudget {
  private ceilingTokens: number;
  private readonly guardBandFraction: number;
  private active = 0;
  private queuedTokens = 0;
  private live = 0;
  private readonly releaseListeners = new Set<() => void>();

  constructor(options: TokenBudgetOptions) {
    if (options === null || typeof options !== "object") {
      throw new TypeError(`TokenBudget takes an options object, got ${String(options)}`);
    }
    checkTokens("ceilingTokens", options.ceilingTokens);
    const fraction = options.guardBandFraction ?? DEFAULT_GUARD_BAND_FRACTION;
    if (!(typeof fraction === "number" && fraction >= 0 && fraction < 1)) {
      throw new RangeError(`guardBandFraction should be in [0, 1), got ${fraction}`);
    }
    this.ceilingTokens = options.ceilingTokens;
    this.guardBandFraction = fraction;
  }

  /** The ceiling, tokens. */
  get ceiling(): number {
    return this.ceilingTokens;
  }

  /** The guard band, tokens: `ceiling × guardBandFraction`, rounded up. */
  get guardTokens(): number {
    // The epsilon keeps 96,000 × 0.1 at 9,600 whatever the float rounding does.
    return Math.ceil(this.ceilingTokens * this.guardBandFraction - 1e-6);
  }

  /** Tokens reserved by calls that are running, tokens. */
  get reservedActive(): number {
    return this.active;
  }

  /** Tokens reserved by calls that wait in a queue, tokens. */
  get reservedQueued(): number {
    return this.queuedTokens;
  }

  /** Live (not yet released) reservations. */
  get outstanding(): number {
    return this.live;
  }

  /** The largest reservation this budget could ever grant (`ceiling − guard`); larger calls are a 413 `context_limit`. */
  get maxReservable(): number {
    return Math.max(0, this.ceilingTokens - this.guardTokens);
  }

  /** Tokens a new reservation may take now; never negative. */
  available(): number {
    return Math.max(0, this.ceilingTokens - this.active - this.queuedTokens - this.guardTokens);
  }

  /** Changes the ceiling (the engine reported its KV capacity); existing reservations stay. */
  setCeiling(tokens: number): void {
    checkTokens("ceilingTokens", tokens);
    const grew = tokens > this.ceilingTokens;
    this.ceilingTokens = tokens;
    if (grew) this.released();
  }

  /**
   * Calls `listener` whenever room may have opened (a reservation released, the ceiling raised),
   * after the counters changed; returns the function that stops it. The budget queue drains on it.
   */
  onRelease(listener: () => void): () => void {
    this.releaseListeners.add(listener);
    return () => this.releaseListeners.delete(listener);
  }

  /** Reserves `tokens` when they fit in `available()`; null otherwise (nothing is held then). */
  tryReserve(tokens: number, options: ReserveOptions = {}): Reservation | null {
    checkTokens("reservation", tokens);
    if (tokens > this.available() + Math.max(0, options.creditTokens ?? 0)) return null;
    return this.grant(tokens, options.queued === true);
  }

  /**
   * Reserves `tokens` or throws the matching refusal: 413 `context_limit` when
   * the call exceeds `maxReservable` (it could never fit), 429
   * `token_budget_exhausted` when it does not fit now.
   */
  reserveOrRefuse(tokens: number, options: ReserveOrRefuseOptions = {}): Reservation {
    checkTokens("reservation", tokens);
    this.checkReservable(tokens, options);
    const reservation = this.tryReserve(tokens, options);
    if (reservation) return reservation;
    throw new Refusal(
      "token_budget_exhausted",
      `the call needs ${tokens} tokens of new KV (uncached input + max_tokens) but only ${this.available()} are available now`,
      { lane: options.lane, scope: "worker", retryAfterSeconds: options.retryAfterSeconds ?? 1 },
    );
  }

  /**
   * Throws 413 `context_limit` when the call (`callTokens`, else the reservation) exceeds
   * `maxReservable`: it could never fit, so it must not wait for room either.
   */
  checkReservable(tokens: number, options: { callTokens?: number; lane?: Lane } = {}): void {
    const callTokens = Math.max(tokens, options.callTokens ?? tokens);
    if (callTokens > this.maxReservable) {
      throw new Refusal(
        "context_limit",
        `the call needs ${callTokens} tokens (input + max_tokens) but this replica can hold at most ${this.maxReservable}`,
        { lane: options.lane, scope: "request", limits: { max_total_tokens: this.maxReservable } },
      );
    }
  }

  /** Plain-JSON view. */
  snapshot(): TokenBudgetSnapshot {
    return {
      ceilingTokens: this.ceilingTokens,
      guardTokens: this.guardTokens,
      reservedActive: this.active,
      reservedQueued: this.queuedTokens,
      availableTokens: this.available(),
      outstanding: this.live,
    };
  }

  toJSON(): TokenBudgetSnapshot {
    return this.snapshot();
  }

  private released(): void {
    for (const listener of this.releaseListeners) listener();
  }

  private grant(tokens: number, queued: boolean): Reservation {
    // The reservation's state is a closed union so release() can subtract from exactly one bucket, once.
    let state: "queued" | "active" | "released" = queued ? "queued" : "active";
    if (queued) this.queuedTokens += tokens;
    else this.active += tokens;
    this.live++;
    const budget = this;
    return {
      tokens,
      get queued() {
        return state === "queued";
      },
      get released() {
        return state === "released";
      },
      activate() {
        if (state !== "queued") return;
        budget.queuedTokens -= tokens;
        budget.active += tokens;
        state = "active";
      },
      release() {
        if (state === "released") return;
        if (state === "queued") budget.queuedTokens -= tokens;
        else budget.active -= tokens;
        budget.live--;
        state = "released";
        budget.released();
      },
    };
  }
}
