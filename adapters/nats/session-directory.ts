/**
 * @module Where every session lives, on JetStream KV (bucket `sluice-sessions`,
 * key = session id → `{ replica, state, frontend }`). Written on every session
 * event, read by a frontend that meets a session it does not hold: the
 * scheduler pins the session to the same replica (`SessionDirectory`), and the
 * NATS service hands the step to the frontend holding it (`SessionRouter`),
 * so a session keeps one window slot however the queue group spreads its steps.
 */

import { Empty, ErrorCode, type KV, type KvEntry, type NatsConnection, type NatsError } from "nats";
import { Refusal } from "../../src/errors.js";
import type { SessionDirectory } from "../../src/sessions/window-authority.js";
import type { SchedulerEvents, SessionState, SessionView } from "../../src/types.js";
import { frontendSubject, kvKey } from "./protocol.js";
import { isRevisionConflict } from "./window-authority.js";

/** Name of the KV bucket holding the session directory. */
export const SESSIONS_BUCKET = "sluice-sessions";

/** The value stored under a session's key. */
export interface SessionRecordValue {
  id: string;
  state: SessionState;
  replica: string | null;
  /** Frontend holding the session. */
  frontend: string;
  /** Steps and context tokens as of the write (the holder's view is exact; this one may lag a step). */
  steps?: number;
  tokens?: number;
  /** Wall-clock time of the write, ms since the epoch (for operators; never compared across machines). */
  at: number;
}

/** Where a session's requests are served when several frontends share the queue group. */
export type SessionRoute = { owner: "self" } | { owner: "other"; frontendId: string };

/** Keeps each session's steps on the one frontend that holds it (JetStream KV: the directory below). */
export interface SessionRouter {
  /**
   * Decides where a session not open on this frontend is served. With
   * `claim`, a session no live frontend holds is claimed for this one.
   */
  route(sessionId: string, options: { claim: boolean }): Promise<SessionRoute>;
  /** Before a session is handed over: no write for it from here may land after the new holder's claim. */
  prepareRelease?(id: string): Promise<void>;
  /** The hand-over did not happen after all. */
  cancelRelease?(id: string, view: SessionView): void;
}

/** What a frontend handing a session over tells the next holder. */
export interface Handover {
  replica: string | null;
  steps: number;
  tokens: number;
  lane?: "interactive" | "bulk";
  metadata?: Record<string, unknown>;
}

/** A holder's answer to a hand-over request. */
export type TakeoverAnswer =
  | { kind: "released"; handover: Handover }
  | { kind: "busy" }
  | { kind: "not-held" }
  | { kind: "gone" };

/** Options of {@link KvSessionDirectory}. */
export interface KvSessionDirectoryOptions {
  /** The `sluice-sessions` bucket. */
  kv: KV;
  nc: NatsConnection;
  frontendId: string;
  /** Longest a lookup on the request path waits for KV, ms; slower means "unknown". Default 500. */
  lookupTimeoutMs?: number;
  /**
   * Longest a claim (taking a session over, or routing a step to its holder) waits for KV while
   * connected, ms; slower refuses the step with 503 `unavailable`. Default 5000. Never "unknown":
   * a step run here without knowing the holder would open a second copy of the session.
   */
  claimTimeoutMs?: number;
  /** Longest a liveness ping of another frontend waits, ms; slower refuses the step with 503. Default 500. */
  pingTimeoutMs?: number;
  /**
   * How long a holder may have no subscriber on its subject before its sessions are taken over, ms.
   * Default 3000: after a NATS restart the frontends resubscribe one by one (reconnect wait 250 ms plus
   * jitter), and a holder not yet back is not gone.
   */
  holderGraceMs?: number;
  /** A frontend that answered a ping is taken as alive this long, ms. Default 1000. */
  aliveCacheMs?: number;
  /** Whether the connection is up (lookups while it is down answer "unknown" at once). */
  isConnected?: () => boolean;
  onError?: (err: unknown) => void;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function decode(entry: KvEntry | null): SessionRecordValue | undefined {
  if (entry?.operation !== "PUT" || entry.value.byteLength === 0) return undefined;
  try {
    return JSON.parse(decoder.decode(entry.value)) as SessionRecordValue;
  } catch {
    return undefined;
  }
}

/** The directory could not say who holds a session: the step is refused rather than run as a possible second copy. */
function unsettled(id: string, why: string): Refusal {
  return new Refusal(
    "unavailable",
    `the session directory entry of ${JSON.stringify(id)} ${why}; try again`,
    {
      retryAfterSeconds: 1,
      scope: "fleet",
    },
  );
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/**
 * The session directory and router over JetStream KV. Event writes are
 * queued and written behind (latest state per session wins), so a NATS
 * outage delays them rather than losing them or slowing a call.
 */
export class KvSessionDirectory implements SessionDirectory, SessionRouter {
  readonly frontendId: string;
  private readonly kv: KV;
  private readonly nc: NatsConnection;
  private readonly lookupTimeoutMs: number;
  private readonly claimTimeoutMs: number;
  private readonly pingTimeoutMs: number;
  private readonly holderGraceMs: number;
  private readonly aliveCacheMs: number;
  private readonly isConnected: () => boolean;
  private readonly onError: (err: unknown) => void;
  private readonly pending = new Map<string, SessionRecordValue>();
  private readonly aliveUntil = new Map<string, number>();
  /** Frontends last found with no subscriber: when that was first and last seen (performance.now()). */
  private readonly unheard = new Map<string, { first: number; last: number }>();
  /** Sessions handed to another frontend: their local close is not written. */
  private readonly released = new Set<string>();
  private flushing: Promise<void> | undefined;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private closed = false;

  constructor(options: KvSessionDirectoryOptions) {
    this.kv = options.kv;
    this.nc = options.nc;
    this.frontendId = options.frontendId;
    this.lookupTimeoutMs = options.lookupTimeoutMs ?? 500;
    this.claimTimeoutMs = options.claimTimeoutMs ?? 5000;
    this.pingTimeoutMs = options.pingTimeoutMs ?? 500;
    this.aliveCacheMs = options.aliveCacheMs ?? 1000;
    this.holderGraceMs = options.holderGraceMs ?? 3000;
    for (const [name, value] of [
      ["lookupTimeoutMs", this.lookupTimeoutMs],
      ["claimTimeoutMs", this.claimTimeoutMs],
      ["pingTimeoutMs", this.pingTimeoutMs],
      ["holderGraceMs", this.holderGraceMs],
      ["aliveCacheMs", this.aliveCacheMs],
    ] as const) {
      if (!(Number.isFinite(value) && value > 0))
        throw new RangeError(`${name} must be a positive number of ms, got ${value}`);
    }
    this.isConnected = options.isConnected ?? (() => !this.nc.isClosed());
    this.onError = options.onError ?? (() => {});
  }

  /** Writes the scheduler's session events into the directory. */
  bind(scheduler: {
    addEvents(events: SchedulerEvents): void;
    getSession?(id: string): { steps: number; tokens: number } | undefined;
  }): void {
    scheduler.addEvents({
      session: (e) => {
        // A session handed to another frontend is closed here, but the directory now speaks for its new holder.
        if (this.released.has(e.id)) return;
        const state: SessionState =
          e.event === "closed" ? "closed" : e.event === "paused" ? "paused" : "active";
        const view = scheduler.getSession?.(e.id);
        this.record(e.id, state, e.replica, view);
      },
    });
  }

  /**
   * Before closing a session handed to another frontend: no write of this
   * frontend for it may land after the new holder's claim. Drops what is
   * queued for it, waits for a write in progress, and ignores its events
   * until this frontend claims it again.
   */
  async prepareRelease(id: string): Promise<void> {
    this.released.add(id);
    this.pending.delete(id);
    await this.flushing;
  }

  /** The hand-over did not happen (a step started meanwhile): this frontend writes the session again. */
  cancelRelease(
    id: string,
    view: { state: SessionState; replica: string | null; steps: number; tokens: number },
  ): void {
    if (!this.released.delete(id)) return;
    this.record(id, view.state, view.replica, view);
  }

  /**
   * Makes this frontend the session's holder (an HTTP step arrived here).
   * A live holder elsewhere is asked to hand it over first (`release`): it
   * answers once no step of the session runs there, with its history; a
   * holder with no subscriber for `holderGraceMs` is gone, a slow one is
   * not (503). The claim is a compare-and-set, so
   * two frontends taking the same session at once cannot both win. Returns
   * the history to adopt; "busy" when a step of it still runs at its holder
   * after the holder's wait; or undefined (a new session, or NATS unreachable:
   * best effort, the step runs here). Throws a 503 {@link Refusal} when KV is
   * connected but does not settle who holds the session in time: running the
   * step here then could open a second copy of a session held elsewhere.
   */
  async takeOver(
    id: string,
    release: (owner: string, id: string) => Promise<TakeoverAnswer>,
  ): Promise<Handover | "busy" | undefined> {
    if (!this.isConnected()) return undefined;
    const key = kvKey(id);
    // A holder that released the session to this take-over has closed its copy: if the claim below
    // loses a race (a write of that holder's still landing) and the record still names it, its
    // hand-over is the history, not the record (which lags a step: it is written at step starts).
    let releasedBy: { frontend: string; handover: Handover } | undefined;
    for (let attempt = 0; attempt < 4; attempt++) {
      let entry: KvEntry | null | undefined;
      try {
        entry = await withTimeout(this.kv.get(key), this.claimTimeoutMs);
      } catch (err) {
        this.onError(err);
        return undefined;
      }
      if (entry === undefined) throw unsettled(id, "did not answer in time");
      const value = decode(entry);
      const open = value !== undefined && value.state !== "closed";
      let handover: Handover | undefined;
      if (open && value.frontend !== this.frontendId) {
        const holder = value.frontend;
        const answer =
          releasedBy?.frontend === holder
            ? ({ kind: "released", handover: releasedBy.handover } as const)
            : await this.askHolder(holder, id, () => release(holder, id));
        // Its holder waited for the step running there and it still runs: never a second copy.
        if (answer.kind === "busy") return "busy";
        if (answer.kind === "released") releasedBy = { frontend: value.frontend, handover: answer.handover };
        handover =
          answer.kind === "released"
            ? answer.handover
            : // Not held there after all, or its holder is gone: its record still knows the replica.
              { replica: value.replica, steps: value.steps ?? 0, tokens: value.tokens ?? 0 };
      } else if (open) {
        handover = undefined;
      }
      const mine: SessionRecordValue = {
        id,
        state: open ? value.state : "waiting",
        replica: handover?.replica ?? (open ? value.replica : null),
        frontend: this.frontendId,
        at: Date.now(),
        ...(handover ? { steps: handover.steps, tokens: handover.tokens } : {}),
      };
      try {
        const data = encoder.encode(JSON.stringify(mine));
        if (entry === null || entry.operation !== "PUT") await this.kv.create(key, data);
        else await this.kv.update(key, data, entry.revision);
        this.released.delete(id);
        return handover;
      } catch (err) {
        if (!isRevisionConflict(err)) {
          this.onError(err);
          this.released.delete(id);
          return handover;
        }
      }
    }
    throw unsettled(id, "kept changing under concurrent claims");
  }

  /** The replica another frontend pinned a session to (`SessionDirectory`). */
  async lookup(id: string): Promise<{ replica: string | null } | undefined> {
    const value = await this.read(id);
    if (!value || value.state === "closed") return undefined;
    return { replica: value.replica };
  }

  /** The stored record of a session, or undefined (unknown, or KV unreachable). */
  async read(id: string): Promise<SessionRecordValue | undefined> {
    const queued = this.pending.get(id);
    if (queued) return queued;
    if (!this.isConnected()) return undefined;
    try {
      return decode((await withTimeout(this.kv.get(kvKey(id)), this.lookupTimeoutMs)) ?? null);
    } catch (err) {
      this.onError(err);
      return undefined;
    }
  }

  /**
   * Where a step, close or read of a session not open here is served. Waits for KV up to the claim
   * bound and refuses with 503 when it does not answer: served here, a close or read would act on a
   * stale local copy while the holder keeps the session open.
   */
  async route(sessionId: string, options: { claim: boolean }): Promise<SessionRoute> {
    if (!this.isConnected()) return { owner: "self" };
    const key = kvKey(sessionId);
    for (let attempt = 0; attempt < 3; attempt++) {
      let entry: KvEntry | null | undefined;
      try {
        entry = await withTimeout(this.kv.get(key), this.claimTimeoutMs);
      } catch (err) {
        this.onError(err);
        return { owner: "self" };
      }
      if (entry === undefined) throw unsettled(sessionId, "did not answer in time");
      const value = decode(entry);
      if (value && value.state !== "closed" && value.frontend !== this.frontendId) {
        if (await this.alive(value.frontend, sessionId))
          return { owner: "other", frontendId: value.frontend };
      }
      if (!options.claim) return { owner: "self" };
      // Free, closed, ours, or held by a frontend that is gone: take it, atomically against a concurrent taker.
      const mine: SessionRecordValue = {
        id: sessionId,
        state: value && value.state !== "closed" ? value.state : "waiting",
        replica: value?.replica ?? null,
        frontend: this.frontendId,
        at: Date.now(),
      };
      try {
        const data = encoder.encode(JSON.stringify(mine));
        if (entry === null || entry.operation !== "PUT") await this.kv.create(key, data);
        else await this.kv.update(key, data, entry.revision);
        this.released.delete(sessionId);
        return { owner: "self" };
      } catch (err) {
        if (!isRevisionConflict(err)) {
          this.onError(err);
          return { owner: "self" };
        }
      }
    }
    if (options.claim) throw unsettled(sessionId, "kept changing under concurrent claims");
    return { owner: "self" };
  }

  /** Queues a write of a session's state (latest per session wins). */
  record(
    id: string,
    state: SessionState,
    replica: string | null,
    progress?: { steps: number; tokens: number },
  ): void {
    if (this.closed) return;
    this.pending.set(id, {
      id,
      state,
      replica,
      frontend: this.frontendId,
      at: Date.now(),
      ...(progress ? { steps: progress.steps, tokens: progress.tokens } : {}),
    });
    this.kick();
  }

  /** Resolves when every queued write is stored (or the directory closed). */
  async flush(): Promise<void> {
    while (this.pending.size > 0 && !this.closed) {
      this.kick();
      await this.flushing;
      if (this.pending.size > 0) await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Writes queued now are still attempted; nothing is queued after. */
  async close(): Promise<void> {
    if (this.closed) return;
    clearTimeout(this.retryTimer);
    if (this.isConnected()) await withTimeout(this.flush(), 2000);
    this.closed = true;
  }

  /** The connection came back: write what queued up while it was down. */
  reconnected(): void {
    this.aliveUntil.clear();
    // What was unheard while this frontend was away says nothing of the others.
    this.unheard.clear();
    this.kick();
  }

  private kick(): void {
    if (this.flushing || this.pending.size === 0) return;
    this.flushing = this.flushOnce().finally(() => {
      this.flushing = undefined;
      if (this.pending.size > 0 && !this.closed) {
        clearTimeout(this.retryTimer);
        // Failed writes wait for the connection; retry on a slow beat rather than spinning.
        this.retryTimer = setTimeout(() => this.kick(), this.isConnected() ? 50 : 500);
        this.retryTimer.unref?.();
      }
    });
  }

  private async flushOnce(): Promise<void> {
    if (!this.isConnected()) return;
    const batch = [...this.pending.values()];
    await Promise.all(
      batch.map(async (value) => {
        try {
          await this.kv.put(kvKey(value.id), encoder.encode(JSON.stringify(value)));
          // A newer state queued meanwhile stays queued.
          if (this.pending.get(value.id) === value) this.pending.delete(value.id);
        } catch (err) {
          this.onError(err);
        }
      }),
    );
  }

  /** Whether another frontend answers on its own subject (cached briefly); see {@link askHolder}. */
  private async alive(frontendId: string, sessionId: string): Promise<boolean> {
    const until = this.aliveUntil.get(frontendId);
    if (until !== undefined && until > performance.now()) return true;
    const answer = await this.askHolder(frontendId, sessionId, async () => {
      await this.nc.request(frontendSubject(frontendId, "ping"), Empty, { timeout: this.pingTimeoutMs });
      return true as const;
    });
    if (answer === true) this.aliveUntil.set(frontendId, performance.now() + this.aliveCacheMs);
    else this.aliveUntil.delete(frontendId);
    return answer === true;
  }

  /**
   * Asks a session's holder something over NATS: the one rule for when a holder is gone. No
   * subscriber on its subject for `holderGraceMs` (asked again meanwhile) is gone: its subscription
   * died with it. A slow answer is not: a busy holder is alive, and taking its session would open a
   * second copy, so the step is refused with 503 to be retried.
   */
  private async askHolder<T>(
    holder: string,
    sessionId: string,
    ask: () => Promise<T>,
  ): Promise<T | { kind: "gone" }> {
    for (;;) {
      try {
        const answer = await ask();
        this.unheard.delete(holder);
        return answer;
      } catch (err) {
        if ((err as NatsError)?.code !== ErrorCode.NoResponders || !this.isConnected()) {
          throw unsettled(sessionId, `names frontend ${holder}, which did not answer in time`);
        }
        const now = performance.now();
        const seen = this.unheard.get(holder);
        // A gap longer than the grace since the last miss starts the count afresh: the holder may be reconnecting now.
        const first = seen && now - seen.last <= this.holderGraceMs ? seen.first : now;
        this.unheard.set(holder, { first, last: now });
        if (now - first >= this.holderGraceMs) return { kind: "gone" };
        await new Promise((resolve) => setTimeout(resolve, Math.min(100, this.holderGraceMs)));
      }
    }
  }
}
