/** @module The host-memory KV tier of a simulated rank: an LRU set of block hashes that GPU evictions spill into. */

import { HashIndex, type KvBlockEvent } from "./block-pool.js";

const NONE = -1;

/**
 * Block hashes kept in host memory, at most `capacity` of them, least
 * recently used first out. Only hashes are kept: a block's place in the
 * chain is in its hash, so a hash found here is a block whose KV can be
 * copied back instead of recomputed.
 *
 * A block enters when the GPU pool evicts it (or is touched again when it
 * is already here), and is touched when a call loads it. It stays after a
 * load — the host copy is still valid, as in vLLM's CPU offloading and
 * SGLang's HiCache — and leaves only when the tier is full and it is the
 * least recently used. Everything is O(1) per block over typed arrays.
 */
export class HostTier {
  readonly capacity: number;
  private readonly index: HashIndex;
  private readonly hashOf: Float64Array;
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  /** Least recently used slot (next to leave). */
  private head = NONE;
  /** Most recently used slot. */
  private tail = NONE;
  private used = 0;
  private evictions = 0;
  private stores = 0;

  /**
   * @param capacity blocks the tier holds (≥ 1)
   * @param onEvent called when a hash enters or leaves the tier (`medium: "CPU"`)
   */
  constructor(
    capacity: number,
    private readonly onEvent?: (event: KvBlockEvent) => void,
  ) {
    if (!(Number.isInteger(capacity) && capacity >= 1)) {
      throw new RangeError(`capacity should be a positive integer, got ${capacity}`);
    }
    this.capacity = capacity;
    this.index = new HashIndex(capacity);
    this.hashOf = new Float64Array(capacity);
    this.prev = new Int32Array(capacity).fill(NONE);
    this.next = new Int32Array(capacity).fill(NONE);
  }

  /** Blocks held. */
  size(): number {
    return this.used;
  }

  /** Blocks dropped to make room so far. */
  evictedBlocks(): number {
    return this.evictions;
  }

  /** Blocks written from GPU memory so far (a block already here is not written again). */
  storedBlocks(): number {
    return this.stores;
  }

  /** Whether a block with this chained hash is held. */
  has(hash: number): boolean {
    return this.index.get(hash) !== NONE;
  }

  /**
   * A block evicted from GPU memory: kept as the most recently used, dropping
   * the least recently used one when full. Returns whether it was written
   * (false when the tier already held it).
   */
  store(hash: number): boolean {
    const slot = this.index.get(hash);
    if (slot !== NONE) {
      this.moveToTail(slot);
      return false;
    }
    let fresh: number;
    if (this.used < this.capacity) {
      fresh = this.used++;
    } else {
      fresh = this.head;
      this.unlink(fresh);
      const dropped = this.hashOf[fresh]!;
      this.index.delete(dropped);
      this.evictions++;
      this.onEvent?.({ type: "removed", hash: dropped, medium: "CPU" });
    }
    this.hashOf[fresh] = hash;
    this.index.set(hash, fresh);
    this.append(fresh);
    this.stores++;
    this.onEvent?.({ type: "stored", hash, medium: "CPU" });
    return true;
  }

  /**
   * How many of `hashes[from…limit)` are held, counting from `from` and
   * stopping at the first absent one (a block counts only when every block
   * before it does).
   */
  matchFrom(hashes: readonly number[], from: number, limit: number): number {
    const end = Math.min(limit, hashes.length);
    let n = 0;
    for (let i = from; i < end; i++) {
      if (this.index.get(hashes[i]!) === NONE) break;
      n++;
    }
    return n;
  }

  /** Marks `hashes[from…from+count)` as just used (they were loaded). */
  touch(hashes: readonly number[], from: number, count: number): void {
    for (let i = from; i < from + count; i++) {
      const slot = this.index.get(hashes[i]!);
      if (slot !== NONE) this.moveToTail(slot);
    }
  }

  /** Hashes held, least recently used first (for tests; O(size)). */
  lruOrder(): number[] {
    const out: number[] = [];
    for (let s = this.head; s !== NONE; s = this.next[s]!) out.push(this.hashOf[s]!);
    return out;
  }

  private moveToTail(slot: number): void {
    if (slot === this.tail) return;
    this.unlink(slot);
    this.append(slot);
  }

  private unlink(slot: number): void {
    const p = this.prev[slot]!;
    const n = this.next[slot]!;
    if (p === NONE) this.head = n;
    else this.next[p] = n;
    if (n === NONE) this.tail = p;
    else this.prev[n] = p;
    this.prev[slot] = NONE;
    this.next[slot] = NONE;
  }

  private append(slot: number): void {
    this.prev[slot] = this.tail;
    this.next[slot] = NONE;
    if (this.tail === NONE) this.head = slot;
    else this.next[this.tail] = slot;
    this.tail = slot;
  }
}
