/**
 * @module The scheduler's configuration: one zod schema with every default,
 * validated once at start-up. Where a component exports its own defaults
 * (the AIMD law, the lanes, staleness), the schema takes them from there, so
 * each default is written once. The command line, the variables and
 * docs/configuration.md are derived from this schema (scheduler-settings.ts).
 */

import { z } from "zod";
import { DEFAULT_BUDGET_HEAD_RESERVE_MS, DEFAULT_BUDGET_QUEUE_LIMIT } from "../budget/budget-queue.js";
import { DEFAULT_LANE_LIMITS } from "../budget/classify-lane.js";
import { DEFAULT_AIMD_OPTIONS } from "../sessions/aimd-window.js";
import { DEFAULT_INFERENCE_CAPACITY, INFERENCE_MODES } from "../sessions/session-inference.js";
import { DEFAULT_STALE_AFTER_MS } from "../signals/staleness.js";
import {
  DEFAULT_GUARD_BAND_FRACTION,
  DEFAULT_OVERLOAD,
  DEFAULT_OVERLOAD_STATUS,
  DEFAULT_SESSIONS,
} from "./defaults.js";

const positiveInt = z.number().int().positive();
const nonNegativeInt = z.number().int().nonnegative();
const fraction = z.number().min(0).max(1);
const ms = z.number().nonnegative();

/** Policies the scheduler can run; the baselines go through the same code. */
export const POLICIES = ["rr", "gate", "gate-prefix", "concur", "sluice"] as const;
export type Policy = (typeof POLICIES)[number];

/** What a session window counts: KV tokens of cache footprint (docs/how-it-works.md#session-window-tokens-of-cache-footprint), or sessions (CONCUR's law). */
export const WINDOW_UNITS = ["tokens", "sessions"] as const;
export type WindowUnit = (typeof WINDOW_UNITS)[number];

/** How a call to a disaggregated fleet is checked against the decode pool (`disaggregation.decodeCheck`). */
export const DECODE_CHECKS = ["predicted", "current", "none"] as const;
export type DecodeCheck = (typeof DECODE_CHECKS)[number];

/** Priority bands of tenants, in strict order (docs/tenants.md). */
export const BANDS = ["protected", "standard", "sheddable"] as const;
export type Band = (typeof BANDS)[number];

/** One tenant's share of the fleet's windows: weight, band and an optional cap (docs/tenants.md). */
export const tenantSchema = z.strictObject({
  /** Weight of its share, > 0. Default 1. */
  weight: z.number().positive().finite().optional(),
  /** Its band. Default `standard`. */
  band: z.enum(BANDS).optional(),
  /** Largest share of the fleet's total window it may be entitled to, in (0, 1]. */
  max_share: z.number().gt(0).max(1).optional(),
});
export type TenantSpec = z.output<typeof tenantSchema>;

/** `--tenants FILE`: tenant name → its share. */
export const tenantsSchema = z.record(z.string().min(1), tenantSchema);

const laneQueue = z.strictObject({
  /** Lane queue limit; undefined follows the gate's request queue limit. */
  queueLimit: nonNegativeInt.optional(),
  /** Longest a call may wait in this lane's queue before a 429 `queue_timeout`, ms. */
  maxResidenceMs: ms,
  /** Time-to-first-token deadline of the lane for the feasibility check, ms. */
  deadlineMs: ms,
});

export const schedulerConfigSchema = z.strictObject({
  policy: z.enum(POLICIES).default("sluice"),
  /** `tenants`: the windows are shared among tenants by weight and band; `off`: arrival order. */
  fairness: z.enum(["tenants", "off"]).default("tenants"),
  /** Tenants with a weight, band or cap; a tenant not named here has weight 1, band `standard`. */
  tenants: tenantsSchema.default({}),
  /** How long a session of a tenant below its entitlement (or of a higher band) waits before others are paused for it, ms. */
  fairReclaimAfterMs: ms.default(5000),
  /** Router block size in tokens (docs/routing.md). */
  blockSize: positiveInt.default(64),
  /** `max_tokens` of a call that sets none. */
  defaultMaxTokens: positiveInt.default(1024),
  /** Context window override in tokens; undefined takes what the engine reports (or 131072). */
  contextWindowTokens: positiveInt.optional(),
  gate: z
    .strictObject({
      engineRequestLimit: positiveInt.optional(),
      engineRequestWaitingLimit: positiveInt.optional(),
      requestQueueLimit: nonNegativeInt.optional(),
      /** HTTP status of a gate rejection. */
      overloadStatus: z.number().int().min(400).max(599).default(DEFAULT_OVERLOAD_STATUS),
    })
    .prefault({}),
  lanes: z
    .strictObject({
      interactiveMaxInputTokens: positiveInt.default(DEFAULT_LANE_LIMITS.interactiveMaxInputTokens),
      interactiveMaxOutputTokens: positiveInt.default(DEFAULT_LANE_LIMITS.interactiveMaxOutputTokens),
      /** Largest input + max_tokens of any call; undefined takes the context window. */
      bulkMaxTotalTokens: positiveInt.optional(),
      interactive: laneQueue.partial().prefault({}),
      bulk: laneQueue.partial().prefault({}),
      bulkFloorShare: fraction.default(0.1),
      bulkMaxShare: fraction.default(0.5),
      shareWindowMs: ms.default(60_000),
    })
    .prefault({}),
  budget: z
    .strictObject({
      /** KV ceiling in tokens; undefined takes the engine's KV capacity. */
      ceilingTokens: positiveInt.optional(),
      guardBandFraction: fraction.default(DEFAULT_GUARD_BAND_FRACTION),
      /** Calls that may wait for budget on one replica; beyond: 429 `token_budget_exhausted`. 0: no waiting. */
      queueLimit: nonNegativeInt.default(DEFAULT_BUDGET_QUEUE_LIMIT),
      /** A lane's head waiting longer than this holds its place in the budget queue, ms. */
      headReserveMs: ms.default(DEFAULT_BUDGET_HEAD_RESERVE_MS),
    })
    .prefault({}),
  window: z
    .strictObject({
      /** `tokens`: the documented token window; `sessions`: CONCUR's session-count law (also policy `concur`). */
      unit: z.enum(WINDOW_UNITS).default("tokens"),
      /** Session-count law: window before the first control step, sessions. */
      initial: positiveInt.default(DEFAULT_AIMD_OPTIONS.initial),
      min: positiveInt.default(DEFAULT_AIMD_OPTIONS.min),
      max: positiveInt.default(DEFAULT_AIMD_OPTIONS.max),
      increase: positiveInt.default(DEFAULT_AIMD_OPTIONS.increase),
      decrease: z.number().gt(0).lt(1).default(DEFAULT_AIMD_OPTIONS.decrease),
      kvLow: fraction.default(DEFAULT_AIMD_OPTIONS.kvLow),
      kvHigh: fraction.default(DEFAULT_AIMD_OPTIONS.kvHigh),
      hitLow: fraction.default(DEFAULT_AIMD_OPTIONS.hitLow),
      /** Token law: first W, tokens; undefined: the replica's KV capacity less the guard band. */
      initialTokens: positiveInt.optional(),
      /** Token law: smallest W, tokens; undefined: the largest single footprint. */
      minTokens: positiveInt.optional(),
      /** Token law: largest W, tokens; undefined: four times the KV capacity. */
      maxTokens: positiveInt.optional(),
      /** Token law: α, tokens added per interval after the first cut; undefined: KV capacity / 16. */
      increaseTokens: positiveInt.optional(),
      /**
       * Token law: no thrash cut while W is within the KV capacity less the guard band (its
       * sessions' contexts all fit the cache, so what they lose was pushed out by calls the window
       * does not govern). Off by default: docs/how-it-works.md#session-window-tokens-of-cache-footprint cuts W on thrash wherever it stands.
       */
      holdWithinCapacity: z.boolean().default(false),
    })
    .prefault({}),
  sessions: z
    .strictObject({
      controlIntervalMs: z.number().positive().default(2000),
      idleTimeoutMs: z.number().positive().default(DEFAULT_SESSIONS.idleTimeoutMs),
      /** Quantile of a session's (or the fleet's) idle gaps taken as its retention time (docs/how-it-works.md#session-window-tokens-of-cache-footprint). */
      retentionQuantile: z.number().gt(0).max(1).default(DEFAULT_SESSIONS.retentionQuantile),
      queueLimit: nonNegativeInt.default(DEFAULT_SESSIONS.queueLimit),
      waitLimitMs: ms.default(DEFAULT_SESSIONS.waitLimitMs),
      staleSignals: z.enum(["closed", "open"]).default("closed"),
      staleAfterMs: z.number().positive().default(DEFAULT_STALE_AFTER_MS),
      /** Inferred sessions for calls without a key (docs/routing.md): `on`, `shadow` (report only) or `off`. */
      infer: z.enum(INFERENCE_MODES).default("on"),
      /** Chain points the inference remembers (LRU), ~250 bytes each. */
      inferCapacity: positiveInt.default(DEFAULT_INFERENCE_CAPACITY),
    })
    .prefault({}),
  routing: z
    .strictObject({
      affinityBreakKv: fraction.default(0.85),
      affinityBreakMs: ms.default(5000),
      busyMarkMs: ms.default(1000),
    })
    .prefault({}),
  disaggregation: z
    .strictObject({
      /**
       * How a call to a prefill/decode fleet is checked against the decode pool before its prefill:
       * `predicted` (decode room and batch slot at the moment its KV will have arrived, counting calls
       * already admitted), `current` (the decode replicas' KV usage as last measured), `none` (no check
       * before prefill). With `current` and `none` the call is checked again on current load when it
       * reaches decode, and one refused there has wasted its prefill. The last two are for comparison.
       */
      decodeCheck: z.enum(DECODE_CHECKS).default("predicted"),
    })
    .prefault({}),
  overload: z
    .strictObject({
      /** Interactive queue-age objective (p95 per window), ms. */
      objectiveMs: z.number().positive().default(DEFAULT_OVERLOAD.objectiveMs),
      windowMs: z.number().positive().default(DEFAULT_OVERLOAD.windowMs),
      bulkPauseAfter: positiveInt.default(DEFAULT_OVERLOAD.bulkPauseAfter),
      shedAfter: positiveInt.default(DEFAULT_OVERLOAD.shedAfter),
      recoverAfter: positiveInt.default(DEFAULT_OVERLOAD.recoverAfter),
      recoverFraction: fraction.default(DEFAULT_OVERLOAD.recoverFraction),
    })
    .prefault({}),
});

/** Configuration as given: every field optional. */
export type SchedulerConfigInput = z.input<typeof schedulerConfigSchema>;
/** Configuration with every default filled in. */
export type SchedulerConfig = z.output<typeof schedulerConfigSchema>;

export const LANE_DEFAULTS = {
  interactive: { maxResidenceMs: 10_000, deadlineMs: 10_000 },
  bulk: { maxResidenceMs: 300_000, deadlineMs: 300_000 },
} as const;

/** Validates a configuration and fills in defaults; throws a `RangeError` naming every bad field. */
export function resolveSchedulerConfig(input: SchedulerConfigInput = {}): SchedulerConfig {
  const parsed = schedulerConfigSchema.safeParse(input);
  if (!parsed.success)
    throw new RangeError(`invalid scheduler configuration: ${z.prettifyError(parsed.error)}`);
  const config = parsed.data;
  if (config.window.min > config.window.max) {
    throw new RangeError(
      `window.min (${config.window.min}) must not exceed window.max (${config.window.max})`,
    );
  }
  if (input.window?.initial === undefined) {
    // The default initial window (8) follows a window narrowed or raised around it.
    config.window.initial = Math.min(config.window.max, Math.max(config.window.min, config.window.initial));
  } else if (config.window.initial < config.window.min || config.window.initial > config.window.max) {
    throw new RangeError(
      `window.initial (${config.window.initial}) must be within window.min (${config.window.min}) and window.max (${config.window.max})`,
    );
  }
  const { minTokens, maxTokens } = config.window;
  if (minTokens !== undefined && maxTokens !== undefined && minTokens > maxTokens) {
    throw new RangeError(`window.minTokens (${minTokens}) must not exceed window.maxTokens (${maxTokens})`);
  }
  if (config.window.kvLow > config.window.kvHigh) {
    throw new RangeError(
      `window.kvLow (${config.window.kvLow}) must not exceed window.kvHigh (${config.window.kvHigh})`,
    );
  }
  return config;
}
