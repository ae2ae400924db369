/**
 * @module The KV link of a simulated decode replica: prompts' KV pulled from prefill replicas,
 * one transfer after another, and the counters vLLM's NIXL connector reports for them.
 */

import type { Cancel, Clock } from "../../../src/clock.js";
import type { SimCall } from "./sim-call.js";

/**
 * KV transfers a decode replica received, as vLLM's NIXL connector counts them
 * (`vllm:nixl_xfer_time_seconds`, `vllm:nixl_bytes_transferred`).
 */
export interface KvTransferStats {
  transfers: number;
  bytes: number;
  /** Σ time on the link, seconds (the wait for the link excluded). */
  seconds: number;
  /** Each transfer's seconds and bytes, for histograms; the latest 4096 only. */
  recent: { seconds: number; bytes: number }[];
}

/** Transfers each wait for the link to finish the ones started before them. */
export class KvLink {
  readonly stats: KvTransferStats = { transfers: 0, bytes: 0, seconds: 0, recent: [] };
  /** When the link finishes the transfers already started, clock ms. */
  private freeAt = Number.NEGATIVE_INFINITY;
  /** Calls whose KV is on the link, with the timer that hands each over once it arrived. */
  private readonly receiving = new Map<SimCall, Cancel>();

  constructor(private readonly clock: Clock) {}

  /** Sends `tokens` tokens of `sim`'s KV, `bytes` bytes, taking `ms` on the link; `arrived` runs once they are in. */
  receive(sim: SimCall, tokens: number, ms: number, bytes: number, arrived: () => void): void {
    const now = this.clock.now();
    const start = Math.max(now, this.freeAt);
    this.freeAt = start + ms;
    sim.remoteTokens = tokens;
    const cancel = this.clock.setTimeout(
      () => {
        this.receiving.delete(sim);
        const stats = this.stats;
        stats.transfers++;
        stats.bytes += bytes;
        stats.seconds += ms / 1000;
        stats.recent.push({ seconds: ms / 1000, bytes });
        if (stats.recent.length > 4096) stats.recent.shift();
        arrived();
      },
      start + ms - now,
    );
    this.receiving.set(sim, cancel);
  }

  /** Stops `sim`'s transfer; false when it is not on the link. */
  cancel(sim: SimCall): boolean {
    const receiving = this.receiving.get(sim);
    if (!receiving) return false;
    receiving();
    this.receiving.delete(sim);
    return true;
  }

  /** The calls on the link now. */
  calls(): SimCall[] {
    return [...this.receiving.keys()];
  }
}
