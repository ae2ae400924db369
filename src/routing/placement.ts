/**
 * @module Placement (docs/routing.md): predicted time to first token per replica and the choice among them.
 * Pure functions over a snapshot; the router owns the state (indexes, pins, busy marks).
 */

import { reservationTokens } from "../budget/token-budget.js";

/**
 * What placement asks of a prefix index: every replica's longest prefix in one call, and one
 * replica's alone. `FleetPrefixIndex` is the one the router keeps.
 */
export interface PrefixMatcher {
  /** Blocks of `hashes` each replica holds as an unbroken prefix (replicas with none left out); with `gpuBlocks`, how many of them are in GPU memory. */
  match(hashes: readonly string[], gpuBlocks?: Map<string, number>): Map<string, number>;
  /** One replica's longest prefix of `hashes`, in blocks; with `tiers`, how many of them are in GPU memory. */
  matchReplica(replica: string, hashes: readonly string[], tiers?: { gpuBlocks: number }): number;
}

/** What the TTFT prediction needs to know about one replica. */
export interface TtftInput {
  /** Prompt tokens this replica would have to compute (not in its prefix cache). */
  uncachedPrefillTokens: number;
  /** Prefill tokens of calls queued for this replica (sluice's queues and the engine's waiting). */
  queuedPrefillTokens: number;
  /** Prefill tokens of calls admitted and not yet past their first token. */
  inflightPrefillTokens: number;
  /** Measured prefill rate, tokens per second (> 0). */
  prefillTokensPerSecond: number;
  /** KV usage 0–1 (blocks held by running calls). */
  kvUsage: number;
  /** Prompt tokens this replica would load from its host-memory tier instead of computing them. Default 0. */
  hostLoadTokens?: number;
  /** How fast one call loads from the host tier, tokens per second (> 0 when `hostLoadTokens` > 0). */
  hostLoadTokensPerSecond?: number;
}

/**
 * Scale of the KV-pressure term, ms. With usage u the term is `KV_PRESSURE_MS · u² / (1 − u)`:
 * 12.5 ms at u = 0.2, 125 ms at 0.5, ~1 s at 0.85, ~3.6 s at 0.95, ~20 s at 0.99, capped at
 * u = 0.999 (~250 s). Near a full KV cache the engine must evict cached prefixes or preempt
 * running calls before a new prefill can start, and that cost grows without bound as free
 * blocks run out; at low usage the term only breaks ties towards the emptier replica.
 */
export const KV_PRESSURE_MS = 250;

/** Usage at which the pressure term stops growing (keeps it finite at u = 1). */
const KV_USAGE_CAP = 0.999;

/**
 * Predicted time to first token on one replica, ms:
 * `(uncached + queued + in-flight prefill tokens) / prefill rate × 1000`, plus the host-tier load
 * `host tokens / load rate × 1000`, plus the KV-pressure term (see {@link KV_PRESSURE_MS}).
 * @throws RangeError when a rate is not a positive finite number or a count is negative
 */
export function predictTtftMs(candidate: TtftInput): number {
  return (
    ttftMs(
      candidate.uncachedPrefillTokens,
      candidate.queuedPrefillTokens,
      candidate.inflightPrefillTokens,
      candidate.prefillTokensPerSecond,
      candidate.kvUsage,
    ) + hostLoadMs(candidate.hostLoadTokens ?? 0, candidate.hostLoadTokensPerSecond ?? 0)
  );
}

/**
 * Time to load `tokens` from the host tier, ms. A host hit is priced at its load, not as free
 * (a GPU hit) nor as a miss (recomputed): on `h100-llama3-8b` a token loads over PCIe in ~5 µs
 * against ~25 µs or more to compute it, so the two rates, not a fixed credit, say what a host hit
 * is worth on each replica.
 * @throws RangeError when tokens are loaded at a rate that is not a positive finite number
 */
export function hostLoadMs(tokens: number, tokensPerSecond: number): number {
  if (tokens === 0) return 0;
  if (!(tokens > 0)) throw new RangeError(`host load tokens should be ≥ 0, got ${tokens}`);
  if (!(tokensPerSecond > 0) || !Number.isFinite(tokensPerSecond)) {
    throw new RangeError(`hostLoadTokensPerSecond should be a positive number, got ${tokensPerSecond}`);
  }
  return (tokens / tokensPerSecond) * 1000;
}

/** {@link predictTtftMs} over plain numbers: placement scores a whole fleet without an object per replica. */
function ttftMs(
  uncachedPrefillTokens: number,
  queuedPrefillTokens: number,
  inflightPrefillTokens: number,
  prefillTokensPerSecond: number,
  kvUsage: number,
): number {
  if (!(prefillTokensPerSecond > 0) || !Number.isFinite(prefillTokensPerSecond)) {
    throw new RangeError(`prefillTokensPerSecond should be a positive number, got ${prefillTokensPerSecond}`);
  }
  if (!(uncachedPrefillTokens >= 0 && queuedPrefillTokens >= 0 && inflightPrefillTokens >= 0)) {
    throw new RangeError(
      `prefill token counts should be ≥ 0, got uncached ${uncachedPrefillTokens}, queued ${queuedPrefillTokens}, in-flight ${inflightPrefillTokens}`,
    );
  }
  const prefillMs =
    ((uncachedPrefillTokens + queuedPrefillTokens + inflightPrefillTokens) / prefillTokensPerSecond) * 1000;
  return prefillMs + kvPressureMs(kvUsage);
}

/** The KV-pressure term alone, ms (0 for usage ≤ 0 or not a number). */
export function kvPressureMs(kvUsage: number): number {
  if (!(kvUsage > 0)) return 0;
  const u = Math.min(kvUsage, KV_USAGE_CAP);
  return (KV_PRESSURE_MS * u * u) / (1 - u);
}

/** One replica as placement sees it. */
export interface PlacementCandidate {
  id: string;
  queuedPrefillTokens: number;
  inflightPrefillTokens: number;
  prefillTokensPerSecond: number;
  kvUsage: number;
  /**
   * How fast one call loads from the replica's host-memory tier, tokens per second (stated or
   * measured); absent or 0 when it has no host tier or the rate is unknown — then a block predicted
   * in host memory only is priced as a miss.
   */
  hostLoadTokensPerSecond?: number;
  /**
   * Tokens its token budget can still reserve (docs/how-it-works.md#token-budget-and-feasibility); absent when it keeps none. A call whose
   * reservation would not fit goes elsewhere while some replica can hold it: refused here, it
   * would only come back after a Retry-After.
   */
  budgetAvailableTokens?: number;
  /** A worker-wide gate rejection within the last second. */
  busy: boolean;
  /** Healthy and serving the model; an ineligible replica is never chosen. */
  eligible: boolean;
}

export interface PlacementInput {
  promptTokens: number;
  /** Chained block hashes of the prompt, of `blockSize` tokens each. */
  hashes: readonly string[];
  /** The replica the session is pinned to, if any. */
  pinned?: string | undefined;
  candidates: readonly PlacementCandidate[];
  /**
   * The fleet-wide prefix index: one walk of `hashes` scores every candidate, and a pinned step
   * that keeps its replica walks for that replica alone. When absent (e.g. the baselines), no
   * replica is predicted to hold any of the prompt.
   */
  fleetIndex?: PrefixMatcher | null | undefined;
  /** Tokens per block of `hashes`. */
  blockSize: number;
  /** KV usage at or above which a pinned replica loses the session. Default 0.85. */
  affinityBreakKv?: number;
  /** Margin, ms, by which the pinned replica's TTFT may exceed the best alternative's. Default 5000. */
  affinityBreakMs?: number;
  /** Whether prefix hits count; false: every prompt token is uncached everywhere. */
  usePrefix: boolean;
  /** The call's `max_tokens`, part of what it reserves in a token budget. Default 0. */
  maxTokens?: number;
}

export type PlacementReason = "pinned" | "prefix" | "load" | "affinity_break";

export interface Placement {
  replica: string;
  reason: PlacementReason;
  /** Prompt tokens predicted not to be computed on the chosen replica: in GPU memory, or loaded from host memory. */
  predictedHitTokens: number;
  /** Of those, tokens predicted to be loaded from its host-memory tier (they take GPU blocks anew). Default 0. */
  predictedHostHitTokens?: number;
  predictedTtftMs: number;
}

/** A candidate with its predicted hit (both tiers), host part of it, and TTFT. */
interface Scored {
  candidate: PlacementCandidate;
  hitTokens: number;
  hostTokens: number;
  ttftMs: number;
}

/** Lower TTFT first; then more cached tokens; then lower KV usage; then candidate order (the incumbent stays). */
function beats(ttft: number, hitTokens: number, kvUsage: number, incumbent: Scored | undefined): boolean {
  if (incumbent === undefined) return true;
  if (ttft !== incumbent.ttftMs) return ttft < incumbent.ttftMs;
  if (hitTokens !== incumbent.hitTokens) return hitTokens > incumbent.hitTokens;
  return kvUsage < incumbent.candidate.kvUsage;
}

function choice(s: Scored, reason: PlacementReason): Placement {
  return {
    replica: s.candidate.id,
    reason,
    predictedHitTokens: s.hitTokens,
    ...(s.hostTokens > 0 ? { predictedHostHitTokens: s.hostTokens } : {}),
    predictedTtftMs: s.ttftMs,
  };
}

/**
 * Tokens of a prefix of `blocks` blocks, `gpuBlocks` of them in GPU memory, that are hits: the GPU
 * part, and the host part where the replica can load it (else it is a miss).
 */
function hits(
  candidate: PlacementCandidate,
  blocks: number,
  gpuBlocks: number,
  promptTokens: number,
  blockSize: number,
): { hitTokens: number; hostTokens: number } {
  const gpuTokens = Math.min(gpuBlocks * blockSize, promptTokens);
  const loadable = (candidate.hostLoadTokensPerSecond ?? 0) > 0;
  const hitTokens = loadable ? Math.min(blocks * blockSize, promptTokens) : gpuTokens;
  return { hitTokens, hostTokens: hitTokens - gpuTokens };
}

function score(
  candidate: PlacementCandidate,
  blocks: number,
  gpuBlocks: number,
  promptTokens: number,
  blockSize: number,
): Scored {
  const { hitTokens, hostTokens } = hits(candidate, blocks, gpuBlocks, promptTokens, blockSize);
  return {
    candidate,
    hitTokens,
    hostTokens,
    ttftMs: ttftOf(candidate, promptTokens - hitTokens, hostTokens),
  };
}

function ttftOf(candidate: PlacementCandidate, uncachedPrefillTokens: number, hostTokens: number): number {
  return (
    ttftMs(
      uncachedPrefillTokens,
      candidate.queuedPrefillTokens,
      candidate.inflightPrefillTokens,
      candidate.prefillTokensPerSecond,
      candidate.kvUsage,
    ) + (hostTokens > 0 ? hostLoadMs(hostTokens, candidate.hostLoadTokensPerSecond!) : 0)
  );
}

/** The affinity settings with their defaults, after checking every number of the input. */
function checkedSettings(input: PlacementInput): { affinityBreakKv: number; affinityBreakMs: number } {
  const { promptTokens, blockSize } = input;
  const affinityBreakKv = input.affinityBreakKv ?? 0.85;
  const affinityBreakMs = input.affinityBreakMs ?? 5000;
  if (!(promptTokens >= 0)) throw new RangeError(`promptTokens should be ≥ 0, got ${promptTokens}`);
  if (!Number.isInteger(blockSize) || blockSize < 1) {
    throw new RangeError(`blockSize should be a positive integer, got ${blockSize}`);
  }
  if (!(affinityBreakKv >= 0)) throw new RangeError(`affinityBreakKv should be ≥ 0, got ${affinityBreakKv}`);
  if (!(affinityBreakMs >= 0)) throw new RangeError(`affinityBreakMs should be ≥ 0, got ${affinityBreakMs}`);
  return { affinityBreakKv, affinityBreakMs };
}

/**
 * The pinned step's shortcut: the placement {@link choosePlacement} would return when the pinned
 * replica keeps the session on its own merits — eligible, not busy, below `affinityBreakKv` and
 * predicted within `affinityBreakMs` (no alternative's TTFT is below 0, so none can beat it by
 * the margin) — else undefined, and the whole pool must be scored. Only the pinned candidate is
 * read, so a caller may pass that one alone and build the others only when this returns undefined.
 */
export function keepPin(input: PlacementInput): Placement | undefined {
  const { promptTokens, hashes, pinned, candidates, blockSize, usePrefix } = input;
  if (pinned === undefined) return undefined;
  const { affinityBreakKv, affinityBreakMs } = checkedSettings(input);
  const home = candidates.find((c) => c.id === pinned);
  if (!home?.eligible || home.busy || !(home.kvUsage < affinityBreakKv)) return undefined;
  const fleetIndex = usePrefix ? (input.fleetIndex ?? null) : null;
  const tiers = { gpuBlocks: 0 };
  let blocks = 0;
  if (fleetIndex !== null) blocks = fleetIndex.matchReplica(home.id, hashes, tiers);
  const scored = score(home, blocks, tiers.gpuBlocks, promptTokens, blockSize);
  if (!fitsBudget(home, scored.hitTokens - scored.hostTokens, promptTokens, input.maxTokens ?? 0))
    return undefined;
  return scored.ttftMs <= affinityBreakMs ? choice(scored, "pinned") : undefined;
}

/** Whether a call fits a candidate's token budget now, reserving what the scheduler will (`reservationTokens`). */
function fitsBudget(
  candidate: PlacementCandidate,
  gpuHitTokens: number,
  promptTokens: number,
  maxTokens: number,
): boolean {
  const available = candidate.budgetAvailableTokens;
  return available === undefined || reservationTokens(promptTokens, gpuHitTokens, maxTokens) <= available;
}

/**
 * Chooses the replica for a call (docs/routing.md), or undefined when no replica is eligible.
 *
 * - Ineligible replicas are never chosen. Busy replicas are skipped unless every eligible one is busy.
 * - Lower predicted TTFT wins (ties: more cached tokens, lower KV usage, candidate order).
 * - A replica whose token budget cannot hold the call is skipped while another can; a pinned
 *   replica that cannot loses the session to one that can (`affinity_break`).
 * - A pinned replica keeps the session unless its KV usage is ≥ `affinityBreakKv` or its TTFT
 *   exceeds the best alternative's by more than `affinityBreakMs`; then the best alternative
 *   takes it (`affinity_break`). A KV break needs an alternative below the threshold: moving
 *   between saturated replicas would only recompute the prefix. A pinned replica that is
 *   ineligible, busy (while others are not) or gone also yields `affinity_break`.
 * - Otherwise the reason is `prefix` when the chosen replica is predicted to hold ≥ 1 block of
 *   the prompt, else `load`.
 *
 * Cost: a pinned replica that is eligible, not busy, below `affinityBreakKv` and predicted within
 * `affinityBreakMs` keeps the session without any other replica being scored (no alternative's
 * TTFT is below 0, so none can beat it by the margin). Otherwise every candidate in the pool is
 * scored, from a single walk of the fleet index.
 */
export function choosePlacement(input: PlacementInput): Placement | undefined {
  const { promptTokens, hashes, pinned, candidates, blockSize, usePrefix } = input;
  const { affinityBreakKv, affinityBreakMs } = checkedSettings(input);
  const fleetIndex = usePrefix ? (input.fleetIndex ?? null) : null;

  if (pinned !== undefined) {
    const kept = keepPin(input);
    if (kept !== undefined) return kept;
  }

  let anyIdle = false;
  let anyEligible = false;
  for (const c of candidates) {
    if (!c.eligible) continue;
    anyEligible = true;
    if (!c.busy) {
      anyIdle = true;
      break;
    }
  }
  if (!anyEligible) return undefined;

  const gpuMatches = new Map<string, number>();
  const matches = fleetIndex !== null && hashes.length > 0 ? fleetIndex.match(hashes, gpuMatches) : null;
  const maxTokens = input.maxTokens ?? 0;
  /** Best of the pool, best except the pinned replica, and that below the KV break threshold. */
  let best: Scored | undefined;
  let home: Scored | undefined;
  let alternative: Scored | undefined;
  let unsaturated: Scored | undefined;
  // Replicas whose token budget cannot hold the call are left out while another can (it would be
  // refused there and wait for a Retry-After); when none can, the call is placed as if all could.
  for (const budgetMatters of [true, false]) {
    for (const candidate of candidates) {
      if (!candidate.eligible || (anyIdle && candidate.busy)) continue;
      let blocks = 0;
      let gpuBlocks = 0;
      if (matches !== null) {
        blocks = matches.get(candidate.id) ?? 0;
        gpuBlocks = gpuMatches.get(candidate.id) ?? 0;
      }
      let hitTokens = Math.min(gpuBlocks * blockSize, promptTokens);
      if (budgetMatters && !fitsBudget(candidate, hitTokens, promptTokens, maxTokens)) continue;
      let hostTokens = 0;
      if (blocks > gpuBlocks)
        ({ hitTokens, hostTokens } = hits(candidate, blocks, gpuBlocks, promptTokens, blockSize));
      const ttft = ttftOf(candidate, promptTokens - hitTokens, hostTokens);
      const kv = candidate.kvUsage;
      // A Scored object only for a candidate that leads something: no allocation per replica.
      let s: Scored | undefined;
      if (beats(ttft, hitTokens, kv, best)) {
        s = { candidate, hitTokens, hostTokens, ttftMs: ttft };
        best = s;
      }
      if (pinned === undefined) continue;
      if (candidate.id === pinned && home === undefined) {
        home = s ?? { candidate, hitTokens, hostTokens, ttftMs: ttft };
        continue;
      }
      if (beats(ttft, hitTokens, kv, alternative)) {
        s ??= { candidate, hitTokens, hostTokens, ttftMs: ttft };
        alternative = s;
      }
      if (kv < affinityBreakKv && beats(ttft, hitTokens, kv, unsaturated)) {
        s ??= { candidate, hitTokens, hostTokens, ttftMs: ttft };
        unsaturated = s;
      }
    }
    if (best !== undefined) break;
  }
  best = best!;
  if (pinned === undefined) return choice(best, best.hitTokens > 0 ? "prefix" : "load");
  if (home === undefined) return choice(best, "affinity_break");
  if (alternative === undefined) return choice(home, "pinned");
  if (home.candidate.kvUsage >= affinityBreakKv && unsaturated !== undefined) {
    return choice(unsaturated, "affinity_break");
  }
  if (home.ttftMs - alternative.ttftMs > affinityBreakMs) return choice(alternative, "affinity_break");
  return choice(home, "pinned");
}
