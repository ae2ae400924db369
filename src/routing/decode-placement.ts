/**
 * @module Where a call of a disaggregated fleet will decode, decided before its
 * prefill starts: the decode replica with the most KV room at the moment the
 * call's KV will have arrived. A pure function of plain numbers, as
 * `placement.ts` is for the prefill side.
 */

import type { DecodeCheck } from "../config/scheduler-config.js";

/** A call decoding on the replica: the KV it holds now and the tokens it may still generate (max_tokens less its output). */
export interface DecodingCall {
  kvTokens: number;
  remainingTokens: number;
}

/** A call admitted for the replica whose KV has not arrived yet (prefill, link). */
export interface ComingCall {
  promptTokens: number;
  maxTokens: number;
}

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
  /**
   * KV of the calls admission knows of that the last scrape could show
   * (arrived by then, not waiting in the engine), as admission counts it.
   * The measured KV less this is what admission does not know of: another
   * client's calls (more), or prompt blocks calls share (less).
   */
  shownTokens: number;
  /** Calls admitted for this replica whose KV has not arrived yet. */
  coming: readonly ComingCall[];
  /** Calls decoding on it, as admission knows them. */
  decoding: readonly DecodingCall[];
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
 * The most KV a replica will hold from now on, if every call decodes to its
 * max_tokens at one token a step (continuous batching: all running calls step
 * together, so the answer does not depend on how long a step takes). A
 * decoding call holds `kvTokens + k` at step k until its remaining tokens are
 * out, then nothing; a joining call (KV still to arrive) is taken as holding
 * `promptTokens + min(k, maxTokens)` from now on, which is at least what it
 * holds at every step whenever it arrives. Between two departures the total
 * only grows, so the peak is just before one of them, or at the end.
 *
 * One sweep over both lists sorted by when they stop growing, O((d + j) log(d + j)): the steps
 * looked at only move forward, so the joining calls' total at each is kept, not summed again.
 */
export function peakKvTokens(decoding: readonly DecodingCall[], joining: readonly ComingCall[]): number {
  const byEnd = [...decoding].sort((a, b) => a.remainingTokens - b.remainingTokens);
  const byMax = [...joining].sort((a, b) => a.maxTokens - b.maxTokens);
  // The joining calls at step k hold their prompts, the whole output of those whose max_tokens is
  // at most k, and k tokens each of the others.
  let joinedPrompts = 0;
  for (const j of byMax) joinedPrompts += j.promptTokens;
  let fullOutputs = 0;
  let grown = 0;
  const joiningAt = (k: number) => {
    while (grown < byMax.length && byMax[grown]!.maxTokens <= k) fullOutputs += byMax[grown++]!.maxTokens;
    const stillGrowing = byMax.length - grown;
    return joinedPrompts + fullOutputs + (stillGrowing > 0 ? stillGrowing * k : 0);
  };
  let aliveKv = 0;
  for (const call of byEnd) aliveKv += call.kvTokens;
  let peak = aliveKv + joiningAt(0);
  let i = 0;
  while (i < byEnd.length) {
    const end = byEnd[i]!.remainingTokens;
    // The last step before the calls of this remaining length finish: every call still alive has grown by `end − 1`.
    if (end > 0) peak = Math.max(peak, aliveKv + (byEnd.length - i) * (end - 1) + joiningAt(end - 1));
    while (i < byEnd.length && byEnd[i]!.remainingTokens === end) aliveKv -= byEnd[i++]!.kvTokens;
  }
  return Math.max(peak, joiningAt(Number.POSITIVE_INFINITY));
}

/**
 * Room on `c` for the call when its KV arrives.
 *
 * `current`: what the last scrape says is free — blind to calls admitted but
 * not yet arrived, and late by the scrape interval.
 *
 * `predicted`: the room left at the replica's peak from now on, for as long
 * as the call decodes (`peakKvTokens`), so there is room when its KV arrives
 * and it never has to be preempted: every call decoding there as admission
 * knows it (its KV now, its output still to come, when it ends), every call
 * admitted and still in prefill or on the link, and the call itself; plus
 * the difference between the measurement and what admission knows it shows
 * (`shownTokens`), taken as staying. Room is `usable − peak + the call's own
 * input + max_tokens`, so the call fits when it is at least that. Calls on
 * their way join now rather than at their predicted arrival: the prefill
 * time behind that prediction reads seconds to minutes long under load while
 * prefills take well under one, and crediting a departure that has not
 * happened when the KV arrives overfills the replica. The one guess left is
 * that a call may generate up to its max_tokens, so the prediction errs
 * toward too little room when calls stop early.
 */
export function decodeRoom(c: DecodeCandidate, demand: DecodeDemand, check: DecodeCheck): DecodeRoom {
  const arrivalInMs = demand.prefillDoneInMs + transferMs(demand.transferTokens, c.transferTokensPerSecond);
  const measuredTokens = c.kvUsage * c.capacityTokens;
  if (check !== "predicted") {
    return { tokens: c.usableTokens - measuredTokens, slots: c.batchSlots - c.running, arrivalInMs };
  }
  const unknownTokens = measuredTokens - c.shownTokens;
  const itself: ComingCall = { promptTokens: demand.tokens - demand.maxTokens, maxTokens: demand.maxTokens };
  const peak = unknownTokens + peakKvTokens(c.decoding, [...c.coming, itself]);
  const running = Math.max(c.decoding.length, c.running) + c.coming.length;
  return { tokens: c.usableTokens - peak + demand.tokens, slots: c.batchSlots - running, arrivalInMs };
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
