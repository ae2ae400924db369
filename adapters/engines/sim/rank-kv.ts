/**
 * @module The KV memory of one simulated rank: its paged, prefix-cached GPU pool, the host tier
 * behind it, and how a call's blocks are found, taken and offered to the cache.
 */

import { BlockPool } from "./block-pool.js";
import { HostTier } from "./host-tier.js";
import type { RankContext, RankCounters } from "./rank-types.js";
import type { SimCall } from "./sim-call.js";

/** Where a call's prompt is already cached: GPU blocks in the pool, then blocks in the host tier continuing the chain. */
export interface PrefixHits {
  /** The call's cached blocks in GPU memory, in chain order. */
  blocks: number[];
  /** Blocks after those found in the host tier (0 without one). */
  hostBlocks: number;
}

/** The GPU pool and host tier of one rank. Blocks evicted from GPU memory are written to the host tier. */
export class RankKv {
  readonly pool: BlockPool;
  /** The host-memory tier, when the rank has one. */
  readonly host: HostTier | undefined;
  readonly blockSize: number;

  constructor(
    ctx: RankContext,
    private readonly counters: RankCounters,
  ) {
    const { params } = ctx;
    this.blockSize = params.blockSize;
    const onKv = ctx.onKvEvent;
    const hostBlocks = Math.floor(params.hostKvTokens / params.blockSize);
    const onHostKv = ctx.onHostKvEvent;
    const host =
      hostBlocks > 0
        ? new HostTier(hostBlocks, onHostKv ? (event) => onHostKv(ctx.rank, event) : undefined)
        : undefined;
    this.host = host;
    this.pool = new BlockPool(
      Math.floor(params.kvCapacityTokens / params.blockSize),
      onKv ? (event) => onKv(ctx.rank, event) : undefined,
      host
        ? (hash) => {
            if (host.store(hash)) counters.hostStoredBlocks++;
          }
        : undefined,
    );
  }

  /**
   * The cached prefix of a call's prompt. At least the last prompt token is computed (as vLLM
   * does), so hits stop one short of it; the chain continues in host memory where GPU memory lost it.
   */
  prefixHits(call: SimCall): PrefixHits {
    const maxHitBlocks = Math.floor((call.numTokens - 1) / this.blockSize);
    const blocks = this.pool.lookup(call.hashes, maxHitBlocks);
    const hostBlocks = this.host ? this.host.matchFrom(call.hashes, blocks.length, maxHitBlocks) : 0;
    return { blocks, hostBlocks };
  }

  /** Counts a call's first prefix lookup: `queryTokens` looked up, found in GPU memory, then in the host tier. */
  countLookup(queryTokens: number, gpuHitTokens: number, hostHitTokens: number): void {
    const counters = this.counters;
    counters.prefixQueryTokens += queryTokens;
    counters.prefixHitTokens += gpuHitTokens;
    if (this.host) {
      counters.hostQueryTokens += queryTokens - gpuHitTokens;
      counters.hostHitTokens += hostHitTokens;
    }
  }

  /**
   * Gives a waiting call its cached blocks and fresh ones up to `tokens` tokens, its first
   * `computed` tokens already in place; false (and nothing taken) when the pool is short.
   */
  admit(call: SimCall, hits: PrefixHits, computed: number, tokens: number): boolean {
    const cached = hits.blocks;
    const need = Math.ceil(tokens / this.blockSize) - cached.length;
    if (need > this.pool.freeBlocks() - this.pool.countFree(cached)) return false;
    this.pool.touch(cached);
    // Touched before allocating: the evictions that allocation spills into the host tier must not push these out.
    if (hits.hostBlocks > 0) this.host!.touch(call.hashes, cached.length, hits.hostBlocks);
    call.blocks = cached;
    call.registered = cached.length;
    call.numComputed = computed;
    for (let j = 0; j < need; j++) call.blocks.push(this.pool.allocate());
    return true;
  }

  /** Gives the call enough blocks for `tokens` tokens; false (and nothing taken) when the pool is short. */
  grow(call: SimCall, tokens: number): boolean {
    const need = Math.ceil(tokens / this.blockSize) - call.blocks.length;
    if (need <= 0) return true;
    if (need > this.pool.freeBlocks()) return false;
    for (let j = 0; j < need; j++) call.blocks.push(this.pool.allocate());
    return true;
  }

  /** Offers the call's newly full blocks to the prefix cache. */
  registerFull(call: SimCall): void {
    const full = Math.floor(call.numComputed / this.blockSize);
    for (let i = call.registered; i < full; i++) this.pool.register(call.blocks[i]!, call.hashes[i]!);
    if (full > call.registered) call.registered = full;
  }

  /** Returns the call's blocks to the pool (cached blocks stay cached until evicted). */
  release(call: SimCall): void {
    if (call.blocks.length > 0) this.pool.release(call.blocks);
    call.blocks = [];
  }

  /** Largest n ≤ `limit` such that every running call can get the blocks for n decode steps. */
  feasibleSteps(running: readonly SimCall[], limit: number): number {
    const enough = (n: number): boolean => {
      let need = 0;
      // numComputed already includes the first step of the run.
      for (const call of running) {
        const extra = Math.ceil((call.numComputed + n - 1) / this.blockSize) - call.blocks.length;
        if (extra > 0) need += extra;
      }
      return need <= this.pool.freeBlocks();
    };
    if (enough(limit)) return limit;
    let lo = 1;
    let hi = limit;
    while (hi - lo > 1) {
      const mid = Math.floor((lo + hi) / 2);
      if (enough(mid)) lo = mid;
      else hi = mid;
    }
    return lo;
  }
}
