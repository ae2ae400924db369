/** @module A run of pure-decode steps that one simulated rank applies with one timer, and its step arithmetic. */

import type { SimCall } from "./sim-call.js";

/**
 * A run of pure-decode steps simulated with one timer. Valid while nothing
 * can change the batch: no call is waiting that could be admitted, no
 * prefill, and enough free blocks for every step. Step j of the run (from
 * `base`) lasts `a + cKv·(K + j·D)` ms. Steps are applied lazily: at the end,
 * or up to the present when an arrival, abort or signal read interrupts.
 */
export interface DecodeRun {
  calls: SimCall[];
  /** Start of the next step not yet applied. */
  base: number;
  /** Steps not yet applied, including the one in progress. */
  remaining: number;
  /** Whether the next step's slots are already allocated (true for the first step of the run). */
  slotsTaken: boolean;
  /** Per-step constant part, ms. */
  a: number;
  /** Decode context tokens of the next step. */
  K: number;
  D: number;
  endAt: number;
}

/** End time of the first `k` remaining steps of a run (summed step by step, as applied). */
export function runEnd(run: DecodeRun, k: number, cKv: number): number {
  let t = run.base;
  for (let j = 0; j < k; j++) t += run.a + cKv * (run.K + j * run.D);
  return t;
}

/** Steps of the run that ended strictly before `now`, at most `remaining − 1`. */
export function stepsBefore(run: DecodeRun, now: number, cKv: number): number {
  let t = run.base;
  let k = 0;
  while (k < run.remaining - 1) {
    const end = t + run.a + cKv * (run.K + k * run.D);
    if (end >= now) break;
    t = end;
    k++;
  }
  return k;
}
