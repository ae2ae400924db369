/** @module Everything the scheduler keeps per replica: its gate, budget, window, prefix index and signals. */

import { BudgetQueue, type BudgetQueueOptions } from "../budget/budget-queue.js";
import { TokenBudget } from "../budget/token-budget.js";
import type { Clock } from "../clock.js";
import { gateLimitsFromConfig } from "../config/gate-limits.js";
import type { PolicyFeatures } from "../config/policy-features.js";
import type { SchedulerConfig } from "../config/scheduler-config.js";
import { LANE_DEFAULTS } from "../config/scheduler-config.js";
import type { Engine, EngineCall, EngineSignals, EngineStream } from "../engine.js";
import { EngineError, Refusal } from "../errors.js";
import { BackendGate } from "../gate/backend-gate.js";
import { DrainEstimator } from "../gate/drain-estimator.js";
import type { FleetPrefixIndex } from "../routing/fleet-prefix-index.js";
import { AimdWindow } from "../sessions/aimd-window.js";
import type { SessionRecord } from "../sessions/session-admission.js";
import { TokenWindow } from "../sessions/token-window.js";
import { CacheTurnover } from "../signals/cache-turnover.js";
import { HitRateMeter } from "../signals/hit-rate.js";
import { PrefillRateEstimator } from "../signals/prefill-rate.js";
import { isStale } from "../signals/staleness.js";
import { ThrashEvidence } from "../signals/thrash-evidence.js";
import { tieredPrefixCounters } from "../signals/tiered-prefix-counters.js";
import type { Lane } from "../types.js";

/**
 * How far back the token window reads its evidence of thrash (`ThrashEvidence`): several control
 * intervals, so one call that lost its prefix or one interval of low KV usage does not move W alone.
 */
const THRASH_HORIZON_MS = 10_000;

/** KV capacity assumed for the prefix index before an engine reports its own, in tokens. */
const FALLBACK_KV_TOKENS = 1_000_000;

/** Per-replica state of the scheduler. Mechanics only: decisions live in the pure modules it holds. */
export class ReplicaRuntime {
  readonly id: string;
  readonly engine: Engine;
  readonly gate: BackendGate | null;
  readonly budget: TokenBudget | null;
  /** Calls that do not fit the budget wait here (docs/how-it-works.md); null without a budget. */
  readonly budgetQueue: BudgetQueue | null;
  /** CONCUR's session-count law, for the `sessions` window unit. */
  readonly window: AimdWindow | null;
  /** the documented token law, for the `tokens` window unit; rebuilt when the engine first reports its capacity. */
  tokenWindow: TokenWindow | null;
  /** The fleet-wide prefix index this replica records into; null when the policy keeps none. */
  readonly index: FleetPrefixIndex | null;
  /** This replica's KV capacity in blocks of the prefix index (its KV capacity over the block size). */
  private indexCapacityBlocks: number;
  /** Its host-memory tier's capacity in the prefix index, blocks; 0 without a tier or when the policy ignores tiers. */
  indexHostCapacityBlocks = 0;
  /** Whether placement and the window see this replica's host tier (the policy's `tiers` feature). */
  private readonly seesTiers: boolean;
  readonly hitRate = new HitRateMeter();
  /** Predicted against delivered prefix hits and KV usage over the last few control intervals (the token window reads them). */
  readonly thrashEvidence: ThrashEvidence;
  /** How fast its GPU prefix cache turns over (how long a block outlives its last use). */
  readonly cacheTurnover = new CacheTurnover();
  readonly prefillRate: PrefillRateEstimator;
  /** A worker-wide gate rejection keeps new calls away until then (clock ms). */
  private busyUntil = Number.NEGATIVE_INFINITY;
  /** When a call last found the engine unreachable (clock ms). */
  private unreachableAt = Number.NEGATIVE_INFINITY;
  /** Uncached prompt tokens waiting in the gate queue, by lane. */
  private readonly queuedPrefill: Record<Lane, number> = { interactive: 0, bulk: 0 };
  /** The gate's bulk floor share while lanes order its queue; null when they do not (one FIFO). */
  private readonly bulkFloorShare: number | null;
  private inflightPrefill = 0;
  private runningCalls = 0;
  /** KV tokens the calls running here took anew: their prompts less the prefix they found in GPU memory. */
  private runningNewKvTokens = 0;
  /** The replica's one completion rate behind every Retry-After (the gate's 529 and 429s, the budget's, the session queue's). */
  private readonly completions: DrainEstimator;
  private signalsSeen: EngineSignals;
  private reportedMaxNumSeqs = 0;
  private readonly clock: Clock;

  constructor(
    engine: Engine,
    clock: Clock,
    private readonly config: SchedulerConfig,
    features: PolicyFeatures,
    fleetIndex: FleetPrefixIndex | null = null,
    /** How its budget queue orders waiters and which give way when it is full (the tenants' bands and shares). */
    budgetPolicy: Pick<BudgetQueueOptions, "orderKey" | "shedRank"> = {},
  ) {
    this.id = engine.id;
    this.engine = engine;
    this.clock = clock;
    this.signalsSeen = engine.signals();
    this.completions = new DrainEstimator({ clock });
    this.thrashEvidence = new ThrashEvidence(
      Math.max(1, Math.ceil(THRASH_HORIZON_MS / config.sessions.controlIntervalMs)),
    );
    const signals = this.signalsSeen;
    this.prefillRate = new PrefillRateEstimator({
      priorTokensPerSecond:
        signals.prefillTokensPerSecond && signals.prefillTokensPerSecond > 0
          ? signals.prefillTokensPerSecond
          : 10_000,
    });
    if (features.gate) {
      const limits = this.gateLimits(signals.maxNumSeqs);
      this.reportedMaxNumSeqs = signals.maxNumSeqs;
      const lanes = features.lanes ? this.laneOptions() : undefined;
      this.bulkFloorShare = lanes ? lanes.bulkFloorShare : null;
      this.gate = new BackendGate({
        ...limits,
        ...(signals.dataParallelSize > 1 ? { ranks: signals.dataParallelSize } : {}),
        ...(lanes ? { lanes } : {}),
        clock,
        overloadStatus: config.gate.overloadStatus,
        drain: this.completions,
      });
    } else {
      this.gate = null;
      this.bulkFloorShare = null;
    }
    this.budget = features.budget
      ? new TokenBudget({
          ceilingTokens: config.budget.ceilingTokens ?? (signals.kvCapacityTokens || Number.MAX_SAFE_INTEGER),
          guardBandFraction: config.budget.guardBandFraction,
        })
      : null;
    this.budgetQueue = this.budget
      ? new BudgetQueue(this.budget, {
          clock,
          limit: config.budget.queueLimit,
          headReserveMs: config.budget.headReserveMs,
          bulkFloorShare: features.lanes ? config.lanes.bulkFloorShare : 0,
          shareWindowMs: config.lanes.shareWindowMs,
          retryAfterSeconds: (deficit) => this.budgetDrainSeconds(deficit),
          ...budgetPolicy,
        })
      : null;
    this.window = features.window === "sessions" ? new AimdWindow({ ...config.window }) : null;
    this.tokenWindow = features.window === "tokens" ? this.newTokenWindow(signals.kvCapacityTokens) : null;
    // A decode replica of a disaggregated fleet is placed for room, not prefix: it keeps no index.
    this.index = features.placement === "prefix" && engine.role !== "decode" ? fleetIndex : null;
    this.seesTiers = features.tiers;
    this.indexCapacityBlocks = Math.max(
      1,
      Math.floor((signals.kvCapacityTokens || FALLBACK_KV_TOKENS) / config.blockSize),
    );
    this.indexHostCapacityBlocks = this.hostBlocks(signals);
  }

  /**
   * How fast one call loads from this replica's host tier, tokens per second, as the engine states
   * or measures it; 0 when it has none, its rate is unknown, or the policy ignores tiers (then a
   * block predicted in host memory only is priced as a miss).
   */
  hostLoadTokensPerSecond(): number {
    if (!this.seesTiers || !(this.hostTierTokens() > 0)) return 0;
    const rate = this.signalsSeen.hostLoadTokensPerSecond;
    return rate !== undefined && rate > 0 && Number.isFinite(rate) ? rate : 0;
  }

  /**
   * The host tier's capacity as placement and the window see it, tokens: what the engine states,
   * 0 without a tier, an unstated size or a policy that ignores tiers.
   */
  hostTierTokens(signals: EngineSignals = this.signalsSeen): number {
    const tokens = signals.hostKvCapacityTokens;
    return this.seesTiers && tokens !== undefined && tokens > 0 ? tokens : 0;
  }

  /** Cumulative prefix-cache counters for the window law's hit rate, tiers counted as the policy sees them. */
  prefixCounters(signals: EngineSignals = this.signalsSeen): { hits: number; queries: number } {
    return tieredPrefixCounters(signals, this.hostTierTokens(signals));
  }

  private hostBlocks(signals: EngineSignals): number {
    return Math.floor(this.hostTierTokens(signals) / this.config.blockSize);
  }

  /** The latest signals the engine reported. */
  get signals(): EngineSignals {
    return this.signalsSeen;
  }

  /** Whether the signals are older than the staleness limit. */
  stale(now: number): boolean {
    return isStale(this.signalsSeen.readAtMs, now, this.config.sessions.staleAfterMs);
  }

  /** Healthy by its signals, and not found unreachable by a call since they were read. */
  healthy(): boolean {
    const unreachable =
      this.unreachableAt > Number.NEGATIVE_INFINITY && this.unreachableAt >= this.signalsSeen.readAtMs;
    return this.signalsSeen.healthy && !unreachable;
  }

  /** Why the replica is unhealthy now, in words for an operator (undefined when it is healthy). */
  unhealthyCause(now: number): string | undefined {
    if (this.healthy()) return undefined;
    const readAt = this.signalsSeen.readAtMs;
    if (!Number.isFinite(readAt))
      return "no signals ever read from it: its /metrics endpoint cannot be reached or parsed (is the engine up, is the URL right?)";
    if (this.unreachableAt >= readAt) return "a call could not reach it";
    if (this.stale(now))
      return `its signals are stale (last read ${((now - readAt) / 1000).toFixed(1)} s ago): its /metrics endpoint cannot be read`;
    return "its last scrape failed or it reports no model";
  }

  /** A call could not reach the engine: unhealthy until signals read after now say otherwise. */
  markUnreachable(now: number): void {
    this.unreachableAt = now;
  }

  busy(now: number): boolean {
    return now < this.busyUntil;
  }

  /** A worker-wide rejection: no new calls are routed here until `until` (clock ms) unless every replica is busy. */
  markBusy(until: number): void {
    this.busyUntil = Math.max(this.busyUntil, until);
  }

  /** Uncached prompt tokens of calls waiting in the gate queue. */
  get queuedPrefillTokens(): number {
    return this.queuedPrefill.interactive + this.queuedPrefill.bulk;
  }

  /**
   * Queued prefill a new call of `lane` waits behind at the gate: all of it for bulk, or when one
   * FIFO queue serves both lanes. An interactive call overtakes queued bulk calls (docs/how-it-works.md#token-budget-and-feasibility) except
   * for bulk's floor share f of the prefill tokens admitted while both lanes wait, so it waits
   * behind the interactive tokens queued I and at most `I · f / (1 − f)` bulk tokens. Counting the
   * whole queue would predict a short call the bulk backlog's wait and refuse it as
   * `deadline_infeasible` when it would have met its deadline.
   */
  queuedPrefillAheadOf(lane: Lane): number {
    const { interactive, bulk } = this.queuedPrefill;
    const floor = this.bulkFloorShare;
    if (floor === null || lane === "bulk") return interactive + bulk;
    return interactive + (floor < 1 ? Math.min(bulk, (interactive * floor) / (1 - floor)) : bulk);
  }

  /** Uncached prompt tokens of admitted calls that have no first token yet. */
  get inflightPrefillTokens(): number {
    return this.inflightPrefill;
  }

  /** Calls forwarded to the engine and not yet ended. */
  get running(): number {
    return this.runningCalls;
  }

  /** KV tokens the running calls took anew (`callStarted`); 0 once every call ended. */
  get runningNewKv(): number {
    return this.runningNewKvTokens;
  }

  /**
   * Starts a call at the engine. A worker-wide refusal from a gate in front of
   * it (a sidecar) marks the replica busy, as the scheduler's own gate does;
   * an engine that cannot be reached is a 503 `unavailable` for the call and
   * unhealthy until it answers a scrape (its sessions move).
   */
  async generate(call: EngineCall): Promise<EngineStream> {
    try {
      return await this.engine.generate(call);
    } catch (error) {
      if (error instanceof Refusal && error.reason === "worker_overloaded") {
        this.markBusy(this.clock.now() + this.config.routing.busyMarkMs);
      }
      if (error instanceof EngineError) {
        this.markUnreachable(this.clock.now());
        throw new Refusal("unavailable", `replica ${this.id} could not be reached: ${error.message}`, {
          retryAfterSeconds: 1,
          scope: "worker",
          cause: error,
        });
      }
      throw error;
    }
  }

  /** A call's uncached prefill waits in the gate queue of its lane. */
  queuePrefill(tokens: number, lane: Lane): void {
    this.queuedPrefill[lane] += tokens;
  }

  /** It left the gate queue (admitted, refused or cancelled). */
  dequeuePrefill(tokens: number, lane: Lane): void {
    this.queuedPrefill[lane] -= tokens;
  }

  /** A call's uncached prefill reached the engine. */
  startPrefill(tokens: number): void {
    this.inflightPrefill += tokens;
  }

  /** Its first token came, or it ended before one. */
  endPrefill(tokens: number): void {
    this.inflightPrefill -= tokens;
  }

  /**
   * A call was forwarded to the engine, taking `newKvTokens` of its KV anew (`reservationTokens`
   * of its prompt, without output). The engine allocates them by evicting cached blocks, so the
   * index's GPU part shrinks at once (`indexGpuBlocks`).
   */
  callStarted(newKvTokens: number): void {
    this.runningCalls++;
    this.runningNewKvTokens += newKvTokens;
    if (this.index && newKvTokens > 0) {
      this.index.resize(this.id, this.indexGpuBlocks(), this.indexHostCapacityBlocks);
    }
  }

  /** A forwarded call ended; `newKvTokens` as it started. */
  callEnded(newKvTokens: number): void {
    this.runningCalls--;
    this.runningNewKvTokens -= newKvTokens;
  }

  /**
   * How many blocks of this replica the prefix index takes to be in GPU memory: its KV capacity
   * less the blocks running calls took anew. The index records a call's blocks when it ends, so
   * while calls run, what the engine holds of the chains recorded before is only what they left
   * free — vLLM evicts only blocks no running request uses. Counting the whole capacity had the
   * router predict hits the cache no longer held whenever KV usage was high: on the Mooncake
   * conversation trace without a host tier, the returning sessions' "lost" prefixes that cut the
   * token window (docs/tiers.md). A call's output is left out: `max_tokens` bounds it, not what it
   * generates, and it is recorded with the call when it ends.
   */
  indexGpuBlocks(): number {
    const taken = Math.ceil(Math.max(0, this.runningNewKvTokens) / this.config.blockSize);
    return Math.max(1, this.indexCapacityBlocks - taken);
  }

  /** Reads fresh signals and lets gate limits, ranks, budget ceiling and index size follow the engine. */
  refreshSignals(): EngineSignals {
    const signals = this.engine.signals();
    this.signalsSeen = signals;
    if (this.gate) {
      if (signals.maxNumSeqs > 0 && signals.maxNumSeqs !== this.reportedMaxNumSeqs) {
        this.reportedMaxNumSeqs = signals.maxNumSeqs;
        this.gate.setLimits(this.gateLimits(signals.maxNumSeqs));
      }
      if (signals.dataParallelSize > 1 && this.gate.snapshot().ranks.length !== signals.dataParallelSize) {
        this.gate.setRanks(signals.dataParallelSize);
      }
    }
    if (this.budget && this.config.budget.ceilingTokens === undefined && signals.kvCapacityTokens > 0) {
      if (this.budget.ceiling !== signals.kvCapacityTokens) this.budget.setCeiling(signals.kvCapacityTokens);
    }
    if (this.tokenWindow && signals.kvCapacityTokens > 0) {
      if (this.tokenWindow.options.capacityTokens !== this.windowCapacity(signals.kvCapacityTokens)) {
        this.tokenWindow = this.newTokenWindow(signals.kvCapacityTokens);
      }
    }
    if (this.index) {
      const blocks =
        signals.kvCapacityTokens > 0
          ? Math.max(1, Math.floor(signals.kvCapacityTokens / this.config.blockSize))
          : this.indexCapacityBlocks;
      const hostBlocks = this.hostBlocks(signals);
      if (blocks !== this.indexCapacityBlocks || hostBlocks !== this.indexHostCapacityBlocks) {
        this.indexCapacityBlocks = blocks;
        this.indexHostCapacityBlocks = hostBlocks;
        this.index.resize(this.id, this.indexGpuBlocks(), hostBlocks);
      }
    }
    return signals;
  }

  /** Picks the data-parallel rank with the least work, or undefined for a single-rank engine. */
  chooseRank(): number | undefined {
    if (!this.gate) return undefined;
    const ranks = this.gate.snapshot().ranks;
    if (ranks.length <= 1) return undefined;
    let best = ranks[0]!;
    for (const rank of ranks) {
      if (rank.requests + rank.queued < best.requests + best.queued) best = rank;
    }
    return best.rank;
  }

  /** Records a call that ended, for the drain-rate estimate (a gate, where there is one, records its own calls). */
  recordCompletion(): void {
    if (!this.gate) this.completions.record();
  }

  /** Completions per second over the drain estimator's window (the same rate behind every Retry-After). */
  completionRate(): number {
    return this.completions.ratePerSecond();
  }

  /** Conservative whole seconds (≥ 1) until `ahead` calls and this one have drained, from the completion rate. */
  drainSeconds(ahead: number): number {
    return this.completions.retryAfterSeconds(ahead + 1);
  }

  /**
   * Seconds until `deficitTokens` of this replica's budget are free: the calls that must finish to
   * free them (at the mean reservation held), drained at the measured completion rate.
   */
  budgetDrainSeconds(deficitTokens: number): number {
    const budget = this.budget;
    if (!budget) return 1;
    const reserved = budget.reservedActive + budget.reservedQueued;
    const meanReservation = budget.outstanding > 0 ? reserved / budget.outstanding : deficitTokens;
    const callsToFinish = Math.max(1, Math.ceil(deficitTokens / Math.max(1, meanReservation)));
    return this.drainSeconds(callsToFinish - 1);
  }

  /**
   * A call is sent to this replica's engine with `uncachedTokens` of its `promptTokens` predicted
   * uncached: its predicted hits are the window's evidence, counted as sent, not as placed (a call
   * placed may still be refused by the budget or its deadline, and placed again when it retries).
   * A prompt without block hashes (`hashed` false) was predicted nothing and is no evidence. Returns
   * the epoch to hand to `settleThrashEvidence`, or undefined.
   */
  thrashEvidenceSent(promptTokens: number, uncachedTokens: number, hashed: boolean): number | undefined {
    return hashed ? this.thrashEvidence.sent(promptTokens - uncachedTokens, promptTokens) : undefined;
  }

  /**
   * A call this replica's evidence saw sent (`thrashEvidenceSent` returned `sentEpoch`) ended well,
   * the engine reporting `cachedTokens` of its prompt cached against `predictedHitTokens`.
   *
   * Evidence of thrash is what the cache lost of contexts the window held: a session step that
   * waited for its place (first, paused or dormant) was not held, and finding its cache gone after
   * minutes away says nothing of W (on the Mooncake conversation trace such returns were most of the
   * predicted hits lost). A one-off call counts: it took its share of the cache beside the window.
   */
  settleThrashEvidence(
    session: SessionRecord | undefined,
    predictedHitTokens: number,
    cachedTokens: number,
    sentEpoch: number,
  ): void {
    if (session && !session.stepHeldInWindow) return;
    this.thrashEvidence.ended(predictedHitTokens, cachedTokens, sentEpoch);
  }

  /** Current occupancy counters for leak checks. */
  holdings(): { permits: number; queued: number; reservations: number } {
    const snapshot = this.gate?.snapshot();
    return {
      permits: snapshot ? snapshot.requests + snapshot.waiting : 0,
      queued: (snapshot ? snapshot.queued : 0) + (this.budgetQueue?.size ?? 0),
      reservations: this.budget?.outstanding ?? 0,
    };
  }

  /** The capacity the token window is sized by: the budget's ceiling when set, else the engine's KV capacity. */
  private windowCapacity(kvCapacityTokens: number): number {
    return this.config.budget.ceilingTokens ?? (kvCapacityTokens > 0 ? kvCapacityTokens : FALLBACK_KV_TOKENS);
  }

  private newTokenWindow(kvCapacityTokens: number): TokenWindow {
    const w = this.config.window;
    return new TokenWindow({
      capacityTokens: this.windowCapacity(kvCapacityTokens),
      guardBandFraction: this.config.budget.guardBandFraction,
      decrease: w.decrease,
      kvLow: w.kvLow,
      kvHigh: w.kvHigh,
      hitLow: w.hitLow,
      ...(w.initialTokens !== undefined ? { initial: w.initialTokens } : {}),
      ...(w.minTokens !== undefined ? { min: w.minTokens } : {}),
      ...(w.maxTokens !== undefined ? { max: w.maxTokens } : {}),
      ...(w.increaseTokens !== undefined ? { increase: w.increaseTokens } : {}),
    });
  }

  private gateLimits(maxNumSeqs: number) {
    return gateLimitsFromConfig(this.config.gate, maxNumSeqs > 0 ? { maxNumSeqs } : {});
  }

  private laneOptions() {
    const lanes = this.config.lanes;
    return {
      interactive: {
        ...(lanes.interactive.queueLimit !== undefined ? { queueLimit: lanes.interactive.queueLimit } : {}),
        maxResidenceMs: lanes.interactive.maxResidenceMs ?? LANE_DEFAULTS.interactive.maxResidenceMs,
      },
      bulk: {
        ...(lanes.bulk.queueLimit !== undefined ? { queueLimit: lanes.bulk.queueLimit } : {}),
        maxResidenceMs: lanes.bulk.maxResidenceMs ?? LANE_DEFAULTS.bulk.maxResidenceMs,
      },
      bulkFloorShare: lanes.bulkFloorShare,
      bulkMaxShare: lanes.bulkMaxShare,
      shareWindowMs: lanes.shareWindowMs,
    };
  }
}
