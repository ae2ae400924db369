/**
 * @module Every default the scheduler's parts share with its configuration, written once. The config
 * schema (`scheduler-config.ts`) takes its defaults from here and so do the library's constructors, so a
 * part built without the schema (a test, a library user) behaves as the configured scheduler does. This
 * module imports nothing, so any part may import it without a cycle.
 */

/** Share of a replica's KV capacity kept out of every budget and the first token window. */
export const DEFAULT_GUARD_BAND_FRACTION = 0.1;

/** CONCUR's thresholds and multiplicative decrease, shared by the session-count and the token laws. */
export const DEFAULT_WINDOW_LAW = Object.freeze({
  /** β: the window is multiplied by this on thrash. */
  decrease: 0.5,
  /** U_low: KV usage below which the window may grow. */
  kvLow: 0.2,
  /** U_high: KV usage above which a low hit rate is thrash. */
  kvHigh: 0.5,
  /** H_low: prefix hit rate below which high KV usage is thrash. */
  hitLow: 0.2,
});

/** Session admission. */
export const DEFAULT_SESSIONS = Object.freeze({
  /** Quantile of a session's (or the fleet's) idle gaps taken as its retention time. */
  retentionQuantile: 0.99,
  idleTimeoutMs: 120_000,
  queueLimit: 1024,
  waitLimitMs: 600_000,
});

/** The overload stages: window length, consecutive windows per stage, and the objective. */
export const DEFAULT_OVERLOAD = Object.freeze({
  objectiveMs: 2000,
  windowMs: 60_000,
  bulkPauseAfter: 3,
  shedAfter: 2,
  recoverAfter: 5,
  recoverFraction: 0.7,
});

/** HTTP status of a gate rejection (Dynamo's choice: 529, "overloaded"). */
export const DEFAULT_OVERLOAD_STATUS = 529;
