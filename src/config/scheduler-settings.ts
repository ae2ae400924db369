/**
 * @module The scheduler's settings as flags and variables: one entry per
 * flag, each pointing at a field of `schedulerConfigSchema`, whose type,
 * range and default it takes (so the command line accepts exactly what the
 * scheduler does).
 */

import { ConfigError } from "./config-error.js";
import {
  resolveSchedulerConfig,
  type SchedulerConfigInput,
  schedulerConfigSchema,
} from "./scheduler-config.js";
import { defineSetting, fieldSchema, type Setting, type SettingSpec } from "./settings.js";

/** Help topics of the scheduler's settings, in the order help shows them. */
export const TOPICS = {
  policy: "Policy and calls",
  gate: "Gate, per rank",
  lanes: "Lanes and routing",
  window: "Session window",
  tokenWindow: "Token window (--window-unit tokens)",
  sessionWindow: "Session-count window (--window-unit sessions, policy concur)",
  sessions: "Sessions",
  budget: "Token budget",
} as const;

type Entry = Omit<SettingSpec, "path" | "schema"> & { field: string };

/** A setting of the scheduler configuration, at `config.<field>` of the command's options. */
function configSetting(entry: Entry): Setting {
  const { field, ...rest } = entry;
  return defineSetting({
    ...rest,
    path: `config.${field}`,
    schema: fieldSchema(schedulerConfigSchema, field),
  });
}

/** The gate's per-rank limits (docs/configuration.md table): flag, canonical variable and Dynamo alias. */
export const GATE_LIMIT_SETTINGS = {
  engineRequestLimit: configSetting({
    flag: "engine-request-limit",
    field: "gate.engineRequestLimit",
    topic: TOPICS.gate,
    alias: "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT",
    defaultText: "engine max_num_seqs, else 10000",
    help: "admitted calls per rank",
  }),
  engineRequestWaitingLimit: configSetting({
    flag: "engine-request-waiting-limit",
    field: "gate.engineRequestWaitingLimit",
    topic: TOPICS.gate,
    alias: "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT",
    defaultText: "engine max_num_seqs, else 10000",
    help: "admitted calls per rank still before their first token",
  }),
  requestQueueLimit: configSetting({
    flag: "request-queue-limit",
    field: "gate.requestQueueLimit",
    topic: TOPICS.gate,
    alias: "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT",
    defaultText: "2 × engine max_num_seqs, else 20000",
    help: "queued calls per rank; 0: no queue",
  }),
} as const;

/** `--overload-status`. */
export const OVERLOAD_STATUS_SETTING = configSetting({
  flag: "overload-status",
  field: "gate.overloadStatus",
  topic: TOPICS.gate,
  help: "HTTP status of a gate rejection",
});

/** `--default-max-tokens`. */
export const DEFAULT_MAX_TOKENS_SETTING = configSetting({
  flag: "default-max-tokens",
  field: "defaultMaxTokens",
  topic: TOPICS.policy,
  help: "max_tokens of a call that sets none",
});

/** Every scheduler setting `sluice serve` takes, grouped by topic. */
export const SCHEDULER_SETTINGS: readonly Setting[] = [
  configSetting({
    flag: "policy",
    field: "policy",
    topic: TOPICS.policy,
    help: "admission policy; concur is CONCUR's session-count window",
  }),
  configSetting({
    flag: "block-size",
    field: "blockSize",
    topic: TOPICS.policy,
    help: "router block size, tokens",
  }),
  DEFAULT_MAX_TOKENS_SETTING,
  configSetting({
    flag: "context-window",
    field: "contextWindowTokens",
    topic: TOPICS.policy,
    defaultText: "what the engine reports, else 131072",
    help: "context window override, tokens",
  }),
  GATE_LIMIT_SETTINGS.engineRequestLimit,
  GATE_LIMIT_SETTINGS.engineRequestWaitingLimit,
  GATE_LIMIT_SETTINGS.requestQueueLimit,
  OVERLOAD_STATUS_SETTING,
  configSetting({
    flag: "bulk-max-total-tokens",
    field: "lanes.bulkMaxTotalTokens",
    topic: TOPICS.lanes,
    defaultText: "the context window",
    help: "largest input + max_tokens of a call; beyond: 413 overflow",
  }),
  configSetting({
    flag: "budget-queue-limit",
    field: "budget.queueLimit",
    topic: TOPICS.budget,
    help: "calls that may wait for token budget per replica; beyond: 429 token_budget_exhausted (0: refuse at once)",
  }),
  configSetting({
    flag: "budget-head-reserve-ms",
    field: "budget.headReserveMs",
    topic: TOPICS.budget,
    help: "a lane's first waiter for token budget holds its place after this wait: later calls take only budget beside it, ms",
  }),
  configSetting({
    flag: "affinity-break-kv",
    field: "routing.affinityBreakKv",
    topic: TOPICS.lanes,
    help: "KV usage (0-1) at which a pinned replica loses its session",
  }),
  configSetting({
    flag: "affinity-break-ms",
    field: "routing.affinityBreakMs",
    topic: TOPICS.lanes,
    help: "predicted TTFT margin over the best alternative that breaks a pin, ms",
  }),
  configSetting({
    flag: "decode-check",
    field: "disaggregation.decodeCheck",
    topic: TOPICS.lanes,
    help: "prefill/decode fleets: check decode room before prefill on predicted load, current load, or not at all (docs/disaggregated.md)",
  }),
  configSetting({
    flag: "window-unit",
    field: "window.unit",
    topic: TOPICS.window,
    help: "what the window counts: KV tokens of footprint, or sessions (CONCUR's law)",
  }),
  configSetting({
    flag: "window-decrease",
    field: "window.decrease",
    topic: TOPICS.window,
    help: "factor the window is cut by on thrash (β)",
  }),
  configSetting({
    flag: "window-kv-low",
    field: "window.kvLow",
    topic: TOPICS.window,
    help: "KV usage (0-1) below which the window grows (U_low)",
  }),
  configSetting({
    flag: "window-kv-high",
    field: "window.kvHigh",
    topic: TOPICS.window,
    help: "KV usage (0-1) above which a low hit rate cuts the window (U_high)",
  }),
  configSetting({
    flag: "window-hit-low",
    field: "window.hitLow",
    topic: TOPICS.window,
    help: "prefix-cache hit rate (0-1) under which high KV usage cuts the window (H_low)",
  }),
  configSetting({
    flag: "control-interval-ms",
    field: "sessions.controlIntervalMs",
    topic: TOPICS.window,
    help: "window control interval, ms",
  }),
  configSetting({
    flag: "stale-signals",
    field: "sessions.staleSignals",
    topic: TOPICS.window,
    help: "signals older than 5 s: closed refuses new sessions, open admits anyway",
  }),
  configSetting({
    flag: "infer-sessions",
    field: "sessions.infer",
    topic: TOPICS.sessions,
    help: "sessions for calls without a key, inferred from the chain of prompts and returned outputs: on, shadow (report agreement with keys only) or off",
  }),
  configSetting({
    flag: "infer-sessions-capacity",
    field: "sessions.inferCapacity",
    topic: TOPICS.sessions,
    help: "chain points the session inference remembers (LRU; ~250 bytes each)",
  }),
  configSetting({
    flag: "window-hold-within-capacity",
    field: "window.holdWithinCapacity",
    topic: TOPICS.tokenWindow,
    help: "no thrash cut while W is within the KV capacity less the guard band (off: the documented law; docs/tiers.md)",
  }),
  configSetting({
    flag: "window-initial-tokens",
    field: "window.initialTokens",
    topic: TOPICS.tokenWindow,
    defaultText: "the replica's KV capacity less the guard band",
    help: "first window W, tokens",
  }),
  configSetting({
    flag: "window-min-tokens",
    field: "window.minTokens",
    topic: TOPICS.tokenWindow,
    defaultText: "the largest single footprint",
    help: "smallest window (W_min), tokens",
  }),
  configSetting({
    flag: "window-max-tokens",
    field: "window.maxTokens",
    topic: TOPICS.tokenWindow,
    defaultText: "four times the KV capacity",
    help: "largest window (W_max), tokens",
  }),
  configSetting({
    flag: "window-increase-tokens",
    field: "window.increaseTokens",
    topic: TOPICS.tokenWindow,
    defaultText: "KV capacity / 16",
    help: "tokens added per interval after the first cut (α)",
  }),
  configSetting({
    flag: "window-initial",
    field: "window.initial",
    topic: TOPICS.sessionWindow,
    help: "window before the first control step, sessions (kept within min and max when unset)",
  }),
  configSetting({
    flag: "window-min",
    field: "window.min",
    topic: TOPICS.sessionWindow,
    help: "smallest window (W_min), sessions",
  }),
  configSetting({
    flag: "window-max",
    field: "window.max",
    topic: TOPICS.sessionWindow,
    help: "largest window (W_max), sessions",
  }),
  configSetting({
    flag: "window-increase",
    field: "window.increase",
    topic: TOPICS.sessionWindow,
    help: "sessions added per control step while KV usage is low (α)",
  }),
  configSetting({
    flag: "idle-timeout-ms",
    field: "sessions.idleTimeoutMs",
    topic: TOPICS.sessions,
    help: "a session idle this long is closed, ms",
  }),
  configSetting({
    flag: "retention-quantile",
    field: "sessions.retentionQuantile",
    topic: TOPICS.sessions,
    help: "quantile of a session's (or the fleet's) idle gaps taken as its retention time",
  }),
  configSetting({
    flag: "session-queue-limit",
    field: "sessions.queueLimit",
    topic: TOPICS.sessions,
    help: "sessions waiting for a window; beyond: 429 session_queue_full",
  }),
  configSetting({
    flag: "fairness",
    field: "fairness",
    topic: TOPICS.sessions,
    help: "tenants: windows shared among tenants by weight and band; off: arrival order",
  }),
  configSetting({
    flag: "fair-reclaim-after-ms",
    field: "fairReclaimAfterMs",
    topic: TOPICS.sessions,
    help: "wait of a session below its tenant's share before over-share sessions are paused, ms",
  }),
];

/**
 * Checks a configuration built from flags and variables as the scheduler
 * will (ranges and the rules between fields, such as min ≤ max), so start-up
 * fails before anything opens, with the flags named instead of the fields.
 *
 * @throws ConfigError naming the flags involved.
 */
export function checkSchedulerSettings(config: SchedulerConfigInput): void {
  try {
    resolveSchedulerConfig(config);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    let message = error.message;
    // Longest paths first, so `window.initialTokens` is not read as `window.initial`.
    const byPath = [...SCHEDULER_SETTINGS].sort((a, b) => b.path.length - a.path.length);
    for (const setting of byPath) {
      const field = setting.path.replace(/^config\./, "");
      message = message.replace(new RegExp(`\\b${field.replace(/\./g, "\\.")}\\b`, "g"), `--${setting.flag}`);
    }
    throw new ConfigError(message);
  }
}
