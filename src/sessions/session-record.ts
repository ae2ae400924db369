/**
 * @module The session record (docs/how-it-works.md#session-window-tokens-of-cache-footprint): one session as the admission layer
 * tracks it, where it stands, the steps waiting for it, and the per-replica
 * window state it is counted in. `SessionAdmission` alone changes them.
 */

import type { Cancel } from "../clock.js";
import type { Band } from "../config/scheduler-config.js";
import { DEFAULT_TENANT } from "../tenants/tenant-ledger.js";
import type { Lane } from "../types.js";
import type { IdleGaps } from "./idle-gaps.js";
/** What a window counts: tokens of cache footprint (docs/how-it-works.md#session-window-tokens-of-cache-footprint) or sessions (CONCUR). */
export type AdmissionUnit = "tokens" | "sessions";

/** Where a session stands; `dormant` shows as `paused` in the documented view. */
export type SessionStatus = "waiting" | "active" | "paused" | "dormant" | "closed";

/**
 * Where a session stands, with what only that state has: a pin exists from
 * the first admission on, a pause request only while active, a leaving time
 * only while paused or dormant. Every transition replaces it whole.
 */
export type SessionPlace =
  | { readonly state: "waiting" }
  | { readonly state: "active"; readonly replica: string; readonly pauseRequested: boolean }
  | { readonly state: "paused" | "dormant"; readonly replica: string; readonly since: number }
  | { readonly state: "closed"; readonly replica: string | null };

/** Why a session left its window at a step boundary: its tenant was over its share, a higher band waited, or the window shrank. */
export type PauseReason = "fairness" | "priority" | "window";

/**
 * Why a session left its window, as its `paused` event says: a pause (above), or `unhealthy`: its
 * replica became unhealthy and it waits for room on another (not a pause for sharing, so not
 * counted among the pauses).
 */
export type LeaveReason = PauseReason | "unhealthy";

/** Why a waiting step still waits: no room, a higher band first, or tenants below their share first. */
export type WaitReason = "window" | "priority" | "fairness";

/** No prompt blocks known (before a step, or counted nowhere). */
export const NO_BLOCKS: readonly string[] = Object.freeze([]);

/** One session as the admission layer tracks it. */
export class SessionRecord {
  /** Where it stands; changed only by `SessionAdmission`'s transitions. */
  place: SessionPlace = { state: "waiting" };
  steps = 0;
  /** Tokens of the context: last prompt plus its output. */
  tokens = 0;
  /** Steps in flight right now. */
  running = 0;
  /**
   * Whether its latest step was admitted while it held its place in the window (an idle session
   * coming back within its place), rather than waiting for one — first, paused or dormant.
   */
  stepHeldInWindow = false;
  /** Order of first admission; the youngest (largest) are paused first. */
  admittedSeq = 0;
  /** The replica a paused session was moved away from when it resumed elsewhere; cleared by whoever reports it. */
  movedFrom: string | null = null;
  /** Its replica went unhealthy, or it came from another frontend: it waits ahead of every session never admitted. */
  evacuated = false;
  /** Handed over by another frontend: the replica holding its cache, the only one it waits for while that one accepts. */
  home: string | null = null;
  /** Steps waiting for this session to become active. */
  readonly waiters: StepWaiter[] = [];
  /** The tenant it belongs to (fixed at open) and that tenant's band. */
  tenant: string = DEFAULT_TENANT;
  band: Band = "standard";
  /** Why a pause was asked of it while active (null: none asked), and why it last left its window. */
  pauseReason: PauseReason | null = null;
  lastPauseReason: PauseReason | null = null;
  /** Free for the scheduler: per-session routing state (incremental hashes). */
  routing: unknown = undefined;
  /** Prompt plus `max_tokens` of the steps waiting or running now, the most one of them can hold; 0 between steps. */
  demandTokens = 0;
  /** Sum and count of context growth per step after the first (its own learned growth). */
  growthTokens = 0;
  growthSamples = 0;
  /** Growth expected of its next step, fixed when its last step ended (so a footprint changes only with the session). */
  expectedGrowthTokens = 0;
  /** When its last step ended (clock ms); NaN while a step runs or before the first. */
  idleSince = Number.NaN;
  /** How long it keeps its place once idle before it may go dormant, ms. */
  retentionMs = 0;
  /** Where `retentionMs` came from. */
  retentionSource: RetentionSource = "default";
  /** The client's hint for the idle gap after the step running now, ms. */
  expectedIdleMs: number | undefined = undefined;
  /** Its own recent idle gaps. */
  gaps: IdleGaps | undefined = undefined;
  /** What it counts for in `heldOn`'s window now (0 when not counted). */
  held = 0;
  heldOn: ReplicaSlots | null = null;
  /** The window whose `pauseRequests` counts this session's pending pause. */
  requestOn: ReplicaSlots | null = null;
  /**
   * Out of the window (paused or dormant) with its context counted as retained in its replica's
   * host-memory tier: decided when it left, by the room there then.
   */
  retainedInHost = false;
  /** Context tokens it counts for in `hostOn`'s host tier now (0 when not counted). */
  hostHeld = 0;
  hostOn: ReplicaSlots | null = null;
  /** Chained block hashes of its latest prompt (the router's), for a prefix sessions share to count once. */
  promptBlocks: readonly string[] = NO_BLOCKS;
  /** The blocks counted in `blocksOn`'s shared-prefix counts now, and where. */
  countedBlocks: readonly string[] = NO_BLOCKS;
  blocksOn: ReplicaSlots | null = null;

  constructor(
    readonly id: string,
    public lane: Lane | undefined,
    public metadata: Record<string, unknown> | undefined,
    /** When it was last used (clock ms), for idle expiry. */
    public touchedAt: number,
  ) {}

  get state(): SessionStatus {
    return this.place.state;
  }

  /** Replica the session is pinned to (it holds its window place there while active); null before its first admission. */
  get replica(): string | null {
    return this.place.state === "waiting" ? null : this.place.replica;
  }

  /** The window shrank: pause this session at its next step boundary. */
  get pauseRequested(): boolean {
    return this.place.state === "active" && this.place.pauseRequested;
  }

  /** When it last left the window (paused or dormant); 0 otherwise. */
  get pausedAt(): number {
    return this.place.state === "paused" || this.place.state === "dormant" ? this.place.since : 0;
  }
}

/** What a frontend handing a session over tells the next holder (scale-out). */
export interface SessionHandover {
  replica: string | null;
  steps: number;
  tokens: number;
  lane?: Lane;
  metadata?: Record<string, unknown>;
}

/** What a step asks for when it arrives: sizes for its footprint, and the client's hint for the gap after it. */
export interface StepDemand {
  promptTokens: number;
  maxTokens: number;
  /** How long the client expects to be away after this step, ms (`x-sluice-expected-idle-ms`). */
  expectedIdleMs?: number | undefined;
  /**
   * Chained hashes of the prompt's blocks (`blockTokens` each, as the router hashes them): a
   * prefix several sessions on a replica share (a system prompt) counts once in its window.
   */
  promptBlocks?: readonly string[] | undefined;
}

export interface StepWaiter {
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

/** Where a retention time came from. */
export type RetentionSource = "own" | "fleet" | "hint" | "default";

export interface ReplicaSlots {
  readonly id: string;
  /** null: no window (the policy admits every session at once). Sessions or tokens, as the unit says. */
  size: number | null;
  /** Whether the replica takes sessions it does not already hold (healthy, fresh signals). */
  accepting: boolean;
  /** Active sessions ordered by first admission (oldest first). */
  readonly active: SessionRecord[];
  /** Paused sessions, oldest pause first. */
  readonly paused: SessionRecord[];
  /** Dormant sessions, oldest first. */
  readonly dormant: SessionRecord[];
  /** Sum of what its counted sessions hold (sessions or footprint tokens). */
  held: number;
  /** Sessions counted in `held`. */
  holders: number;
  /** Active sessions asked to pause at their next boundary. */
  pauseRequests: number;
  /** Its host-memory KV tier's capacity, tokens; 0 without one (docs/tiers.md). */
  hostRoom: number;
  /** How long a block outlives its last use in its GPU prefix cache, ms (Infinity: unknown). */
  turnoverMs: number;
  /** Context tokens of its paused and dormant sessions counted as retained in host memory (≤ `hostRoom`). */
  hostHeld: number;
  /** How many of its counted sessions' prompts hold each block (token window). */
  readonly blockRefs: Map<string, number>;
  /** Tokens of prompt blocks counted in `held` more than once: `held` less this is what the window holds. */
  sharedTokens: number;
}
