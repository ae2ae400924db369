/** @module The gate's two ways of not handing out a permit: rejection (overloaded) and cancellation. */

import { Refusal } from "../errors.js";
import type { Lane } from "../types.js";

/** Whom a gate rejection concerns: the rejected call's rank only, or the whole replica (docs/how-it-works.md#per-rank-gate). */
export type GateRejectionScope = "worker" | "rank";

export interface GateRejectionInit {
  /** HTTP status; 529 unless configured (`--overload-status`). */
  status?: number;
  scope: GateRejectionScope;
  rank?: number;
  lane?: Lane;
  /** Whole seconds, ≥ 1, from the gate's drain estimate. */
  retryAfterSeconds?: number;
}

/**
 * The gate could neither admit nor queue the call (`worker_overloaded`).
 * `scope: "worker"` tells a router to stop sending calls to this replica for 1 s.
 */
export class GateRejection extends Refusal {
  declare readonly reason: "worker_overloaded";
  declare readonly scope: GateRejectionScope;

  constructor(message: string, init: GateRejectionInit) {
    super("worker_overloaded", message, {
      status: init.status ?? 529,
      scope: init.scope,
      rank: init.rank,
      lane: init.lane,
      retryAfterSeconds: init.retryAfterSeconds,
    });
    this.name = "GateRejection";
  }
}

/** The caller's signal aborted before the call was admitted; nothing is held. */
export class GateCancelled extends Error {
  constructor(reason?: unknown) {
    super(
      "the call was cancelled before the gate admitted it",
      reason === undefined ? undefined : { cause: reason },
    );
    this.name = "AbortError";
  }
}
