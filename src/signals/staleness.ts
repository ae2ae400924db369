/** @module Signal age and staleness: signals older than the limit count as saturated for new sessions (docs/how-it-works.md#session-window-tokens-of-cache-footprint). */

import type { Clock } from "../clock.js";

/** docs/how-it-works.md#session-window-tokens-of-cache-footprint default staleness limit, ms. */
export const DEFAULT_STALE_AFTER_MS = 5000;

/**
 * Whether a signal read at `readAtMs` is stale at `nowMs`: older than
 * `staleAfterMs` (strictly), or never read (`readAtMs` undefined, NaN or −∞).
 */
export function isStale(readAtMs: number | undefined, nowMs: number, staleAfterMs: number): boolean {
  if (readAtMs === undefined || Number.isNaN(readAtMs)) return true;
  return nowMs - readAtMs > staleAfterMs;
}

/** Tracks when a replica's signals were last read, on an injected clock. */
export class SignalAge {
  private readonly clock: Clock;
  private readonly staleAfterMs: number;
  private readAtMs: number | undefined;

  constructor(options: { clock: Clock; staleAfterMs?: number }) {
    if (!options || typeof options.clock?.now !== "function") {
      throw new TypeError(`SignalAge needs options.clock, a Clock, got ${String(options?.clock)}`);
    }
    const staleAfterMs = options.staleAfterMs ?? DEFAULT_STALE_AFTER_MS;
    if (!(typeof staleAfterMs === "number" && staleAfterMs >= 0 && !Number.isNaN(staleAfterMs))) {
      throw new RangeError(`staleAfterMs should be a non-negative number of ms, got ${staleAfterMs}`);
    }
    this.clock = options.clock;
    this.staleAfterMs = staleAfterMs;
  }

  /** Records a fresh reading, now or at `atMs`. */
  mark(atMs: number = this.clock.now()): void {
    this.readAtMs = atMs;
  }

  /** When the signals were last read, ms; undefined when never. */
  get lastReadAtMs(): number | undefined {
    return this.readAtMs;
  }

  /** Age of the last reading, ms; +∞ when never read. */
  ageMs(): number {
    return this.readAtMs === undefined ? Number.POSITIVE_INFINITY : this.clock.now() - this.readAtMs;
  }

  /** Whether the signals are stale now. */
  stale(): boolean {
    return isStale(this.readAtMs, this.clock.now(), this.staleAfterMs);
  }
}
