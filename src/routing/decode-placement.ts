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
  /** KV the budget may fill: ceiling less guard band, tokens. */
  usableTokens: number;
  /** Calls admitted for this replica whose KV has not arrived yet (in prefill or on the link), and their reserved tokens. */
  comingCalls: number;
  comingTokens: number;
  /** Calls decoding on this replica, and their reserved tokens. */
  decodingCalls: number;
  decodingTokens: number;
  /** Completions per second the replica has shown over the drain estimator's window. */
  completionsPerSecond: number;
  /** Measured KV usage 0–1 and running calls, from the last scrape. */
  kvUsage: number;
  running: number;
  /** KV capacity, tokens, and batch slots (max_num_seqs over every rank). */
  capacityTokens: number;
  batchSlots: number;
  /** KV transfer rate into this replica, tokens per second (> 0). */
  transferTokensPerSecond: number;
}

/** What the call needs and when its prefill ends. */
export interface DecodeDemand {
  /** KV the call holds on decode: input + max_tokens, tokens. */
  tokens: number;
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
  /** Of the decoding calls' tokens, how many are predicted to be freed by then (0 for `current`). */
  creditTokens: number;
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
 * `predicted`: every call already admitted for the replica counts, those still
 * in prefill too (they will be there first); of the decoding calls, as many as
 * the replica's completion rate finishes before the arrival are taken as gone
 * (at their mean reservation). The rate is the drain estimator's, which reads
 * low right after start-up, so the prediction errs toward too little room.
 *
 * `current`: what the last scrape says is free now — blind to calls admitted
 * but not yet arrived, and late by the scrape interval.
 */
export function decodeRoom(c: DecodeCandidate, demand: DecodeDemand, check: DecodeCheck): DecodeRoom {
  const arrivalInMs = demand.prefillDoneInMs + transferMs(demand.transferTokens, c.transferTokensPerSecond);
  if (check !== "predicted") {
    return {
      tokens: c.capacityTokens * (1 - c.kvUsage) - (c.capacityTokens - c.usableTokens),
      slots: c.batchSlots - c.running,
      creditTokens: 0,
      arrivalInMs,
    };
  }
  const finished = Math.min(c.decodingCalls, (c.completionsPerSecond * arrivalInMs) / 1000);
  const creditTokens =
    c.decodingCalls > 0 ? Math.floor((c.decodingTokens * Math.floor(finished)) / c.decodingCalls) : 0;
  return {
    tokens: c.usableTokens - c.comingTokens - c.decodingTokens + creditTokens,
    slots: c.batchSlots - c.comingCalls - c.decodingCalls + Math.floor(finished),
    creditTokens,
    arrivalInMs,
  };
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
