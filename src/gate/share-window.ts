/** @module Prefill tokens admitted per lane over a sliding window: the measure behind bulk's floor and cap. */

/** Lane index inside the gate: 0 interactive, 1 bulk. */
export type LaneIndex = 0 | 1;

/**
 * Admitted prefill tokens per lane over the last `windowMs`, exact (one entry
 * per admission, kept in a growable ring), with a second pair of sums for the
 * admissions made while the other lane had calls queued ("contended").
 * Entries leave the window `windowMs` after they were recorded.
 */
export class ShareWindow {
  private readonly windowMs: number;
  private times = new Float64Array(64);
  private tokens = new Float64Array(64);
  /** bit 0: bulk; bit 1: contended. */
  private flags = new Uint8Array(64);
  private head = 0;
  private size = 0;
  private readonly all: [number, number] = [0, 0];
  private readonly contended: [number, number] = [0, 0];

  constructor(windowMs: number) {
    this.windowMs = windowMs;
  }

  /** Records an admission of `tokens` prefill tokens in `lane` at time `now` (ms). */
  record(now: number, lane: LaneIndex, tokens: number, contended: boolean): void {
    this.evict(now);
    if (this.size === this.times.length) this.grow();
    const i = (this.head + this.size) % this.times.length;
    this.times[i] = now;
    this.tokens[i] = tokens;
    this.flags[i] = lane | (contended ? 2 : 0);
    this.size++;
    this.all[lane] += tokens;
    if (contended) this.contended[lane] += tokens;
  }

  /** Bulk's share (0–1) of all prefill tokens admitted in the window; 0 when none was. */
  bulkShare(now: number): number {
    this.evict(now);
    const total = this.all[0] + this.all[1];
    return total > 0 ? this.all[1] / total : 0;
  }

  /**
   * Bulk's share (0–1) of the tokens admitted while both lanes had calls
   * waiting, or undefined when there was no such admission in the window.
   */
  contendedBulkShare(now: number): number | undefined {
    this.evict(now);
    const total = this.contended[0] + this.contended[1];
    return total > 0 ? this.contended[1] / total : undefined;
  }

  /** Tokens admitted in the window: `[interactive, bulk]`. */
  totals(now: number): [number, number] {
    this.evict(now);
    return [this.all[0], this.all[1]];
  }

  /** When the oldest entry leaves the window (ms), or undefined when the window is empty. */
  nextExpiryAt(now: number): number | undefined {
    this.evict(now);
    return this.size > 0 ? this.times[this.head]! + this.windowMs : undefined;
  }

  private evict(now: number): void {
    const cutoff = now - this.windowMs;
    const cap = this.times.length;
    while (this.size > 0 && this.times[this.head]! <= cutoff) {
      const flags = this.flags[this.head]!;
      const lane = (flags & 1) as LaneIndex;
      const tokens = this.tokens[this.head]!;
      this.all[lane] -= tokens;
      if (flags & 2) this.contended[lane] -= tokens;
      this.head = (this.head + 1) % cap;
      this.size--;
    }
    if (this.size === 0) {
      // Resetting the sums keeps float drift from fractional token counts out of an empty window.
      this.all[0] = this.all[1] = this.contended[0] = this.contended[1] = 0;
      this.head = 0;
    }
  }

  private grow(): void {
    const cap = this.times.length;
    const times = new Float64Array(cap * 2);
    const tokens = new Float64Array(cap * 2);
    const flags = new Uint8Array(cap * 2);
    for (let k = 0; k < this.size; k++) {
      const i = (this.head + k) % cap;
      times[k] = this.times[i]!;
      tokens[k] = this.tokens[i]!;
      flags[k] = this.flags[i]!;
    }
    this.times = times;
    this.tokens = tokens;
    this.flags = flags;
    this.head = 0;
  }
}
