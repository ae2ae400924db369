/** @module Paged KV blocks with automatic prefix caching: chained block hashes, ref counts and an LRU free queue (as vLLM's). */

const NONE = -1;

/** What happened to a cached block, for observers that mirror the cache (KV events). */
export interface KvBlockEvent {
  type: "stored" | "removed";
  /** The block's chained hash (53-bit integer). */
  hash: number;
  /**
   * Where the block is, in vLLM's KV-event terms (`BlockStored.medium`,
   * `BlockRemoved.medium`: "GPU", "CPU"): absent for the GPU tier, `CPU` for
   * the host tier (whose events come through `onHostKvEvent`).
   */
  medium?: "CPU";
}

/**
 * hash → block for at most `capacity` entries: open addressing with linear
 * probing and backward-shift deletion over typed arrays. The simulator
 * registers and evicts millions of blocks; a `Map` with 53-bit float keys
 * spent most of its time boxing and hashing them.
 */
export class HashIndex {
  private readonly keys: Float64Array;
  private readonly values: Int32Array;
  private readonly mask: number;
  size = 0;

  constructor(capacity: number) {
    let slots = 16;
    while (slots < capacity * 2) slots *= 2;
    this.keys = new Float64Array(slots);
    this.values = new Int32Array(slots).fill(NONE);
    this.mask = slots - 1;
  }

  /** The block stored under `hash`, or −1. */
  get(hash: number): number {
    const { keys, values, mask } = this;
    // Block hashes are mixed already: their low 32 bits are a murmur finaliser's output.
    for (let i = (hash % 4294967296) & mask; ; i = (i + 1) & mask) {
      const v = values[i]!;
      if (v === NONE) return NONE;
      if (keys[i] === hash) return v;
    }
  }

  /** Stores `block` under `hash` (which must be absent). */
  set(hash: number, block: number): void {
    const { keys, values, mask } = this;
    let i = (hash % 4294967296) & mask;
    while (values[i] !== NONE) i = (i + 1) & mask;
    keys[i] = hash;
    values[i] = block;
    this.size++;
  }

  /** Removes `hash` if present. */
  delete(hash: number): void {
    const { keys, values, mask } = this;
    let i = (hash % 4294967296) & mask;
    for (;;) {
      if (values[i] === NONE) return;
      if (keys[i] === hash) break;
      i = (i + 1) & mask;
    }
    // Backward shift: move later entries of the probe run into the hole so lookups never stop early.
    let hole = i;
    for (let j = (i + 1) & mask; values[j] !== NONE; j = (j + 1) & mask) {
      const home = (keys[j]! % 4294967296) & mask;
      // Entry j may fill the hole when its home is not strictly between hole and j (cyclically).
      const between = hole <= j ? hole < home && home <= j : hole < home || home <= j;
      if (!between) {
        keys[hole] = keys[j]!;
        values[hole] = values[j]!;
        hole = j;
      }
    }
    values[hole] = NONE;
    this.size--;
  }
}

/**
 * The KV blocks of one rank. A block is *used* while some call references it
 * (ref count > 0) and *free* otherwise. Free blocks sit in one LRU queue:
 * allocation takes the head, release appends at the tail. A free block that
 * still carries a hash is *evictable cache*: a later call with the same
 * prefix takes it back out of the queue (a hit) until allocation reaches it
 * and drops its hash (an eviction). Used blocks are never evicted.
 *
 * Everything is O(1) per block; no token arrays are kept here, only hashes.
 */
export class BlockPool {
  readonly numBlocks: number;
  private readonly ref: Int32Array;
  private readonly hashOf: Float64Array;
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private head = NONE;
  private tail = NONE;
  private free: number;
  private readonly cache: HashIndex;
  private evictions = 0;

  /**
   * @param numBlocks blocks in the pool (≥ 1)
   * @param onEvent called when a hash enters or leaves the cache
   * @param onEvict called with the hash of each cached block evicted to make room (a host tier keeps it)
   */
  constructor(
    numBlocks: number,
    private readonly onEvent?: (event: KvBlockEvent) => void,
    private readonly onEvict?: (hash: number) => void,
  ) {
    if (!(Number.isInteger(numBlocks) && numBlocks >= 1)) {
      throw new RangeError(`numBlocks should be a positive integer, got ${numBlocks}`);
    }
    this.numBlocks = numBlocks;
    this.ref = new Int32Array(numBlocks);
    this.hashOf = new Float64Array(numBlocks).fill(NONE);
    this.prev = new Int32Array(numBlocks);
    this.next = new Int32Array(numBlocks);
    for (let b = 0; b < numBlocks; b++) {
      this.prev[b] = b - 1;
      this.next[b] = b + 1 < numBlocks ? b + 1 : NONE;
    }
    this.cache = new HashIndex(numBlocks);
    this.head = 0;
    this.tail = numBlocks - 1;
    this.free = numBlocks;
  }

  /** Blocks in the free queue (never used, or evictable cache). */
  freeBlocks(): number {
    return this.free;
  }

  /** Blocks referenced by at least one call. */
  usedBlocks(): number {
    return this.numBlocks - this.free;
  }

  /** Blocks whose hash is in the cache (used or evictable). */
  cachedBlocks(): number {
    return this.cache.size;
  }

  /** Cached blocks evicted so far (a hashed free block handed out again). */
  evictedBlocks(): number {
    return this.evictions;
  }

  /** Whether a block with this chained hash is cached. */
  has(hash: number): boolean {
    return this.cache.get(hash) !== NONE;
  }

  /** Reference count of a block (for tests). */
  refCount(block: number): number {
    return this.ref[block]!;
  }

  /** Block ids of the free queue, next to be allocated first (for tests; O(free)). */
  freeQueue(): number[] {
    const out: number[] = [];
    for (let b = this.head; b !== NONE; b = this.next[b]!) out.push(b);
    return out;
  }

  /** Hash a block carries, or undefined (for tests). */
  hashOfBlock(block: number): number | undefined {
    const h = this.hashOf[block]!;
    return h === NONE ? undefined : h;
  }

  /**
   * The cached blocks of the longest unbroken prefix of `hashes`, at most
   * `maxBlocks`: a block counts only when every block before it does.
   */
  lookup(hashes: readonly number[], maxBlocks: number): number[] {
    const out: number[] = [];
    const limit = Math.min(maxBlocks, hashes.length);
    for (let i = 0; i < limit; i++) {
      const block = this.cache.get(hashes[i]!);
      if (block === NONE) break;
      out.push(block);
    }
    return out;
  }

  /** How many of `blocks` are free (taking them leaves the free queue shorter by that much). */
  countFree(blocks: readonly number[]): number {
    let n = 0;
    for (const b of blocks) if (this.ref[b] === 0) n++;
    return n;
  }

  /** Adds a reference to each block, taking free ones out of the queue (a prefix-cache hit). */
  touch(blocks: readonly number[]): void {
    for (const b of blocks) {
      if (this.ref[b] === 0) this.unlink(b);
      this.ref[b]!++;
    }
  }

  /** Takes the least recently freed block, evicting its cached hash. Throws when none is free. */
  allocate(): number {
    const b = this.head;
    if (b === NONE) throw new Error("BlockPool.allocate: no free block (callers check freeBlocks() first)");
    this.unlink(b);
    const h = this.hashOf[b]!;
    if (h !== NONE) {
      this.hashOf[b] = NONE;
      if (this.cache.get(h) === b) {
        this.cache.delete(h);
        this.evictions++;
        this.onEvict?.(h);
        this.onEvent?.({ type: "removed", hash: h });
      }
    }
    this.ref[b] = 1;
    return b;
  }

  /**
   * Publishes a full block under its chained hash. When another block already
   * holds that hash (two calls computed the same prefix at once) the first
   * stays the cached one and this block stays anonymous.
   */
  register(block: number, hash: number): void {
    if (this.hashOf[block] !== NONE || this.cache.get(hash) !== NONE) return;
    this.hashOf[block] = hash;
    this.cache.set(hash, block);
    this.onEvent?.({ type: "stored", hash });
  }

  /**
   * Drops one reference to each block, last block first, so that a call's
   * tail is evicted before its head and the shared prefix survives longest.
   */
  release(blocks: readonly number[]): void {
    for (let i = blocks.length - 1; i >= 0; i--) {
      const b = blocks[i]!;
      const r = this.ref[b]! - 1;
      if (r < 0) throw new Error(`BlockPool.release: block ${b} was not referenced`);
      this.ref[b] = r;
      if (r === 0) this.append(b);
    }
  }

  private unlink(b: number): void {
    const p = this.prev[b]!;
    const n = this.next[b]!;
    if (p === NONE) this.head = n;
    else this.next[p] = n;
    if (n === NONE) this.tail = p;
    else this.prev[n] = p;
    this.prev[b] = NONE;
    this.next[b] = NONE;
    this.free--;
  }

  private append(b: number): void {
    this.prev[b] = this.tail;
    this.next[b] = NONE;
    if (this.tail === NONE) this.head = b;
    else this.next[this.tail] = b;
    this.tail = b;
    this.free++;
  }
}
