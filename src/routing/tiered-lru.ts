/**
 * @module Per-replica LRU lists of the fleet prefix index's entries, each cut in two tiers
 * (docs/routing.md, docs/tiers.md): a replica's most recent `capacity` entries are taken to be in
 * GPU memory, the next `hostCapacity` in host memory only. That is what a write-back host tier
 * does — a block GPU memory evicts (its least recently used) moves to the head of the host LRU,
 * and one used again moves back — so one list cut in two predicts both tiers from what was routed.
 *
 * Entries are ids the index allocates; this module keeps their recency links and tier in typed
 * arrays indexed by entry, and per replica its list ends, counts and capacities.
 */

import { NONE } from "./id-table.js";

export const GPU = 0;
export const HOST = 1;

function grownInt32(old: Int32Array<ArrayBuffer>, length: number): Int32Array<ArrayBuffer> {
  const next = new Int32Array(length);
  next.set(old);
  return next;
}

export class TieredLru {
  /** Per entry: towards the more recent entry of the same replica. */
  prev: Int32Array<ArrayBuffer>;
  /** Per entry: towards the less recent entry. */
  next: Int32Array<ArrayBuffer>;
  /** Per entry: GPU or HOST. */
  tier: Uint8Array<ArrayBuffer>;

  // Per replica slot.
  readonly head: number[] = [];
  readonly tail: number[] = [];
  /** Entries in both tiers. */
  readonly held: number[] = [];
  /** Entries in GPU memory; the rest of `held` are host entries. */
  readonly gpuHeld: number[] = [];
  readonly capacity: number[] = [];
  readonly hostCapacity: number[] = [];
  /** The most recent host entry (every later entry in the list is host too), NONE when there is none. */
  readonly hostHead: number[] = [];

  constructor(length: number) {
    this.prev = new Int32Array(length);
    this.next = new Int32Array(length);
    this.tier = new Uint8Array(length);
  }

  /** Room for entries up to `length`. */
  grow(length: number): void {
    this.prev = grownInt32(this.prev, length);
    this.next = grownInt32(this.next, length);
    const tier = new Uint8Array(length);
    tier.set(this.tier);
    this.tier = tier;
  }

  /** Bytes of the per-entry arrays, allocated. */
  get bytes(): number {
    return this.prev.byteLength + this.next.byteLength + this.tier.byteLength;
  }

  /** A replica slot, empty, with GPU capacity 1 and no host tier until set. */
  reset(r: number): void {
    this.head[r] = NONE;
    this.tail[r] = NONE;
    this.held[r] = 0;
    this.gpuHeld[r] = 0;
    this.capacity[r] = 1;
    this.hostCapacity[r] = 0;
    this.hostHead[r] = NONE;
  }

  /**
   * Makes `entry` a GPU entry right behind `after` in recency (at the head when `after` is NONE),
   * `after` being a GPU entry. `fresh`: the entry is new to the replica's list.
   */
  touch(entry: number, r: number, after: number, fresh: boolean): void {
    if (fresh) this.held[r]!++;
    else this.unlink(entry, r);
    // Right behind a GPU entry (or at the head): still ahead of `hostHead`, so in the GPU part.
    const next = after === NONE ? this.head[r]! : this.next[after]!;
    this.prev[entry] = after;
    this.next[entry] = next;
    if (after === NONE) this.head[r] = entry;
    else this.next[after] = entry;
    if (next === NONE) this.tail[r] = entry;
    else this.prev[next] = entry;
    this.tier[entry] = GPU;
    this.gpuHeld[r]!++;
  }

  /** Takes `entry` out of the replica's list for good. */
  remove(entry: number, r: number): void {
    this.unlink(entry, r);
    this.held[r]!--;
  }

  /**
   * Moves GPU entries beyond the GPU capacity to host memory, least recent first (the entry just
   * ahead of the host head becomes it). Then returns the least recent entry when host entries
   * exceed the host capacity (the caller removes it and asks again), else NONE.
   */
  overflow(r: number): number {
    const max = this.capacity[r]!;
    while (this.gpuHeld[r]! > max) {
      const head = this.hostHead[r]!;
      const last = head === NONE ? this.tail[r]! : this.prev[head]!;
      this.tier[last] = HOST;
      this.hostHead[r] = last;
      this.gpuHeld[r]!--;
    }
    return this.held[r]! - this.gpuHeld[r]! > this.hostCapacity[r]! ? this.tail[r]! : NONE;
  }

  /** Takes `entry` out of the list, and out of its GPU count or off the host head. */
  private unlink(entry: number, r: number): void {
    const prev = this.prev[entry]!;
    const next = this.next[entry]!;
    if (this.tier[entry] === GPU) this.gpuHeld[r]!--;
    else if (this.hostHead[r] === entry) this.hostHead[r] = next;
    if (prev !== NONE) this.next[prev] = next;
    else this.head[r] = next;
    if (next !== NONE) this.prev[next] = prev;
    else this.tail[r] = prev;
  }
}
