/**
 * @module Session admission mechanics (SPEC 6): the session table, per-replica
 * windows of active sessions, pausing at step boundaries, resume order, the
 * bounded session queue and idle expiry. The window *law* lives in
 * `aimd-window.ts`; this file only applies whatever size it gives.
 */

import { LRUCache } from "lru-cache";
import type { Cancel, Clock } from "../clock.js";
import { Refusal } from "../errors.js";
import type { Lane, SessionState, SessionView } from "../types.js";

/** One session as the admission layer tracks it. */
export interface SessionRecord {
  readonly id: string;
  lane: Lane | undefined;
  metadata: Record<string, unknown> | undefined;
  state: SessionState;
  /** Replica the session is pinned to (holds its window slot there while active). */
  replica: string | null;
  steps: number;
  /** Tokens of the context: last prompt plus its output. */
  tokens: number;
  /** Steps in flight right now. */
  running: number;
  /** The window shrank: pause this session at its next step boundary. */
  pauseRequested: boolean;
  /** Order of first admission; the youngest (largest) are paused first. */
  admittedSeq: number;
  pausedAt: number;
  /** The replica a paused session was moved away from when it resumed elsewhere; cleared by whoever reports it. */
  movedFrom: string | null;
  /** Steps waiting for this session to become active. */
  readonly waiters: StepWaiter[];
  /** Free for the scheduler: per-session routing state (incremental hashes). */
  routing: unknown;
}

interface StepWaiter {
  readonly session: SessionRecord;
  readonly enqueuedAt: number;
  /** Chooses a replica among those with room, for a session not yet pinned. */
  readonly choose: (candidates: readonly string[]) => string | undefined;
  resolve(replica: string): void;
  reject(error: unknown): void;
  /** True while it sits in the global queue of not-yet-admitted sessions. */
  queued: boolean;
  done: boolean;
  cancelTimer: Cancel | undefined;
  detachSignal: (() => void) | undefined;
}

interface ReplicaSlots {
  /** null: no window (the policy admits every session at once). */
  size: number | null;
  /** Whether the replica takes sessions it does not already hold (healthy, fresh signals). */
  accepting: boolean;
  /** Active sessions ordered by first admission (oldest first). */
  readonly active: SessionRecord[];
  /** Paused sessions, oldest pause first. */
  readonly paused: SessionRecord[];
}

export type SessionEventName = "admitted" | "paused" | "resumed" | "closed";

export interface SessionAdmissionOptions {
  clock: Clock;
  /** Sessions that may wait for a first admission at once (beyond: 429 `session_queue_full`). */
  queueLimit: number;
  /** Longest a step waits for its session to become active, ms (beyond: 429 `queue_timeout`). */
  waitLimitMs: number;
  /** A session with no step for this long is closed, ms. */
  idleTimeoutMs: number;
  /** Most sessions remembered at once (open or closed); the least recently used beyond it are dropped. */
  maxSessions?: number;
  /** Estimated seconds until a slot frees, for Retry-After. */
  retryAfterSeconds?: () => number;
  onEvent?: (id: string, event: SessionEventName, replica: string | null) => void;
}

/** One replica's window occupancy (see `ReplicaState.window`). */
export interface ReplicaWindowCounts {
  size: number | null;
  sizeTokens: number | null;
  footprintTokens: number | null;
  active: number;
  idle: number;
  dormant: number;
  paused: number;
  waiting: number;
}

/** Leaks and load, for `idleCheck()` and state snapshots. */
export interface AdmissionCounts {
  total: number;
  waiting: number;
  active: number;
  idle: number;
  dormant: number;
  paused: number;
  runningSteps: number;
  queuedSteps: number;
}

/**
 * Admits whole sessions into per-replica windows. A step of an active session
 * passes at once; a step of a waiting or paused session waits until its session
 * holds a slot. Every wait honours an AbortSignal and the wait limit.
 */
export class SessionAdmission {
  private readonly clock: Clock;
  private readonly options: SessionAdmissionOptions;
  private readonly replicas = new Map<string, ReplicaSlots>();
  private readonly sessions: LRUCache<string, SessionRecord>;
  /** First steps of sessions never admitted, in arrival order. */
  private readonly queue: StepWaiter[] = [];
  private admittedSeq = 0;
  private filling = false;

  constructor(options: SessionAdmissionOptions) {
    this.options = options;
    this.clock = options.clock;
    const clock = options.clock;
    this.sessions = new LRUCache<string, SessionRecord>({
      max: options.maxSessions ?? 100_000,
      ttl: options.idleTimeoutMs,
      ttlResolution: 0,
      updateAgeOnGet: false,
      // lru-cache reads a start time of 0 as "no TTL"; a virtual clock starts at 0.
      perf: { now: () => clock.now() + 1 },
      dispose: (session, _id, reason) => {
        if (reason === "expire" || reason === "evict") this.expire(session);
      },
    });
  }

  /** Registers a replica; `size` null means no window. */
  addReplica(id: string, size: number | null): void {
    if (this.replicas.has(id)) return;
    this.replicas.set(id, { size, accepting: true, active: [], paused: [] });
  }

  /** Applies a new window size (and whether the replica takes new sessions), pausing or admitting as needed. */
  setWindow(id: string, size: number | null, accepting: boolean): void {
    const slots = this.replicas.get(id);
    if (!slots) return;
    slots.size = size;
    slots.accepting = accepting;
    this.enforce(slots);
    this.fill();
  }

  /** Whether the replica takes sessions it does not hold yet (healthy, fresh signals, granted). */
  isAccepting(id: string): boolean {
    return this.replicas.get(id)?.accepting ?? false;
  }

  /** Whether the replica has room for one more session now. */
  hasRoom(id: string): boolean {
    const slots = this.replicas.get(id);
    return slots !== undefined && this.room(slots) > 0;
  }

  /** Opens a session (state `waiting`); an id that is open already is returned as it is. */
  open(id: string, init: { lane?: Lane; metadata?: Record<string, unknown> } = {}): SessionRecord {
    const existing = this.sessions.get(id);
    if (existing && existing.state !== "closed") return existing;
    const session: SessionRecord = {
      id,
      lane: init.lane,
      metadata: init.metadata,
      state: "waiting",
      replica: null,
      steps: 0,
      tokens: 0,
      running: 0,
      pauseRequested: false,
      admittedSeq: 0,
      pausedAt: 0,
      movedFrom: null,
      waiters: [],
      routing: undefined,
    };
    this.sessions.set(id, session);
    return session;
  }

  /** The session with this id, closed ones included while remembered. */
  get(id: string): SessionRecord | undefined {
    return this.sessions.get(id, { allowStale: true });
  }

  view(session: SessionRecord): SessionView {
    const view: SessionView = {
      id: session.id,
      state: session.state,
      replica: session.replica,
      steps: session.steps,
      tokens: session.tokens,
      phase: session.state === "active" && session.running === 0 ? "idle" : session.state,
      footprint_tokens: 0,
      retention_ms: 0,
    };
    if (session.lane) view.lane = session.lane;
    if (session.metadata) view.metadata = session.metadata;
    return view;
  }

  /**
   * Waits until `session` may run a step and returns the replica it is pinned
   * to. `choose` picks a replica among those with room when the session has
   * none yet. Rejects with `Refusal` (`session_queue_full`, `queue_timeout`,
   * `session_not_found`) or the signal's abort reason.
   */
  acquireStep(
    session: SessionRecord,
    choose: (candidates: readonly string[]) => string | undefined,
    signal?: AbortSignal,
  ): Promise<string> {
    signal?.throwIfAborted();
    if (session.state === "closed") {
      return Promise.reject(new Refusal("session_not_found", `session ${session.id} is closed`));
    }
    this.touch(session);
    if (session.state === "active" && session.replica !== null) {
      const slots = this.replicas.get(session.replica);
      if (!session.pauseRequested || session.running > 0 || !slots) {
        session.running++;
        return Promise.resolve(session.replica);
      }
      // The window shrank while this session was between steps: this boundary is where it pauses.
      this.pause(session, slots);
    }
    if (session.state === "waiting") {
      const candidates = this.candidates();
      if (candidates.length > 0 && this.queue.length === 0) {
        const replica = choose(candidates);
        if (replica !== undefined && this.hasRoom(replica)) {
          this.activate(session, replica, "admitted");
          session.running++;
          return Promise.resolve(replica);
        }
      }
      const alreadyQueued = session.waiters.some((waiter) => waiter.queued);
      if (!alreadyQueued && this.queue.length >= this.options.queueLimit) {
        return Promise.reject(
          new Refusal(
            "session_queue_full",
            `the session queue is full (${this.options.queueLimit} sessions)`,
            {
              retryAfterSeconds: this.options.retryAfterSeconds?.() ?? 1,
            },
          ),
        );
      }
    }
    return this.wait(session, choose, signal);
  }

  /** A step ended (normally or not): updates the session and pauses it here when asked to. */
  endStep(session: SessionRecord, outcome: { contextTokens?: number; completed: boolean }): void {
    session.running = Math.max(0, session.running - 1);
    if (outcome.completed) {
      session.steps++;
      if (outcome.contextTokens !== undefined) session.tokens = outcome.contextTokens;
    }
    if (session.state === "closed") return;
    this.touch(session);
    if (session.state === "active" && session.pauseRequested && session.running === 0 && session.replica) {
      const slots = this.replicas.get(session.replica);
      if (slots) this.pause(session, slots);
      this.fill();
    }
  }

  /** Moves an active session's slot to another replica (an affinity break). */
  rebind(session: SessionRecord, replica: string): void {
    if (session.state !== "active" || session.replica === replica) return;
    const from = session.replica ? this.replicas.get(session.replica) : undefined;
    const to = this.replicas.get(replica);
    if (!to) return;
    if (from) removeFrom(from.active, session);
    insertByAdmission(to.active, session);
    session.replica = replica;
    session.pauseRequested = false;
    this.fill();
  }

  /** Closes a session: frees its slot at once and wakes the next. Returns false for an unknown id. */
  close(id: string): boolean {
    const session = this.sessions.get(id, { allowStale: true });
    if (!session || session.state === "closed") return false;
    this.shut(session, "closed by client");
    return true;
  }

  /** Expires sessions idle past the timeout (called on every control tick). */
  sweep(): void {
    this.sessions.purgeStale();
  }

  counts(): AdmissionCounts {
    const counts: AdmissionCounts = {
      total: 0,
      waiting: 0,
      active: 0,
      idle: 0,
      dormant: 0,
      paused: 0,
      runningSteps: 0,
      queuedSteps: 0,
    };
    for (const session of this.sessions.values()) {
      if (session.state === "closed") continue;
      counts.total++;
      counts[session.state]++;
      if (session.state === "active" && session.running === 0) counts.idle++;
      counts.runningSteps += session.running;
      counts.queuedSteps += session.waiters.length;
    }
    return counts;
  }

  /** Window occupancy of one replica. */
  replicaCounts(id: string): ReplicaWindowCounts {
    const slots = this.replicas.get(id);
    if (!slots)
      return {
        size: null,
        sizeTokens: null,
        footprintTokens: null,
        active: 0,
        idle: 0,
        dormant: 0,
        paused: 0,
        waiting: 0,
      };
    let waiting = 0;
    for (const session of slots.paused) waiting += session.waiters.length > 0 ? 1 : 0;
    let idle = 0;
    for (const session of slots.active) if (session.running === 0) idle++;
    return {
      size: slots.size,
      sizeTokens: null,
      footprintTokens: null,
      active: slots.active.length,
      idle,
      dormant: 0,
      paused: slots.paused.length,
      waiting: waiting + this.queue.length,
    };
  }

  /** Sessions waiting for a first admission. */
  get queuedSessions(): number {
    return this.queue.length;
  }

  private room(slots: ReplicaSlots): number {
    if (!slots.accepting) return 0;
    if (slots.size === null) return Number.POSITIVE_INFINITY;
    let holding = 0;
    for (const session of slots.active) if (!session.pauseRequested) holding++;
    return slots.size - holding;
  }

  private candidates(): string[] {
    const ids: string[] = [];
    for (const [id, slots] of this.replicas) if (this.room(slots) > 0) ids.push(id);
    return ids;
  }

  private touch(session: SessionRecord): void {
    // Re-setting refreshes the idle TTL without disposing the record.
    this.sessions.set(session.id, session, { noDisposeOnSet: true });
  }

  private activate(session: SessionRecord, replica: string, event: "admitted" | "resumed"): void {
    const slots = this.replicas.get(replica);
    if (!slots) return;
    if (session.state === "paused") {
      const from = session.replica ? this.replicas.get(session.replica) : undefined;
      if (from) removeFrom(from.paused, session);
    }
    if (event === "admitted") session.admittedSeq = ++this.admittedSeq;
    session.state = "active";
    session.replica = replica;
    session.pauseRequested = false;
    insertByAdmission(slots.active, session);
    this.options.onEvent?.(session.id, event, replica);
    for (const waiter of session.waiters.splice(0)) this.settle(waiter, replica);
  }

  private pause(session: SessionRecord, slots: ReplicaSlots): void {
    removeFrom(slots.active, session);
    session.state = "paused";
    session.pauseRequested = false;
    session.pausedAt = this.clock.now();
    slots.paused.push(session);
    this.options.onEvent?.(session.id, "paused", session.replica);
  }

  /** The window is smaller than the sessions it holds: mark the youngest to pause at their next boundary. */
  private enforce(slots: ReplicaSlots): void {
    if (slots.size === null) return;
    let excess = -this.room(slots);
    for (let i = slots.active.length - 1; i >= 0 && excess > 0; i--) {
      const session = slots.active[i]!;
      if (session.pauseRequested) continue;
      session.pauseRequested = true;
      excess--;
    }
    for (const session of [...slots.active]) {
      if (session.pauseRequested && session.running === 0) this.pause(session, slots);
    }
  }

  /**
   * Room opened: un-pause pending pauses, resume paused sessions (oldest first), then admit waiting
   * ones; room still left over takes paused sessions of replicas without room (`resumeElsewhere`).
   */
  private fill(): void {
    if (this.filling) return;
    this.filling = true;
    try {
      for (const slots of this.replicas.values()) {
        for (const session of slots.active) {
          if (this.room(slots) <= 0) break;
          if (session.pauseRequested) session.pauseRequested = false;
        }
        while (slots.paused.length > 0 && this.room(slots) > 0) {
          const session = slots.paused[0]!;
          this.activate(session, session.replica!, "resumed");
        }
      }
      while (this.queue.length > 0) {
        const candidates = this.candidates();
        if (candidates.length === 0) break;
        const waiter = this.queue[0]!;
        const replica = waiter.choose(candidates);
        if (replica === undefined || !candidates.includes(replica)) break;
        this.queue.shift();
        waiter.queued = false;
        this.activate(waiter.session, replica, "admitted");
      }
      this.resumeElsewhere();
    } finally {
      this.filling = false;
    }
  }

  /**
   * Cache affinity is load: a paused session with a step waiting, pinned to a
   * replica whose window has no room, resumes on a replica that has room once
   * nothing else wants that room (its own paused sessions and every waiting
   * session went first). A slot left empty is throughput lost, while the
   * paused session's cache is being evicted on its old replica anyway; the
   * step pays a recompute where it lands. Oldest pause first.
   */
  private resumeElsewhere(): void {
    if (this.queue.length > 0) return;
    const stranded: SessionRecord[] = [];
    for (const slots of this.replicas.values()) {
      if (this.room(slots) > 0) continue;
      for (const session of slots.paused) if (session.waiters.length > 0) stranded.push(session);
    }
    if (stranded.length === 0) return;
    stranded.sort((a, b) => a.pausedAt - b.pausedAt);
    // A stranded session's own replica has no room, so it is never among the candidates.
    let candidates = this.candidates();
    for (const session of stranded) {
      if (candidates.length === 0) return;
      const replica = session.waiters[0]!.choose(candidates);
      if (replica === undefined || !candidates.includes(replica)) continue;
      session.movedFrom = session.replica;
      this.activate(session, replica, "resumed");
      if (!this.hasRoom(replica)) candidates = candidates.filter((id) => id !== replica);
    }
  }

  private wait(
    session: SessionRecord,
    choose: (candidates: readonly string[]) => string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<string> {
    return new Promise<string>((resolve, reject) => {
      const waiter: StepWaiter = {
        session,
        enqueuedAt: this.clock.now(),
        choose,
        resolve,
        reject,
        queued: false,
        done: false,
        cancelTimer: undefined,
        detachSignal: undefined,
      };
      session.waiters.push(waiter);
      if (session.state === "waiting" && !session.waiters.some((other) => other !== waiter && other.queued)) {
        waiter.queued = true;
        this.queue.push(waiter);
      }
      waiter.cancelTimer = this.clock.setTimeout(() => {
        this.drop(
          waiter,
          new Refusal(
            "queue_timeout",
            `the session waited ${this.options.waitLimitMs} ms for a window slot`,
            {
              retryAfterSeconds: this.options.retryAfterSeconds?.() ?? 1,
            },
          ),
        );
      }, this.options.waitLimitMs);
      if (signal) {
        const onAbort = () => this.drop(waiter, signal.reason);
        signal.addEventListener("abort", onAbort, { once: true });
        waiter.detachSignal = () => signal.removeEventListener("abort", onAbort);
      }
      this.fill();
    });
  }

  private settle(waiter: StepWaiter, replica: string): void {
    if (waiter.done) return;
    waiter.done = true;
    waiter.cancelTimer?.();
    waiter.detachSignal?.();
    waiter.session.running++;
    waiter.resolve(replica);
  }

  /** Removes a waiter that gave up (timeout, abort, close) and hands its queue place on. */
  private drop(waiter: StepWaiter, error: unknown): void {
    if (waiter.done) return;
    waiter.done = true;
    waiter.cancelTimer?.();
    waiter.detachSignal?.();
    removeFrom(waiter.session.waiters, waiter);
    if (waiter.queued) {
      removeFrom(this.queue, waiter);
      waiter.queued = false;
      // Another step of the same session may still wait: it takes the queue place.
      const next = waiter.session.waiters[0];
      if (next && waiter.session.state === "waiting") {
        next.queued = true;
        insertByEnqueue(this.queue, next);
      }
    }
    waiter.reject(error);
    this.fill();
  }

  private expire(session: SessionRecord): void {
    if (session.state === "closed") return;
    if (session.running > 0 || session.waiters.length > 0) {
      // A session with a step in flight is not idle: keep it.
      queueMicrotask(() => {
        if (session.state !== "closed") this.sessions.set(session.id, session, { noDisposeOnSet: true });
      });
      return;
    }
    this.shut(session, "expired");
  }

  private shut(session: SessionRecord, why: string): void {
    const slots = session.replica ? this.replicas.get(session.replica) : undefined;
    if (slots) {
      removeFrom(slots.active, session);
      removeFrom(slots.paused, session);
    }
    session.state = "closed";
    session.pauseRequested = false;
    for (const waiter of [...session.waiters]) {
      this.drop(waiter, new Refusal("session_not_found", `session ${session.id} was ${why}`));
    }
    this.options.onEvent?.(session.id, "closed", session.replica);
    this.fill();
  }
}

function removeFrom<T>(list: T[], item: T): void {
  const index = list.indexOf(item);
  if (index >= 0) list.splice(index, 1);
}

function insertByAdmission(list: SessionRecord[], session: SessionRecord): void {
  let i = list.length;
  while (i > 0 && list[i - 1]!.admittedSeq > session.admittedSeq) i--;
  list.splice(i, 0, session);
}

function insertByEnqueue(list: StepWaiter[], waiter: StepWaiter): void {
  let i = list.length;
  while (i > 0 && list[i - 1]!.enqueuedAt > waiter.enqueuedAt) i--;
  list.splice(i, 0, waiter);
}
