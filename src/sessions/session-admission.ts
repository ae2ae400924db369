/**
 * @module Session admission mechanics (docs/how-it-works.md#session-window-tokens-of-cache-footprint): the session table, per-replica
 * windows of active sessions counted in sessions or in tokens of cache
 * footprint, soft retention and dormancy of idle sessions, pausing at step
 * boundaries, resume order, the bounded session queue and idle expiry. The
 * window *laws* live in `aimd-window.ts` and `token-window.ts`; this file only
 * applies whatever size they give.
 */

import type { Clock } from "../clock.js";
import { DEFAULT_SESSIONS } from "../config/defaults.js";
import type { Band, TenantSpec } from "../config/scheduler-config.js";
import { Refusal } from "../errors.js";
import { entitlements, jainIndex } from "../tenants/fair-share.js";
import { BAND_RANK, DEFAULT_TENANT, TenantLedger } from "../tenants/tenant-ledger.js";
import type { Lane, SessionPhase, SessionState, SessionView, TenantState } from "../types.js";
import { IdleGaps } from "./idle-gaps.js";
import {
  type AdmissionUnit,
  type LeaveReason,
  NO_BLOCKS,
  type PauseReason,
  type ReplicaSlots,
  type RetentionSource,
  type SessionHandover,
  SessionRecord,
  type SessionStatus,
  type StepDemand,
  type StepWaiter,
  type WaitReason,
} from "./session-record.js";

export type {
  AdmissionUnit,
  LeaveReason,
  PauseReason,
  RetentionSource,
  SessionHandover,
  SessionPlace,
  SessionStatus,
  StepDemand,
  WaitReason,
} from "./session-record.js";
export { SessionRecord } from "./session-record.js";

/** The budget-queue key of every call while tenants do not share the windows. */
const EVEN_BUDGET_KEY: readonly [number, number] = [0, 0];

/** A tenant's standing in the shares now. */
interface TenantShare {
  usage: number;
  entitlement: number;
  /** usage ÷ entitlement (0 with neither; Infinity holding room without entitlement). */
  ratio: number;
  virtualService: number;
}

/** A session waiting for room, with its sort keys (see `fairEntries`). */
interface FairEntry {
  session: SessionRecord;
  /** The replica a paused or returning session waits for. */
  slots: ReplicaSlots | undefined;
  /** The queued step of a session never admitted. */
  waiter: StepWaiter | undefined;
  band: number;
  starving: number;
  ratio: number;
  service: number;
  group: number;
  order: number;
}

export type SessionEventName = "admitted" | "paused" | "resumed" | "dormant" | "closed";

/** What an event says besides its name: the session's tenant and band, why it paused, how long its step waited. */
export interface SessionEventDetail {
  tenant: string;
  band: Band;
  /** For `paused`: why it left its window. */
  reason?: LeaveReason;
  /** For `admitted` and `resumed`: how long its oldest waiting step waited, ms. */
  waitedMs?: number;
}

/** One tenant as the metrics and the dashboard show it. */
export type TenantView = TenantState;

export interface SessionAdmissionOptions {
  clock: Clock;
  /** Sessions that may wait for a first admission at once (beyond: 429 `session_queue_full`). */
  queueLimit: number;
  /** Longest a step waits for its session to become active, ms (beyond: 429 `queue_timeout`). */
  waitLimitMs: number;
  /** A session with no step for this long is closed, ms. */
  idleTimeoutMs: number;
  /** What windows count. Default `sessions`. */
  unit?: AdmissionUnit;
  /** Quantile of idle gaps taken as a retention time (0–1]. Default 0.9. */
  retentionQuantile?: number;
  /** Tokens per block of a step's `promptBlocks`. Default 0: a shared prefix counts in every session. */
  blockTokens?: number;
  /** Most sessions remembered at once (open or closed); the least recently used beyond it are dropped. */
  maxSessions?: number;
  /** Estimated seconds until a slot frees, for Retry-After. */
  retryAfterSeconds?: () => number;
  onEvent?: (id: string, event: SessionEventName, replica: string | null, detail: SessionEventDetail) => void;
  /** `tenants`: windows shared among tenants by weight and band (docs/tenants.md); `off` (default): arrival order. */
  fairness?: "tenants" | "off";
  /** Tenants' weights, bands and caps; others have weight 1, band `standard`. */
  tenants?: Readonly<Record<string, TenantSpec>>;
  /** A session below its tenant's share (or of a higher band) waiting longer than this makes others pause for it, ms. Default 5000. */
  fairReclaimAfterMs?: number;
  /** An idle session was given a retention time. */
  onRetention?: (replica: string, retentionMs: number, source: RetentionSource) => void;
}

/** One replica's window occupancy (see `ReplicaState.window`). */
export interface ReplicaWindowCounts {
  /** W for the session-count law; the count of sessions the window holds for the token window. */
  size: number | null;
  sizeTokens: number | null;
  /** Sum of the active sessions' footprints (the documented `sluice_session_footprint_tokens`). */
  footprintTokens: number | null;
  /**
   * Of that sum, prompt-block tokens counted in more than one session (a shared system prompt):
   * the window holds `footprintTokens − sharedPrefixTokens` against W.
   */
  sharedPrefixTokens: number | null;
  /** Context tokens of paused and dormant sessions counted as retained in the replica's host-memory tier. */
  hostRetainedTokens: number;
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
  /** Prompt blocks counted in the token windows' shared-prefix counts (0 once no session is counted). */
  promptBlocks: number;
}

/** Own idle gaps remembered per session; the fleet's. */
const OWN_GAPS = 16;
const FLEET_GAPS = 256;
/**
 * A retention is a high quantile of gaps seen; a gap just past it should not
 * cost a session its place (and its cache, once others take the room). On
 * `agents`, retention at the bare quantile made 58 sessions dormant moments
 * before they came back (877 s); with this slack 20 (816 s).
 */
const RETENTION_SLACK = 1.5;
/** Retention with nothing learned yet, as a share of the idle timeout. */
const DEFAULT_RETENTION_SHARE = 1 / 4;

/**
 * Admits whole sessions into per-replica windows. A step of an active session
 * passes at once; a step of a waiting, paused or dormant session waits until
 * its session holds a place. Every wait honours an AbortSignal and the wait limit.
 */
export class SessionAdmission {
  private readonly clock: Clock;
  private readonly options: SessionAdmissionOptions;
  private readonly unit: AdmissionUnit;
  private readonly retentionQuantile: number;
  private readonly blockTokens: number;
  private readonly maxSessions: number;
  private readonly replicas = new Map<string, ReplicaSlots>();
  /** Every session, least recently touched first (re-inserted on touch), closed ones until they age out. */
  private readonly sessions = new Map<string, SessionRecord>();
  /** First steps of sessions never admitted, in arrival order. */
  private readonly queue: StepWaiter[] = [];
  private readonly fleetGaps = new IdleGaps(FLEET_GAPS);
  private fleetGrowthTokens = 0;
  private fleetGrowthSamples = 0;
  private admittedSeq = 0;
  private filling = false;
  private readonly fairness: boolean;
  /** The shares `budgetOrderKey` read, and when. */
  private budgetShares: { at: number; shares: Map<string, TenantShare> } | null = null;
  private readonly reclaimAfterMs: number;
  private readonly ledger: TenantLedger;
  private readonly pauseCounts = new Map<string, Record<PauseReason, number>>();

  constructor(options: SessionAdmissionOptions) {
    this.options = options;
    this.clock = options.clock;
    this.unit = options.unit ?? "sessions";
    this.retentionQuantile = options.retentionQuantile ?? DEFAULT_SESSIONS.retentionQuantile;
    this.blockTokens = options.blockTokens ?? 0;
    this.maxSessions = options.maxSessions ?? 100_000;
    this.fairness = options.fairness === "tenants";
    this.reclaimAfterMs = options.fairReclaimAfterMs ?? 5000;
    this.ledger = new TenantLedger(options.tenants ?? {});
  }

  /** Registers a replica; `size` null means no window. */
  addReplica(id: string, size: number | null): void {
    if (this.replicas.has(id)) return;
    this.replicas.set(id, {
      id,
      size,
      accepting: true,
      active: [],
      paused: [],
      dormant: [],
      held: 0,
      holders: 0,
      pauseRequests: 0,
      hostRoom: 0,
      hostHeld: 0,
      turnoverMs: Number.POSITIVE_INFINITY,
      blockRefs: new Map(),
      sharedTokens: 0,
    });
  }

  /**
   * What keeps an idle session's cache on a replica besides its window place (docs/how-it-works.md):
   * - `hostRoomTokens`, its host-memory KV tier's capacity (0: none). A session leaving the token
   *   window there is counted as retained in host memory while its context fits what is left of
   *   it; sessions already counted stay counted (a smaller tier forgets its oldest blocks first,
   *   which the router's index sees, not this count);
   * - `turnoverMs`, how long a block outlives its last use in its GPU cache (Infinity: unknown).
   *   A session expected back later than that finds its cache gone whatever its place.
   */
  setCacheRetention(id: string, retention: { hostRoomTokens: number; turnoverMs: number }): void {
    const { hostRoomTokens, turnoverMs } = retention;
    if (!(Number.isFinite(hostRoomTokens) && hostRoomTokens >= 0)) {
      throw new RangeError(`host room should be a number of tokens ≥ 0, got ${hostRoomTokens}`);
    }
    if (!(turnoverMs > 0)) throw new RangeError(`turnoverMs should be a number of ms > 0, got ${turnoverMs}`);
    const slots = this.replicas.get(id);
    if (!slots) return;
    slots.hostRoom = hostRoomTokens;
    slots.turnoverMs = turnoverMs;
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

  /** Whether the replica has room for `session` now (for the session-count law: for one more session). */
  hasRoom(id: string, session?: SessionRecord): boolean {
    const slots = this.replicas.get(id);
    return slots !== undefined && this.fits(slots, session);
  }

  /** Opens a session (state `waiting`); an id that is open already is returned as it is. */
  open(
    id: string,
    init: { lane?: Lane; metadata?: Record<string, unknown>; tenant?: string | undefined } = {},
  ): SessionRecord {
    const existing = this.sessions.get(id);
    if (existing && existing.state !== "closed") return existing;
    const session = new SessionRecord(id, init.lane, init.metadata, this.clock.now());
    session.tenant = init.tenant ?? DEFAULT_TENANT;
    session.band = this.ledger.policy(session.tenant).band;
    this.ledger.countSession(session.tenant, 1);
    this.sessions.delete(id);
    this.sessions.set(id, session);
    this.bound();
    return session;
  }

  /** The session with this id, closed ones included while remembered. */
  get(id: string): SessionRecord | undefined {
    return this.sessions.get(id);
  }

  /** Every session id held (open, or closed and not yet forgotten). */
  ids(): IterableIterator<string> {
    return this.sessions.keys();
  }

  view(session: SessionRecord): SessionView {
    const view: SessionView = {
      id: session.id,
      state: publicState(session.state),
      replica: session.replica,
      steps: session.steps,
      tokens: session.tokens,
      phase: phaseOf(session),
      footprint_tokens: tokenFootprint(session),
      retention_ms: session.retentionMs,
    };
    view.tenant = session.tenant;
    view.band = session.band;
    const standing = this.standing(session);
    if (standing) {
      view.position = standing.position;
      view.reason = standing.reason;
    }
    if (session.lane) view.lane = session.lane;
    if (session.metadata) view.metadata = session.metadata;
    return view;
  }

  /**
   * Waits until `session` may run a step and returns the replica it is pinned
   * to. `choose` picks a replica among those with room when the session has
   * none yet; `demand` sizes the step for a token window. Rejects with
   * `Refusal` (`session_queue_full`, `queue_timeout`, `session_not_found`) or
   * the signal's abort reason.
   */
  acquireStep(
    session: SessionRecord,
    choose: (candidates: readonly string[]) => string | undefined,
    signal?: AbortSignal,
    demand?: StepDemand,
  ): Promise<string> {
    signal?.throwIfAborted();
    if (session.state === "closed") {
      return Promise.reject(new Refusal("session_not_found", `session ${session.id} is closed`));
    }
    this.touch(session);
    this.arrive(session, demand);
    session.stepHeldInWindow = false;
    if (session.state === "active" && session.replica !== null) {
      const slots = this.replicas.get(session.replica);
      if (!session.pauseRequested || session.running > 0 || !slots) {
        session.running++;
        session.stepHeldInWindow = true;
        return Promise.resolve(session.replica);
      }
      // The window shrank while this session was between steps: this boundary is where it pauses.
      this.pause(session, slots);
    }
    if (session.state === "waiting") {
      if (this.queue.length === 0) {
        const candidates = this.candidates(session);
        if (candidates.length > 0) {
          const replica = choose(candidates);
          if (replica !== undefined && candidates.includes(replica)) {
            this.activate(session, replica, "admitted");
            session.running++;
            return Promise.resolve(replica);
          }
        }
      }
      const alreadyQueued = session.waiters.some((waiter) => waiter.queued);
      if (
        !alreadyQueued &&
        this.queue.length >= this.options.queueLimit &&
        !(this.options.queueLimit > 0 && this.refuseLowerBand(session))
      ) {
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
      if (outcome.contextTokens !== undefined) {
        if (session.steps > 1) this.learnGrowth(session, outcome.contextTokens - session.tokens);
        session.tokens = outcome.contextTokens;
      }
      session.expectedGrowthTokens = this.expectedGrowth(session);
    }
    if (session.running === 0 && session.waiters.length === 0) {
      // Until a step completes, the footprint is the first step's prompt plus max_tokens
      // (docs/how-it-works.md): a first step refused or failed leaves the session holding what its
      // retry needs, not nothing, or the window would count it as room and admit others into it.
      if (session.steps > 0) session.demandTokens = 0;
      session.idleSince = this.clock.now();
      this.retain(session);
    }
    if (session.state === "closed") return;
    this.touch(session);
    this.account(session);
    const slots = session.replica ? this.replicas.get(session.replica) : undefined;
    if (!slots) return;
    // A footprint that grew here is enforced on the next control tick, not at once: pausing on every
    // step's end made sessions flap in and out at each boundary (measured: 299 pauses against 196
    // and 7 % longer makespan on `agents`).
    if (session.state === "active" && session.pauseRequested && session.running === 0)
      this.pause(session, slots);
    this.fill();
  }

  /** Moves an active session's place to another replica (an affinity break). */
  rebind(session: SessionRecord, replica: string): void {
    if (session.state !== "active" || session.replica === replica) return;
    const from = session.replica ? this.replicas.get(session.replica) : undefined;
    const to = this.replicas.get(replica);
    if (!to) return;
    if (from) removeFrom(from.active, session);
    insertByAdmission(to.active, session);
    session.place = { state: "active", replica, pauseRequested: false };
    this.account(session);
    this.fill();
  }

  /**
   * The session's replica is unhealthy: it leaves that replica's window and
   * waits for room on another, first in the queue (ahead of every session
   * never admitted), so a failover makes room rather than sending steps to
   * a dead replica. Call at a step boundary (no step of it running).
   */
  evacuate(session: SessionRecord): void {
    if (session.state === "closed" || session.state === "waiting" || session.running > 0) return;
    const slots = session.replica ? this.replicas.get(session.replica) : undefined;
    if (slots) {
      removeFrom(slots.active, session);
      removeFrom(slots.paused, session);
      removeFrom(slots.dormant, session);
    }
    session.movedFrom = session.replica;
    session.place = { state: "waiting" };
    session.evacuated = true;
    session.home = null;
    this.account(session);
    this.emit(session, "paused", session.movedFrom, { reason: "unhealthy" });
    this.fill();
  }

  /**
   * Hands a session to another frontend (scale-out): closes it here when no
   * step of it runs or waits, and returns what its next holder needs; "busy"
   * while a step runs or waits; undefined when it is not open here.
   */
  release(id: string): { handover: SessionHandover; place: number } | "busy" | undefined {
    const session = this.sessions.get(id);
    if (!session || session.state === "closed") return undefined;
    if (session.running > 0 || session.waiters.length > 0) return "busy";
    // The place it held here (window units): a shared window keeps it for the next holder.
    const place = session.state === "active" || session.state === "paused" ? this.footprint(session) : 0;
    const handover: SessionHandover = {
      replica: session.replica,
      steps: session.steps,
      tokens: session.tokens,
      ...(session.lane ? { lane: session.lane } : {}),
      ...(session.metadata ? { metadata: session.metadata } : {}),
    };
    // Its place is for the session's next holder: no new session here takes it before the shared
    // window has seen that holder's demand (the next fill, or the window shrinking, decides).
    this.shut(session, "handed over to another frontend", false);
    return { handover, place };
  }

  /**
   * Opens a session another frontend handed over: its history carries on,
   * and its next step waits for room on the replica holding its cache, ahead
   * of every session never admitted (as a returning session does).
   */
  adopt(id: string, from: SessionHandover): SessionRecord {
    const existing = this.sessions.get(id);
    if (existing && existing.state !== "closed") return existing;
    const session = this.open(id, {
      ...(from.lane ? { lane: from.lane } : {}),
      ...(from.metadata ? { metadata: from.metadata } : {}),
    });
    session.steps = from.steps;
    session.tokens = from.tokens;
    session.expectedGrowthTokens = this.expectedGrowth(session);
    session.evacuated = true;
    session.home = from.replica !== null && this.replicas.has(from.replica) ? from.replica : null;
    return session;
  }

  /** Closes a session: frees its place at once and wakes the next. Returns false for an unknown id. */
  close(id: string): boolean {
    const session = this.sessions.get(id);
    if (!session || session.state === "closed") return false;
    this.shut(session, "closed by client");
    return true;
  }

  /**
   * The control tick's housekeeping: closes sessions idle past the timeout
   * (the map is in touch order, so it stops at the first fresh one), forgets
   * closed ones as old, and lets idle sessions past their retention go
   * dormant while others wait.
   */
  sweep(): void {
    const now = this.clock.now();
    for (const session of this.sessions.values()) {
      if (now - session.touchedAt < this.options.idleTimeoutMs) break;
      if (session.state === "closed") {
        this.sessions.delete(session.id);
      } else if (session.running > 0 || session.waiters.length > 0) {
        // A session with a step in flight or waiting is not idle; it goes to the back.
        this.touch(session);
      } else {
        this.shut(session, "expired");
        this.touch(session);
      }
    }
    this.reclaimIdle();
    this.reclaimForShares();
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
      promptBlocks: 0,
    };
    for (const slots of this.replicas.values()) counts.promptBlocks += slots.blockRefs.size;
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
    if (!slots) {
      return {
        size: null,
        sizeTokens: null,
        footprintTokens: null,
        sharedPrefixTokens: null,
        hostRetainedTokens: 0,
        active: 0,
        idle: 0,
        dormant: 0,
        paused: 0,
        waiting: 0,
      };
    }
    let waiting = this.queue.length;
    for (const session of slots.paused) if (session.waiters.length > 0) waiting++;
    for (const session of slots.dormant) if (session.waiters.length > 0) waiting++;
    let idle = 0;
    for (const session of slots.active) if (session.running === 0) idle++;
    const tokens = this.unit === "tokens";
    return {
      size: tokens ? (slots.size === null ? null : slots.holders) : slots.size,
      sizeTokens: tokens ? slots.size : null,
      footprintTokens: tokens ? slots.held : null,
      sharedPrefixTokens: tokens ? slots.sharedTokens : null,
      hostRetainedTokens: slots.hostHeld,
      active: slots.active.length,
      idle,
      dormant: slots.dormant.length,
      paused: slots.paused.length,
      waiting,
    };
  }

  /**
   * This frontend's demand on a replica's window in its unit, for a window
   * shared by several frontends: what its active sessions hold, what its
   * paused ones would, and what the sessions waiting for any replica ask.
   */
  windowDemand(id: string): { active: number; paused: number; waiting: number } {
    const slots = this.replicas.get(id);
    if (!slots) return { active: 0, paused: 0, waiting: 0 };
    // A waiting session could start on any replica, except a handed-over one: it waits for its own.
    const wantsHere = (session: SessionRecord) =>
      session.home === null || session.home === id || !this.replicas.get(session.home)?.accepting;
    // Handed-over sessions and those leaving a dead replica are returning, as paused ones are.
    if (this.unit === "sessions") {
      let paused = slots.paused.length;
      let waiting = 0;
      for (const waiter of this.queue) {
        if (!wantsHere(waiter.session)) continue;
        if (waiter.session.evacuated) paused++;
        else waiting++;
      }
      return { active: slots.active.length, paused, waiting };
    }
    let paused = 0;
    for (const session of slots.paused) paused += tokenFootprint(session);
    for (const session of slots.dormant) if (session.waiters.length > 0) paused += tokenFootprint(session);
    let waiting = 0;
    for (const waiter of this.queue) {
      if (!wantsHere(waiter.session)) continue;
      if (waiter.session.evacuated) paused += tokenFootprint(waiter.session);
      else waiting += tokenFootprint(waiter.session);
    }
    return { active: occupied(slots), paused, waiting };
  }

  /** The largest footprint among a replica's active sessions, tokens (the token law's floor). */
  largestFootprint(id: string): number {
    const slots = this.replicas.get(id);
    let largest = 0;
    if (slots) for (const session of slots.active) largest = Math.max(largest, tokenFootprint(session));
    return largest;
  }

  /** Whether sessions wait for room that this replica could give (new ones anywhere, or its own returning ones). */
  waitingFor(id: string): boolean {
    const slots = this.replicas.get(id);
    if (!slots) return false;
    return this.queue.length > 0 || hasWaiter(slots.paused) || hasWaiter(slots.dormant);
  }

  /** Sessions waiting for a first admission. */
  get queuedSessions(): number {
    return this.queue.length;
  }

  /** What a session holds in a window: one place for the session-count law, its footprint for the token window. */
  footprint(session: SessionRecord): number {
    return this.unit === "sessions" ? 1 : tokenFootprint(session);
  }

  /** Its own mean growth per step after the first; else the fleet's; else its first step's size. */
  private expectedGrowth(session: SessionRecord): number {
    if (session.growthSamples > 0) return Math.round(session.growthTokens / session.growthSamples);
    if (this.fleetGrowthSamples > 0) return Math.round(this.fleetGrowthTokens / this.fleetGrowthSamples);
    return session.tokens;
  }

  private learnGrowth(session: SessionRecord, growth: number): void {
    if (!(growth >= 0)) return;
    session.growthTokens += growth;
    session.growthSamples++;
    this.fleetGrowthTokens += growth;
    this.fleetGrowthSamples++;
  }

  /** A step arrived: records the idle gap it ends and sizes the session's footprint by the step. */
  private arrive(session: SessionRecord, demand: StepDemand | undefined): void {
    if (Number.isFinite(session.idleSince)) {
      const gap = this.clock.now() - session.idleSince;
      session.gaps ??= new IdleGaps(OWN_GAPS);
      session.gaps.record(gap);
      this.fleetGaps.record(gap);
      session.idleSince = Number.NaN;
    }
    if (demand) {
      session.demandTokens = Math.max(session.demandTokens, demand.promptTokens + demand.maxTokens);
      session.expectedIdleMs = demand.expectedIdleMs;
      if (demand.promptBlocks) session.promptBlocks = demand.promptBlocks;
    }
    this.account(session);
  }

  /** Gives an idle session its retention time: the client's hint, its own gaps, the fleet's, or a default. */
  private retain(session: SessionRecord): void {
    const q = this.retentionQuantile;
    const hint = session.expectedIdleMs;
    session.expectedIdleMs = undefined;
    let source: RetentionSource;
    let retention: number;
    const own = session.gaps?.quantile(q);
    const fleet = this.fleetGaps.quantile(q);
    if (hint !== undefined) {
      source = "hint";
      retention = hint;
    } else if (own !== undefined) {
      source = "own";
      retention = own;
    } else if (fleet !== undefined) {
      source = "fleet";
      retention = fleet;
    } else {
      source = "default";
      retention = this.options.idleTimeoutMs * DEFAULT_RETENTION_SHARE;
    }
    if (source === "own" || source === "fleet") retention *= RETENTION_SLACK;
    session.retentionMs = Math.min(this.options.idleTimeoutMs, Math.max(0, retention));
    session.retentionSource = source;
    if (this.unit === "tokens" && session.state === "active" && session.replica !== null) {
      this.options.onRetention?.(session.replica, session.retentionMs, source);
    }
  }

  /** Whether `session` fits in the replica's window now. */
  private fits(slots: ReplicaSlots, session: SessionRecord | undefined): boolean {
    if (!slots.accepting) return false;
    if (slots.size === null) return true;
    const counted = session !== undefined && session.heldOn === slots;
    const own = counted ? session.held : 0;
    const need = session ? this.footprint(session) : 1;
    const after = occupied(slots) - own + need;
    if (after <= slots.size) return true;
    // A session counted here has its blocks counted already; one coming in shares the prefix the
    // window's sessions hold (looked up only when it matters: a fleet checks every replica).
    if (
      session &&
      !counted &&
      after - Math.min(need, this.sharedPrefixTokens(slots, session)) <= slots.size
    ) {
      return true;
    }
    // A session larger than the token window is admitted alone, so nothing starves.
    return this.unit === "tokens" && slots.holders - (own > 0 ? 1 : 0) === 0;
  }

  /**
   * Replicas a session never admitted may start on: room for it, and nobody
   * returning there first — unless its step has waited half the wait limit.
   */
  private candidates(session: SessionRecord): string[] {
    const ids: string[] = [];
    const starving = session.evacuated || this.starving(session);
    // A handed-over session waits for the replica holding its cache while that replica takes sessions.
    const home = session.home !== null ? this.replicas.get(session.home) : undefined;
    if (home?.accepting && !this.starving(session)) return this.fits(home, session) ? [home.id] : [];
    for (const [id, slots] of this.replicas) {
      if ((starving || !this.returningWait(slots)) && this.fits(slots, session)) ids.push(id);
    }
    return ids;
  }

  /**
   * Whether a session's oldest waiting step has waited half the wait limit.
   * Such a step goes before every priority group, so that no order between
   * groups can starve it into a `queue_timeout`.
   */
  private starving(session: SessionRecord): boolean {
    const first = session.waiters[0];
    return first !== undefined && this.clock.now() - first.enqueuedAt >= this.options.waitLimitMs / 2;
  }

  /** Paused sessions, or dormant ones with a step waiting, still wait for this replica (they go before new ones). */
  private returningWait(slots: ReplicaSlots): boolean {
    return slots.paused.length > 0 || hasWaiter(slots.dormant);
  }

  /** Re-inserts the session last in the map (touch order) and stamps it. */
  private touch(session: SessionRecord): void {
    session.touchedAt = this.clock.now();
    this.sessions.delete(session.id);
    this.sessions.set(session.id, session);
  }

  /** Keeps at most `maxSessions`: forgets the least recently touched, closing open ones. */
  private bound(): void {
    for (const session of this.sessions.values()) {
      if (this.sessions.size <= this.maxSessions) return;
      if (session.running > 0 || session.waiters.length > 0) continue;
      if (session.state !== "closed") this.shut(session, "evicted");
      this.sessions.delete(session.id);
    }
  }

  /** Brings what a session counts for in its replica's window up to date: the one place `held` changes. */
  private account(session: SessionRecord): void {
    // A reclaim's victim holds its footprint until it pauses: the next decision waits for the room it frees.
    const counted = !session.pauseRequested || session.pauseReason !== "window";
    const slots =
      session.state === "active" && counted && session.replica !== null
        ? this.replicas.get(session.replica)
        : undefined;
    const amount = slots ? this.footprint(session) : 0;
    this.ledger.addUsage(session.tenant, amount - session.held, this.clock.now());
    const before = session.heldOn;
    if (before) {
      before.held -= session.held;
      before.holders--;
    }
    session.held = amount;
    session.heldOn = slots ?? null;
    if (slots) {
      slots.held += amount;
      slots.holders++;
    }
    this.countBlocks(session, this.unit === "tokens" ? slots : undefined);
    const requested =
      session.pauseRequested && session.replica !== null
        ? (this.replicas.get(session.replica) ?? null)
        : null;
    if (session.requestOn) session.requestOn.pauseRequests--;
    session.requestOn = requested;
    if (requested) requested.pauseRequests++;
    const state = session.state;
    if (!(state === "paused" || state === "dormant")) session.retainedInHost = false;
    const hostSlots =
      session.retainedInHost && session.replica !== null ? this.replicas.get(session.replica) : undefined;
    if (session.hostOn) session.hostOn.hostHeld -= session.hostHeld;
    session.hostHeld = hostSlots ? session.tokens : 0;
    session.hostOn = hostSlots ?? null;
    if (hostSlots) hostSlots.hostHeld += session.hostHeld;
  }

  /**
   * Keeps `blocksOn`'s counts of the prompt blocks its counted sessions hold in step with `session`,
   * counted on `slots` (undefined: nowhere). A prompt that extends the last one (the usual next
   * step) changes only its new blocks: chained hashes that match match all the way back.
   */
  private countBlocks(session: SessionRecord, slots: ReplicaSlots | undefined): void {
    const to = slots && this.blockTokens > 0 ? slots : null;
    const blocks = to ? session.promptBlocks : NO_BLOCKS;
    const from = session.blocksOn;
    const counted = session.countedBlocks;
    if (from === to && counted === blocks) return;
    let same = 0;
    if (from === to) {
      const n = Math.min(counted.length, blocks.length);
      while (same < n && counted[same] === blocks[same]) same++;
    }
    if (from) {
      for (let i = same; i < counted.length; i++) {
        const hash = counted[i]!;
        const refs = from.blockRefs.get(hash) ?? 0;
        if (refs > 1) {
          from.blockRefs.set(hash, refs - 1);
          from.sharedTokens -= this.blockTokens;
        } else from.blockRefs.delete(hash);
      }
    }
    if (to) {
      for (let i = same; i < blocks.length; i++) {
        const hash = blocks[i]!;
        const refs = to.blockRefs.get(hash) ?? 0;
        if (refs > 0) to.sharedTokens += this.blockTokens;
        to.blockRefs.set(hash, refs + 1);
      }
    }
    session.countedBlocks = blocks;
    session.blocksOn = to;
  }

  /** Tokens of `session`'s prompt held already by the sessions `slots` counts: its leading blocks found there. */
  private sharedPrefixTokens(slots: ReplicaSlots, session: SessionRecord): number {
    if (this.blockTokens === 0 || slots.blockRefs.size === 0) return 0;
    let blocks = 0;
    for (const hash of session.promptBlocks) {
      if (!slots.blockRefs.has(hash)) break;
      blocks++;
    }
    return blocks * this.blockTokens;
  }

  /** Whether the context of `session`, leaving the token window, fits what is left of the replica's host tier. */
  private hostHasRoom(slots: ReplicaSlots, session: SessionRecord): boolean {
    return this.unit === "tokens" && session.tokens > 0 && slots.hostHeld + session.tokens <= slots.hostRoom;
  }

  private activate(session: SessionRecord, replica: string, event: "admitted" | "resumed"): void {
    const slots = this.replicas.get(replica);
    if (!slots) return;
    const from = session.replica ? this.replicas.get(session.replica) : undefined;
    if (from && session.state === "paused") removeFrom(from.paused, session);
    if (from && session.state === "dormant") removeFrom(from.dormant, session);
    if (event === "admitted") session.admittedSeq = ++this.admittedSeq;
    session.evacuated = false;
    session.home = null;
    session.place = { state: "active", replica, pauseRequested: false };
    insertByAdmission(slots.active, session);
    this.account(session);
    const waitedMs = session.waiters.length > 0 ? this.clock.now() - session.waiters[0]!.enqueuedAt : 0;
    this.emit(session, event, replica, { waitedMs });
    for (const waiter of session.waiters.splice(0)) this.settle(waiter, replica);
  }

  /** Takes a session out of its window: paused (the window shrank) or dormant (idle past its retention). */
  private leave(session: SessionRecord, slots: ReplicaSlots, to: "paused" | "dormant"): void {
    removeFrom(slots.active, session);
    session.place = { state: to, replica: slots.id, since: this.clock.now() };
    (to === "paused" ? slots.paused : slots.dormant).push(session);
    session.retainedInHost = this.hostHasRoom(slots, session);
    if (to === "paused") {
      const reason = session.pauseReason ?? "window";
      session.lastPauseReason = reason;
      session.pauseReason = null;
      const counts = this.pausesOf(session.tenant);
      counts[reason]++;
      this.account(session);
      this.emit(session, to, session.replica, { reason });
    } else {
      this.account(session);
      this.emit(session, to, session.replica, {});
    }
  }

  private pause(session: SessionRecord, slots: ReplicaSlots): void {
    this.leave(session, slots, "paused");
  }

  private emit(
    session: SessionRecord,
    event: SessionEventName,
    replica: string | null,
    extra: { reason?: LeaveReason; waitedMs?: number },
  ): void {
    this.options.onEvent?.(session.id, event, replica, {
      tenant: session.tenant,
      band: session.band,
      ...extra,
    });
  }

  private pausesOf(tenant: string): Record<PauseReason, number> {
    let counts = this.pauseCounts.get(tenant);
    if (!counts) {
      counts = { fairness: 0, priority: 0, window: 0 };
      this.pauseCounts.set(tenant, counts);
    }
    return counts;
  }

  /** The window holds more than its size: choose who leaves at their next step boundary. */
  private enforce(slots: ReplicaSlots): void {
    if (slots.size === null || occupied(slots) <= slots.size) return;
    for (const session of this.leaveOrder(slots)) {
      if (occupied(slots) <= slots.size) break;
      // A lone session is never asked to leave the token window: nothing would run.
      if (this.unit === "tokens" && slots.holders <= 1) break;
      if (session.pauseRequested) continue;
      requestPause(session, true, "window");
      this.account(session);
    }
    for (const session of [...slots.active]) {
      if (session.pauseRequested && session.running === 0) this.pause(session, slots);
    }
  }

  /**
   * Who leaves first. Session-count law: the youngest. Token window (docs/how-it-works.md#session-window-tokens-of-cache-footprint):
   * idle sessions past their retention, then idle ones expected back latest,
   * then the youngest of those running.
   */
  private leaveOrder(slots: ReplicaSlots): SessionRecord[] {
    const youngestFirst = [...slots.active].reverse();
    if (this.unit === "sessions") return youngestFirst;
    const now = this.clock.now();
    const idle = youngestFirst.filter((session) => session.running === 0 && session.waiters.length === 0);
    const busy = youngestFirst.filter((session) => !(session.running === 0 && session.waiters.length === 0));
    const backAt = (session: SessionRecord) => session.idleSince + session.retentionMs;
    idle.sort((a, b) => {
      const pastA = backAt(a) <= now;
      const pastB = backAt(b) <= now;
      if (pastA !== pastB) return pastA ? -1 : 1;
      return backAt(b) - backAt(a);
    });
    const order = [...idle, ...busy];
    return this.sharing() ? this.byShareToLeave(order) : order;
  }

  /**
   * A shared window's leave order: the lowest band first; within a band, tenants over their
   * entitlement first, furthest over (usage ÷ entitlement) first; everyone else, and the sessions
   * of one tenant, in the window's own order. A shrink then takes from whoever holds the most
   * beyond their share, as a reclaim would, before anyone within theirs.
   */
  private byShareToLeave(order: SessionRecord[]): SessionRecord[] {
    const shares = this.shares();
    const over = (session: SessionRecord) => {
      const ratio = shares.get(session.tenant)?.ratio ?? 0;
      return ratio > 1 ? ratio : 0;
    };
    const rank = new Map(order.map((session, i) => [session, i]));
    return order.sort(
      (a, b) => BAND_RANK[b.band] - BAND_RANK[a.band] || over(b) - over(a) || rank.get(a)! - rank.get(b)!,
    );
  }

  /**
   * Paused sessions in the order they resume. Session-count law: oldest pause
   * first (CONCUR). Token window: the most recently paused first — its cache
   * is the most likely still resident, while an older pause's was evicted
   * already and costs the same recompute later; the aging rule in `fill`
   * keeps the oldest from starving. On `agents` (seed 1): oldest first 914 s,
   * hit rate 0.80; smallest footprint first 934 s; newest first 877 s, 0.85.
   */
  private resumeOrder(paused: readonly SessionRecord[]): readonly SessionRecord[] {
    return this.unit === "sessions" ? paused : [...paused].reverse();
  }

  /**
   * While others wait for room, idle sessions past their retention go dormant:
   * they leave the window (their footprint stops counting) and keep their pin.
   * Retention keeps a cache in GPU memory, so an idle session within it goes
   * too where its place keeps nothing there: it is expected back (its
   * retention) later than blocks outlive their last use in the GPU cache. Its
   * GPU room serves a session that waits now; where the host tier has room
   * for its context, it is counted as retained there and comes back to a load.
   * Letting every idle session with host room go at once was measured worse:
   * on `agents-256` with a host tier, 917 s against 794 s — each 1–5 s tool
   * call cost its session a wait for room in the window.
   */
  private reclaimIdle(): void {
    if (this.unit !== "tokens") return;
    const now = this.clock.now();
    let freed = false;
    for (const slots of this.replicas.values()) {
      if (!this.waitingFor(slots.id)) continue;
      for (const session of [...slots.active]) {
        if (session.running > 0 || session.waiters.length > 0) continue;
        // A default retention is a guess, not an expected return: it never outlasts the cache on its own.
        const backAfterTurnover =
          session.retentionSource !== "default" && session.retentionMs > slots.turnoverMs;
        if (now - session.idleSince < session.retentionMs && !backAfterTurnover) continue;
        this.leave(session, slots, "dormant");
        freed = true;
      }
    }
    if (freed) this.fill();
  }

  /**
   * Room opened. Per replica: pending pauses withdrawn while they fit, then
   * paused sessions (oldest pause first), then dormant ones with a step waiting
   * (oldest first); then sessions never admitted, in arrival order; room left
   * over takes returning sessions stranded where there is none (`resumeElsewhere`).
   * Within each group no one overtakes: the head waits for room that fits it.
   */
  private fill(): void {
    if (this.filling) return;
    this.filling = true;
    const shared = this.sharing();
    try {
      for (const slots of this.replicas.values()) {
        // Most replicas have nothing pending: a step's end must not cost a pass over every session.
        if (slots.pauseRequests === 0 && slots.paused.length === 0 && slots.dormant.length === 0) continue;
        for (const session of slots.pauseRequests > 0 ? slots.active : []) {
          // Only the window's own requests are withdrawn when it has room: a reclaim stands until its boundary.
          if (!session.pauseRequested || session.pauseReason !== "window") continue;
          requestPause(session, false);
          this.account(session);
          if (slots.size !== null && occupied(slots) > slots.size) {
            requestPause(session, true, "window");
            this.account(session);
            break;
          }
        }
        // Shared among tenants, returning sessions take their turn in the tenants' order below.
        if (shared) continue;
        if (slots.paused.length + slots.dormant.length > 0) {
          for (const session of [...slots.paused, ...slots.dormant]) {
            if (this.starving(session) && this.fits(slots, session))
              this.activate(session, slots.id, "resumed");
          }
        }
        for (const session of this.resumeOrder(slots.paused)) {
          if (!this.fits(slots, session)) break;
          this.activate(session, slots.id, "resumed");
        }
        for (const session of returningOrder(slots.dormant)) {
          if (!this.fits(slots, session)) break;
          this.activate(session, slots.id, "resumed");
        }
      }
      if (shared) this.fairFill();
      while (!shared && this.queue.length > 0) {
        const waiter = this.queue[0]!;
        const candidates = this.candidates(waiter.session);
        if (candidates.length === 0) break;
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
   * Where a call of `tenant` stands in its replica's budget queue (docs/tenants.md): its band's
   * rank, then its tenant's usage ÷ entitlement. Equal for every call unless tenants share the
   * windows now, so with one tenant (or fairness off) the queue keeps its own order.
   */
  budgetOrderKey(tenant: string | undefined): readonly [number, number] {
    if (!this.sharing()) return EVEN_BUDGET_KEY;
    const name = tenant || DEFAULT_TENANT;
    const now = this.clock.now();
    // The queue reads every waiter's key at each decision: the shares are worked out once per instant.
    if (this.budgetShares === null || this.budgetShares.at !== now) {
      this.budgetShares = { at: now, shares: this.shares() };
    }
    const band = BAND_RANK[this.ledger.peekPolicy(name).band];
    return [band, this.budgetShares.shares.get(name)?.ratio ?? 0];
  }

  /** Which calls of a full budget queue give way first: the band's rank with fairness on (sheddable highest), else all alike. */
  budgetShedRank(tenant: string | undefined): number {
    return this.fairness ? BAND_RANK[this.ledger.peekPolicy(tenant || DEFAULT_TENANT).band] : 0;
  }

  /** Whether admission follows the tenants' shares now: fairness on and sessions of more than one tenant open. */
  private sharing(): boolean {
    return this.fairness && this.ledger.shared;
  }

  /**
   * Every tenant's usage, entitlement and virtual service now. Demand is what
   * its active sessions hold plus the footprints of its paused, returning and
   * queued ones; the total is the sum of the accepting replicas' windows.
   */
  private shares(): Map<string, TenantShare> {
    const now = this.clock.now();
    const demand = new Map<string, number>();
    const add = (session: SessionRecord) =>
      demand.set(session.tenant, (demand.get(session.tenant) ?? 0) + this.footprint(session));
    let total = 0;
    let sized = false;
    for (const slots of this.replicas.values()) {
      if (slots.accepting && slots.size !== null) {
        total += slots.size;
        sized = true;
      }
      for (const session of slots.paused) add(session);
      for (const session of slots.dormant) if (session.waiters.length > 0) add(session);
    }
    for (const waiter of this.queue) add(waiter.session);
    const accounts = this.ledger.snapshot(now);
    for (const account of accounts) {
      if (account.usage > 0)
        demand.set(account.policy.name, (demand.get(account.policy.name) ?? 0) + account.usage);
    }
    const demands = [...demand].map(([tenant, tokens]) => {
      const policy = this.ledger.policy(tenant);
      return { tenant, weight: policy.weight, demandTokens: tokens, maxShare: policy.maxShare };
    });
    const entitled = entitlements(sized ? total : Number.POSITIVE_INFINITY, demands);
    const shares = new Map<string, TenantShare>();
    for (const account of accounts) {
      const entitlement = entitled.get(account.policy.name) ?? 0;
      const usage = account.usage;
      shares.set(account.policy.name, {
        usage,
        entitlement,
        ratio: entitlement > 0 ? usage / entitlement : usage > 0 ? Number.POSITIVE_INFINITY : 0,
        virtualService: account.virtualService,
      });
    }
    return shares;
  }

  /**
   * Sessions waiting for room, in the tenants' order (docs/tenants.md): band
   * first; then a step waiting half the wait limit; then the tenant with the
   * lowest usage ÷ entitlement, ties by least virtual service; within a
   * tenant the documented order (paused, returning dormant, then never admitted).
   * Pinned sessions on `blocked` replicas are left out.
   */
  private fairEntries(shares: Map<string, TenantShare>, blocked: ReadonlySet<ReplicaSlots>): FairEntry[] {
    const entries: FairEntry[] = [];
    const push = (session: SessionRecord, group: number, slots?: ReplicaSlots, waiter?: StepWaiter) => {
      const share = shares.get(session.tenant);
      entries.push({
        session,
        slots,
        waiter,
        band: BAND_RANK[session.band],
        starving: this.starving(session) ? 0 : 1,
        ratio: share?.ratio ?? 0,
        service: share?.virtualService ?? 0,
        group,
        order: entries.length,
      });
    };
    for (const slots of this.replicas.values()) {
      if (blocked.has(slots)) continue;
      for (const session of this.resumeOrder(slots.paused)) push(session, 0, slots);
      for (const session of returningOrder(slots.dormant)) push(session, 1, slots);
    }
    for (const waiter of this.queue)
      push(waiter.session, waiter.session.evacuated ? 0 : 2, undefined, waiter);
    entries.sort(
      (a, b) =>
        a.band - b.band ||
        a.starving - b.starving ||
        a.ratio - b.ratio ||
        a.service - b.service ||
        (a.session.tenant < b.session.tenant ? -1 : a.session.tenant > b.session.tenant ? 1 : 0) ||
        a.group - b.group ||
        a.order - b.order,
    );
    return entries;
  }

  /**
   * Room opened while tenants share the windows: the best-placed waiting
   * session goes first. A pinned one without room keeps its replica's room
   * for itself (no one after it takes it); a never-admitted one without room
   * anywhere stops the pass, so room freed for it is not taken by others.
   */
  private fairFill(): void {
    const blocked = new Set<ReplicaSlots>();
    for (;;) {
      const entries = this.fairEntries(this.shares(), blocked);
      let admitted = false;
      for (const entry of entries) {
        if (entry.slots) {
          if (!this.fits(entry.slots, entry.session)) {
            blocked.add(entry.slots);
            continue;
          }
          this.activate(entry.session, entry.slots.id, "resumed");
          admitted = true;
          break;
        }
        const waiter = entry.waiter!;
        const candidates = this.candidatesOutside(waiter.session, blocked);
        if (candidates.length === 0) return;
        const replica = waiter.choose(candidates);
        if (replica === undefined || !candidates.includes(replica)) return;
        removeFrom(this.queue, waiter);
        waiter.queued = false;
        this.activate(waiter.session, replica, "admitted");
        admitted = true;
        break;
      }
      if (!admitted) return;
    }
  }

  /** Replicas with room for a never-admitted session, outside `blocked` (its home first, as `candidates` has it). */
  private candidatesOutside(session: SessionRecord, blocked: ReadonlySet<ReplicaSlots>): string[] {
    const home = session.home !== null ? this.replicas.get(session.home) : undefined;
    if (home?.accepting && !this.starving(session))
      return !blocked.has(home) && this.fits(home, session) ? [home.id] : [];
    const ids: string[] = [];
    for (const [id, slots] of this.replicas)
      if (!blocked.has(slots) && this.fits(slots, session)) ids.push(id);
    return ids;
  }

  /**
   * Reclaim (docs/tenants.md): the best-placed session that waited longer
   * than the reclaim delay, of a tenant below its entitlement or of a higher
   * band than sessions holding room, has others paused for it at their next
   * step boundary until it fits: lowest band first, then the tenant furthest
   * above its entitlement, then its most recently admitted session. Paced:
   * nothing more is decided while a victim of the last decision still runs.
   */
  private reclaimForShares(): void {
    if (!this.sharing()) return;
    for (const slots of this.replicas.values()) {
      for (const session of slots.active)
        if (session.pauseRequested && session.pauseReason !== "window") return;
    }
    const now = this.clock.now();
    const shares = this.shares();
    for (const entry of this.fairEntries(shares, new Set())) {
      const first = entry.waiter ?? entry.session.waiters[0];
      if (!first || now - first.enqueuedAt < this.reclaimAfterMs) continue;
      const claimant = shares.get(entry.session.tenant);
      const below = claimant !== undefined && claimant.usage < claimant.entitlement;
      const victims = this.victims(entry.session, below, shares, entry.slots);
      if (victims.length === 0) continue;
      const target = entry.slots ?? victims[0]!.heldOn!;
      if (target.size === null) continue;
      const need = this.footprint(entry.session);
      let room = target.size - occupied(target);
      const taken = new Map<string, number>();
      let paused = false;
      for (const victim of victims) {
        if (room >= need) break;
        if (victim.heldOn !== target) continue;
        const share = shares.get(victim.tenant)!;
        const reason: PauseReason =
          BAND_RANK[victim.band] > BAND_RANK[entry.session.band] ? "priority" : "fairness";
        // A tenant is brought down to its entitlement, not below it, for fairness.
        const left = share.usage - (taken.get(victim.tenant) ?? 0);
        if (reason === "fairness" && left <= share.entitlement) continue;
        taken.set(victim.tenant, (taken.get(victim.tenant) ?? 0) + victim.held);
        room += victim.held;
        requestPause(victim, true, reason);
        this.account(victim);
        if (victim.running === 0 && victim.waiters.length === 0) this.pause(victim, target);
        paused = true;
      }
      if (paused) {
        this.fill();
        return;
      }
    }
  }

  /** Active sessions that may be paused for `claimant`, in the order they go. */
  private victims(
    claimant: SessionRecord,
    claimantBelow: boolean,
    shares: Map<string, TenantShare>,
    pinned: ReplicaSlots | undefined,
  ): SessionRecord[] {
    const rank = BAND_RANK[claimant.band];
    const found: SessionRecord[] = [];
    for (const slots of this.replicas.values()) {
      if (slots.size === null || !slots.accepting || (pinned && slots !== pinned)) continue;
      for (const session of slots.active) {
        if (session.tenant === claimant.tenant || session.pauseRequested || session.heldOn !== slots)
          continue;
        const victimRank = BAND_RANK[session.band];
        // A protected session is never paused for a lower or equal band.
        if (victimRank < rank || (victimRank === rank && session.band === "protected")) continue;
        if (victimRank === rank) {
          const share = shares.get(session.tenant);
          if (!claimantBelow || !share || share.usage <= share.entitlement) continue;
        }
        found.push(session);
      }
    }
    const ratio = (session: SessionRecord) => shares.get(session.tenant)?.ratio ?? 0;
    found.sort(
      (a, b) => BAND_RANK[b.band] - BAND_RANK[a.band] || ratio(b) - ratio(a) || b.admittedSeq - a.admittedSeq,
    );
    return found;
  }

  /** Where a waiting session stands: its place in the order and why it waits; undefined when it does not wait. */
  private standing(session: SessionRecord): { position: number; reason: WaitReason } | undefined {
    if (session.waiters.length === 0 || session.state === "active" || session.state === "closed")
      return undefined;
    if (!this.sharing()) {
      const queued = this.queue.findIndex((waiter) => waiter.session === session);
      if (queued >= 0) return { position: queued + 1, reason: "window" };
      const slots = session.replica ? this.replicas.get(session.replica) : undefined;
      const returning = slots ? [...this.resumeOrder(slots.paused), ...returningOrder(slots.dormant)] : [];
      return { position: Math.max(0, returning.indexOf(session)) + 1, reason: "window" };
    }
    const entries = this.fairEntries(this.shares(), new Set());
    const index = entries.findIndex((entry) => entry.session === session);
    if (index < 0) return undefined;
    let reason: WaitReason = "window";
    for (const ahead of entries.slice(0, index)) {
      if (ahead.band < BAND_RANK[session.band]) {
        reason = "priority";
        break;
      }
      if (ahead.session.tenant !== session.tenant) reason = "fairness";
    }
    return { position: index + 1, reason };
  }

  /** Every tenant seen, as the metrics and the dashboard show it, and Jain's index of usage ÷ entitlement among those with demand. */
  tenants(): { tenants: TenantView[]; jainIndex: number } {
    const shares = this.shares();
    const views = new Map<string, TenantView>();
    for (const account of this.ledger.snapshot(this.clock.now())) {
      const name = account.policy.name;
      views.set(name, {
        tenant: name,
        band: account.policy.band,
        weight: account.policy.weight,
        usageTokens: account.usage,
        entitlementTokens: shares.get(name)?.entitlement ?? 0,
        sessions: { active: 0, idle: 0, waiting: 0, paused: 0, dormant: 0 },
        serviceTokenSeconds: account.serviceTokenMs / 1000,
        pauses: { ...this.pausesOf(name) },
      });
    }
    for (const session of this.sessions.values()) {
      const view = views.get(session.tenant);
      if (!view || session.state === "closed") continue;
      if (session.state === "active") view.sessions[session.running > 0 ? "active" : "idle"]++;
      else view.sessions[session.state]++;
    }
    const ratios: number[] = [];
    for (const share of shares.values())
      if (share.entitlement > 0) ratios.push(share.usage / share.entitlement);
    return { tenants: [...views.values()], jainIndex: jainIndex(ratios) };
  }

  /** The queue is full and `session` would wait: the most recently queued session of a lower band gives up its place. */
  private refuseLowerBand(session: SessionRecord): boolean {
    if (!this.fairness) return false;
    const rank = BAND_RANK[session.band];
    let victim: StepWaiter | undefined;
    let victimRank = rank;
    for (const waiter of this.queue) {
      const other = BAND_RANK[waiter.session.band];
      if (other > victimRank || (other === victimRank && victim !== undefined)) {
        victim = waiter;
        victimRank = other;
      }
    }
    if (!victim || victimRank <= rank) return false;
    this.drop(
      victim,
      new Refusal(
        "session_queue_full",
        `the session queue is full: a session of a higher band took this place`,
        {
          retryAfterSeconds: this.options.retryAfterSeconds?.() ?? 1,
        },
      ),
    );
    return true;
  }

  /**
   * Cache affinity is load: a paused or dormant session with a step waiting,
   * pinned to a replica without room for it, resumes on a replica that has
   * room once nothing else wants that room (its own returning sessions and
   * every waiting session went first). A place left empty is throughput
   * lost, while the session's cache is being evicted on its old replica
   * anyway; the step pays a recompute where it lands. Oldest first.
   */
  private resumeElsewhere(): void {
    if (this.queue.length > 0) return;
    const stranded: SessionRecord[] = [];
    for (const slots of this.replicas.values()) {
      for (const session of slots.paused) {
        if (session.waiters.length > 0 && !this.fits(slots, session)) stranded.push(session);
      }
      for (const session of slots.dormant) {
        if (session.waiters.length > 0 && !this.fits(slots, session)) stranded.push(session);
      }
    }
    if (stranded.length === 0) return;
    stranded.sort((a, b) => a.pausedAt - b.pausedAt);
    for (const session of stranded) {
      const candidates = this.candidates(session);
      if (candidates.length === 0) continue;
      const replica = session.waiters[0]!.choose(candidates);
      if (replica === undefined || !candidates.includes(replica)) continue;
      session.movedFrom = session.replica;
      this.activate(session, replica, "resumed");
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
      // A tenant asking again after holding nothing banks no credit for its idle time (VTC).
      if (this.fairness) this.ledger.lift(session.tenant, this.clock.now());
      if (session.state === "waiting" && !session.waiters.some((other) => other !== waiter && other.queued)) {
        waiter.queued = true;
        if (session.evacuated) {
          // A failover goes before sessions never admitted: behind earlier evacuees only.
          let i = 0;
          while (i < this.queue.length && this.queue[i]!.session.evacuated) i++;
          this.queue.splice(i, 0, waiter);
        } else {
          this.queue.push(waiter);
        }
      }
      waiter.cancelTimer = this.clock.setTimeout(() => {
        this.drop(
          waiter,
          new Refusal(
            "queue_timeout",
            `the session waited ${this.options.waitLimitMs} ms for room in a window`,
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
      // Still waiting: idle sessions past their retention make room now rather than at the next tick.
      if (!waiter.done) this.reclaimIdle();
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
    const session = waiter.session;
    removeFrom(session.waiters, waiter);
    if (waiter.queued) {
      removeFrom(this.queue, waiter);
      waiter.queued = false;
      // Another step of the same session may still wait: it takes the queue place.
      const next = session.waiters[0];
      if (next && session.state === "waiting") {
        next.queued = true;
        insertByEnqueue(this.queue, next);
      }
    }
    if (session.running === 0 && session.waiters.length === 0 && session.demandTokens > 0) {
      // The step never ran: the session is idle again, sized by its context.
      session.demandTokens = 0;
      session.idleSince = this.clock.now();
      this.account(session);
    }
    waiter.reject(error);
    this.fill();
  }

  private shut(session: SessionRecord, why: string, refill = true): void {
    const slots = session.replica ? this.replicas.get(session.replica) : undefined;
    if (slots) {
      removeFrom(slots.active, session);
      removeFrom(slots.paused, session);
      removeFrom(slots.dormant, session);
    }
    session.place = { state: "closed", replica: session.replica };
    this.account(session);
    for (const waiter of [...session.waiters]) {
      this.drop(waiter, new Refusal("session_not_found", `session ${session.id} was ${why}`));
    }
    this.ledger.countSession(session.tenant, -1);
    this.emit(session, "closed", session.replica, {});
    if (refill) this.fill();
  }
}

/** What a replica's window holds: its counted footprints, a prompt prefix its sessions share counted once. */
function occupied(slots: ReplicaSlots): number {
  return slots.held - slots.sharedTokens;
}

/**
 * A session's cache footprint on its replica, tokens (docs/how-it-works.md#session-window-tokens-of-cache-footprint): the prompt plus
 * `max_tokens` of a step waiting or running (the most it can hold then), else
 * its context plus the growth expected of its next step.
 */
export function tokenFootprint(session: SessionRecord): number {
  if (session.demandTokens > 0) return Math.max(session.demandTokens, session.tokens);
  return session.tokens + session.expectedGrowthTokens;
}

/** Asks an active session to pause at its next step boundary (and why), or withdraws the request. */
function requestPause(session: SessionRecord, requested: boolean, reason?: PauseReason): void {
  if (session.place.state !== "active") return;
  session.place = { ...session.place, pauseRequested: requested };
  session.pauseReason = requested ? (reason ?? "window") : null;
}

function publicState(state: SessionStatus): SessionState {
  return state === "dormant" ? "paused" : state;
}

function phaseOf(session: SessionRecord): SessionPhase {
  if (session.state === "active") return session.running > 0 ? "active" : "idle";
  return session.state;
}

function hasWaiter(sessions: readonly SessionRecord[]): boolean {
  for (const session of sessions) if (session.waiters.length > 0) return true;
  return false;
}

/** Dormant sessions with a step waiting, the longest waiting first. */
function returningOrder(dormant: readonly SessionRecord[]): SessionRecord[] {
  const returning = dormant.filter((session) => session.waiters.length > 0);
  if (returning.length > 1) returning.sort((a, b) => a.waiters[0]!.enqueuedAt - b.waiters[0]!.enqueuedAt);
  return returning;
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
