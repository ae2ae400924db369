/**
 * @module Where a call of a disaggregated fleet will decode, decided before its
 * prefill starts: the decode replica with the most KV room at the moment the
 * call's KV will have arrived. A pure function of plain numbers, as
 * `placement.ts` is for the prefill side.
 */

import type { DecodeCheck } from "../config/scheduler-config.js";

/** One decode replica as the decision sees it. */
export interface DecodeCandidate {
  id: string;
  /** Healthy and serving the model. */
  eligible: boolean;
  /** Marked busy by a worker-wide gate rejection. */
  busy: boolean;
  /** KV capacity, tokens, and the part of it admission may fill (capacity less the guard band). */
  capacityTokens: number;
  usableTokens: number;
  /** Batch slots (max_num_seqs over every rank). */
  batchSlots: number;
  /** Measured at the last scrape: KV usage 0–1 and running calls. */
  kvUsage: number;
  running: number;
  /** Calls whose decode leg started since the last scrape (so the measurement misses them), and their prompt tokens. */
  startedSinceScrapeCalls: number;
  startedSinceScrapeTokens: number;
  /** Calls that ended since the last scrape (the measurement still counts them), and their prompt tokens. */
  endedSinceScrapeCalls: number;
  endedSinceScrapeTokens: number;
  /** Calls admitted for this replica whose KV has not arrived yet (prefill, link), and their tokens. */
  comingCalls: number;
  comingTokens: number;
  /** Calls decoding, their tokens, and the output they may still add (Σ max_tokens: an upper bound on growth). */
  decodingCalls: number;
  decodingTokens: number;
  decodingGrowthTokens: number;
  /** Completions per second the replica has shown over the drain estimator's window. */
  completionsPerSecond: number;
  /** KV transfer rate into this replica, tokens per second (0: unknown, taken as instant). */
  transferTokensPerSecond: number;
}

/** What the call needs and when its prefill ends. */
export interface DecodeDemand {
  /** KV the call holds on decode: input + max_tokens, tokens. */
  tokens: number;
  /** Its max_tokens (part of `tokens`). */
  maxTokens: number;
  /** Prompt tokens whose KV crosses the link. */
  transferTokens: number;
  /** Predicted time until its prefill finished (queue ahead plus its own prefill), ms. */
  prefillDoneInMs: number;
}

/** Room a decode replica is predicted (or measured) to have for one more call. */
export interface DecodeRoom {
  /** KV tokens free for the call. */
  tokens: number;
  /** Batch slots free for the call. */
  slots: number;
  /** When the call's KV will have arrived, ms from now. */
  arrivalInMs: number;
}

/** The transfer time of `tokens` into a replica, ms. */
export function transferMs(tokens: number, tokensPerSecond: number): number {
  return tokensPerSecond > 0 ? (tokens / tokensPerSecond) * 1000 : 0;
}

/**
 * Room on `c` for the call when its KV arrives.
 *
 * `current`: what the last scrape says is free — blind to calls admitted but
 * not yet arrived, and late by the scrape interval.
 *
 * `predicted`: the same measurement, corrected for everything it cannot show
 * yet: calls that started decoding since the scrape (added) or ended since
 * (removed), calls admitted and still in prefill or on the link (they will be
 * there first), and the output decoding calls may still add; less what the
 * replica's completion rate frees before the arrival (at the decoding calls'
 * mean size). The rate is the drain estimator's, which reads low right after
 * start-up, so the prediction errs toward too little room.
 */
export function decodeRoom(c: DecodeCandidate, demand: DecodeDemand, check: DecodeCheck): DecodeRoom {
  const arrivalInMs = demand.prefillDoneInMs + transferMs(demand.transferTokens, c.transferTokensPerSecond);
  const measuredTokens = c.kvUsage * c.capacityTokens;
  if (check !== "predicted") {
    return { tokens: c.usableTokens - measuredTokens, slots: c.batchSlots - c.running, arrivalInMs };
  }
  const finished = Math.floor(Math.min(c.decodingCalls, (c.completionsPerSecond * arrivalInMs) / 1000));
  const freedTokens = c.decodingCalls > 0 ? (c.decodingTokens * finished) / c.decodingCalls : 0;
  const usedTokens =
    Math.max(0, measuredTokens + c.startedSinceScrapeTokens - c.endedSinceScrapeTokens) +
    c.comingTokens +
    c.decodingGrowthTokens -
    freedTokens;
  const running =
    Math.max(0, c.running + c.startedSinceScrapeCalls - c.endedSinceScrapeCalls) + c.comingCalls - finished;
  return { tokens: c.usableTokens - usedTokens, slots: c.batchSlots - running, arrivalInMs };
}

/** The decision: a replica and its room, or none with the best room seen (for the refusal's message). */
export type DecodeChoice =
  | { replica: string; room: DecodeRoom }
  | { replica: undefined; best: DecodeRoom | undefined; bestId: string | undefined };

/**
 * Picks the eligible decode replica with the most KV room for the call that
 * also has a batch slot; replicas marked busy only when no other fits. Ties go
 * to the earlier candidate (fleet order), so equal replicas fill in turn as
 * each one's room shrinks.
 */
export function chooseDecode(
  candidates: readonly DecodeCandidate[],
  demand: DecodeDemand,
  check: DecodeCheck,
): DecodeChoice {
  let chosen: { id: string; room: DecodeRoom; busy: boolean } | undefined;
  let best: { id: string; room: DecodeRoom } | undefined;
  for (const c of candidates) {
    if (!c.eligible) continue;
    const room = decodeRoom(c, demand, check);
    if (!best || room.tokens > best.room.tokens) best = { id: c.id, room };
    if (room.tokens < demand.tokens || room.slots < 1) continue;
    const better =
      !chosen || (chosen.busy && !c.busy) || (chosen.busy === c.busy && room.tokens > chosen.room.tokens);
    if (better) chosen = { id: c.id, room, busy: c.busy };
  }
  if (chosen) return { replica: chosen.id, room: chosen.room };
  return { replica: undefined, best: best?.room, bestId: best?.id };
}
