/** @module A scheduler stand-in with a scripted state and events, for the operator surfaces (metrics, dashboard, logs) where a state shape matters, not a decision. */

import type { HttpScheduler } from "../../adapters/http/scheduler-port.js";
import { Refusal } from "../../src/errors.js";
import type { AdminState, ReplicaState, SchedulerEvents } from "../../src/types.js";

/** One replica's state with a token window; override what a test looks at. */
export function replicaState(id: string, window: Partial<ReplicaState["window"]> = {}): ReplicaState {
  return {
    id,
    healthy: true,
    busy: false,
    signals: {
      kvUsage: 0.42,
      hitRate: 0.81,
      running: 3,
      waiting: 0,
      preemptions: 0,
      stale: false,
      ageMs: 120,
      kvCapacityTokens: 96_000,
      maxNumSeqs: 256,
      dataParallelSize: 1,
      prefillTokensPerSecond: 20_000,
    },
    window: {
      unit: "tokens",
      size: 4,
      sizeTokens: 64_000,
      footprintTokens: 52_000,
      sharedPrefixTokens: 0,
      active: 4,
      idle: 1,
      dormant: 2,
      paused: 1,
      waiting: 2,
      ...window,
    },
    gate: {
      requests: 3,
      waiting: 1,
      queued: 0,
      ranks: [{ rank: 0, requests: 3, waiting: 1, queued: 0 }],
      unranked: { requests: 0, waiting: 0, queued: 0 },
      limits: { engineRequestLimit: 16, engineRequestWaitingLimit: 16, requestQueueLimit: 32 },
      counters: { received: 10, admittedDirect: 10, admittedQueue: 0, rejected: 0, cancelled: 0 },
    },
    budget: { ceilingTokens: 96_000, reservedTokens: 80_000, availableTokens: 6_400, guardTokens: 9_600 },
    lanes: { interactive: { queued: 0, oldestAgeMs: 0 }, bulk: { queued: 0, oldestAgeMs: 0 } },
    queuedPrefillTokens: 0,
    inflightPrefillTokens: 0,
  };
}

/** A scheduler whose state a test sets and whose events a test emits, as the real one would. */
export class StubScheduler implements HttpScheduler {
  readonly config = { window: { kvLow: 0.2, kvHigh: 0.5, hitLow: 0.2 } };
  readonly listeners: SchedulerEvents[] = [];
  current: AdminState;

  constructor(replicas: ReplicaState[] = [replicaState("gpu-a"), replicaState("gpu-b")]) {
    this.current = {
      atMs: 0,
      policy: "sluice",
      stage: "normal",
      models: ["m"],
      replicas,
      sessions: { total: 0, waiting: 0, active: 0, idle: 0, dormant: 0, paused: 0 },
      rejections: {},
    };
    this.current.sessions = StubScheduler.totals(replicas);
  }

  /** Fleet totals as the sum over replicas (plus sessions not placed yet, waiting). */
  static totals(replicas: ReplicaState[], unplacedWaiting = 0): AdminState["sessions"] {
    const sum = (read: (r: ReplicaState) => number) => replicas.reduce((total, r) => total + read(r), 0);
    const active = sum((r) => r.window.active);
    const dormant = sum((r) => r.window.dormant);
    const paused = sum((r) => r.window.paused);
    const waiting = sum((r) => r.window.waiting) + unplacedWaiting;
    return {
      total: active + dormant + paused + waiting,
      waiting,
      active,
      idle: sum((r) => r.window.idle),
      dormant,
      paused,
    };
  }

  emit<K extends keyof SchedulerEvents>(
    name: K,
    event: Parameters<NonNullable<SchedulerEvents[K]>>[0],
  ): void {
    for (const listener of this.listeners)
      (listener[name] as ((e: typeof event) => void) | undefined)?.(event);
  }

  addEvents(events: SchedulerEvents): void {
    this.listeners.push(events);
  }
  state(): AdminState {
    return this.current;
  }
  replicaState(id: string) {
    return this.current.replicas.find((replica) => replica.id === id);
  }
  gates() {
    return [];
  }
  submit(): Promise<never> {
    return Promise.reject(new Refusal("unavailable", "the stub runs no calls", { retryAfterSeconds: 1 }));
  }
  openSession(): never {
    throw new Refusal("unavailable", "the stub opens no sessions");
  }
  getSession() {
    return undefined;
  }
  closeSession() {
    return false;
  }
  tenantsOfSession(): string[] {
    return [];
  }
  models() {
    return ["m"];
  }
  contextWindow() {
    return 8192;
  }
  readyReplicas() {
    return this.current.replicas.filter((r) => r.healthy).length;
  }
}
