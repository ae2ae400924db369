/** @module Server-side history for the dashboard: the state sampled every second or two in a ring, and the operator events that explain it. */

import type { Clock } from "../../src/clock.js";
import type { AdminState, Lane, OverloadStage, RouteReason, SchedulerEvents } from "../../src/types.js";
import type { CompletedCall } from "../metrics/metrics.js";

/** What the history reads from the scheduler. */
export interface HistoryScheduler {
  state(): AdminState;
  addEvents(events: SchedulerEvents): void;
}

/** One replica in one sample. Token fields are null when the policy has no token window. */
export interface ReplicaSample {
  id: string;
  healthy: boolean;
  /** Null when the engine does not publish it (the chart leaves a gap). */
  kvUsage: number | null;
  hitRate: number | null;
  windowTokens: number | null;
  /** The sum of active sessions' footprints (the documented gauge). */
  footprintTokens: number | null;
  /** What those footprints hold of W: their sum less the shared prompt prefix counted more than once. */
  heldTokens: number | null;
  windowSessions: number | null;
  active: number;
  idle: number;
  dormant: number;
  paused: number;
  waiting: number;
  gateRequests: number;
  gateWaiting: number;
  gateQueued: number;
  requestLimit: number;
  reservedTokens: number;
  ceilingTokens: number;
  guardTokens: number;
  availableTokens: number;
}

/** Latency quantiles over one sample interval, seconds; null when nothing was measured. */
export interface IntervalQuantiles {
  p50: number | null;
  p95: number | null;
}

/** What happened between two samples (counts, not rates: the page divides by the interval). */
export interface IntervalActivity {
  ms: number;
  completed: number;
  generatedTokens: number;
  ttft: IntervalQuantiles;
  e2e: IntervalQuantiles;
  queueWait: IntervalQuantiles;
  /** Router's prediction: prompt tokens it expected cached, and prompt tokens routed. */
  predictedHitTokens: number;
  routedPromptTokens: number;
  /** What the engines delivered on calls that ended: cached prompt tokens, and prompt tokens. */
  cachedTokens: number;
  promptTokens: number;
  routes: Record<RouteReason, number>;
  refusals: Record<string, number>;
}

/** The state at one instant, compacted for a 15-minute ring. */
export interface StateSample {
  /** Wall-clock time, ms since the epoch (what the page's axis shows). */
  t: number;
  stage: OverloadStage;
  sessions: AdminState["sessions"];
  replicas: ReplicaSample[];
  lanes: Record<Lane, { queued: number; oldestAgeMs: number }>;
  /** Cumulative refusals by reason (as `state().rejections`). */
  rejections: Record<string, number>;
  interval: IntervalActivity;
}

/** An event an operator reads to learn why something changed. */
export interface OperatorEvent {
  /** Increasing number, so a reader asks for events after the last it has. */
  seq: number;
  t: number;
  kind: "window" | "session" | "stage" | "health";
  replica: string | null;
  /** What changed, one line. */
  text: string;
  /** Why, when known. */
  cause: string;
  /** The log level it deserves. */
  level: "info" | "warn";
  /** For a window change: which way W moved. */
  action?: "increase" | "decrease";
}

/** Options of `StateHistory`. */
export interface StateHistoryOptions {
  scheduler: HistoryScheduler;
  /** Schedules the sampling (the scheduler's clock). */
  clock: Clock;
  /** Wall-clock time for sample stamps, ms since the epoch. Default `Date.now`. */
  wallNow?: () => number;
  /** Sampling period, ms. Default 1000. */
  sampleMs?: number;
  /** History kept, ms. Default 15 minutes. */
  keepMs?: number;
  /** Operator events kept. Default 500. */
  maxEvents?: number;
}

function quantiles(values: number[]): IntervalQuantiles {
  if (values.length === 0) return { p50: null, p95: null };
  values.sort((a, b) => a - b);
  const at = (q: number) => values[Math.min(values.length - 1, Math.ceil(q * values.length) - 1)]!;
  return { p50: at(0.5), p95: at(0.95) };
}

function emptyActivity(): Omit<IntervalActivity, "ms" | "ttft" | "e2e" | "queueWait"> & {
  ttftS: number[];
  e2eS: number[];
  queueS: number[];
} {
  return {
    completed: 0,
    generatedTokens: 0,
    predictedHitTokens: 0,
    routedPromptTokens: 0,
    cachedTokens: 0,
    promptTokens: 0,
    routes: { pinned: 0, prefix: 0, load: 0, affinity_break: 0 },
    refusals: {},
    ttftS: [],
    e2eS: [],
    queueS: [],
  };
}

/**
 * Samples `scheduler.state()` every `sampleMs` into a ring of `keepMs`, with
 * what happened in between (latency quantiles, throughput, predicted and
 * delivered hit tokens, route reasons, refusals), and keeps the operator
 * events that explain changes: window law decisions, pauses and dormancies,
 * overload stage and replica health (the scheduler's `stage` and `health`
 * events). A page opened late asks for all of it.
 */
export class StateHistory {
  private readonly scheduler: HistoryScheduler;
  private readonly clock: Clock;
  private readonly wallNow: () => number;
  readonly sampleMs: number;
  private readonly keepMs: number;
  private readonly maxEvents: number;
  private readonly samples: StateSample[] = [];
  private readonly events: OperatorEvent[] = [];
  private readonly listeners: ((event: OperatorEvent) => void)[] = [];
  private activity = emptyActivity();
  private lastSampleAt: number;
  private cancelTimer: (() => void) | undefined;
  private nextSeq = 1;

  constructor(options: StateHistoryOptions) {
    const sampleMs = options.sampleMs ?? 1000;
    if (!(Number.isFinite(sampleMs) && sampleMs >= 100))
      throw new RangeError(`sampleMs must be at least 100, got ${sampleMs}`);
    const keepMs = options.keepMs ?? 15 * 60_000;
    if (!(Number.isFinite(keepMs) && keepMs >= sampleMs))
      throw new RangeError(`keepMs must be at least sampleMs (${sampleMs}), got ${keepMs}`);
    this.scheduler = options.scheduler;
    this.clock = options.clock;
    this.wallNow = options.wallNow ?? Date.now;
    this.sampleMs = sampleMs;
    this.keepMs = keepMs;
    this.maxEvents = options.maxEvents ?? 500;
    this.lastSampleAt = this.clock.now();
    this.scheduler.addEvents(this.hooks());
  }

  /** Starts sampling every `sampleMs`. Idempotent. */
  start(): void {
    if (this.cancelTimer) return;
    const tick = () => {
      this.sample();
      this.cancelTimer = this.clock.setTimeout(tick, this.sampleMs);
    };
    this.cancelTimer = this.clock.setTimeout(tick, this.sampleMs);
  }

  /** Stops sampling; what was kept stays readable. */
  stop(): void {
    this.cancelTimer?.();
    this.cancelTimer = undefined;
  }

  /** Calls `listener` with every operator event as it is recorded (the log follows these). */
  onEvent(listener: (event: OperatorEvent) => void): void {
    this.listeners.push(listener);
  }

  /** A call that ran to its end (the transport reports it; the scheduler's events carry no duration). */
  recordCompletion(e: CompletedCall): void {
    this.activity.completed++;
    this.activity.generatedTokens += Math.max(0, e.completionTokens);
    this.activity.e2eS.push(Math.max(0, e.durationMs) / 1000);
    this.activity.cachedTokens += Math.max(0, Math.min(e.cachedTokens, e.promptTokens));
    this.activity.promptTokens += Math.max(0, e.promptTokens);
  }

  /** Takes one sample now (the timer calls this; tests may too). */
  sample(): StateSample {
    const state = this.scheduler.state();
    const now = this.clock.now();
    const a = this.activity;
    this.activity = emptyActivity();
    const sample: StateSample = {
      t: this.wallNow(),
      stage: state.stage,
      sessions: { ...state.sessions },
      replicas: state.replicas.map((r) => ({
        id: r.id,
        healthy: r.healthy,
        kvUsage: r.signals.kvUsage,
        hitRate: r.signals.hitRate,
        windowTokens: r.window.sizeTokens,
        footprintTokens: r.window.footprintTokens,
        heldTokens:
          r.window.footprintTokens === null
            ? null
            : r.window.footprintTokens - (r.window.sharedPrefixTokens ?? 0),
        windowSessions: r.window.size,
        active: r.window.active,
        idle: r.window.idle,
        dormant: r.window.dormant,
        paused: r.window.paused,
        waiting: r.window.waiting,
        gateRequests: r.gate.requests,
        gateWaiting: r.gate.waiting,
        gateQueued: r.gate.queued,
        requestLimit: r.gate.limits.engineRequestLimit * Math.max(1, r.gate.ranks.length),
        reservedTokens: r.budget.reservedTokens,
        ceilingTokens: r.budget.ceilingTokens,
        guardTokens: r.budget.guardTokens,
        availableTokens: r.budget.availableTokens,
      })),
      lanes: {
        interactive: laneTotals(state, "interactive"),
        bulk: laneTotals(state, "bulk"),
      },
      rejections: { ...state.rejections },
      interval: {
        ms: Math.max(0, now - this.lastSampleAt),
        completed: a.completed,
        generatedTokens: a.generatedTokens,
        ttft: quantiles(a.ttftS),
        e2e: quantiles(a.e2eS),
        queueWait: quantiles(a.queueS),
        predictedHitTokens: a.predictedHitTokens,
        routedPromptTokens: a.routedPromptTokens,
        cachedTokens: a.cachedTokens,
        promptTokens: a.promptTokens,
        routes: a.routes,
        refusals: a.refusals,
      },
    };
    this.lastSampleAt = now;
    this.samples.push(sample);
    const cutoff = sample.t - this.keepMs;
    while (this.samples.length > 1 && this.samples[0]!.t < cutoff) this.samples.shift();
    return sample;
  }

  /** Samples newer than `sinceT` and operator events after sequence number `afterSeq` (all when omitted). */
  since(
    sinceT = Number.NEGATIVE_INFINITY,
    afterSeq = 0,
  ): {
    sampleMs: number;
    samples: StateSample[];
    events: OperatorEvent[];
  } {
    return {
      sampleMs: this.sampleMs,
      samples: this.samples.filter((s) => s.t > sinceT),
      events: this.events.filter((e) => e.seq > afterSeq),
    };
  }

  private record(event: Omit<OperatorEvent, "t" | "seq">): void {
    const full = { seq: this.nextSeq++, t: this.wallNow(), ...event };
    this.events.push(full);
    if (this.events.length > this.maxEvents) this.events.splice(0, this.events.length - this.maxEvents);
    for (const listener of this.listeners) {
      try {
        listener(full);
      } catch {
        // An observer's failure must not stop the history.
      }
    }
  }

  private hooks(): SchedulerEvents {
    return {
      firstToken: (e) => {
        this.activity.ttftS.push(Math.max(0, e.ttftMs) / 1000);
      },
      admitted: (e) => {
        this.activity.queueS.push(Math.max(0, e.queueWaitMs) / 1000);
      },
      route: (e) => {
        this.activity.routes[e.reason] = (this.activity.routes[e.reason] ?? 0) + 1;
        this.activity.predictedHitTokens += Math.max(0, e.predictedHitTokens);
        this.activity.routedPromptTokens += Math.max(0, e.promptTokens);
      },
      refusal: (e) => {
        this.activity.refusals[e.reason] = (this.activity.refusals[e.reason] ?? 0) + 1;
      },
      window: (e) => {
        const unit = e.unit === "tokens" ? " tokens" : " sessions";
        this.record({
          kind: "window",
          replica: e.replica,
          text: `${e.replica} W ${Math.round(e.from)} → ${Math.round(e.to)}${unit} (${e.action})`,
          cause: e.cause,
          level: "info",
          action: e.action,
        });
      },
      session: (e) => {
        if (e.event !== "paused" && e.event !== "dormant") return;
        this.record({
          kind: "session",
          replica: e.replica,
          text: `session ${e.id} ${e.event}${e.replica ? ` on ${e.replica}` : ""}`,
          cause:
            e.event === "dormant"
              ? "idle past its retention time while other sessions wait"
              : pauseCause(e.reason, e.tenant),
          level: "info",
        });
      },
      stage: (e) => {
        this.record({
          kind: "stage",
          replica: null,
          text: `overload stage ${e.from} → ${e.to}`,
          cause: e.cause,
          level: e.to === "normal" ? "info" : "warn",
        });
      },
      health: (e) => {
        this.record({
          kind: "health",
          replica: e.replica,
          text: `replica ${e.replica} ${e.healthy ? "healthy" : "unhealthy"}`,
          cause: e.cause,
          level: e.healthy ? "info" : "warn",
        });
      },
    };
  }
}

function laneTotals(state: AdminState, lane: Lane): { queued: number; oldestAgeMs: number } {
  let queued = 0;
  let oldestAgeMs = 0;
  for (const replica of state.replicas) {
    queued += replica.lanes[lane]?.queued ?? 0;
    oldestAgeMs = Math.max(oldestAgeMs, replica.lanes[lane]?.oldestAgeMs ?? 0);
  }
  return { queued, oldestAgeMs };
}

/** Why a session was paused, in an operator's words (docs/tenants.md). */
function pauseCause(
  reason: "fairness" | "priority" | "window" | "unhealthy" | undefined,
  tenant: string | undefined,
): string {
  const of = tenant ? ` (tenant ${tenant})` : "";
  if (reason === "fairness")
    return `fairness: its tenant${of} held more than its share while a tenant below its share waited`;
  if (reason === "priority") return `priority: a session of a higher band waited for its room${of}`;
  if (reason === "unhealthy") return "its replica became unhealthy: it waits for room on another";
  return "the window shrank below the sum of footprints";
}
