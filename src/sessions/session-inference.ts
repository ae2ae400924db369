/**
 * @module Inferred sessions (docs/routing.md): a call that sends no session key is the next step
 * of the session whose recent call's prompt and returned output its prompt continues. A bounded,
 * message-level chain index over the points recent calls reached; pure, no clock.
 */

import type { InferenceOutcome } from "../types.js";
import {
  type ChainEnd,
  chainEnd,
  continuesTail,
  type PromptDigest,
  type ReturnedOutput,
  unitKey,
} from "./message-digest.js";

export type { InferenceOutcome };

/** `on` infers sessions for calls without a key; `shadow` infers beside explicit keys and only reports; `off` does nothing. */
export const INFERENCE_MODES = ["on", "shadow", "off"] as const;
export type InferenceMode = (typeof INFERENCE_MODES)[number];

/**
 * Default number of chain points remembered: ~500 bytes each (token prompts: ~750, with a block's
 * tail), ~50–75 MB, the presence filter (~20 bytes per point) included (docs/routing.md).
 */
export const DEFAULT_INFERENCE_CAPACITY = 100_000;

/**
 * Presence-filter slots per remembered point (rounded up to a power of two). A prompt's entries are
 * mostly absent; the filter answers those from two array reads (one slot per 32-bit word of the
 * entry, each counting the entries held there), so only the few that pass both are rendered and
 * looked up: at 8 slots per point, about 1 in 25 absent entries. 2 bytes a slot: 2 MB at the default capacity.
 */
const FILTER_SLOTS_PER_POINT = 8;

/** A filter slot's count stops here: a saturated slot always answers "maybe", never a false "no". */
const SLOT_SATURATED = 0xffff;

/** One inferred session (or, before its second call, the chain of one call). */
interface Chain {
  /** Allocated when a second call joins: a session exists from its second call. */
  id: string | undefined;
  parent: string | undefined;
  /** Shadow mode: the explicit key its calls carried. */
  key: string | undefined;
}

/** A point a finished call's prompt and output reached. */
interface Point {
  chain: Chain;
  tail: readonly number[];
  /** The claim of the call that continued this point first (a second one forks); never the call itself, which holds its prompt. */
  continuedBy: object | undefined;
}

/** The points filed under one chain entry, and the presence-filter slots the entry counts in. */
interface Entry {
  slotA: number;
  slotB: number;
  points: Point[];
}

/** A decided call, until its output is known. */
export interface PendingCall {
  readonly prompt: PromptDigest;
  /** What a point it continued holds of it. */
  readonly claim: object;
  readonly chain: Chain | undefined;
  /** The point it continued (claimed), released when the call fails. */
  claimed: Point | undefined;
}

/** What inference decided for a call. */
export interface InferenceDecision {
  outcome: InferenceOutcome;
  /** The session the call runs in (mode `on`, outcomes `continued` and `forked`). */
  sessionId?: string;
  /** A fork's parent session: place the child beside it. */
  parentId?: string;
  /** Hand back to {@link SessionInference.settle} when the call ends; absent when nothing is recorded. */
  pending?: PendingCall;
}

export interface SessionInferenceOptions {
  mode: InferenceMode;
  /** Chain points remembered (LRU); default {@link DEFAULT_INFERENCE_CAPACITY}. */
  capacity?: number;
  /** Session id for the n-th inferred session (n from 1); default `~inferred-<n>`. */
  newId?: (n: number) => string;
}

/**
 * The chain index. Each finished call adds the point its prompt and output reached, keyed by the
 * chain entry there. A new prompt is matched at its longest chain entry that holds a point; two
 * chains at one point make it ambiguous, and an ambiguous point decides nothing, so identical
 * openers with identical answers never merge. Points are forgotten least recently used first.
 */
export class SessionInference {
  readonly mode: InferenceMode;
  readonly capacity: number;
  private readonly points = new Map<string, Entry>();
  /** Per slot, the chain entries held with a word that falls there (saturating). */
  private readonly present: Uint16Array;
  private readonly slotMask: number;
  private pointCount = 0;
  private sessions = 0;
  private readonly newId: (n: number) => string;
  /** Shadow: explicit keys seen, most recent last (bounded like the points). */
  private readonly keysSeen = new Map<string, true>();

  constructor(options: SessionInferenceOptions) {
    this.mode = options.mode;
    this.capacity = options.capacity ?? DEFAULT_INFERENCE_CAPACITY;
    if (!(Number.isInteger(this.capacity) && this.capacity >= 1)) {
      throw new RangeError(`SessionInference: capacity must be a positive integer, got ${this.capacity}`);
    }
    this.newId = options.newId ?? ((n) => `~inferred-${n}`);
    let slots = 64;
    while (slots < this.capacity * FILTER_SLOTS_PER_POINT) slots *= 2;
    this.present = new Uint16Array(slots);
    this.slotMask = slots - 1;
  }

  /** Chain points held (≤ capacity). */
  get size(): number {
    return this.pointCount;
  }

  /**
   * Decides a call's session. `prompt` undefined: a prompt inference does not read. `key`: the
   * call's explicit key, if any (mode `on` leaves such calls alone).
   */
  decide(prompt: PromptDigest | undefined, key?: string): InferenceDecision {
    if (this.mode === "off") return { outcome: key === undefined ? "new" : "keyed" };
    if (this.mode === "on" && key !== undefined) return { outcome: "keyed" };
    if (this.mode === "shadow" && key === undefined) return { outcome: "unkeyed" };
    if (prompt === undefined) return { outcome: "unsupported" };
    const found = this.match(prompt);
    if (this.mode === "shadow") return this.shadow(prompt, key!, found);
    if (found === "ambiguous")
      return { outcome: "ambiguous", pending: { prompt, claim: {}, chain: undefined, claimed: undefined } };
    if (found === undefined)
      return { outcome: "new", pending: { prompt, claim: {}, chain: undefined, claimed: undefined } };
    if (found.continuedBy === undefined) {
      const chain = found.chain;
      chain.id ??= this.newId(++this.sessions);
      const pending: PendingCall = { prompt, claim: {}, chain, claimed: found };
      found.continuedBy = pending.claim;
      return { outcome: "continued", sessionId: chain.id, pending };
    }
    // A second call continuing one point, or a call continuing an earlier point: a child session.
    const parent = found.chain;
    parent.id ??= this.newId(++this.sessions);
    const child: Chain = { id: this.newId(++this.sessions), parent: parent.id, key: undefined };
    return {
      outcome: "forked",
      sessionId: child.id!,
      parentId: parent.id,
      pending: { prompt, claim: {}, chain: child, claimed: undefined },
    };
  }

  /**
   * A decided call ended. With its output (it completed), the point it reached is added; without
   * (refused after deciding, failed, cancelled), the point it continued is released, so its retry
   * continues the same session rather than fork.
   */
  settle(pending: PendingCall, output: ReturnedOutput | undefined): void {
    if (output === undefined) {
      if (pending.claimed?.continuedBy === pending.claim) pending.claimed.continuedBy = undefined;
      pending.claimed = undefined;
      return;
    }
    const end = chainEnd(pending.prompt, output);
    if (end === undefined) {
      if (pending.claimed?.continuedBy === pending.claim) pending.claimed.continuedBy = undefined;
      pending.claimed = undefined;
      return;
    }
    pending.claimed = undefined;
    this.add(end, pending.chain ?? { id: undefined, parent: undefined, key: undefined });
  }

  /** Calls a shadow decision with the key it carried (the chain it adds to records the key). */
  private shadow(
    prompt: PromptDigest,
    key: string,
    found: Point | "ambiguous" | undefined,
  ): InferenceDecision {
    const seen = this.keysSeen.has(key);
    this.keysSeen.delete(key);
    this.keysSeen.set(key, true);
    if (this.keysSeen.size > this.capacity) this.keysSeen.delete(this.keysSeen.keys().next().value as string);
    const chain: Chain = { id: undefined, parent: undefined, key };
    const pending: PendingCall = { prompt, claim: {}, chain, claimed: undefined };
    if (found === undefined || found === "ambiguous") return { outcome: seen ? "missed" : "agreed", pending };
    return { outcome: found.chain.key === key ? "agreed" : "disagreed", pending };
  }

  /** The point a prompt continues at its longest chain entry holding one; `ambiguous` when two chains reached it. */
  private match(prompt: PromptDigest): Point | "ambiguous" | undefined {
    for (let units = prompt.units; units >= 1; units--) {
      if (this.present[prompt.lanes[2 * units - 2]! & this.slotMask] === 0) continue;
      if (this.present[prompt.lanes[2 * units - 1]! & this.slotMask] === 0) continue;
      const key = unitKey(prompt, units);
      const entry = this.points.get(key);
      if (entry === undefined) continue;
      let found: Point | undefined;
      let ambiguous = false;
      for (const point of entry.points) {
        if (!continuesTail(prompt, units, point.tail)) continue;
        if (found === undefined) found = point;
        else if (found.chain !== point.chain) ambiguous = true;
      }
      if (found === undefined) continue;
      this.touch(key, entry);
      return ambiguous ? "ambiguous" : found;
    }
    return undefined;
  }

  private add(end: ChainEnd, chain: Chain): void {
    let entry = this.points.get(end.key);
    if (entry === undefined) {
      entry = { slotA: end.lanes[0] & this.slotMask, slotB: end.lanes[1] & this.slotMask, points: [] };
      this.count(entry, 1);
    } else if (entry.points.some((p) => p.chain === chain && sameTail(p.tail, end.tail))) {
      this.touch(end.key, entry);
      return;
    }
    entry.points.push({ chain, tail: end.tail, continuedBy: undefined });
    this.pointCount++;
    this.touch(end.key, entry);
    while (this.pointCount > this.capacity) {
      const [oldest, evicted] = this.points.entries().next().value as [string, Entry];
      this.points.delete(oldest);
      this.count(evicted, -1);
      this.pointCount -= evicted.points.length;
    }
  }

  /** Counts an entry in (1) or out (−1) of its two filter slots; a saturated slot stays saturated. */
  private count(entry: Entry, by: 1 | -1): void {
    for (const slot of [entry.slotA, entry.slotB]) {
      const held = this.present[slot]!;
      if (held !== SLOT_SATURATED) this.present[slot] = held + by;
    }
  }

  private touch(key: string, entry: Entry): void {
    this.points.delete(key);
    this.points.set(key, entry);
  }
}

function sameTail(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
