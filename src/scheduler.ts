/**
 * @module The scheduler: composes every layer in the documented order — tokenize and
 * budget, classify, session admission, route, token budget and feasibility,
 * gate, forward — and releases whatever it took on any refusal, cancel or
 * engine failure. The benchmark's baselines run through this same code with
 * layers switched off by policy.
 */

import { followAbort } from "./abort.js";
import type { BudgetOrderKey } from "./budget/budget-order.js";
import type { BudgetQueueSnapshot } from "./budget/budget-queue.js";
import { classifyLane } from "./budget/classify-lane.js";
import { checkDeadline } from "./budget/feasibility.js";
import { OverloadController } from "./budget/overload-stages.js";
import { type Reservation, reservationTokens } from "./budget/token-budget.js";
import { type Cancel, type Clock, realClock } from "./clock.js";
import { type PolicyFeatures, policyFeatures } from "./config/policy-features.js";
import {
  LANE_DEFAULTS,
  type Policy,
  resolveSchedulerConfig,
  type SchedulerConfig,
  type SchedulerConfigInput,
} from "./config/scheduler-config.js";
import type { Engine, EngineResult, EngineStream } from "./engine.js";
import { Refusal } from "./errors.js";
import type { BackendGate, Permit } from "./gate/backend-gate.js";
import { GateRejection } from "./gate/gate-errors.js";
import { blockHashesFrom, extendBlockHashes } from "./routing/block-hash.js";
import { FleetPrefixIndex } from "./routing/fleet-prefix-index.js";
import {
  choosePlacement,
  keepPin,
  type PlacementCandidate,
  type Placement as PlacementDecision,
  predictTtftMs,
} from "./routing/placement.js";
import { AdmittedCallImpl, type CallHoldings } from "./scheduler/admitted-call.js";
import { DisaggregatedPath, type HeldCall } from "./scheduler/disaggregated-path.js";
import { ReplicaRuntime } from "./scheduler/replica-runtime.js";
import { controlWindow, type WindowControlContext } from "./scheduler/window-controller.js";
import { digestPrompt } from "./sessions/message-digest.js";
import { type ResponseOrigin, ResponseOrigins } from "./sessions/response-origins.js";
import {
  SessionAdmission,
  type SessionHandover,
  type SessionRecord,
  type TenantView,
} from "./sessions/session-admission.js";
import { checkSessionId } from "./sessions/session-id.js";
import { type InferenceDecision, SessionInference } from "./sessions/session-inference.js";
import { scopedSessionId, unscopeSessionId } from "./sessions/session-scope.js";
import type { SessionDirectory, WindowAuthority } from "./sessions/window-authority.js";
import { DEFAULT_TENANT } from "./tenants/tenant-ledger.js";
import type { Tokenizer } from "./tokenizer.js";
import { PromptTokenizer } from "./tokens/prompt-tokenizer.js";
import type {
  AdminState,
  AdmittedCall,
  CallInput,
  CallOutcome,
  CallRequest,
  Lane,
  LaneClass,
  OpenSessionInit,
  ReplicaState,
  SchedulerEvents,
  SessionView,
} from "./types.js";

/** Context window assumed when neither the configuration nor the engine gives one, in tokens. */
const FALLBACK_CONTEXT_WINDOW = 131_072;

export interface SchedulerOptions {
  engines: readonly Engine[];
  clock?: Clock;
  /** Overrides `config.policy`. */
  policy?: Policy;
  config?: SchedulerConfigInput;
  /** Needed for chat and text prompts; token prompts need none. */
  tokenizer?: Tokenizer;
  events?: SchedulerEvents;
  /** Decides window sizes when several frontends share a fleet; default: this frontend's own law. */
  windowAuthority?: WindowAuthority;
  /** Finds sessions other frontends opened, so a step lands on the replica holding its prefix. */
  sessionDirectory?: SessionDirectory;
  /**
   * Orders calls waiting for token budget within a lane (lower keys first, arrival order breaking
   * ties); default arrival order. Read at every decision, so it may follow moving state.
   */
  budgetOrder?: BudgetOrderKey;
}

/** Per-session routing memory: the block hashes of the last prompt, so a growing prompt hashes only its new blocks. */
interface SessionRouting {
  hashes: string[];
}

/** A call after steps 1–3: validated, tokenized and classified. */
interface CallPlan {
  model: string;
  tokens: readonly number[];
  maxTokens: number;
  lane: Lane;
  session: SessionRecord | undefined;
  /** Responses API: the replica holding the state of the response this call continues; it goes nowhere else. */
  boundReplica?: string;
}

/** What a call holds while it passes steps 4–8; released at once when a step refuses. */
interface PendingHolds {
  /** A session step counted as running. */
  step: boolean;
  reservation: Reservation | null;
  permit: Permit | null;
  replica: ReplicaRuntime | undefined;
  /** Prefill tokens counted in flight on `replica`. */
  inflight: number;
}

/** Counts that must all be zero once the scheduler is idle (every session closed, every call ended). */
export interface IdleCheck {
  permits: number;
  reservations: number;
  windowSlots: number;
  queued: number;
}

/**
 * Admission scheduler over a fleet of engines. `submit()` resolves with an
 * admitted call bound to a replica or rejects with a `Refusal`.
 */
export class Scheduler {
  readonly config: SchedulerConfig;
  readonly policy: Policy;
  /** What the policy switches on; every step asks this, never the policy's name. */
  readonly features: PolicyFeatures;
  private readonly clock: Clock;
  private readonly replicas: ReplicaRuntime[];
  private readonly byId = new Map<string, ReplicaRuntime>();
  /** Blocks each replica is believed to hold, one index for the fleet; null for policies without prefix routing. */
  private readonly prefixIndex: FleetPrefixIndex | null;
  private readonly promptTokenizer: PromptTokenizer | undefined;
  private readonly tokenizer: Tokenizer | undefined;
  private readonly listeners: SchedulerEvents[] = [];
  private readonly admission: SessionAdmission;
  private readonly overload: OverloadController | null;
  private readonly rejections: Record<string, number> = {};
  private readonly windowAuthority: WindowAuthority | undefined;
  private readonly sessionDirectory: SessionDirectory | undefined;
  /** Replica a session was pinned to by another frontend, for its first step here. */
  private readonly pinHints = new Map<string, string>();
  /** The replica of the last call with each `prompt_cache_key`, per tenant; oldest first, bounded. */
  private readonly cacheHints = new Map<string, string>();
  /** Sessions whose running step is their last (`finalStep`): closed when it ends. */
  private readonly finalSteps = new WeakSet<SessionRecord>();
  /** Responses API: which replica produced each recent response (and in which session). */
  private readonly responseOrigins = new ResponseOrigins();
  /** Sessions of calls that send no key, inferred from the chain of prompts and returned outputs. */
  private readonly inference: SessionInference;
  private roundRobin = 0;
  /** What the per-replica window control reads and reports through. */
  private readonly windowContext: WindowControlContext;
  private cancelTick: Cancel | undefined;
  /** The two-call path of a fleet of prefill and decode replicas; null for one pool. */
  private readonly disaggregated: DisaggregatedPath | null;
  private running = false;
  private accepting = true;

  constructor(options: SchedulerOptions) {
    if (options.engines.length === 0) throw new RangeError("a scheduler needs at least one engine, got 0");
    this.config = resolveSchedulerConfig({
      ...options.config,
      ...(options.policy ? { policy: options.policy } : {}),
    });
    this.policy = this.config.policy;
    this.features = policyFeatures(this.policy, this.config.window.unit);
    this.clock = options.clock ?? realClock;
    this.tokenizer = options.tokenizer;
    this.windowAuthority = options.windowAuthority;
    this.sessionDirectory = options.sessionDirectory;
    this.promptTokenizer = options.tokenizer ? new PromptTokenizer(options.tokenizer) : undefined;
    if (options.events) this.listeners.push(options.events);
    this.prefixIndex =
      this.features.placement === "prefix"
        ? new FleetPrefixIndex({
            capacityBlocks: (id) => this.byId.get(id)?.indexGpuBlocks() ?? 1,
            hostCapacityBlocks: (id) => this.byId.get(id)?.indexHostCapacityBlocks ?? 0,
          })
        : null;
    for (const engine of options.engines) {
      if (this.byId.has(engine.id))
        throw new RangeError(`engine ids must be unique, got "${engine.id}" twice`);
      const replica = new ReplicaRuntime(engine, this.clock, this.config, this.features, this.prefixIndex, {
        // Band, then the tenants' fair shares, unless the caller orders the budget queues itself.
        orderKey: options.budgetOrder ?? ((waiter) => this.admission.budgetOrderKey(waiter.tenant)),
        // A full queue refuses the lowest band first.
        shedRank: (waiter) => this.admission.budgetShedRank(waiter.tenant),
      });
      this.byId.set(engine.id, replica);
    }
    this.replicas = [...this.byId.values()];
    this.inference = new SessionInference({
      mode: this.config.sessions.infer,
      capacity: this.config.sessions.inferCapacity,
    });
    this.disaggregated = this.disaggregatedPath();
    this.admission = new SessionAdmission({
      clock: this.clock,
      queueLimit: this.config.sessions.queueLimit,
      waitLimitMs: this.config.sessions.waitLimitMs,
      idleTimeoutMs: this.config.sessions.idleTimeoutMs,
      unit: this.features.window ?? "sessions",
      retentionQuantile: this.config.sessions.retentionQuantile,
      blockTokens: this.config.blockSize,
      retryAfterSeconds: () => this.sessionRetryAfter(),
      onEvent: (id, event, replica, detail) => this.emit("session", { id, event, replica, ...detail }),
      fairness: this.config.fairness,
      tenants: this.config.tenants,
      fairReclaimAfterMs: this.config.fairReclaimAfterMs,
      onRetention: (replica, retentionMs, source) => this.emit("retention", { replica, retentionMs, source }),
    });
    for (const replica of this.replicas) {
      this.admission.addReplica(replica.id, replica.window?.size ?? replica.tokenWindow?.size ?? null);
    }
    this.windowContext = {
      config: this.config,
      admission: this.admission,
      onChange: (event) => this.emit("window", event),
    };
    this.overload = this.features.overload
      ? new OverloadController({
          clock: this.clock,
          objectiveMs: this.config.overload.objectiveMs,
          windowMs: this.config.overload.windowMs,
          bulkPauseAfter: this.config.overload.bulkPauseAfter,
          shedAfter: this.config.overload.shedAfter,
          recoverAfter: this.config.overload.recoverAfter,
          recoverFraction: this.config.overload.recoverFraction,
          autoEvaluate: false,
          onStage: (to, from, report) =>
            this.emit("stage", {
              from,
              to,
              cause: `p95 interactive gate queue age ${Math.round(report.p95Ms)} ms over ${report.samples} calls in the last window (objective ${this.config.overload.objectiveMs} ms)`,
            }),
        })
      : null;
  }

  /** Attaches more event listeners (metrics, NATS session events). */
  addEvents(events: SchedulerEvents): void {
    this.listeners.push(events);
  }

  /** Starts the control loop: signals, window law, idle expiry, overload windows — every control interval. */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.controlTick();
    this.scheduleOverloadWindow();
  }

  /** Stops the control loops. Engines are not closed. */
  async stop(): Promise<void> {
    this.running = false;
    this.cancelTick?.();
    this.cancelTick = undefined;
    this.cancelOverload?.();
    this.cancelOverload = undefined;
  }

  /**
   * Applies a window grant at once (a shared-window authority got one between
   * control ticks). Ignored for policies without a window.
   */
  applyWindow(replicaId: string, size: number, accepting: boolean): void {
    const replica = this.byId.get(replicaId);
    if (!replica?.window && !replica?.tokenWindow) return;
    this.admission.setWindow(replicaId, size, accepting);
  }

  /** This frontend's demand on a replica's window, in the window's unit (for a shared-window authority). */
  windowCounts(replicaId: string): { active: number; paused: number; waiting: number } {
    return this.admission.windowDemand(replicaId);
  }

  /** Refuses every new call with 503 from now on (graceful shutdown); running calls go on. */
  drain(): void {
    this.accepting = false;
  }

  /** Models the fleet serves, first replica's first. */
  models(): string[] {
    const names = new Set<string>();
    for (const replica of this.replicas) for (const model of replica.engine.models()) names.add(model);
    return [...names];
  }

  /** Context window of a model in tokens: configured, else the smallest any replica reports. */
  contextWindow(model?: string): number {
    if (this.config.contextWindowTokens !== undefined) return this.config.contextWindowTokens;
    let smallest = Number.POSITIVE_INFINITY;
    for (const replica of this.replicas) {
      const reported = replica.engine.contextWindow?.(model);
      if (reported !== undefined && reported > 0) smallest = Math.min(smallest, reported);
    }
    return Number.isFinite(smallest) ? smallest : FALLBACK_CONTEXT_WINDOW;
  }

  /** Healthy replicas (readiness). */
  readyReplicas(): number {
    let ready = 0;
    for (const replica of this.replicas) if (replica.healthy()) ready++;
    return ready;
  }

  /** Every replica's gate, for the gate metrics. */
  *gates(): Iterable<{ worker: string; gate: BackendGate }> {
    for (const replica of this.replicas) if (replica.gate) yield { worker: replica.id, gate: replica.gate };
  }

  /** Opens a session of `init.tenant` (default: the `default` tenant); its view names the client's key. */
  openSession(init: OpenSessionInit = {}): SessionView {
    const key = init.id ?? this.newSessionId();
    validateSessionId(key);
    const session = this.admission.open(scopedSessionId(key, init.tenant), {
      ...(init.tenant ? { tenant: init.tenant } : {}),
      ...(init.lane ? { lane: init.lane } : {}),
      ...(init.metadata ? { metadata: init.metadata } : {}),
    });
    return this.viewOf(session);
  }

  /**
   * The session `id` names for `tenant`. Without a tenant, `id` is the scheduler's own scoped id
   * (the key itself for the `default` tenant; the session directory and the event listeners use these).
   */
  getSession(id: string, tenant?: string): SessionView | undefined {
    const session = this.admission.get(scopedSessionId(id, tenant));
    return session ? this.viewOf(session) : undefined;
  }

  /** Closes the session `id` names for `tenant` (see `getSession`); false when there is none. */
  closeSession(id: string, tenant?: string): boolean {
    return this.admission.close(scopedSessionId(id, tenant));
  }

  /** The tenants holding an open or recently closed session under `key` (an admin looking one up). */
  tenantsOfSession(key: string): string[] {
    const tenants: string[] = [];
    for (const id of this.admission.ids()) {
      const scoped = unscopeSessionId(id);
      if (scoped.key === key) tenants.push(scoped.tenant);
    }
    return tenants;
  }

  /** A session's view under the client's key, with its tenant. */
  private viewOf(session: SessionRecord): SessionView {
    const view = this.admission.view(session);
    const { key, tenant } = unscopeSessionId(session.id);
    return { ...view, id: key, tenant };
  }

  /**
   * Scale-out: hands a session to another frontend. Closes it here when no
   * step of it runs or waits and returns its history; "busy" while one does;
   * undefined when it is not open here.
   */
  releaseSession(id: string): SessionHandover | "busy" | undefined {
    const released = this.admission.release(id);
    if (released === undefined || released === "busy") return released;
    const { handover, place } = released;
    if (handover.replica !== null && place > 0) this.windowAuthority?.handedOver?.(handover.replica, place);
    return handover;
  }

  /** Scale-out: opens a session handed over by another frontend, pinned to the replica holding its cache. */
  adoptSession(id: string, from: SessionHandover): SessionView {
    validateSessionId(unscopeSessionId(id).key);
    const session = this.admission.adopt(id, from);
    if (from.replica !== null && this.byId.has(from.replica)) this.pinHints.set(id, from.replica);
    return this.admission.view(session);
  }

  /** Counts that are zero once every call ended and every session closed. */
  idleCheck(): IdleCheck {
    const check: IdleCheck = { permits: 0, reservations: 0, windowSlots: 0, queued: 0 };
    for (const replica of this.replicas) {
      const holdings = replica.holdings();
      check.permits += holdings.permits;
      check.reservations += holdings.reservations;
      check.queued += holdings.queued;
    }
    // Calls counted on a decode replica (coming or decoding) hold decode room as reservations do.
    check.reservations += this.disaggregated?.outstanding() ?? 0;
    const counts = this.admission.counts();
    check.windowSlots = counts.active + counts.paused;
    check.queued += counts.queuedSteps;
    return check;
  }

  /** Everything an operator or the dashboard needs, as plain JSON. */
  /** One replica's part of `state()`, without the rest of the fleet's (a refusal's advice reads its own replica). */
  replicaState(id: string): ReplicaState | undefined {
    const replica = this.byId.get(id);
    return replica ? this.replicaSnapshot(replica, this.clock.now()) : undefined;
  }

  state(): AdminState {
    const now = this.clock.now();
    const counts = this.admission.counts();
    return {
      atMs: now,
      policy: this.policy,
      stage: this.overload?.stage ?? "normal",
      models: this.models(),
      replicas: this.replicas.map((replica) => this.replicaSnapshot(replica, now)),
      sessions: {
        total: counts.total,
        waiting: counts.waiting,
        active: counts.active,
        idle: counts.idle,
        dormant: counts.dormant,
        paused: counts.paused,
      },
      rejections: { ...this.rejections },
      tenants: this.tenantsState(),
      ...(this.disaggregated ? { disaggregation: this.disaggregated.summary() } : {}),
    };
  }

  /**
   * Runs steps 2–8 of docs/how-it-works.md#the-request-path for one call. Resolves with the admitted call (iterate
   * it for chunks) or rejects with a `Refusal`; a call whose signal aborts while
   * it waits rejects with the signal's reason (an `AbortError`).
   */
  async submit(req: CallRequest): Promise<AdmittedCall> {
    let lane: LaneClass | undefined;
    let inferred: InferenceDecision | undefined;
    try {
      req.signal?.throwIfAborted();
      if (!this.accepting) {
        throw new Refusal("unavailable", "sluice is shutting down", { retryAfterSeconds: 1, scope: "fleet" });
      }
      const model = this.resolveModel(req.model);
      const maxTokens = req.maxTokens ?? this.config.defaultMaxTokens;
      const origin = req.previousResponseId === undefined ? undefined : this.originOf(req.previousResponseId);
      // A response continues its producer's session for that tenant only; any caller holding the id reaches its replica.
      const keyed =
        req.sessionId !== undefined
          ? scopedSessionId(req.sessionId, req.tenant)
          : origin?.tenant === req.tenant
            ? origin?.sessionId
            : undefined;
      inferred = this.inferSession(req, keyed);
      // Inferred sessions are the tenant's own, as keyed ones are.
      const sessionId =
        keyed ??
        (inferred?.sessionId !== undefined ? scopedSessionId(inferred.sessionId, req.tenant) : undefined);
      const session = sessionId === undefined ? undefined : await this.sessionFor(sessionId, req);
      if (session && req.finalStep) this.finalSteps.add(session);
      const contextWindow = this.contextWindow(model);
      // Tokenizing stops once the prompt cannot fit: a huge prompt costs no more than a window's worth of work.
      const { tokens, complete } = this.tokenize(req.input, contextWindow);
      if (tokens.length + maxTokens > contextWindow) {
        const counted = complete ? `${tokens.length}` : `at least ${tokens.length}`;
        throw new Refusal(
          "context_limit",
          `the prompt has ${counted} tokens and max_tokens is ${maxTokens}: ${complete ? "" : "at least "}${tokens.length + maxTokens} exceeds the context window of ${contextWindow}`,
          {
            limits: {
              max_total_tokens: contextWindow,
              max_input_tokens: Math.max(0, contextWindow - maxTokens),
              max_output_tokens: Math.max(0, contextWindow - tokens.length),
            },
          },
        );
      }
      lane = classifyLane(
        {
          inputTokens: tokens.length,
          maxOutputTokens: maxTokens,
          ...(req.declaredLane ? { declared: req.declaredLane } : {}),
        },
        {
          interactiveMaxInputTokens: this.config.lanes.interactiveMaxInputTokens,
          interactiveMaxOutputTokens: this.config.lanes.interactiveMaxOutputTokens,
          bulkMaxTotalTokens: this.config.lanes.bulkMaxTotalTokens ?? contextWindow,
        },
      );
      this.emit("arrival", { lane, inputTokens: tokens.length, maxTokens });
      if (lane === "overflow") {
        const bulkMax = this.config.lanes.bulkMaxTotalTokens ?? contextWindow;
        throw new Refusal(
          "overflow",
          `input + max_tokens (${tokens.length + maxTokens}) exceeds the bulk limit of ${bulkMax}`,
          {
            lane,
            limits: { max_total_tokens: bulkMax },
          },
        );
      }
      this.checkOverloadStage(lane, req.priority ?? 0);
      const call = await this.admit(req, {
        model,
        tokens,
        maxTokens,
        lane,
        session,
        ...(origin ? { boundReplica: origin.replica } : {}),
      });
      const pending = inferred?.pending;
      if (call instanceof AdmittedCallImpl) {
        if (inferred?.sessionId !== undefined && keyed === undefined) call.sessionInferred = true;
        if (pending) call.observeOutput((output) => this.inference.settle(pending, output));
      } else if (pending) this.inference.settle(pending, undefined);
      return call;
    } catch (error) {
      if (inferred?.pending) this.inference.settle(inferred.pending, undefined);
      // A hint from another frontend (or a fork's parent) is for this session's first admission only.
      if (req.sessionId !== undefined) {
        const id = scopedSessionId(req.sessionId, req.tenant);
        this.pinHints.delete(id);
        // A last step refused did not run: the session stays open for the client's retry.
        const open = this.admission.get(id);
        if (open) this.finalSteps.delete(open);
      }
      if (inferred?.outcome === "forked" && inferred.sessionId !== undefined)
        this.pinHints.delete(scopedSessionId(inferred.sessionId, req.tenant));
      if (error instanceof Refusal) {
        const refusal = error.lane || !lane ? error : error.with({ lane });
        this.rejections[refusal.reason] = (this.rejections[refusal.reason] ?? 0) + 1;
        this.emit("refusal", { reason: refusal.reason, lane: refusal.lane ?? lane, status: refusal.status });
        throw refusal;
      }
      throw error;
    }
  }

  /**
   * steps 4–8 of docs/how-it-works.md#the-request-path for a validated, tokenized and classified call: session
   * admission and routing, token budget, feasibility, gate, forward — one
   * step a method, each refusing as early as it can. Whatever a step took is
   * in `holds` and is released at once when a later one refuses; once the
   * call is forwarded, the admitted call owns every hold.
   */
  private async admit(req: CallRequest, call: CallPlan): Promise<AdmittedCall> {
    const startedAt = this.clock.now();
    const hashes = this.features.placement === "prefix" ? this.hashesFor(call.session, call.tokens) : [];
    const holds: PendingHolds = {
      step: false,
      reservation: null,
      permit: null,
      replica: undefined,
      inflight: 0,
    };
    try {
      const decision = await this.admitAndRoute(req, call, hashes, holds);
      const replica = this.byId.get(decision.replica)!;
      holds.replica = replica;
      if (req.cacheHint !== undefined) this.rememberCacheHint(req, replica.id);
      this.emit("route", {
        replica: replica.id,
        reason: decision.reason,
        predictedHitTokens: decision.predictedHitTokens,
        promptTokens: call.tokens.length,
      });
      const uncached = Math.max(0, call.tokens.length - decision.predictedHitTokens);
      // Loaded from host memory, a prefix is not computed but takes GPU blocks anew.
      const hostHit = decision.predictedHostHitTokens ?? 0;
      const gpuCached = decision.predictedHitTokens - hostHit;
      if (this.disaggregated) {
        return await this.disaggregated.admit(
          { req, ...call, prefill: replica, uncached, gpuCached, hashes, startedAt },
          holds,
        );
      }
      holds.reservation = await this.reserveBudget(req, replica, call, gpuCached);
      this.checkFeasibility(req, replica, call.lane, uncached, hostHit);
      holds.permit = await this.passGate(req, replica, call.lane, uncached);
      const newKvTokens = reservationTokens(call.tokens.length, gpuCached, 0);
      return await this.forward(req, call, { replica, hashes, uncached, newKvTokens, startedAt, holds });
    } catch (error) {
      holds.permit?.release();
      holds.reservation?.release();
      holds.replica?.endPrefill(holds.inflight);
      if (holds.step && call.session) this.admission.endStep(call.session, { completed: false });
      throw error;
    }
  }

  /** Steps 4 and 5: a session step waits for its window and is routed to its pin (or moved); other calls are placed. */
  private async admitAndRoute(
    req: CallRequest,
    call: CallPlan,
    hashes: string[],
    holds: PendingHolds,
  ): Promise<PlacementDecision> {
    const { session, tokens } = call;
    const eligible = this.boundTo(call, this.eligible(call.model), req.previousResponseId);
    if (eligible.length === 0) {
      throw new Refusal("unavailable", "no healthy replica serves this model", {
        retryAfterSeconds: 1,
        scope: "fleet",
      });
    }
    const demand = {
      promptTokens: tokens.length,
      maxTokens: call.maxTokens,
      expectedIdleMs: req.expectedIdleMs,
      promptBlocks: hashes,
    };
    if (!session || this.features.window === null) {
      const placed = this.route(call, hashes, eligible, session ? undefined : this.placementHintOf(req));
      if (!placed)
        throw new Refusal("unavailable", "no replica can take the call", {
          retryAfterSeconds: 1,
          scope: "fleet",
        });
      if (session) {
        await this.admission.acquireStep(session, () => placed.replica, req.signal, demand);
        holds.step = true;
        this.admission.rebind(session, placed.replica);
      }
      return placed;
    }
    if (
      session.state === "waiting" &&
      eligible.every((candidate) => !this.admission.isAccepting(candidate.id))
    ) {
      // Fail closed: no replica has fresh signals (or a shared-window grant) to admit a new session on.
      throw new Refusal(
        "unavailable",
        "no replica can take new sessions now (signals stale or unavailable)",
        {
          retryAfterSeconds: Math.ceil(this.config.sessions.controlIntervalMs / 1000),
          scope: "fleet",
        },
      );
    }
    const hint = this.pinHints.get(session.id);
    const choose = (candidates: readonly string[]) =>
      hint !== undefined && candidates.includes(hint)
        ? hint
        : this.place(call, hashes, undefined, this.replicasOf(candidates, eligible))?.replica;
    let pinned = await this.admission.acquireStep(session, choose, req.signal, demand);
    holds.step = true;
    const alive = (id: string) => eligible.some((candidate) => candidate.id === id);
    if (!alive(pinned) && !eligible.some((candidate) => this.admission.hasRoom(candidate.id, session))) {
      // Its replica is down and no survivor has room now: leave the dead replica's window and
      // wait for room elsewhere, ahead of new sessions, rather than be sent where no one answers.
      this.admission.endStep(session, { completed: false });
      holds.step = false;
      this.admission.evacuate(session);
      pinned = await this.admission.acquireStep(session, choose, req.signal, demand);
      holds.step = true;
      if (!alive(pinned)) {
        throw new Refusal("unavailable", `replica ${pinned} is unavailable and no other has room`, {
          retryAfterSeconds: Math.ceil(this.config.sessions.controlIntervalMs / 1000),
          scope: "fleet",
        });
      }
    }
    this.pinHints.delete(session.id);
    const movable = eligible.filter(
      (candidate) => candidate.id === pinned || this.admission.hasRoom(candidate.id, session),
    );
    let decision: PlacementDecision = this.place(call, hashes, pinned, movable) ?? {
      replica: pinned,
      reason: "pinned",
      predictedHitTokens: 0,
      predictedTtftMs: 0,
    };
    if (session.movedFrom !== null) {
      // Resumed on another replica because its own had no room for it: an affinity break.
      if (decision.replica !== session.movedFrom) decision = { ...decision, reason: "affinity_break" };
      session.movedFrom = null;
    }
    if (session.steps === 0 && decision.reason === "pinned") {
      decision = { ...decision, reason: decision.predictedHitTokens > 0 ? "prefix" : "load" };
    }
    if (decision.replica !== pinned) this.admission.rebind(session, decision.replica);
    return decision;
  }

  /**
   * Step 6a. docs/how-it-works.md#token-budget-and-feasibility: a call reserves what it adds to the replica's KV (`reservationTokens`), given
   * the prompt tokens the router predicts in its GPU memory (`gpuCached`); blocks shared with a
   * cached prefix are counted once, by the call that brought them. The whole call must still fit
   * the ceiling less the guard band (else 413 at once); one that does not fit now waits in the
   * replica's budget queue, at most its lane's residence time or its own shorter queue TTL.
   */
  private async reserveBudget(
    req: CallRequest,
    replica: ReplicaRuntime,
    call: CallPlan,
    gpuCached: number,
  ): Promise<Reservation | null> {
    return this.waitForBudget(
      req,
      replica,
      call.lane,
      reservationTokens(call.tokens.length, gpuCached, call.maxTokens),
      call.tokens.length + call.maxTokens,
    );
  }

  /** The budget step of both paths: 413 when the call could never fit, else a reservation, waited for if need be. */
  private async waitForBudget(
    req: CallRequest,
    replica: ReplicaRuntime,
    lane: Lane,
    tokens: number,
    callTokens: number,
  ): Promise<Reservation | null> {
    const budget = replica.budget;
    const queue = replica.budgetQueue;
    if (!budget || !queue) return null;
    budget.checkReservable(tokens, { callTokens, lane });
    const residence = this.config.lanes[lane].maxResidenceMs ?? LANE_DEFAULTS[lane].maxResidenceMs;
    return queue.reserve({
      tokens,
      lane,
      maxWaitMs: req.queueTtlMs === undefined ? residence : Math.min(residence, req.queueTtlMs),
      reserve: { queued: true },
      ...(req.tenant !== undefined ? { tenant: req.tenant } : {}),
      ...(req.signal ? { signal: req.signal } : {}),
    });
  }

  /** Step 6b: a call whose predicted time to first token misses its own or its lane's deadline is refused now. */
  private checkFeasibility(
    req: CallRequest,
    replica: ReplicaRuntime,
    lane: Lane,
    uncached: number,
    hostHit: number,
  ): void {
    if (!this.features.feasibility) return;
    const queued = replica.queuedPrefillAheadOf(lane);
    const inflight = replica.inflightPrefillTokens;
    // Rate samples are first-token times, which include waiting behind other calls in the engine:
    // a burst drives the estimate to its floor, and only a call that runs can move it back up. A
    // replica with nothing running or queued is priced at the rate it started with, so it never
    // refuses every call forever on an estimate no call may correct (docs/how-it-works.md).
    const idle = replica.running === 0 && queued === 0 && inflight === 0;
    const rate = replica.prefillRate.rate();
    const refusal = checkDeadline({
      // The model placement scored this replica by, over the queued prefill this call waits behind in
      // its lane: no more than placement counted, so a call is never placed by one prediction and
      // refused by a harsher one, and a short call is not refused for bulk work it overtakes.
      predictedTtftMs: predictTtftMs({
        uncachedPrefillTokens: uncached,
        queuedPrefillTokens: queued,
        inflightPrefillTokens: inflight,
        prefillTokensPerSecond: idle ? Math.max(rate, replica.prefillRate.prior) : rate,
        kvUsage: replica.signals.kvUsage,
        ...(hostHit > 0
          ? { hostLoadTokens: hostHit, hostLoadTokensPerSecond: replica.hostLoadTokensPerSecond() }
          : {}),
      }),
      deadlineMs: req.deadlineMs,
      laneDeadlineMs: this.config.lanes[lane].deadlineMs ?? LANE_DEFAULTS[lane].deadlineMs,
      lane,
      retryAfterSeconds: replica.drainSeconds(replica.running),
    });
    if (refusal) throw refusal;
  }

  /** Step 7: the per-rank gate; a worker-wide rejection marks the replica busy. */
  private async passGate(
    req: CallRequest,
    replica: ReplicaRuntime,
    lane: Lane,
    uncached: number,
  ): Promise<Permit | null> {
    if (!replica.gate) return null;
    replica.queuePrefill(uncached, lane);
    try {
      const rank = replica.chooseRank();
      return await replica.gate.acquire({
        ...(rank !== undefined ? { rank } : {}),
        ...(this.features.lanes ? { lane } : {}),
        ...(req.signal ? { signal: req.signal } : {}),
        prefillTokens: Math.max(1, uncached),
      });
    } catch (error) {
      if (error instanceof GateRejection && error.scope === "worker") {
        replica.markBusy(this.clock.now() + this.config.routing.busyMarkMs);
      }
      throw error;
    } finally {
      replica.dequeuePrefill(uncached, lane);
    }
  }

  /** Step 8: the call goes to the engine; from its first chunk the admitted call owns every hold. */
  private async forward(
    req: CallRequest,
    call: CallPlan,
    at: {
      replica: ReplicaRuntime;
      hashes: string[];
      uncached: number;
      /** The KV tokens the call takes anew on the replica (`ReplicaRuntime.callStarted`). */
      newKvTokens: number;
      startedAt: number;
      holds: PendingHolds;
    },
  ): Promise<AdmittedCall> {
    const { replica, uncached, newKvTokens, holds } = at;
    const { lane, tokens, maxTokens, session } = call;
    holds.reservation?.activate();
    const admittedAt = this.clock.now();
    const queueMs = admittedAt - at.startedAt;
    this.recordGateWait(lane, holds.permit?.queueMs ?? 0);
    this.emit("admitted", { lane, replica: replica.id, queueWaitMs: queueMs });
    replica.startPrefill(uncached);
    holds.inflight = uncached;
    const thrashEpoch = replica.thrashEvidenceSent(tokens.length, uncached, at.hashes.length > 0);
    const abort = new AbortController();
    const unlinkSignal = followAbort(req.signal, abort);
    let stream: EngineStream;
    try {
      stream = await replica.generate({
        requestId: req.requestId,
        model: call.model,
        promptTokens: tokens,
        maxTokens,
        ...(holds.permit?.rank !== undefined ? { rank: holds.permit.rank } : {}),
        endpoint: req.endpoint,
        ...(req.body ? { body: req.body } : {}),
        stream: req.stream,
        signal: abort.signal,
      });
    } catch (error) {
      unlinkSignal();
      throw error;
    }
    replica.callStarted(newKvTokens);
    const holdings = this.holdings({
      replica,
      lane,
      session,
      tokens,
      hashes: at.hashes,
      permit: holds.permit,
      reservation: holds.reservation,
      uncached,
      newKvTokens,
      admittedAt,
      unlinkSignal,
      ...(thrashEpoch !== undefined ? { thrashEpoch } : {}),
      ...(req.tenant !== undefined ? { tenant: req.tenant } : {}),
    });
    // From here the admitted call owns every hold.
    holds.permit = null;
    holds.reservation = null;
    holds.inflight = 0;
    holds.step = false;
    return new AdmittedCallImpl({
      requestId: req.requestId,
      lane,
      replica: replica.id,
      queueMs,
      inputTokens: tokens.length,
      maxTokens,
      sessionId: session ? unscopeSessionId(session.id).key : undefined,
      stream,
      abort,
      holdings,
    });
  }

  private holdings(held: HeldCall): CallHoldings {
    const { replica, lane, session, permit, reservation } = held;
    let firstTokenAt: number | undefined;
    let inflight = held.uncached;
    const origin: ResponseOrigin = {
      replica: replica.id,
      ...(session ? { sessionId: session.id } : {}),
      ...(held.tenant !== undefined ? { tenant: held.tenant } : {}),
    };
    // A disaggregated call's state is on its decode replica, which takes no first leg: not bound there.
    const remember = (responseId: string) => {
      if (!this.disaggregated) this.responseOrigins.remember(responseId, origin);
    };
    return {
      responded: remember,
      firstToken: () => {
        if (firstTokenAt !== undefined) return;
        firstTokenAt = this.clock.now();
        permit?.firstToken();
        replica.endPrefill(inflight);
        inflight = 0;
        const ttftMs = firstTokenAt - held.admittedAt;
        if (held.uncached > 0 && ttftMs > 0) replica.prefillRate.observe(held.uncached, ttftMs);
        this.emit("firstToken", { lane, replica: replica.id, ttftMs });
      },
      finish: (outcome: CallOutcome, result: EngineResult | undefined, outputTokens: readonly number[]) => {
        const endedAt = this.clock.now();
        held.unlinkSignal();
        permit?.release();
        reservation?.release();
        replica.endPrefill(inflight);
        inflight = 0;
        replica.callEnded(held.newKvTokens);
        replica.recordCompletion();
        if (outcome === "ok" && result?.responseId !== undefined) remember(result.responseId);
        const generated = result?.completionTokens ?? outputTokens.length;
        // Only a call this replica's evidence saw sent (not a decode leg, whose KV was handed over).
        const sentEpoch = held.thrashEpoch;
        if (outcome === "ok" && result && sentEpoch !== undefined) {
          replica.settleThrashEvidence(
            session,
            held.tokens.length - held.uncached,
            result.cachedTokens,
            sentEpoch,
          );
        }
        if (outcome === "ok" && replica.index) {
          const blockSize = this.config.blockSize;
          const promptBlocks = Math.floor(held.tokens.length / blockSize);
          const tail = held.tokens.slice(promptBlocks * blockSize).concat(outputTokens);
          replica.index.record(replica.id, extendBlockHashes(held.hashes, tail, blockSize));
        }
        if (session) {
          this.admission.endStep(session, {
            completed: outcome === "ok",
            contextTokens: held.tokens.length + generated,
          });
          if (this.finalSteps.has(session)) {
            this.finalSteps.delete(session);
            this.admission.close(session.id);
          }
        }
        if (firstTokenAt !== undefined && generated >= 2) {
          const meanGapMs = (endedAt - firstTokenAt) / (generated - 1);
          this.emit("interToken", { lane, replica: replica.id, meanGapMs, tokens: generated });
        }
        this.emit("finished", { lane, replica: replica.id, outcome });
      },
    };
  }

  /** Placement for policies without a session window: round robin, least loaded, or prefix-aware. */
  private route(
    call: CallPlan,
    hashes: string[],
    eligible: ReplicaRuntime[],
    hint?: string,
  ): PlacementDecision | undefined {
    const now = this.clock.now();
    const notBusy = eligible.filter((replica) => !replica.busy(now));
    const pool = notBusy.length > 0 ? notBusy : eligible;
    // A one-off call's hint (its `prompt_cache_key`) is held as a pin is: kept unless its replica is saturated.
    if (hint !== undefined && pool.some((replica) => replica.id === hint)) {
      return this.place(call, hashes, hint, pool);
    }
    if (this.features.placement === "round-robin") {
      const replica = pool[this.roundRobin++ % pool.length]!;
      return { replica: replica.id, reason: "load", predictedHitTokens: 0, predictedTtftMs: 0 };
    }
    if (this.features.placement === "least-loaded") {
      let best = pool[0]!;
      for (const replica of pool) if (load(replica) < load(best)) best = replica;
      return { replica: best.id, reason: "load", predictedHitTokens: 0, predictedTtftMs: 0 };
    }
    return this.place(call, hashes, undefined, pool);
  }

  /**
   * Output tokens a call reserves in the budget of the replica it is placed on: its `max_tokens`, or
   * the one token a prefill replica generates before handing the call over (its decode replica
   * reserves the rest).
   */
  private reservedOutputTokens(call: CallPlan): number {
    return this.disaggregated ? 1 : call.maxTokens;
  }

  private place(
    call: CallPlan,
    hashes: readonly string[],
    pinned: string | undefined,
    candidates: readonly ReplicaRuntime[],
  ): PlacementDecision | undefined {
    const now = this.clock.now();
    const candidate = (replica: ReplicaRuntime) => ({
      id: replica.id,
      queuedPrefillTokens: replica.queuedPrefillTokens,
      inflightPrefillTokens: replica.inflightPrefillTokens,
      prefillTokensPerSecond: replica.prefillRate.rate(),
      kvUsage: replica.signals.kvUsage,
      hostLoadTokensPerSecond: replica.hostLoadTokensPerSecond(),
      ...(replica.budget ? { budgetAvailableTokens: replica.budget.available() } : {}),
      busy: replica.busy(now),
      eligible: replica.healthy(),
    });
    const input = {
      promptTokens: call.tokens.length,
      hashes,
      ...(pinned !== undefined ? { pinned } : {}),
      candidates: [] as PlacementCandidate[],
      fleetIndex: this.prefixIndex,
      blockSize: this.config.blockSize,
      affinityBreakKv: this.config.routing.affinityBreakKv,
      affinityBreakMs: this.config.routing.affinityBreakMs,
      usePrefix: this.features.placement === "prefix",
      maxTokens: this.reservedOutputTokens(call),
    };
    // A pin that holds on its own needs neither the other replicas' snapshots nor their scores.
    const home = pinned === undefined ? undefined : candidates.find((replica) => replica.id === pinned);
    const kept = home && keepPin({ ...input, candidates: [candidate(home)] });
    return kept ?? choosePlacement({ ...input, candidates: candidates.map(candidate) });
  }

  private replicasOf(ids: readonly string[], eligible: readonly ReplicaRuntime[]): ReplicaRuntime[] {
    return eligible.filter((replica) => ids.includes(replica.id));
  }

  /**
   * A response continued by a later call (`previous_response_id`) and known here: where it was
   * produced. Its state lives only on that replica, so a replica gone from the fleet, or
   * unhealthy, cannot continue it: 409 `response_state_lost` (the client resends the history).
   */
  private originOf(responseId: string): ResponseOrigin | undefined {
    const origin = this.responseOrigins.lookup(responseId);
    if (origin === undefined) return undefined;
    const replica = this.byId.get(origin.replica);
    if (!replica?.healthy()) {
      throw new Refusal(
        "response_state_lost",
        `response ${JSON.stringify(responseId)} was produced by replica ${origin.replica}, which is ${replica ? "unhealthy" : "gone"}; its state cannot be continued elsewhere: resend the conversation without previous_response_id`,
        { param: "previous_response_id" },
      );
    }
    return origin;
  }

  /** The replicas a call bound to one replica (its previous response's) may use: that one, or none (409). */
  private boundTo(
    call: CallPlan,
    eligible: ReplicaRuntime[],
    responseId: string | undefined,
  ): ReplicaRuntime[] {
    const bound = call.boundReplica;
    if (bound === undefined) return eligible;
    const home = eligible.filter((replica) => replica.id === bound);
    if (home.length === 0) {
      throw new Refusal(
        "response_state_lost",
        `replica ${bound}, which holds the state of response ${JSON.stringify(responseId)}, cannot take calls (gone, unhealthy or not serving model ${call.model}): resend the conversation without previous_response_id`,
        { param: "previous_response_id" },
      );
    }
    return home;
  }

  /** Replicas a call may be routed to: healthy, serving the model, and not decode-only (decode is placed after). */
  private eligible(model: string): ReplicaRuntime[] {
    return this.replicas.filter(
      (replica) =>
        replica.healthy() && replica.engine.models().includes(model) && replica.engine.role !== "decode",
    );
  }

  /**
   * A fleet with prefill or decode replicas runs every call as two (prefill,
   * then decode); it needs at least one of each, and a `both` replica has no
   * place in it (it would need two budgets on one KV).
   */
  private disaggregatedPath(): DisaggregatedPath | null {
    const roles = this.replicas.map((replica) => replica.engine.role ?? "both");
    if (roles.every((role) => role === "both")) return null;
    for (const needed of ["prefill", "decode"] as const) {
      if (!roles.includes(needed)) {
        throw new RangeError(`a fleet with prefill or decode replicas needs a ${needed} replica, got none`);
      }
    }
    if (roles.includes("both")) {
      throw new RangeError("a fleet of prefill and decode replicas takes no replica of role both");
    }
    return new DisaggregatedPath({
      clock: this.clock,
      config: this.config,
      decodeReplicas: this.replicas.filter((replica) => replica.engine.role === "decode"),
      passGate: (req, replica, lane, uncached) => this.passGate(req, replica, lane, uncached),
      waitForBudget: (req, replica, lane, tokens, callTokens) =>
        this.waitForBudget(req, replica, lane, tokens, callTokens),
      holdings: (held) => this.holdings(held),
      recordPrefix: (replica, hashes) => replica.index?.record(replica.id, hashes),
      recordGateWait: (lane, queueMs) => this.recordGateWait(lane, queueMs),
      emit: (name, event) => this.emit(name, event),
    });
  }

  private resolveModel(model: string | undefined): string {
    const models = this.models();
    if (model === undefined || model === "") {
      const first = models[0];
      if (first === undefined)
        throw new Refusal("unavailable", "no replica reports a model yet", { retryAfterSeconds: 1 });
      return first;
    }
    if (!models.includes(model)) {
      throw new Refusal(
        "model_not_found",
        `model "${model}" is not served here; served: ${models.join(", ")}`,
        {
          param: "model",
        },
      );
    }
    return model;
  }

  /**
   * The inference's decision for a call (docs/routing.md): with `on`, a call without a key that
   * continues a recent call's prompt and output gets that session; a fork is placed beside its parent.
   */
  private inferSession(req: CallRequest, key: string | undefined): InferenceDecision | undefined {
    if (this.inference.mode === "off") return undefined;
    const reads = this.inference.mode === "shadow" ? key !== undefined : key === undefined;
    // Chains are the tenant's own: one tenant's prompts never continue another's.
    const digest = reads ? digestPrompt(req.input, req.tenant || DEFAULT_TENANT) : undefined;
    const decision = this.inference.decide(digest, key);
    this.emit("inference", { outcome: decision.outcome });
    if (
      decision.outcome === "forked" &&
      decision.parentId !== undefined &&
      decision.sessionId !== undefined
    ) {
      const parent = this.admission.get(scopedSessionId(decision.parentId, req.tenant));
      if (parent?.replica && this.byId.has(parent.replica))
        this.pinHints.set(scopedSessionId(decision.sessionId, req.tenant), parent.replica);
    }
    return decision;
  }

  /**
   * The session a call's scoped id names, opened when new. A new session's first placement may
   * follow a hint: the replica another frontend pinned it to, else its parent's replica (a child
   * session of the same tenant), else the replica the last call with its `prompt_cache_key` used.
   */
  private async sessionFor(id: string, req: CallRequest): Promise<SessionRecord> {
    validateSessionId(unscopeSessionId(id).key);
    const existing = this.admission.get(id);
    if (existing && existing.state !== "closed") return existing;
    if (this.sessionDirectory && !existing) {
      const known = await this.sessionDirectory.lookup(id).catch(() => undefined);
      if (known?.replica && this.byId.has(known.replica)) this.pinHints.set(id, known.replica);
      const raced = this.admission.get(id);
      if (raced && raced.state !== "closed") return raced;
    }
    if (!this.pinHints.has(id)) {
      const near = this.placementHintOf(req);
      if (near !== undefined) this.pinHints.set(id, near);
    }
    // An empty tenant (a job of an unkeyed caller) is the default tenant.
    return this.admission.open(id, req.tenant ? { tenant: req.tenant } : {});
  }

  private tenantsState(): NonNullable<AdminState["tenants"]> {
    const { tenants, jainIndex } = this.admission.tenants();
    return { fairness: this.config.fairness, jainIndex, list: tenants };
  }

  /** Tenants sharing the windows: usage, entitlement, sessions and pauses of each, and Jain's index (docs/tenants.md). */
  tenants(): { tenants: TenantView[]; jainIndex: number } {
    return this.admission.tenants();
  }

  /** Remembers where a call with a `prompt_cache_key` went, for the next call with it. */
  private rememberCacheHint(req: CallRequest, replica: string): void {
    const key = cacheHintKey(req);
    this.cacheHints.delete(key);
    this.cacheHints.set(key, replica);
    if (this.cacheHints.size > MAX_CACHE_HINTS) {
      const oldest = this.cacheHints.keys().next().value;
      if (oldest !== undefined) this.cacheHints.delete(oldest);
    }
  }

  /** Where a call with no pin of its own would like to go: its parent's replica, else its cache key's. */
  private placementHintOf(req: CallRequest): string | undefined {
    if (req.parentSessionId !== undefined) {
      const parent = this.admission.get(scopedSessionId(req.parentSessionId, req.tenant));
      if (parent?.replica && this.byId.has(parent.replica)) return parent.replica;
    }
    if (req.cacheHint !== undefined) {
      const replica = this.cacheHints.get(cacheHintKey(req));
      if (replica !== undefined && this.byId.has(replica)) return replica;
    }
    return undefined;
  }

  /** The prompt's tokens; past `limitTokens` it may stop early (`complete` false), the prompt being refused anyway. */
  private tokenize(input: CallInput, limitTokens: number): { tokens: readonly number[]; complete: boolean } {
    if (input.kind === "tokens") return { tokens: input.tokens, complete: true };
    if (!this.promptTokenizer) {
      throw new Refusal("invalid_request", "this scheduler has no tokenizer; send token prompts", {
        param: "messages",
      });
    }
    const tokens =
      input.kind === "chat"
        ? this.promptTokenizer.chat(input.messages, limitTokens)
        : this.promptTokenizer.text(input.prompt, limitTokens);
    // Past the limit the count is a prefix unless every message (or piece) was read; the refusal says "at least".
    return { tokens, complete: tokens.length <= limitTokens };
  }

  private hashesFor(session: SessionRecord | undefined, tokens: readonly number[]): string[] {
    const previous = (session?.routing as SessionRouting | undefined)?.hashes ?? [];
    const hashes = blockHashesFrom(previous, tokens, this.config.blockSize);
    if (session) session.routing = { hashes } satisfies SessionRouting;
    return hashes;
  }

  private checkOverloadStage(lane: Lane, priority: number): void {
    if (!this.overload) return;
    const retryAfterSeconds = Math.ceil(this.config.overload.windowMs / 1000);
    if (lane === "bulk" && !this.overload.admitsBulk()) {
      throw new Refusal(
        "queue_full",
        "bulk work is paused while interactive calls miss their queue-age objective",
        {
          lane,
          retryAfterSeconds,
          scope: "lane",
        },
      );
    }
    if (lane === "interactive" && !this.overload.admitsInteractive(priority)) {
      throw new Refusal("queue_full", "overloaded: low-priority interactive calls are shed", {
        lane,
        retryAfterSeconds,
        scope: "lane",
      });
    }
  }

  private controlTick(): void {
    if (!this.running) return;
    const now = this.clock.now();
    for (const replica of this.replicas) {
      const signals = replica.refreshSignals();
      const hitRate = replica.hitRate.observe(replica.prefixCounters(signals));
      replica.cacheTurnover.observe(
        { hits: signals.prefixHitTokens, queries: signals.prefixQueryTokens },
        now,
      );
      this.admission.setCacheRetention(replica.id, {
        hostRoomTokens: replica.hostTierTokens(signals),
        turnoverMs: replica.cacheTurnover.turnoverMs(signals.kvCapacityTokens),
      });
      const stale = replica.stale(now);
      const healthy = replica.healthy();
      this.reportHealth(replica, healthy, now);
      const accepting = healthy && (!stale || this.config.sessions.staleSignals === "open");
      // Stale signals say nothing about the replica: the window holds still until fresh ones arrive.
      // An engine that publishes no KV gauge says nothing the window law could act on (unknown is not zero).
      const fresh = !stale && healthy && !signals.unknown?.includes("kvUsage");
      replica.thrashEvidence.close(
        replica.hitRate.measured ? replica.hitRate.lastInterval : undefined,
        signals.kvUsage,
      );
      const law = controlWindow(replica, { kvUsage: signals.kvUsage, hitRate, fresh }, this.windowContext);
      if (!law) {
        this.admission.setWindow(replica.id, null, healthy);
      } else if (this.windowAuthority) {
        const grant = this.windowAuthority.decide({
          replica: replica.id,
          proposedSize: law.proposed,
          law: law.step,
          fresh,
          accepting,
          local: this.admission.windowDemand(replica.id),
        });
        this.admission.setWindow(replica.id, grant.size, grant.accepting);
      } else {
        this.admission.setWindow(replica.id, law.proposed, accepting);
      }
    }
    this.admission.sweep();
    this.cancelTick = this.clock.setTimeout(() => this.controlTick(), this.config.sessions.controlIntervalMs);
  }

  private cancelOverload: Cancel | undefined;

  /** Each replica's health as last reported in a `health` event; absent before its first control tick. */
  private readonly healthReported = new Map<string, boolean>();

  /** A change of health is news, and so is a replica unhealthy from the start (an unreachable upstream). */
  private reportHealth(replica: ReplicaRuntime, healthy: boolean, now: number): void {
    const was = this.healthReported.get(replica.id);
    this.healthReported.set(replica.id, healthy);
    if (was === undefined ? healthy : was === healthy) return;
    this.emit("health", {
      replica: replica.id,
      healthy,
      cause: healthy
        ? "its signals are fresh again"
        : `${replica.unhealthyCause(now) ?? "unhealthy"}${was === undefined ? " (since start-up)" : ""}`,
    });
  }

  /**
   * The overload stages' signal: how long an admitted interactive call queued at the gate, ms. A session
   * waiting for its window is the window working, not overload, so it does not count.
   */
  private recordGateWait(lane: Lane, queueMs: number): void {
    if (lane === "interactive") this.overload?.recordQueueAge(queueMs);
  }

  private scheduleOverloadWindow(): void {
    if (!this.overload || !this.running) return;
    this.cancelOverload = this.clock.setTimeout(() => {
      this.overload?.evaluateWindow();
      this.scheduleOverloadWindow();
    }, this.config.overload.windowMs);
  }

  private sessionRetryAfter(): number {
    let best = Number.POSITIVE_INFINITY;
    for (const replica of this.replicas) best = Math.min(best, replica.drainSeconds(replica.running));
    return Number.isFinite(best) ? best : 1;
  }

  private replicaSnapshot(replica: ReplicaRuntime, now: number): ReplicaState {
    const signals = replica.signals;
    const gate = replica.gate;
    const snapshot = gate?.snapshot();
    const counts = this.admission.replicaCounts(replica.id);
    const budget = replica.budget;
    const laneState = (lane: Lane) => ({
      queued: snapshot?.lanes?.[lane]?.queued ?? 0,
      oldestAgeMs: snapshot?.lanes?.[lane]?.oldestAgeMs ?? 0,
    });
    const role = replica.engine.role;
    // A signal the engine does not publish is unknown, not 0 (docs/engines.md).
    const measured = (field: string, value: number): number | null =>
      signals.unknown?.includes(field) ? null : value;
    return {
      id: replica.id,
      ...(role === "prefill" || role === "decode" ? { role } : {}),
      healthy: replica.healthy(),
      busy: replica.busy(now),
      signals: {
        kvUsage: measured("kvUsage", signals.kvUsage),
        hitRate: measured("prefixCache", replica.hitRate.value),
        running: measured("running", signals.running),
        waiting: measured("waiting", signals.waiting),
        preemptions: measured("preemptions", signals.preemptions),
        stale: replica.stale(now),
        ageMs: Number.isFinite(signals.readAtMs) ? Math.max(0, now - signals.readAtMs) : -1,
        kvCapacityTokens: signals.kvCapacityTokens,
        maxNumSeqs: signals.maxNumSeqs,
        dataParallelSize: signals.dataParallelSize,
        prefillTokensPerSecond: replica.prefillRate.rate(),
      },
      window: {
        unit: this.features.window,
        size: counts.size,
        sizeTokens: counts.sizeTokens,
        footprintTokens: counts.footprintTokens,
        sharedPrefixTokens: counts.sharedPrefixTokens,
        active: counts.active,
        idle: counts.idle,
        dormant: counts.dormant,
        paused: counts.paused,
        waiting: counts.waiting,
      },
      gate: {
        requests: snapshot?.requests ?? 0,
        waiting: snapshot?.waiting ?? 0,
        queued: snapshot?.queued ?? 0,
        ranks: snapshot?.ranks ?? [],
        unranked: snapshot?.unranked ?? { requests: 0, waiting: 0, queued: 0 },
        limits: gate?.limits() ?? {
          engineRequestLimit: 0,
          engineRequestWaitingLimit: 0,
          requestQueueLimit: 0,
        },
        counters: gate?.counters() ?? {
          received: 0,
          admittedDirect: 0,
          admittedQueue: 0,
          rejected: 0,
          cancelled: 0,
        },
      },
      budget: {
        ceilingTokens: budget?.ceiling ?? 0,
        reservedTokens: budget ? budget.reservedActive + budget.reservedQueued : 0,
        availableTokens: budget?.available() ?? 0,
        guardTokens: budget?.guardTokens ?? 0,
        ...(replica.budgetQueue ? { queue: budgetQueueState(replica.budgetQueue.snapshot()) } : {}),
      },
      lanes: { interactive: laneState("interactive"), bulk: laneState("bulk") },
      queuedPrefillTokens: replica.queuedPrefillTokens,
      inflightPrefillTokens: replica.inflightPrefillTokens,
      ...(signals.hostKvCapacityTokens === undefined
        ? {}
        : {
            hostTier: {
              capacityTokens: signals.hostKvCapacityTokens,
              ...(signals.hostKvUsage === undefined ? {} : { usage: signals.hostKvUsage }),
              hitTokens: signals.hostPrefixHitTokens ?? 0,
              queryTokens: signals.hostPrefixQueryTokens ?? 0,
              retainedTokens: counts.hostRetainedTokens,
            },
          }),
      ...(signals.profile === undefined
        ? {}
        : {
            engine: {
              profile: signals.profile,
              unknown: [...(signals.unknown ?? [])],
              kvCapacitySource:
                signals.kvCapacitySource ?? (signals.kvCapacityTokens > 0 ? "engine" : "unknown"),
              // A ceiling of MAX_SAFE_INTEGER is the budget switched off for want of a capacity.
              tokenBudget: budget !== null && budget.ceiling < Number.MAX_SAFE_INTEGER,
              ...(signals.statedHitRate === undefined ? {} : { statedHitRate: signals.statedHitRate }),
              ...(signals.warning === undefined ? {} : { warning: signals.warning }),
            },
          }),
    };
  }

  private emit<K extends keyof SchedulerEvents>(
    name: K,
    event: Parameters<NonNullable<SchedulerEvents[K]>>[0],
  ): void {
    for (const listener of this.listeners) {
      const handler = listener[name] as ((e: typeof event) => void) | undefined;
      if (!handler) continue;
      try {
        handler.call(listener, event);
      } catch {
        // A listener's failure must never reach the request path.
      }
    }
  }

  private newSessionId(): string {
    return `sess-${globalThis.crypto.randomUUID()}`;
  }
}

function budgetQueueState(snapshot: BudgetQueueSnapshot): NonNullable<ReplicaState["budget"]["queue"]> {
  return {
    interactive: snapshot.waiting.interactive,
    bulk: snapshot.waiting.bulk,
    tokens: snapshot.waitingTokens,
    oldestWaitMs: snapshot.oldestWaitMs,
    limit: snapshot.limit,
  };
}

function load(replica: ReplicaRuntime): number {
  const snapshot = replica.gate?.snapshot();
  return snapshot ? snapshot.requests + snapshot.queued : replica.running;
}

/** `prompt_cache_key`s remembered (their last replica), across tenants. */
const MAX_CACHE_HINTS = 4096;

/** A cache hint's entry: one tenant's hint never steers another tenant's calls. */
function cacheHintKey(req: CallRequest): string {
  return JSON.stringify([req.tenant ?? "default", req.cacheHint]);
}

/** Session ids are opaque but bounded: printable ASCII, 1–256 characters (`src/sessions/session-id.ts`). */
export function validateSessionId(id: string): void {
  checkSessionId(id);
}
