/**
 * @module Per-tenant numbers of a `tenants` workload run (docs/benchmarks.md): admission waits, TTFT,
 * session completion, service held while tenants competed, pauses, and Jain's index over service ÷ weight.
 */

import type { Clock } from "../../src/clock.js";
import { jainIndex } from "../../src/tenants/fair-share.js";
import type { SessionView } from "../../src/types.js";
import type { CallRecord, FairnessMode, FairnessStats, TenantStats } from "./run-records.js";
import { quantile, round } from "./stats.js";
import type { PlannedCall, Workload } from "./workloads/types.js";

/** Jain's fairness index: the scheduler's own, so the benchmark and the dashboard agree. */
export { jainIndex };

/** What the tracker reads from the scheduler. */
export interface TrackedScheduler {
  getSession?(id: string): SessionView | undefined;
  addEvents?(events: {
    session?(e: { id: string; event: string; replica: string | null; reason?: string }): void;
  }): void;
}

/** The driver's hooks into one run's tenant accounting. */
export interface TenantTracker {
  /** A call is ready and waits for admission (again, after a failed attempt). */
  waiting(call: PlannedCall, promptTokens: number): void;
  admitted(call: PlannedCall): void;
  /** The call is done for good; `servedTokens` (prompt and output) when it completed. */
  settled(call: PlannedCall, servedTokens?: number): void;
  /** Every call of the session has finished. */
  closed(sessionId: string): void;
  refused(call: PlannedCall, reason: string): void;
  /** Adds the state of this moment for the next `dtMs` of service. */
  sample(dtMs: number): void;
  results(
    records: readonly CallRecord[],
    mode: FairnessMode | undefined,
  ): { tenants: Record<string, TenantStats>; fairness: FairnessStats };
}

interface CallState {
  phase: "waiting" | "running";
  /** Prompt plus requested output: what a running call holds when the scheduler shows no footprint. */
  tokens: number;
}

interface SessionTrack {
  tenant: string;
  calls: Map<number, CallState>;
  firstReadyAt?: number;
  firstAdmittedAt?: number;
}

/** A call without a session key is a session of its own. */
function sessionKeyOf(call: PlannedCall): string {
  return call.sessionId ?? `call:${call.id}`;
}

/**
 * Accounts a run's tenants. Service is the footprint a tenant's sessions hold
 * in the window (the scheduler's `footprint_tokens` of an active session, none
 * of a waiting or paused one; for a session the scheduler does not keep, the
 * prompt and requested output of its running calls), integrated over virtual time; it counts toward the shares only while
 * two or more tenants have sessions waiting (a call ready and not admitted, or
 * a paused session).
 */
export function tenantTracker(workload: Workload, scheduler: TrackedScheduler, clock: Clock): TenantTracker {
  const defs = workload.tenants ?? {};
  const names = Object.keys(defs);
  const open = new Map<string, SessionTrack>();
  const tracks = new Map<string, SessionTrack>();
  const contended = new Map<string, number>();
  const whole = new Map<string, number>();
  const served = new Map<string, number>();
  const pauses = new Map<string, Record<string, number>>();
  const refusals = new Map<string, Record<string, number>>();
  const tookPart = new Set<string>();
  let contendedMs = 0;
  const tenantOf = (call: PlannedCall) => call.tenant ?? "default";
  const add = (map: Map<string, number>, key: string, value: number) =>
    map.set(key, (map.get(key) ?? 0) + value);
  const bump = (map: Map<string, Record<string, number>>, key: string, reason: string) => {
    const counts = map.get(key) ?? {};
    counts[reason] = (counts[reason] ?? 0) + 1;
    map.set(key, counts);
  };
  const trackOf = (call: PlannedCall): SessionTrack => {
    const key = sessionKeyOf(call);
    let track = tracks.get(key);
    if (!track) {
      track = { tenant: tenantOf(call), calls: new Map() };
      tracks.set(key, track);
    }
    open.set(key, track);
    return track;
  };

  scheduler.addEvents?.({
    session: (e) => {
      const track = tracks.get(e.id);
      if (!track) return;
      if (e.event === "admitted" && track.firstAdmittedAt === undefined) track.firstAdmittedAt = clock.now();
      if (e.event === "paused") bump(pauses, track.tenant, e.reason ?? "unspecified");
    },
  });

  return {
    waiting(call, promptTokens) {
      const track = trackOf(call);
      track.firstReadyAt ??= clock.now();
      track.calls.set(call.index, { phase: "waiting", tokens: promptTokens + call.maxTokens });
    },
    admitted(call) {
      const track = trackOf(call);
      track.firstAdmittedAt ??= clock.now();
      const state = track.calls.get(call.index);
      if (state) state.phase = "running";
    },
    settled(call, servedTokens) {
      const key = sessionKeyOf(call);
      const track = tracks.get(key);
      track?.calls.delete(call.index);
      if (servedTokens !== undefined) add(served, tenantOf(call), servedTokens);
      if (call.sessionId === undefined) open.delete(key);
    },
    closed(sessionId) {
      open.delete(sessionId);
    },
    refused(call, reason) {
      bump(refusals, tenantOf(call), reason);
    },
    sample(dtMs) {
      const held = new Map<string, number>();
      const waiting = new Set<string>();
      for (const [key, track] of open) {
        const view = key.startsWith("call:") ? undefined : scheduler.getSession?.(key);
        let tokens = 0;
        if (view) tokens = view.state === "active" ? view.footprint_tokens : 0;
        else for (const state of track.calls.values()) if (state.phase === "running") tokens += state.tokens;
        add(held, track.tenant, tokens);
        let waits = view?.state === "paused" || view?.state === "waiting";
        for (const state of track.calls.values()) if (state.phase === "waiting") waits = true;
        if (waits) waiting.add(track.tenant);
      }
      const isContended = waiting.size >= 2;
      if (isContended) contendedMs += dtMs;
      for (const [tenant, tokens] of held) {
        add(whole, tenant, (tokens * dtMs) / 1000);
        if (isContended) {
          add(contended, tenant, (tokens * dtMs) / 1000);
          if (tokens > 0) tookPart.add(tenant);
        }
      }
      if (isContended) for (const tenant of waiting) tookPart.add(tenant);
    },
    results(records, mode) {
      const total = (map: Map<string, number>) => [...map.values()].reduce((a, b) => a + b, 0);
      const contendedTotal = total(contended);
      const wholeTotal = total(whole);
      const servedTotal = total(served);
      const tenants: Record<string, TenantStats> = {};
      for (const tenant of names) {
        const calls = workload.calls.filter((call) => tenantOf(call) === tenant);
        const sessions = new Map<string, { start: number; end: number; complete: boolean }>();
        const ttft: number[] = [];
        for (const call of calls) {
          const record = records[call.index]!;
          const key = sessionKeyOf(call);
          const session = sessions.get(key) ?? { start: Number.POSITIVE_INFINITY, end: 0, complete: true };
          sessions.set(key, session);
          session.start = Math.min(session.start, call.arrivalMs);
          session.end = Math.max(session.end, record.endAt);
          if (record.outcome !== "ok") session.complete = false;
          else ttft.push(((record.firstTokenAt ?? record.endAt) - record.readyAt) / 1000);
        }
        const completion: number[] = [];
        for (const session of sessions.values())
          if (session.complete) completion.push((session.end - session.start) / 1000);
        const admissionWait: number[] = [];
        let neverAdmitted = 0;
        for (const key of sessions.keys()) {
          const track = tracks.get(key);
          if (track?.firstReadyAt === undefined || track.firstAdmittedAt === undefined) neverAdmitted++;
          else admissionWait.push((track.firstAdmittedAt - track.firstReadyAt) / 1000);
        }
        const byReason = pauses.get(tenant) ?? {};
        const rejected: Record<string, number> = {};
        const refused = refusals.get(tenant) ?? {};
        for (const reason of Object.keys(refused).sort()) rejected[reason] = refused[reason]!;
        const def = defs[tenant]!;
        tenants[tenant] = {
          weight: def.weight,
          band: def.band,
          sessions: sessions.size,
          completed: completion.length,
          session_completion_mean_s: round(mean(completion), 3),
          session_completion_p99_s: round(quantile(completion, 0.99), 3),
          ttft_p50_s: round(quantile(ttft, 0.5), 4),
          ttft_p99_s: round(quantile(ttft, 0.99), 4),
          first_admission_wait_p50_s: round(quantile(admissionWait, 0.5), 3),
          first_admission_wait_p99_s: round(quantile(admissionWait, 0.99), 3),
          first_admission_wait_max_s: round(admissionWait.length > 0 ? Math.max(...admissionWait) : 0, 3),
          never_admitted: neverAdmitted,
          service_share: round(contendedTotal > 0 ? (contended.get(tenant) ?? 0) / contendedTotal : 0, 4),
          service_token_s: Math.round(contended.get(tenant) ?? 0),
          service_share_run: round(wholeTotal > 0 ? (whole.get(tenant) ?? 0) / wholeTotal : 0, 4),
          token_share: round(servedTotal > 0 ? (served.get(tenant) ?? 0) / servedTotal : 0, 4),
          pauses: Object.values(byReason).reduce((a, b) => a + b, 0),
          pauses_by_reason: byReason,
          rejected,
        };
      }
      const part = names.filter((tenant) => tookPart.has(tenant));
      const perWeight = part.map((tenant) =>
        contendedTotal > 0 ? (contended.get(tenant) ?? 0) / contendedTotal / defs[tenant]!.weight : 0,
      );
      const lowest = perWeight.length > 0 ? Math.min(...perWeight) : 0;
      const highest = perWeight.length > 0 ? Math.max(...perWeight) : 0;
      return {
        tenants,
        fairness: {
          jain: round(jainIndex(perWeight), 4),
          share_over_weight_max_over_min:
            lowest > 0 ? round(highest / lowest, 3) : perWeight.length > 0 ? null : 1,
          contended_s: round(contendedMs / 1000, 3),
          tenants: part,
          ...(mode !== undefined ? { mode } : {}),
        },
      };
    },
  };
}

function mean(values: readonly number[]): number {
  return values.length > 0 ? values.reduce((a, b) => a + b, 0) / values.length : 0;
}
