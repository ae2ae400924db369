/** @module The simulated vLLM-like replica: engine, HTTP server, presets (the folder's public surface). */

export { BlockPool, type KvBlockEvent } from "./block-pool.js";
export { createSimApp, type SimServer, type SimServerOptions, startSimServer } from "./http-server.js";
export { createSimRegistry } from "./metrics.js";
export {
  DEFAULT_PRESET,
  isPresetName,
  PRESET_MODELS,
  PRESETS,
  type PresetName,
  type PresetOverrides,
  prefillTokensPerSecond,
  resolveSimParams,
  type SimParams,
  type StepShape,
  stepTimeMs,
} from "./presets.js";
export type { RankCounters, SimCallEvent, SimStepEvent } from "./rank-types.js";
export { SimEngine, type SimEngineOptions } from "./sim-engine.js";
export type { RankSignals, SimStats } from "./sim-signals.js";
export { DEFAULT_VOCABULARY, type VocabularyEntry, vocabularyFromTokenizer, WORDS } from "./vocabulary.js";
