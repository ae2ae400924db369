/**
 * @module The order of a budget queue's lane: pure functions over what a key sees of a waiter
 * (docs/how-it-works.md, "Token budget"; docs/tenants.md for the tenants' key).
 */

import type { Lane } from "../types.js";

/** What an ordering key sees of a waiter. */
export interface BudgetWaiterView {
  /** Tokens the call waits for. */
  readonly tokens: number;
  readonly lane: Lane;
  /** The call's tenant, when it has one. */
  readonly tenant: string | undefined;
  /** Arrival order in this queue (0, 1, 2, …). */
  readonly seq: number;
  /** When it started waiting, ms on the queue's clock. */
  readonly enqueuedAtMs: number;
}

/**
 * Orders waiters within a lane: lower keys go first, compared element by element; arrival order
 * breaks ties. Read afresh at every decision, so a key may follow state that moves (a tenant's usage
 * against its entitlement). Default: arrival order alone.
 */
export type BudgetOrderKey = (waiter: BudgetWaiterView) => number | readonly number[];

/** Compares two keys element by element; a shorter key that is a prefix of the other goes first. */
export function compareKeys(a: number | readonly number[], b: number | readonly number[]): number {
  const x = typeof a === "number" ? [a] : a;
  const y = typeof b === "number" ? [b] : b;
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = (x[i] as number) - (y[i] as number);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

/**
 * A lane's waiters in serving order: by key, then arrival. `lane` is in arrival order already, so
 * when every key is the same (one tenant, or tenants not sharing) that order is returned as it is,
 * without building and sorting keyed copies at every decision.
 */
export function orderedLane<W extends BudgetWaiterView>(
  lane: readonly W[],
  key: BudgetOrderKey | undefined,
): W[] {
  if (key === undefined || lane.length < 2) return lane.slice();
  const first = key(lane[0] as W);
  let even = true;
  for (let i = 1; even && i < lane.length; i++) even = compareKeys(key(lane[i] as W), first) === 0;
  if (even) return lane.slice();
  const keyed = lane.map((w) => ({ w, k: key(w) }));
  keyed.sort((a, b) => compareKeys(a.k, b.k) || a.w.seq - b.w.seq);
  return keyed.map((entry) => entry.w);
}
