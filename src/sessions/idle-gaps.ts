/** @module Recent idle gaps (ms) and a high quantile of them: how soon a session is expected back (SPEC 6). */

/** A bounded ring of the most recent gaps. */
export class IdleGaps {
  private readonly values: number[] = [];
  private next = 0;

  constructor(private readonly capacity: number) {
    if (!(Number.isSafeInteger(capacity) && capacity >= 1)) {
      throw new RangeError(`IdleGaps capacity should be a whole number ≥ 1, got ${capacity}`);
    }
  }

  get size(): number {
    return this.values.length;
  }

  record(gapMs: number): void {
    if (!(Number.isFinite(gapMs) && gapMs >= 0)) return;
    if (this.values.length < this.capacity) this.values.push(gapMs);
    else this.values[this.next] = gapMs;
    this.next = (this.next + 1) % this.capacity;
  }

  /**
   * The q-quantile (0–1] of the recorded gaps, nearest rank (a gap that was
   * actually seen, never an interpolation below it); undefined when empty.
   */
  quantile(q: number): number | undefined {
    if (this.values.length === 0) return undefined;
    const sorted = [...this.values].sort((a, b) => a - b);
    const rank = Math.min(sorted.length, Math.max(1, Math.ceil(q * sorted.length)));
    return sorted[rank - 1];
  }
}
