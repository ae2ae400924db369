/**
 * @module Per-replica index of the block hashes sluice sent to it (docs/routing.md): an LRU of at most the
 * replica's KV capacity in blocks, a model of what its prefix cache still holds.
 */

import { LRUCache } from "lru-cache";
import { longestPrefixMatch } from "./block-hash.js";

function checkCapacity(capacityBlocks: number): number {
  if (!Number.isInteger(capacityBlocks) || capacityBlocks < 1) {
    throw new RangeError(`capacityBlocks should be a positive integer, got ${capacityBlocks}`);
  }
  return capacityBlocks;
}

/**
 * The blocks a replica is believed to hold, least recently used evicted first. A model, not the
 * truth: replicas that publish KV events can keep it exact through `record` and `clear`.
 */
export class PrefixIndex {
  private lru: LRUCache<string, true>;

  /** @param capacityBlocks the replica's KV capacity in blocks of the router's block size (≥ 1) */
  constructor(capacityBlocks: number) {
    this.lru = new LRUCache<string, true>({ max: checkCapacity(capacityBlocks) });
  }

  /** Capacity in blocks. */
  get capacity(): number {
    return this.lru.max;
  }

  /** Blocks held. */
  get size(): number {
    return this.lru.size;
  }

  /**
   * Records that the replica now holds these chained blocks (a prompt plus its output), making
   * them the most recently used. Within one chain, block 0 ends up the most recent and the last
   * block the least: a chain is worth something only from its head, so its tail must go
   * first — the order in which vLLM frees a finished request's blocks for eviction.
   */
  record(hashes: readonly string[]): void {
    for (let i = hashes.length - 1; i >= 0; i--) this.lru.set(hashes[i]!, true);
  }

  /** Longest unbroken prefix of `hashes` held, in blocks. Does not change recency. */
  matchBlocks(hashes: readonly string[]): number {
    const lru = this.lru;
    return longestPrefixMatch(hashes, (hash) => lru.has(hash));
  }

  /** Whether one block is held. Does not change recency. */
  has(hash: string): boolean {
    return this.lru.has(hash);
  }

  /** Forgets one block (a KV event reported its eviction). */
  delete(hash: string): boolean {
    return this.lru.delete(hash);
  }

  /** Forgets everything (the replica restarted or reset its prefix cache). */
  clear(): void {
    this.lru.clear();
  }

  /**
   * Changes the capacity (the replica reported its KV capacity). Shrinking evicts the least
   * recently used blocks; recency order is kept.
   */
  resize(capacityBlocks: number): void {
    const max = checkCapacity(capacityBlocks);
    if (max === this.lru.max) return;
    const next = new LRUCache<string, true>({ max });
    // rkeys() runs from least to most recently used, so re-inserting keeps the order.
    for (const key of this.lru.rkeys()) next.set(key, true);
    this.lru = next;
  }
}
