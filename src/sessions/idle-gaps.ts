/** @module Recent idle gaps (ms) and a high quantile of them: how soon a session is expected back (docs/how-it-works.md#session-window-tokens-of-cache-footprint). */

/**
 * A bounded window of the most recent gaps, kept both in arrival order (to
 * know which to drop) and sorted (so a quantile is a lookup, not a sort: the
 * fleet's is asked at every step's end).
 */
export class IdleGaps {
  private readonly ring: number[] = [];
  private readonly sorted: number[] = [];
  private next = 0;

  constructor(private readonly capacity: number) {
    if (!(Number.isSafeInteger(capacity) && capacity >= 1)) {
      throw new RangeError(`IdleGaps capacity should be a whole number ≥ 1, got ${capacity}`);
    }
  }

  get size(): number {
    return this.ring.length;
  }

  record(gapMs: number): void {
    if (!(Number.isFinite(gapMs) && gapMs >= 0)) return;
    if (this.ring.length < this.capacity) {
      this.ring.push(gapMs);
    } else {
      const dropped = this.ring[this.next]!;
      this.sorted.splice(lowerBound(this.sorted, dropped), 1);
      this.ring[this.next] = gapMs;
    }
    this.sorted.splice(lowerBound(this.sorted, gapMs), 0, gapMs);
    this.next = (this.next + 1) % this.capacity;
  }

  /**
   * The q-quantile (0–1] of the recorded gaps, nearest rank (a gap that was
   * actually seen, never an interpolation below it); undefined when empty.
   */
  quantile(q: number): number | undefined {
    const n = this.sorted.length;
    if (n === 0) return undefined;
    const rank = Math.min(n, Math.max(1, Math.ceil(q * n)));
    return this.sorted[rank - 1];
  }
}

/** The first index whose value is ≥ `value` in an ascending array. */
function lowerBound(sorted: readonly number[], value: number): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (sorted[mid]! < value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
