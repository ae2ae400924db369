/** @module Calls in flight over HTTP, so a shutdown can stop taking new ones, wait for the rest, then cancel them. */

import { setMaxListeners } from "node:events";

/**
 * Counts completion requests from arrival (queued ones included) until their
 * response ends, and owns one abort signal every such request listens to.
 */
export class CallTracker {
  private inFlight = 0;
  private draining = false;
  private readonly controller = new AbortController();
  private waiters: (() => void)[] = [];

  constructor() {
    // Every call in flight listens to this signal: many listeners are the design, not a leak.
    setMaxListeners(0, this.controller.signal);
  }

  /** Aborted by `cancelAll()`: queued calls leave their queues, running calls stop. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Requests from arrival to the end of their response. */
  get size(): number {
    return this.inFlight;
  }

  /** True once `drain()` was called: new calls are refused with 503. */
  get isDraining(): boolean {
    return this.draining;
  }

  /** A request arrived; the returned function ends it (idempotent). */
  begin(): () => void {
    this.inFlight++;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.inFlight--;
      if (this.inFlight === 0) {
        const waiters = this.waiters;
        this.waiters = [];
        for (const wake of waiters) wake();
      }
    };
  }

  /** Stops accepting new calls. */
  drain(): void {
    this.draining = true;
  }

  /** Resolves when no request is in flight, or when `signal` aborts (whichever is first). */
  idle(signal?: AbortSignal): Promise<void> {
    if (this.inFlight === 0 || signal?.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        signal?.removeEventListener("abort", done);
        resolve();
      };
      this.waiters.push(done);
      signal?.addEventListener("abort", done, { once: true });
    });
  }

  /** Cancels every call in flight, queued or streaming. */
  cancelAll(): void {
    this.draining = true;
    this.controller.abort(new Error("server shutting down"));
  }
}
