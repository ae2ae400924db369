/** @module Test helpers for the gate: observe a permit promise without awaiting it. */

import { flushMicrotasks } from "../../src/clock.js";
import type { BackendGate, Permit } from "../../src/gate/backend-gate.js";

/** The settled state of an `acquire()` promise, readable synchronously after `settle()`. */
export interface Tracked {
  state: "pending" | "admitted" | "failed";
  permit: Permit | undefined;
  error: unknown;
}

/** Starts tracking a permit promise. */
export function track(promise: Promise<Permit>): Tracked {
  const t: Tracked = { state: "pending", permit: undefined, error: undefined };
  promise.then(
    (permit) => {
      t.state = "admitted";
      t.permit = permit;
    },
    (error: unknown) => {
      t.state = "failed";
      t.error = error;
    },
  );
  return t;
}

/** Lets every promise continuation run. */
export const settle = flushMicrotasks;

/** Asserts the idle invariant: nothing held or queued, and every received call accounted for once. */
export function idleInvariant(gate: BackendGate): string | undefined {
  const s = gate.snapshot();
  if (s.requests !== 0 || s.waiting !== 0 || s.queued !== 0) {
    return `not idle: ${JSON.stringify({ requests: s.requests, waiting: s.waiting, queued: s.queued })}`;
  }
  for (const r of [...s.ranks, s.unranked]) {
    if (r.requests !== 0 || r.waiting !== 0 || r.queued !== 0) return `not idle: ${JSON.stringify(r)}`;
  }
  if (s.lanes && (s.lanes.interactive.queued !== 0 || s.lanes.bulk.queued !== 0))
    return "lane queues not empty";
  if (gate.queuedCount("interactive") !== 0 || gate.queuedCount("bulk") !== 0) return "lane counts not zero";
  const c = gate.counters();
  if (c.received !== c.admittedDirect + c.admittedQueue + c.rejected + c.cancelled) {
    return `invariant broken: ${JSON.stringify(c)}`;
  }
  return undefined;
}
