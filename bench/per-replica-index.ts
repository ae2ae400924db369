/**
 * @module The per-replica prefix indexes the fleet index replaced, as a `PrefixMatcher`: one
 * `PrefixIndex` (an LRU of rendered hashes) per replica, every one probed on each decision. Kept
 * for comparison (bench/routing-scale.ts, bench/overhead-routing.ts) and as a second model that
 * tests check the fleet index against; one tier only (every block held is a GPU block).
 */

import type { PrefixMatcher } from "../src/routing/placement.js";
import { PrefixIndex } from "../src/routing/prefix-index.js";

export class PerReplicaIndexes implements PrefixMatcher {
  private readonly indexes = new Map<string, PrefixIndex>();

  /** Builds `PrefixIndex(capacityBlocks)` for a replica on its first use. */
  constructor(private readonly capacityBlocks: (replica: string) => number = () => 10_000) {}

  /** The replica's index (created empty). */
  of(replica: string): PrefixIndex {
    let index = this.indexes.get(replica);
    if (index === undefined) {
      index = new PrefixIndex(this.capacityBlocks(replica));
      this.indexes.set(replica, index);
    }
    return index;
  }

  /** Uses `index` as the replica's. */
  set(replica: string, index: PrefixIndex): this {
    this.indexes.set(replica, index);
    return this;
  }

  match(hashes: readonly string[], gpuBlocks?: Map<string, number>): Map<string, number> {
    const result = new Map<string, number>();
    for (const [replica, index] of this.indexes) {
      const blocks = index.matchBlocks(hashes);
      if (blocks === 0) continue;
      result.set(replica, blocks);
      gpuBlocks?.set(replica, blocks);
    }
    return result;
  }

  matchReplica(replica: string, hashes: readonly string[], tiers?: { gpuBlocks: number }): number {
    const blocks = this.indexes.get(replica)?.matchBlocks(hashes) ?? 0;
    if (tiers !== undefined) tiers.gpuBlocks = blocks;
    return blocks;
  }
}
