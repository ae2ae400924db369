/** @module The library API of sluice (docs/library.md): re-exports only. */

export * from "./budget/index.js";
export { type Cancel, type Clock, flushMicrotasks, RealClock, realClock, VirtualClock } from "./clock.js";
export { ConfigError } from "./config/config-error.js";
export { type GateLimits, resolveGateLimits } from "./config/gate-limits.js";
export {
  POLICIES,
  type Policy,
  resolveSchedulerConfig,
  type SchedulerConfig,
  type SchedulerConfigInput,
} from "./config/scheduler-config.js";
export * from "./engine.js";
export * from "./errors.js";
export * from "./gate/index.js";
export {
  BlockHasher,
  blockHashes,
  blockHashesFrom,
  extendBlockHashes,
  longestPrefixMatch,
} from "./routing/block-hash.js";
export {
  type BlockTier,
  FleetPrefixIndex,
  type FleetPrefixIndexOptions,
  type FleetPrefixIndexStats,
} from "./routing/fleet-prefix-index.js";
export {
  choosePlacement,
  keepPin,
  type Placement,
  type PlacementCandidate,
  type PlacementInput,
} from "./routing/placement.js";
export { PrefixIndex } from "./routing/prefix-index.js";
export { type IdleCheck, Scheduler, type SchedulerOptions } from "./scheduler.js";
export {
  type AimdAction,
  type AimdOptions,
  AimdWindow,
  DEFAULT_AIMD_OPTIONS,
} from "./sessions/aimd-window.js";
export {
  SessionAdmission,
  type SessionAdmissionOptions,
  type SessionRecord,
} from "./sessions/session-admission.js";
export {
  resolveTokenWindowOptions,
  stepTokenWindow,
  TokenWindow,
  type TokenWindowAction,
  type TokenWindowOptions,
  type TokenWindowSignal,
  type TokenWindowState,
} from "./sessions/token-window.js";
export * from "./signals/index.js";
export type { Tokenizer } from "./tokenizer.js";
export { PromptTokenizer, type PromptTokenizerStats } from "./tokens/prompt-tokenizer.js";
export type * from "./types.js";
