/** @module Why a call stopped early: one abort signal per call, whose reason tells the client's abort from sluice's own. */

/** A stop sluice decided itself; the abort reason of a call's signal. Any other reason is the client's abort. */
export class CallStop extends Error {
  constructor(
    /** `consumer`: whoever iterated the call stopped; `closed`: the engine closed; `timeout`: no headers in time. */
    readonly kind: "consumer" | "closed" | "timeout",
    /** The timeout that ran out, ms (for `timeout`). */
    readonly ms = 0,
  ) {
    super(kind === "timeout" ? `upstream timed out after ${ms} ms` : `call stopped (${kind})`);
    this.name = "CallStop";
  }
}

/** Why the call's signal aborted: a `CallStop`, `"client"` for the client's own abort, or undefined while it runs. */
export function stopCause(signal: AbortSignal): CallStop | "client" | undefined {
  if (!signal.aborted) return undefined;
  return signal.reason instanceof CallStop ? signal.reason : "client";
}
