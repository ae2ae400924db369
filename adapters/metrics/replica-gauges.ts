/**
 * @module The gauges read from the scheduler's snapshot at each scrape (docs/metrics.md): per
 * replica (window, engine signals, token budget) and fleet-wide (lane queues, overload stage,
 * sessions by state).
 */

import { Gauge, type Registry } from "prom-client";
import type { AdminState, OverloadStage } from "../../src/types.js";
import { LANES } from "./call-metrics.js";

/** The scheduler's state as one scrape sees it (read once per scrape, shared by every gauge). */
export type ScrapeSnapshot = () => AdminState;

const STAGE_NUMBER: Record<OverloadStage, number> = { normal: 0, bulk_paused: 1, shedding: 2 };

/** Registers the per-replica gauges; a replica whose value is unknown has no series. */
export function registerReplicaGauges(registry: Registry, snapshot: ScrapeSnapshot): void {
  const perReplica = (
    name: string,
    help: string,
    read: (r: AdminState["replicas"][number]) => number | null,
  ) =>
    new Gauge({
      name,
      help,
      labelNames: ["replica"],
      registers: [registry],
      collect() {
        this.reset();
        for (const replica of snapshot().replicas) {
          const value = read(replica);
          if (value !== null && Number.isFinite(value)) this.set({ replica: replica.id }, value);
        }
      },
    });

  perReplica(
    "sluice_session_window",
    "Sessions the window of a replica holds (the token window), or W of the session-count law; absent when the policy has no window.",
    (r) => r.window.size,
  );
  perReplica(
    "sluice_session_window_tokens",
    "Token window W of a replica: the KV tokens its active sessions may hold (docs/how-it-works.md#session-window-tokens-of-cache-footprint).",
    (r) => r.window.sizeTokens,
  );
  perReplica(
    "sluice_session_footprint_tokens",
    "Sum of the footprints (context plus expected next growth) of a replica's active sessions, tokens.",
    (r) => r.window.footprintTokens,
  );
  perReplica(
    "sluice_sessions_idle",
    "Active sessions between steps (running tools) on a replica; they keep their place for their retention time.",
    (r) => r.window.idle,
  );
  perReplica(
    "sluice_sessions_dormant",
    "Idle sessions that left a replica's window after their retention time; they keep their pin.",
    (r) => r.window.dormant,
  );
  perReplica(
    "sluice_sessions_active",
    "Active sessions per replica (running a step or idle between steps).",
    (r) => r.window.active,
  );
  perReplica(
    "sluice_sessions_paused",
    "Sessions paused per replica because the window shrank.",
    (r) => r.window.paused,
  );
  perReplica(
    "sluice_sessions_waiting",
    "Sessions waiting for room in a replica's window.",
    (r) => r.window.waiting,
  );
  // A signal the engine does not publish is null in the state, so it has no series (docs/engines.md).
  perReplica(
    "sluice_replica_kv_usage",
    "KV cache usage of a replica (0-1), excluding evictable cache; absent when the engine does not publish it.",
    (r) => r.signals.kvUsage,
  );
  perReplica(
    "sluice_replica_prefix_hit_rate",
    "Token-weighted prefix cache hit rate of a replica over the last control interval (0-1); absent when the engine does not publish its prefix-cache counters.",
    (r) => r.signals.hitRate,
  );
  perReplica(
    "sluice_replica_kv_usage_ratio",
    "KV cache usage of a replica (0-1), excluding evictable cache; the same value as sluice_replica_kv_usage.",
    (r) => r.signals.kvUsage,
  );
  perReplica(
    "sluice_replica_prefix_cache_hit_ratio",
    "Token-weighted prefix cache hit rate of a replica over the last control interval (0-1); the same value as sluice_replica_prefix_hit_rate.",
    (r) => r.signals.hitRate,
  );
  perReplica(
    "sluice_replica_engine_stated_hit_rate",
    "The prefix cache hit rate the engine states on its own gauge (0-1: SGLang's cache_hit_rate, vLLM V0's gpu_prefix_cache_hit_rate); absent when it states none.",
    (r) => r.engine?.statedHitRate ?? null,
  );
  perReplica("sluice_replica_healthy", "1 when the replica's signals are fresh and it is reachable.", (r) =>
    r.healthy ? 1 : 0,
  );
  perReplica(
    "sluice_replica_busy",
    "1 while a worker-wide gate rejection keeps new calls away (1 s).",
    (r) => (r.busy ? 1 : 0),
  );
  perReplica("sluice_replica_signal_age_seconds", "Age of the replica's latest signals, seconds.", (r) =>
    r.signals.ageMs >= 0 ? r.signals.ageMs / 1000 : null,
  );
  perReplica(
    "sluice_replica_running_requests",
    "Calls the engine reports running; absent when it does not publish them.",
    (r) => r.signals.running,
  );
  perReplica(
    "sluice_replica_waiting_requests",
    "Calls the engine reports waiting; absent when it does not publish them.",
    (r) => r.signals.waiting,
  );
  perReplica(
    "sluice_replica_token_ceiling",
    "Token budget ceiling of a replica, tokens; absent while the budget is off (no KV capacity known).",
    (r) => (r.engine?.tokenBudget === false ? null : r.budget.ceilingTokens),
  );
  perReplica(
    "sluice_replica_reserved_tokens",
    "Tokens reserved by active and queued calls on a replica.",
    (r) => r.budget.reservedTokens,
  );
  perReplica(
    "sluice_replica_available_tokens",
    "Tokens still reservable on a replica (ceiling - reserved - guard band); absent while the budget is off.",
    (r) => (r.engine?.tokenBudget === false ? null : r.budget.availableTokens),
  );
  perReplica(
    "sluice_budget_queue_calls",
    "Calls waiting for token budget on a replica (interactive and bulk).",
    (r) => (r.budget.queue ? r.budget.queue.interactive + r.budget.queue.bulk : null),
  );
  perReplica(
    "sluice_budget_queue_tokens",
    "Tokens the calls waiting for budget on a replica need.",
    (r) => r.budget.queue?.tokens ?? null,
  );
  perReplica(
    "sluice_budget_queue_oldest_age_seconds",
    "Wait of the oldest call waiting for token budget on a replica, seconds.",
    (r) => (r.budget.queue ? r.budget.queue.oldestWaitMs / 1000 : null),
  );
  perReplica(
    "sluice_queued_prefill_tokens",
    "Prefill tokens of calls queued for a replica.",
    (r) => r.queuedPrefillTokens,
  );
  perReplica(
    "sluice_inflight_prefill_tokens",
    "Prefill tokens of admitted calls not yet past their first token.",
    (r) => r.inflightPrefillTokens,
  );
}

/** Registers the fleet-wide gauges: lane queues (over replicas), the overload stage, sessions by state. */
export function registerFleetGauges(registry: Registry, snapshot: ScrapeSnapshot): void {
  new Gauge({
    name: "sluice_queue_oldest_age_seconds",
    help: "Age of the oldest queued call per lane (max over replicas), seconds.",
    labelNames: ["lane"],
    registers: [registry],
    collect() {
      const state = snapshot();
      for (const lane of LANES) {
        let oldest = 0;
        for (const replica of state.replicas)
          oldest = Math.max(oldest, replica.lanes[lane]?.oldestAgeMs ?? 0);
        this.set({ lane }, oldest / 1000);
      }
    },
  });
  new Gauge({
    name: "sluice_queue_depth",
    help: "Calls queued per lane (sum over replicas).",
    labelNames: ["lane"],
    registers: [registry],
    collect() {
      const state = snapshot();
      for (const lane of LANES) {
        let queued = 0;
        for (const replica of state.replicas) queued += replica.lanes[lane]?.queued ?? 0;
        this.set({ lane }, queued);
      }
    },
  });
  new Gauge({
    name: "sluice_overload_stage",
    help: "Overload stage: 0 normal, 1 bulk_paused, 2 shedding.",
    registers: [registry],
    collect() {
      this.set(STAGE_NUMBER[snapshot().stage] ?? 0);
    },
  });
  new Gauge({
    name: "sluice_sessions",
    help: "Sessions known to the scheduler by state (fleet-wide).",
    labelNames: ["state"],
    registers: [registry],
    collect() {
      const sessions = snapshot().sessions;
      this.set({ state: "waiting" }, sessions.waiting);
      this.set({ state: "active" }, sessions.active);
      this.set({ state: "paused" }, sessions.paused);
      this.set({ state: "idle" }, sessions.idle);
      this.set({ state: "dormant" }, sessions.dormant);
    },
  });
}
