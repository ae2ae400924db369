/** @module Resolves the gate's per-rank limits from flags, environment and the engine's capacity (SPEC 9). */

import { ConfigError } from "./config-error.js";

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

interface Setting {
  key: keyof GateLimits;
  flag: string;
  canonical: string;
  alias: string;
  /** Smallest accepted value: 1 for engine limits, 0 for the queue. */
  min: number;
  /** Default from the engine's `max_num_seqs`. */
  fromEngine: (maxNumSeqs: number) => number;
  fallback: number;
}

const SETTINGS: readonly Setting[] = [
  {
    key: "engineRequestLimit",
    flag: "--engine-request-limit",
    canonical: "SLUICE_ENGINE_REQUEST_LIMIT",
    alias: "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT",
    min: 1,
    fromEngine: (n) => n,
    fallback: 10_000,
  },
  {
    key: "engineRequestWaitingLimit",
    flag: "--engine-request-waiting-limit",
    canonical: "SLUICE_ENGINE_REQUEST_WAITING_LIMIT",
    alias: "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT",
    min: 1,
    fromEngine: (n) => n,
    fallback: 10_000,
  },
  {
    key: "requestQueueLimit",
    flag: "--request-queue-limit",
    canonical: "SLUICE_REQUEST_QUEUE_LIMIT",
    alias: "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT",
    min: 0,
    fromEngine: (n) => 2 * n,
    fallback: 20_000,
  },
];

/** The flag, canonical variable and Dynamo alias of each limit, for help texts and docs. */
export const GATE_LIMIT_SOURCES: ReadonlyArray<{
  key: keyof GateLimits;
  flag: string;
  env: string;
  alias: string;
}> = SETTINGS.map(({ key, flag, canonical, alias }) => ({ key, flag, env: canonical, alias }));

/**
 * Parses a whole number written in decimal digits, spaces around it allowed.
 * Returns undefined for anything else (signs, fractions, exponents, empty).
 */
function parseCount(raw: string, min: number): number | undefined {
  const text = raw.trim();
  if (!/^[0-9]+$/.test(text)) return undefined;
  const value = Number(text);
  if (!Number.isSafeInteger(value) || value < min) return undefined;
  return value;
}

function expectation(min: number): string {
  return min >= 1 ? "a positive integer" : "a non-negative integer";
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
  const maxNumSeqs = input.engine?.maxNumSeqs;
  const engineKnown = typeof maxNumSeqs === "number" && Number.isSafeInteger(maxNumSeqs) && maxNumSeqs >= 1;

  const limits = {} as GateLimits;
  const sources = {} as Record<keyof GateLimits, GateLimitSource>;
  for (const setting of SETTINGS) {
    const resolved = resolveOne(setting, flags[setting.key], env, warn, engineKnown ? maxNumSeqs : undefined);
    limits[setting.key] = resolved.value;
    sources[setting.key] = resolved.source;
  }
  return { limits, sources };
}

/**
 * Resolves the gate's per-rank limits (SPEC 3.2 and 9).
 *
 * @throws ConfigError when a flag is given with an invalid value; an invalid
 *   environment value is reported through `warn` and the next source is used.
 */
export function resolveGateLimits(input: GateLimitsInput = {}): GateLimits {
  return resolveGateLimitsWithSources(input).limits;
}

function resolveOne(
  setting: Setting,
  flagValue: string | undefined,
  env: Record<string, string | undefined>,
  warn: (message: string) => void,
  maxNumSeqs: number | undefined,
): { value: number; source: GateLimitSource } {
  if (flagValue !== undefined) {
    const value = typeof flagValue === "string" ? parseCount(flagValue, setting.min) : undefined;
    if (value === undefined) {
      throw new ConfigError(
        `${setting.flag} takes ${expectation(setting.min)}, got ${JSON.stringify(flagValue)}`,
        { flag: setting.flag, value: flagValue },
      );
    }
    return { value, source: "flag" };
  }
  for (const [variable, source] of [
    [setting.canonical, "env"],
    [setting.alias, "alias"],
  ] as const) {
    const raw = env[variable];
    if (raw === undefined) continue;
    const value = parseCount(raw, setting.min);
    if (value !== undefined) return { value, source };
    warn(
      `ignoring ${variable}=${JSON.stringify(raw)}: expected ${expectation(setting.min)}; ` +
        `falling back to ${source === "env" ? `${setting.alias} or the default` : "the default"}`,
    );
  }
  if (maxNumSeqs !== undefined) return { value: setting.fromEngine(maxNumSeqs), source: "engine" };
  return { value: setting.fallback, source: "default" };
}
