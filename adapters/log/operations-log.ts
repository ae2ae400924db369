/** @module What sluice tells its operator: start-up, operator events (window, stage, health), and a sampled access and refusal log. */

import type { Clock } from "../../src/clock.js";
import type { OperatorEvent } from "../dashboard/history.js";
import type { Logger } from "./logger.js";

/** What start-up says: where to look and what is being served. */
export interface StartupFacts {
  url: string;
  policy: string;
  upstreams: string;
  models: string[];
  /** Per replica: what its engine reported (KV capacity, max_num_seqs, data-parallel ranks) and the limits in force. */
  replicas: Record<string, unknown>[];
  limits: Record<string, unknown>;
  nats?: string | undefined;
}

/** Logs the start-up line an operator looks for first: the URLs of the API, dashboard and metrics, and the limits. */
export function logStartup(logger: Logger, facts: StartupFacts): void {
  logger.info(
    {
      api: `${facts.url}/v1`,
      dashboard: `${facts.url}/dashboard`,
      metrics: `${facts.url}/metrics`,
      policy: facts.policy,
      upstreams: facts.upstreams,
      models: facts.models,
      replicas: facts.replicas,
      limits: facts.limits,
      ...(facts.nats ? { nats: facts.nats } : {}),
    },
    `sluice listening on ${facts.url} (dashboard ${facts.url}/dashboard, metrics ${facts.url}/metrics)`,
  );
}

/** Minimum gap between two `info` lines for W growing on one replica, ms. */
export const WINDOW_GROWTH_LOG_INTERVAL_MS = 30_000;

/**
 * Writes operator events (window law decisions, pauses, dormancies, stage and
 * health changes) with their cause. A cut of W, a stage or a health change
 * is always news; W growing (slow start doubles it every control interval)
 * is written at `info` at most every 30 s per replica, the rest at `debug`,
 * and pauses and dormancies (by the hundred under load) at `debug`.
 */
export function operatorEventLog(logger: Logger, clock: Clock): (event: OperatorEvent) => void {
  const lastGrowthLine = new Map<string, number>();
  return function logOperatorEvent(event: OperatorEvent): void {
    const fields = { event: event.kind, replica: event.replica ?? undefined, cause: event.cause };
    if (event.kind === "session") {
      logger.debug(fields, event.text);
      return;
    }
    if (event.kind === "window" && event.action === "increase") {
      const key = event.replica ?? "";
      const now = clock.now();
      const last = lastGrowthLine.get(key);
      if (last !== undefined && now - last < WINDOW_GROWTH_LOG_INTERVAL_MS) {
        logger.debug(fields, event.text);
        return;
      }
      lastGrowthLine.set(key, now);
    } else if (event.kind === "window") {
      // After a cut, the next growth is news again.
      lastGrowthLine.delete(event.replica ?? "");
    }
    if (event.level === "warn") logger.warn(fields, event.text);
    else logger.info(fields, event.text);
  };
}

/** One served or refused call, as the access log sees it. */
export interface AccessRecord {
  requestId: string;
  method: string;
  path: string;
  status: number;
  /** The refusal's reason; absent for a served call. */
  reason?: string | undefined;
  lane?: string | undefined;
  replica?: string | undefined;
  session?: string | undefined;
  queueMs?: number | undefined;
  durationMs?: number | undefined;
  message?: string | undefined;
}

/** Options of `AccessLog`. */
export interface AccessLogOptions {
  /** Time source for the sampling windows. */
  clock: Clock;
  /** Lines per second written for each refusal reason (and for served calls); the rest are counted. Default 1. */
  perSecond?: number;
}

/**
 * A sampled access and refusal log. Every call is written at `debug`; at
 * `info` (served) and `warn` (refused) at most `perSecond` lines per second
 * are written per refusal reason (served calls share one budget), each
 * saying how many like it were left out since the last one — so a storm of
 * a thousand refusals costs a line a second and still shows its size.
 */
export class AccessLog {
  private readonly clock: Clock;
  private readonly perSecond: number;
  private readonly windows = new Map<string, { startedAt: number; written: number; skipped: number }>();

  constructor(
    private readonly logger: Logger,
    options: AccessLogOptions,
  ) {
    this.clock = options.clock;
    this.perSecond = options.perSecond ?? 1;
    if (!(Number.isInteger(this.perSecond) && this.perSecond >= 1))
      throw new RangeError(`perSecond must be a positive integer, got ${this.perSecond}`);
  }

  record(entry: AccessRecord): void {
    const refused = entry.reason !== undefined;
    const fields = {
      request_id: entry.requestId,
      method: entry.method,
      path: entry.path,
      status: entry.status,
      ...(entry.reason ? { reason: entry.reason } : {}),
      ...(entry.lane ? { lane: entry.lane } : {}),
      ...(entry.replica ? { replica: entry.replica } : {}),
      ...(entry.session ? { session: entry.session } : {}),
      ...(entry.queueMs !== undefined ? { queue_ms: Math.round(entry.queueMs) } : {}),
      ...(entry.durationMs !== undefined ? { duration_ms: Math.round(entry.durationMs) } : {}),
    };
    const text = refused ? `refused ${entry.status} ${entry.reason}: ${entry.message ?? ""}` : "served";
    const level = refused ? "warn" : "info";
    if (!this.logger.isLevelEnabled(level)) {
      this.logger.debug(fields, text);
      return;
    }
    const key = refused ? `refused:${entry.reason}` : "served";
    const now = this.clock.now();
    let window = this.windows.get(key);
    if (!window || now - window.startedAt >= 1000) {
      window = { startedAt: now, written: 0, skipped: window?.skipped ?? 0 };
      this.windows.set(key, window);
    }
    if (window.written < this.perSecond) {
      window.written++;
      const skipped = window.skipped;
      window.skipped = 0;
      this.logger[level]({ ...fields, ...(skipped > 0 ? { unlogged_since_last: skipped } : {}) }, text);
    } else {
      window.skipped++;
      this.logger.debug(fields, text);
    }
  }
}
