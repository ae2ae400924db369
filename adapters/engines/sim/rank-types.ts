/** @module What one rank of the simulated replica reports and needs: its step and call events, its counters, its context. */

import type { Clock } from "../../../src/clock.js";
import type { FinishReason } from "../../../src/engine.js";
import type { KvBlockEvent } from "./block-pool.js";
import type { SimParams } from "./presets.js";
import type { VocabularyEntry } from "./vocabulary.js";

/** One engine step (or a run of identical-shape decode steps simulated in one timer). */
export interface SimStepEvent {
  rank: number;
  /** Start of the first step, clock ms. */
  startMs: number;
  /** End of the last step, clock ms. */
  endMs: number;
  /** Steps covered: 1, or more for a run of pure-decode steps. */
  steps: number;
  /** Uncached prefill tokens computed (P). */
  prefillTokens: number;
  /** Decode sequences per step (D). */
  decodeSeqs: number;
  /** Σ context tokens of the decode sequences in the first step covered (K; grows by D per step). */
  decodeContextTokens: number;
  /** Σ t_i·(s_i + t_i/2) over prefill chunks. */
  prefillPairs: number;
  /** Tokens loaded from the host tier (prefix hits there), 0 without one. */
  hostLoadTokens: number;
  /** Calls preempted while scheduling this step. */
  preempted: number;
  /** Calls running and waiting once the step was scheduled. */
  running: number;
  waiting: number;
}

/** Something that happened to one call, with the clock time it happened at. */
export interface SimCallEvent {
  type: "arrival" | "scheduled" | "first_token" | "preempted" | "finished";
  requestId: string;
  rank: number;
  atMs: number;
  /** For `scheduled`: prompt tokens served from the prefix cache (GPU and host tiers). */
  cachedTokens?: number;
  /** For `scheduled`: of those, tokens loaded from the host tier. */
  hostCachedTokens?: number;
  /** For `finished`. */
  finishReason?: FinishReason;
  /** For `finished`: tokens generated. */
  completionTokens?: number;
}

/** Cumulative counters of one rank. */
export interface RankCounters {
  steps: number;
  timers: number;
  busyMs: number;
  prefillTokens: number;
  decodeTokens: number;
  recomputedTokens: number;
  preemptions: number;
  finished: number;
  aborted: number;
  /** Prompt tokens looked up in the GPU prefix cache, at each call's first scheduling. */
  prefixQueryTokens: number;
  /** Of those, tokens found in the GPU prefix cache. */
  prefixHitTokens: number;
  /** Prompt tokens looked up in the host tier (the prompt less its GPU hits), at first scheduling. */
  hostQueryTokens: number;
  /** Of those, tokens found in the host tier. */
  hostHitTokens: number;
  /** Tokens loaded from the host tier, resumed preempted calls included. */
  hostLoadedTokens: number;
  /** Time spent loading them, ms. */
  hostLoadMs: number;
  /** Blocks written to the host tier when evicted from GPU memory. */
  hostStoredBlocks: number;
  promptTokens: number;
  generationTokens: number;
}

/** What a rank needs from its engine. */
export interface RankContext {
  rank: number;
  clock: Clock;
  params: SimParams;
  vocabulary: readonly VocabularyEntry[];
  /** Simulate runs of pure-decode steps in one timer (virtual time). */
  skipDecodeSteps: boolean;
  onStep?: ((event: SimStepEvent) => void) | undefined;
  onCall?: ((event: SimCallEvent) => void) | undefined;
  onKvEvent?: ((rank: number, event: KvBlockEvent) => void) | undefined;
  onHostKvEvent?: ((rank: number, event: KvBlockEvent) => void) | undefined;
}

/** A rank's counters before its first call. */
export function emptyRankCounters(): RankCounters {
  return {
    steps: 0,
    timers: 0,
    busyMs: 0,
    prefillTokens: 0,
    decodeTokens: 0,
    recomputedTokens: 0,
    preemptions: 0,
    finished: 0,
    aborted: 0,
    prefixQueryTokens: 0,
    prefixHitTokens: 0,
    hostQueryTokens: 0,
    hostHitTokens: 0,
    hostLoadedTokens: 0,
    hostLoadMs: 0,
    hostStoredBlocks: 0,
    promptTokens: 0,
    generationTokens: 0,
  };
}
