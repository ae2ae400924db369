/**
 * @module The window control of one replica per control interval (docs/how-it-works.md#session-window-tokens-of-cache-footprint):
 * applies the replica's law — CONCUR's session count or the token window —
 * to the interval's signals, says why W moved, and offers the same step as a
 * function of another size for a window shared by several frontends. The
 * laws themselves are pure classes in `src/sessions/`; admission applies the
 * size this returns.
 */

import type { SchedulerConfig } from "../config/scheduler-config.js";
import { AimdWindow } from "../sessions/aimd-window.js";
import type { SessionAdmission } from "../sessions/session-admission.js";
import type { SchedulerEvents } from "../types.js";
import type { ReplicaRuntime } from "./replica-runtime.js";

/** A window change as the scheduler reports it. */
export type WindowChange = Parameters<NonNullable<SchedulerEvents["window"]>>[0];

/** What window control reads (configuration, admission's footprints and waiters) and where it reports. */
export interface WindowControlContext {
  readonly config: SchedulerConfig;
  readonly admission: Pick<SessionAdmission, "largestFootprint" | "waitingFor">;
  onChange(change: WindowChange): void;
}

/** One interval's signals of a replica. */
export interface WindowSignals {
  kvUsage: number;
  /** The interval's hit rate; whether it was measured is the replica's meter's to say. */
  hitRate: number;
  /** Fresh and healthy: stale signals say nothing about the replica, so W holds still. */
  fresh: boolean;
}

/** The size proposed after this interval, and the same step applied to another size. */
export interface WindowProposal {
  proposed: number;
  step(current: number): number;
}

/** One control interval of a replica's window; null when the policy has none. */
export function controlWindow(
  replica: ReplicaRuntime,
  signals: WindowSignals,
  context: WindowControlContext,
): WindowProposal | null {
  const { kvUsage, hitRate, fresh } = signals;
  const o = context.config.window;
  const thrash = `KV usage ${kvUsage.toFixed(2)} > ${o.kvHigh} with hit rate ${hitRate.toFixed(2)} < ${o.hitLow}`;
  const report = (unit: "tokens" | "sessions", from: number, to: number, cause: string) => {
    if (from !== to) {
      context.onChange({
        replica: replica.id,
        unit,
        from,
        to,
        action: to > from ? "increase" : "decrease",
        cause,
      });
    }
  };
  if (replica.window) {
    const window = replica.window;
    const signal = { kvUsage, hitRate };
    // An interval without prefix lookups measured no hit rate: the window may still grow on low
    // KV usage, but it does not shrink on a rate carried over from an interval it already acted on
    // (that halved it twice for one thrash episode).
    const applies = fresh && (replica.hitRate.measured || kvUsage <= o.kvHigh);
    const before = window.size;
    if (applies) window.observe(signal);
    const grew = `KV usage ${kvUsage.toFixed(2)} < ${o.kvLow}`;
    report("sessions", before, window.size, window.size < before ? `thrash: ${thrash}` : grew);
    return {
      proposed: window.size,
      step: (current) =>
        applies
          ? new AimdWindow({ ...o, initial: Math.min(o.max, Math.max(o.min, Math.round(current))) }).observe(
              signal,
            )
          : current,
    };
  }
  const window = replica.tokenWindow;
  if (!window) return null;
  // docs/how-it-works.md#session-window-tokens-of-cache-footprint: W_min defaults to the largest single footprint, so a cut never leaves the largest session no room alone.
  window.setFloor(Math.max(o.minTokens ?? 0, context.admission.largestFootprint(replica.id)));
  // H as the token window reads it: the share of the hits the router predicted that the cache
  // delivered, so a workload with little reuse is not taken for thrash (docs/how-it-works.md),
  // call by call over a few intervals (`ThrashEvidence`).
  const { predicted, delivered, kvUsagePeak } = replica.thrashEvidence.read(o.hitLow);
  // With `holdWithinCapacity`: a window within the KV capacity less the guard band holds contexts
  // that all fit in the cache at once, so what its sessions lose there was pushed out by calls it
  // does not govern (one-off calls, bounded by the gate and the budget), and halving it would only
  // make sessions wait. On the Mooncake conversation trace without a host tier, half of whose calls
  // are one-off, such cuts were most of the window's SLO misses (docs/tiers.md). Off by default:
  // docs/how-it-works.md#session-window-tokens-of-cache-footprint cuts W on thrash wherever it stands.
  const fits =
    o.holdWithinCapacity &&
    window.size <= window.options.capacityTokens * (1 - window.options.guardBandFraction);
  const signal = {
    kvUsage,
    kvUsagePeak,
    hitRate: fits ? undefined : delivered,
    waiting: context.admission.waitingFor(replica.id),
  };
  const before = window.size;
  if (fresh) window.observe(signal);
  if (window.size < before) replica.thrashEvidence.forget();
  const grew = window.inSlowStart
    ? `slow start: sessions wait, KV usage at most ${kvUsagePeak.toFixed(2)} < ${o.kvLow} over the last intervals`
    : `additive increase: sessions wait, KV usage ${kvUsage.toFixed(2)} < ${o.kvLow}`;
  const lost = `KV usage ${kvUsage.toFixed(2)} > ${o.kvHigh} with hit rate ${hitRate.toFixed(2)}, ${(delivered ?? 1).toFixed(2)} of the ${(predicted ?? 0).toFixed(2)} predicted < ${o.hitLow}`;
  report("tokens", before, window.size, window.size < before ? `thrash: ${lost}` : grew);
  return {
    proposed: window.size,
    step: (current) =>
      fresh ? window.stepFrom({ size: current, slowStart: window.inSlowStart }, signal).size : current,
  };
}
