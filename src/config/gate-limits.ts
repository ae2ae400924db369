/** @module Resolves the gate's per-rank limits from flags, environment and the engine's capacity (docs/configuration.md). */

import { GATE_LIMIT_SETTINGS } from "./scheduler-settings.js";
import { invalidFlag, resolveSetting } from "./settings.js";

/** Per-rank gate limits: calls (`engineRequestLimit`, `engineRequestWaitingLimit`) and queue places. */
export interface GateLimits {
  /** Admitted calls per rank, ≥ 1. */
  engineRequestLimit: number;
  /** Admitted calls per rank still before their first token, ≥ 1. */
  engineRequestWaitingLimit: number;
  /** Queued calls per rank, ≥ 0 (0: no queueing). */
  requestQueueLimit: number;
}

/** Where a resolved value came from. */
export type GateLimitSource = "flag" | "env" | "alias" | "engine" | "default";

export interface GateLimitsInput {
  /** Raw command-line values (as typed, before any parsing). */
  flags?: { engineRequestLimit?: string; engineRequestWaitingLimit?: string; requestQueueLimit?: string };
  /** The process environment (or a stand-in). */
  env?: Record<string, string | undefined>;
  /** What the engine reported; `maxNumSeqs` sets the defaults. */
  engine?: { maxNumSeqs?: number };
  /** Receives one message per invalid environment value, naming the variable. */
  warn?: (message: string) => void;
}

/** The static default of each limit, before the engine reports its capacity. */
const FALLBACK: GateLimits = {
  engineRequestLimit: 10_000,
  engineRequestWaitingLimit: 10_000,
  requestQueueLimit: 20_000,
};

/** Defaults from the engine's `max_num_seqs`: limits = n, queue = 2n. */
const FROM_ENGINE: Record<keyof GateLimits, (maxNumSeqs: number) => number> = {
  engineRequestLimit: (n) => n,
  engineRequestWaitingLimit: (n) => n,
  requestQueueLimit: (n) => 2 * n,
};

const KEYS = Object.keys(GATE_LIMIT_SETTINGS) as (keyof GateLimits)[];

/** The flag, canonical variable and Dynamo alias of each limit, for help texts and docs. */
export const GATE_LIMIT_SOURCES: ReadonlyArray<{
  key: keyof GateLimits;
  flag: string;
  env: string;
  alias: string;
}> = KEYS.map((key) => {
  const setting = GATE_LIMIT_SETTINGS[key];
  return { key, flag: `--${setting.flag}`, env: setting.env!, alias: setting.alias! };
});

function usableMaxNumSeqs(maxNumSeqs: number | undefined): number | undefined {
  return typeof maxNumSeqs === "number" && Number.isSafeInteger(maxNumSeqs) && maxNumSeqs >= 1
    ? maxNumSeqs
    : undefined;
}

/**
 * The limits from values already validated (the scheduler configuration):
 * each given value stays fixed, the others follow the engine's `maxNumSeqs`,
 * else 10000 / 10000 / 20000.
 */
export function gateLimitsFromConfig(
  configured: Partial<GateLimits>,
  engine: { maxNumSeqs?: number } = {},
): GateLimits {
  const maxNumSeqs = usableMaxNumSeqs(engine.maxNumSeqs);
  const limits = {} as GateLimits;
  for (const key of KEYS) {
    limits[key] =
      configured[key] ?? (maxNumSeqs !== undefined ? FROM_ENGINE[key](maxNumSeqs) : FALLBACK[key]);
  }
  return limits;
}

/**
 * Resolves the limits and reports where each came from. Per setting, the first
 * valid source wins: flag, canonical env, Dynamo alias env, the engine's
 * `maxNumSeqs` (limits = maxNumSeqs, queue = 2 × maxNumSeqs), then
 * 10000 / 10000 / 20000. Settings are independent of each other.
 *
 * @throws ConfigError when a flag is given with an invalid value.
 */
export function resolveGateLimitsWithSources(input: GateLimitsInput = {}): {
  limits: GateLimits;
  sources: Record<keyof GateLimits, GateLimitSource>;
} {
  const flags = input.flags ?? {};
  const env = input.env ?? {};
  const warn = input.warn ?? (() => {});
  const maxNumSeqs = usableMaxNumSeqs(input.engine?.maxNumSeqs);
  const configured: Partial<GateLimits> = {};
  const sources = {} as Record<keyof GateLimits, GateLimitSource>;
  for (const key of KEYS) {
    const flag = flags[key];
    // A flag that is not text (a caller passing a number) is invalid, as any other bad flag.
    if (flag !== undefined && typeof flag !== "string")
      throw invalidFlag(GATE_LIMIT_SETTINGS[key], String(flag));
    const found = resolveSetting(GATE_LIMIT_SETTINGS[key], flag, env, warn);
    if (found) configured[key] = found.value as number;
    sources[key] = found ? found.source : maxNumSeqs !== undefined ? "engine" : "default";
  }
  return {
    limits: gateLimitsFromConfig(configured, { ...(maxNumSeqs !== undefined ? { maxNumSeqs } : {}) }),
    sources,
  };
}

/**
 * Resolves the gate's per-rank limits (docs/library.md and docs/configuration.md).
 *
 * @throws ConfigError when a flag is given with an invalid value; an invalid
 *   environment value is reported through `warn` and the next source is used.
 */
export function resolveGateLimits(input: GateLimitsInput = {}): GateLimits {
  return resolveGateLimitsWithSources(input).limits;
}
