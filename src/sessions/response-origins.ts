/** @module Where each Responses API response was produced: response id → (replica, session), bounded, oldest forgotten first. */

/** The replica that produced a response (and holds its state), and the session it was a step of. */
export interface ResponseOrigin {
  replica: string;
  /** Absent when the call that produced it belonged to no session. */
  sessionId?: string;
  /** The tenant of the call that produced it: only that tenant's calls continue its session. */
  tenant?: string;
}

/** Default number of responses remembered: at ~150 bytes an entry, about 15 MB. */
export const DEFAULT_RESPONSE_ORIGINS = 100_000;

/**
 * A bounded map from response ids to their origin. An engine holds a
 * response's state (`previous_response_id`) only on the replica that produced
 * it, so a call continuing it must go there. Looking an id up refreshes it: the
 * least recently produced or continued responses are forgotten first, and a
 * forgotten id is routed as if sluice had never seen it (the engine then says
 * whether it still holds the state).
 */
export class ResponseOrigins {
  private readonly entries = new Map<string, ResponseOrigin>();

  constructor(readonly capacity: number = DEFAULT_RESPONSE_ORIGINS) {
    if (!(Number.isInteger(capacity) && capacity >= 1)) {
      throw new RangeError(`ResponseOrigins: capacity must be a positive integer, got ${capacity}`);
    }
  }

  /** Records (or moves) a response's origin; evicts the oldest entry beyond capacity. */
  remember(responseId: string, origin: ResponseOrigin): void {
    this.entries.delete(responseId);
    this.entries.set(responseId, origin);
    if (this.entries.size > this.capacity) {
      const oldest = this.entries.keys().next().value as string;
      this.entries.delete(oldest);
    }
  }

  /** The origin of a response, refreshed as recently used; undefined when unknown or forgotten. */
  lookup(responseId: string): ResponseOrigin | undefined {
    const origin = this.entries.get(responseId);
    if (origin === undefined) return undefined;
    this.entries.delete(responseId);
    this.entries.set(responseId, origin);
    return origin;
  }

  /** Responses remembered. */
  get size(): number {
    return this.entries.size;
  }
}
