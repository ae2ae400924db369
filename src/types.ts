/** @module Shared vocabulary of the scheduler's API: calls, sessions, lanes, state snapshots, events. */

import type { CallEndpoint, EngineChunk, EngineResult } from "./engine.js";

/** A lane a call runs in. */
export type Lane = "interactive" | "bulk";
/** A lane classification; `overflow` is refused. */
export type LaneClass = Lane | "overflow";

/** An OpenAI chat message (content may be a string or an array of parts). */
export interface ChatMessage {
  role: string;
  content?: unknown;
  name?: string;
  tool_call_id?: string;
  tool_calls?: unknown;
}

/** The prompt of a call, in whichever form the client sent it. */
export type CallInput =
  | { kind: "chat"; messages: readonly ChatMessage[] }
  | { kind: "text"; prompt: string }
  | { kind: "tokens"; tokens: readonly number[] };

/** A validated call, as the HTTP and NATS adapters and the benchmark hand it to the scheduler. */
export interface CallRequest {
  requestId: string;
  /** Model name; undefined means the fleet's first model. */
  model?: string;
  endpoint: CallEndpoint;
  input: CallInput;
  /** Requested output tokens; undefined takes the configured default (never the context window). */
  maxTokens?: number;
  /** Whether the client streams (SSE); HTTP engines forward raw events then. */
  stream: boolean;
  /** The client's OpenAI body, forwarded to HTTP engines. */
  body?: Record<string, unknown>;
  /**
   * Session key (from a session header, the body or the sessions API), scoped by `tenant`: two
   * tenants' equal keys are two sessions. Opens a session implicitly when new.
   */
  sessionId?: string;
  /** The key of this session's parent (same tenant): a new child is placed on its parent's replica when it may take it. */
  parentSessionId?: string;
  /** This step is the session's last (`x-dynamo-session-final: true`): the session closes when it ends. */
  finalStep?: boolean;
  /** The client's `prompt_cache_key`: a placement hint (calls with the same one go together), never a session key. */
  cacheHint?: string;
  /**
   * Responses API: the response this call continues. Its state lives on the replica that
   * produced it, so the call goes there (and into that call's session when it names none).
   */
  previousResponseId?: string;
  /** Declared intent; a large call stays bulk whatever it declares. */
  declaredLane?: Lane;
  /** The client's own time-to-first-token deadline, ms. */
  deadlineMs?: number;
  /**
   * The longest this call may wait in a sluice queue, ms (`x-sluice-queue-ttl-ms`): it can only
   * shorten its lane's residence time, never lengthen it. 0: it may not wait for token budget.
   */
  queueTtlMs?: number;
  /** How long the client expects to be away after this step, ms: a hint for its session's retention (docs/how-it-works.md#session-window-tokens-of-cache-footprint). */
  expectedIdleMs?: number;
  /** Priority from the API key (higher is more important); never from a client header. Default 0. */
  priority?: number;
  tenant?: string;
  signal?: AbortSignal;
}

/**
 * An admitted call bound to a replica. Iterate it for the engine's chunks;
 * when iteration ends (normally, by `break`, by failure or by `cancel()`),
 * every permit, reservation and session step it holds is released exactly once.
 */
export interface AdmittedCall extends AsyncIterable<EngineChunk> {
  readonly requestId: string;
  readonly lane: Lane;
  readonly replica: string;
  /** Time spent waiting for admission (session window, gate queue), ms. */
  readonly queueMs: number;
  readonly inputTokens: number;
  readonly maxTokens: number;
  readonly sessionId: string | undefined;
  /** Whether `sessionId` was inferred from the prompt (the client named no session). */
  readonly sessionInferred?: boolean;
  /** Settles when the call ends; rejects with `EngineError` when the engine failed. */
  readonly result: Promise<EngineResult>;
  /** Cancels the call (upstream included) and releases what it holds. Idempotent. */
  cancel(): void;
}

/** A session's state as docs/http-api.md names it; a dormant session shows as `paused` (it left the window, keeps its pin). */
export type SessionState = "waiting" | "active" | "paused" | "closed";

/**
 * Where a session stands with its window, finer than `SessionState`: an active
 * session between steps is `idle`; an idle one that left the window after its
 * retention time is `dormant`.
 */
export type SessionPhase = "waiting" | "active" | "idle" | "dormant" | "paused" | "closed";

/** A session as the API shows it (docs/http-api.md). */
export interface SessionView {
  /** The client's key. */
  id: string;
  state: SessionState;
  replica: string | null;
  steps: number;
  /** Tokens the session's context holds: last prompt plus its output. */
  tokens: number;
  /** Finer state: active sessions between steps are `idle`, idle ones out of the window `dormant`. */
  phase: SessionPhase;
  /** Tokens the session holds in its window while active: context plus expected next growth (docs/how-it-works.md#session-window-tokens-of-cache-footprint). */
  footprint_tokens: number;
  /** How long an idle session keeps its place before it may go dormant, ms (docs/how-it-works.md#session-window-tokens-of-cache-footprint). */
  retention_ms: number;
  lane?: Lane;
  metadata?: Record<string, unknown>;
  /** The tenant the session belongs to (its API key's, `default` without one) and that tenant's band. */
  tenant?: string;
  band?: "protected" | "standard" | "sheddable";
  /** While a step waits for room: its place in the admission order (1 is next) and why it waits. */
  position?: number;
  reason?: "window" | "priority" | "fairness";
}

export interface OpenSessionInit {
  id?: string;
  /** The tenant opening it (from its API key); default `default`. */
  tenant?: string;
  lane?: Lane;
  metadata?: Record<string, unknown>;
}

export type OverloadStage = "normal" | "bulk_paused" | "shedding";

export type RouteReason = "pinned" | "prefix" | "load" | "affinity_break";

/** Per-replica part of `/v1/admin/state`. */
export interface ReplicaState {
  id: string;
  /** Its role in a disaggregated fleet; absent for `both`. */
  role?: "prefill" | "decode";
  healthy: boolean;
  /** A worker-wide gate rejection marked it busy (no new calls for 1 s). */
  busy: boolean;
  /** What the engine publishes; a signal it does not publish is null here (and listed in `engine.unknown`), never a stand-in 0. */
  signals: {
    kvUsage: number | null;
    /** Token-weighted prefix-cache hit rate over the last control interval (0–1). */
    hitRate: number | null;
    running: number | null;
    waiting: number | null;
    preemptions: number | null;
    stale: boolean;
    ageMs: number;
    kvCapacityTokens: number;
    maxNumSeqs: number;
    dataParallelSize: number;
    prefillTokensPerSecond: number;
  };
  /**
   * Session window. `unit` null: the policy has none. `size` is W for the
   * session-count law and the count of sessions the window holds for the token
   * window; `sizeTokens` is the token window W, `footprintTokens` the sum of its
   * active sessions' footprints and `sharedPrefixTokens` the prompt-block tokens in
   * that sum counted more than once (a shared system prompt), so the window holds
   * their difference (both null for the session-count law).
   */
  window: {
    unit: "tokens" | "sessions" | null;
    size: number | null;
    sizeTokens: number | null;
    footprintTokens: number | null;
    sharedPrefixTokens: number | null;
    /** Active sessions (running a step or idle between steps). */
    active: number;
    /** Active sessions between steps. */
    idle: number;
    dormant: number;
    paused: number;
    waiting: number;
  };
  gate: {
    requests: number;
    waiting: number;
    queued: number;
    ranks: { rank: number; requests: number; waiting: number; queued: number }[];
    unranked: { requests: number; waiting: number; queued: number };
    limits: { engineRequestLimit: number; engineRequestWaitingLimit: number; requestQueueLimit: number };
    counters: {
      received: number;
      admittedDirect: number;
      admittedQueue: number;
      rejected: number;
      cancelled: number;
    };
  };
  budget: {
    ceilingTokens: number;
    reservedTokens: number;
    availableTokens: number;
    guardTokens: number;
    /** Calls waiting for budget on this replica (docs/how-it-works.md), their tokens and the oldest one's wait, ms. */
    queue?: { interactive: number; bulk: number; tokens: number; oldestWaitMs: number; limit: number };
  };
  lanes: Record<Lane, { queued: number; oldestAgeMs: number }>;
  queuedPrefillTokens: number;
  inflightPrefillTokens: number;
  /** What the replica's adapter knows about the engine behind it, when it reads another system's metrics. */
  /** The engine's second KV tier in host memory, when it has one (the documented simulated replica, vLLM offloading, LMCache, SGLang HiCache). */
  hostTier?: {
    /** Tokens; 0 when the engine states a tier but not its size in tokens. */
    capacityTokens: number;
    usage?: number;
    /** Prompt tokens loaded from the host tier instead of recomputed, and looked up there (cumulative). */
    hitTokens: number;
    queryTokens: number;
    /** Context tokens of sessions out of the window counted as retained there (policies that see tiers; else 0). */
    retainedTokens: number;
  };
  engine?: {
    /** Recognised engine profile (`vllm-v1`, `sglang`, …). */
    profile: string;
    /** Signals the engine does not publish (read as unknown, never as zero). */
    unknown: string[];
    /** Where the KV capacity came from. */
    kvCapacitySource: "engine" | "derived" | "configured" | "unknown";
    /** False when no KV capacity is known, so the token budget is off. */
    tokenBudget: boolean;
    /** The engine's own hit-rate gauge (0–1), when it publishes one. */
    statedHitRate?: number;
    /** Set when its metrics cannot be read: what is unknown and which flags stand in for it. */
    warning?: string;
  };
}

/** `/v1/admin/state`: everything an operator or the dashboard needs, as plain JSON. */
export interface AdminState {
  atMs: number;
  policy: string;
  stage: OverloadStage;
  models: string[];
  replicas: ReplicaState[];
  sessions: { total: number; waiting: number; active: number; idle: number; dormant: number; paused: number };
  /** Cumulative refusals by reason. */
  rejections: Record<string, number>;
  /**
   * Tenants sharing the windows (docs/tenants.md): every tenant seen, and Jain's index of
   * usage ÷ entitlement among those with demand (1 when shares are met evenly).
   */
  tenants?: { fairness: "tenants" | "off"; jainIndex: number; list: TenantState[] };
  /** Present for a disaggregated fleet (prefill and decode replicas). */
  disaggregation?: {
    decodeCheck: "predicted" | "current" | "none";
    /** Calls refused or failed after their prefill ran, and the uncached prefill tokens they had cost. */
    refusedAfterPrefill: number;
    wastedPrefillTokens: number;
  };
}

/** One tenant in `AdminState.tenants`. */
export interface TenantState {
  tenant: string;
  band: "protected" | "standard" | "sheddable";
  weight: number;
  /** What its active sessions hold in their windows (tokens of footprint for the token window). */
  usageTokens: number;
  /** Its weighted max-min share of the fleet's windows now; 0 without demand. */
  entitlementTokens: number;
  /** Its open sessions by state: `active` runs a step, `idle` holds its place between steps. */
  sessions: { active: number; idle: number; waiting: number; paused: number; dormant: number };
  /** Usage integrated over time, token·seconds. */
  serviceTokenSeconds: number;
  /** Sessions paused at a step boundary, by why. */
  pauses: { fairness: number; priority: number; window: number };
}

export type CallOutcome = "ok" | "error" | "cancelled";

/** Hooks the metrics adapter (and tests) attach to; every one is optional and must not throw. */
export interface SchedulerEvents {
  /** A call passed validation and was tokenized and classified. */
  arrival?(e: { lane: LaneClass; inputTokens: number; maxTokens: number }): void;
  refusal?(e: { reason: string; lane: LaneClass | undefined; status: number }): void;
  /**
   * Disaggregated fleets: a call was refused (or failed) after its prefill ran, so
   * that prefill's uncached tokens were computed for nothing. Optional.
   */
  wastedPrefill?(e: { replica: string; tokens: number; reason: string }): void;
  route?(e: { replica: string; reason: RouteReason; predictedHitTokens: number; promptTokens: number }): void;
  admitted?(e: { lane: Lane; replica: string; queueWaitMs: number }): void;
  firstToken?(e: { lane: Lane; replica: string; ttftMs: number }): void;
  /** Mean gap between tokens of a finished call (ms), when it generated ≥ 2 tokens. */
  interToken?(e: { lane: Lane; replica: string; meanGapMs: number; tokens: number }): void;
  finished?(e: { lane: Lane; replica: string; outcome: CallOutcome }): void;
  session?(e: {
    id: string;
    event: "admitted" | "paused" | "resumed" | "dormant" | "closed";
    replica: string | null;
    /** The session's tenant and band (the scheduler always names them). */
    tenant?: string;
    band?: "protected" | "standard" | "sheddable";
    /**
     * For `paused`: why it left its window (its tenant over its share, a higher band waiting, the
     * window shrank, or its replica became unhealthy and it waits for room on another).
     */
    reason?: "fairness" | "priority" | "window" | "unhealthy";
    /** For `admitted` and `resumed`: how long its oldest waiting step waited, ms (0: it did not wait). */
    waitedMs?: number;
  }): void;
  /** An idle session was given a retention time (docs/how-it-works.md#session-window-tokens-of-cache-footprint), from its own gaps, the fleet's, or the client's hint. */
  retention?(e: { replica: string; retentionMs: number; source: "own" | "fleet" | "hint" | "default" }): void;
  /** A replica's window law changed W, and why. */
  window?(e: {
    replica: string;
    unit: "tokens" | "sessions";
    from: number;
    to: number;
    action: "increase" | "decrease";
    cause: string;
  }): void;
  /** The overload stage changed, and why (the p95 interactive gate queue age of the window that moved it). */
  stage?(e: { from: OverloadStage; to: OverloadStage; cause: string }): void;
  /** What session inference made of a call (docs/routing.md), once per call it saw. */
  inference?(e: { outcome: InferenceOutcome }): void;
  /** A replica became healthy or unhealthy at a control tick, and why; one unhealthy from the start is reported once too. */
  health?(e: { replica: string; healthy: boolean; cause: string }): void;
}

/**
 * What inference made of a call (the `outcome` label of `sluice_session_inference_total`).
 * `on`: `continued` (next step of an inferred session), `forked` (a child session off an earlier
 * point, or a second call continuing the same point), `new` (continues nothing: a first call or a
 * rewritten history), `ambiguous` (the point it continues was reached by two or more chains: a
 * shared prefix never decides), `keyed` (the call had a key), `unsupported` (a prompt inference
 * does not read). `shadow`, for calls with a key: `agreed`, `disagreed` (inference would have put it
 * in another key's session), `missed` (its key was seen before but inference found no point);
 * `unkeyed` for calls without one.
 */
export type InferenceOutcome =
  | "continued"
  | "forked"
  | "new"
  | "ambiguous"
  | "keyed"
  | "unsupported"
  | "agreed"
  | "disagreed"
  | "missed"
  | "unkeyed";
