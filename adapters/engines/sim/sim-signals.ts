/**
 * @module What a simulated replica reports of its ranks: the engine signals sluice reads, the
 * per-rank signals its `/metrics` labels with `engine`, and its work counters.
 */

import type { EngineSignals, ReplicaRole } from "../../../src/engine.js";
import {
  hostLoadMsPerToken,
  kvTransferMsPerToken,
  prefillTokensPerSecond,
  type SimParams,
} from "./presets.js";
import type { RankSim } from "./rank.js";
import type { RankCounters } from "./rank-types.js";

/** Cumulative counters of a simulated replica (all ranks). */
export interface SimStats extends RankCounters {
  /** Cached blocks evicted to make room. */
  evictedBlocks: number;
  /** Blocks dropped from the host tier to make room (0 without one). */
  hostEvictedBlocks: number;
  /** Per rank, same fields. */
  ranks: RankCounters[];
}

/** Signals of one rank (what vLLM reports per `engine` label). */
export interface RankSignals {
  rank: number;
  kvUsage: number;
  running: number;
  waiting: number;
  preemptions: number;
  prefixQueryTokens: number;
  prefixHitTokens: number;
  promptTokens: number;
  generationTokens: number;
  numBlocks: number;
  /** Host-tier blocks (0 without a host tier), blocks held there, and its counters. */
  numHostBlocks: number;
  hostBlocksUsed: number;
  hostQueryTokens: number;
  hostHitTokens: number;
  hostLoadedTokens: number;
  hostLoadMs: number;
  hostStoredBlocks: number;
}

/** The replica a set of ranks makes up, as its signals describe it. */
export interface ReplicaShape {
  params: Readonly<SimParams>;
  role: ReplicaRole;
  dataParallelSize: number;
  healthy: boolean;
  readAtMs: number;
}

/** Signals of the whole replica: KV usage over all ranks' blocks, counts summed. */
export function replicaSignals(ranks: readonly RankSim[], replica: ReplicaShape): EngineSignals {
  const { params } = replica;
  let used = 0;
  let blocks = 0;
  let running = 0;
  let waiting = 0;
  let preemptions = 0;
  let queries = 0;
  let hits = 0;
  for (const rank of ranks) {
    rank.catchUp();
    used += rank.kv.pool.usedBlocks();
    blocks += rank.kv.pool.numBlocks;
    running += rank.runningCount();
    waiting += rank.waitingCalls();
    preemptions += rank.counters.preemptions;
    queries += rank.counters.prefixQueryTokens;
    hits += rank.counters.prefixHitTokens;
  }
  const signals: EngineSignals = {
    readAtMs: replica.readAtMs,
    healthy: replica.healthy,
    kvUsage: used / blocks,
    prefixQueryTokens: queries,
    prefixHitTokens: hits,
    running,
    waiting,
    preemptions,
    kvCapacityTokens: blocks * params.blockSize,
    blockSize: params.blockSize,
    maxNumSeqs: params.maxNumSeqs,
    dataParallelSize: replica.dataParallelSize,
    prefillTokensPerSecond: prefillTokensPerSecond(params) * replica.dataParallelSize,
  };
  if (replica.role === "decode") {
    const msPerToken = kvTransferMsPerToken(params);
    signals.kvTransferTokensPerSecond = msPerToken > 0 ? 1000 / msPerToken : 1e9;
  }
  if (ranks[0]!.kv.host) {
    let hostBlocks = 0;
    let hostUsed = 0;
    let hostQueries = 0;
    let hostHits = 0;
    for (const rank of ranks) {
      hostBlocks += rank.kv.host!.capacity;
      hostUsed += rank.kv.host!.size();
      hostQueries += rank.counters.hostQueryTokens;
      hostHits += rank.counters.hostHitTokens;
    }
    signals.hostKvCapacityTokens = hostBlocks * params.blockSize;
    signals.hostKvUsage = hostUsed / hostBlocks;
    signals.hostPrefixQueryTokens = hostQueries;
    signals.hostPrefixHitTokens = hostHits;
    const msPerToken = hostLoadMsPerToken(params);
    signals.hostLoadTokensPerSecond = msPerToken > 0 ? 1000 / msPerToken : 1e9;
  }
  return signals;
}

/** Signals per rank (what vLLM labels with `engine`). */
export function rankSignals(ranks: readonly RankSim[]): RankSignals[] {
  return ranks.map((rank, i) => {
    const { counters } = rank;
    const { pool, host } = rank.kv;
    return {
      rank: i,
      kvUsage: rank.kvUsage(),
      running: rank.runningCount(),
      waiting: rank.waitingCalls(),
      preemptions: counters.preemptions,
      prefixQueryTokens: counters.prefixQueryTokens,
      prefixHitTokens: counters.prefixHitTokens,
      promptTokens: counters.promptTokens,
      generationTokens: counters.generationTokens,
      numBlocks: pool.numBlocks,
      numHostBlocks: host?.capacity ?? 0,
      hostBlocksUsed: host?.size() ?? 0,
      hostQueryTokens: counters.hostQueryTokens,
      hostHitTokens: counters.hostHitTokens,
      hostLoadedTokens: counters.hostLoadedTokens,
      hostLoadMs: counters.hostLoadMs,
      hostStoredBlocks: counters.hostStoredBlocks,
    };
  });
}

/** Work counters (steps, busy time, recomputed tokens, …), summed over ranks and per rank. */
export function replicaStats(ranks: readonly RankSim[]): SimStats {
  const perRank = ranks.map((rank) => {
    rank.catchUp();
    return { ...rank.counters };
  });
  const total = { ...perRank[0]! };
  for (const r of perRank.slice(1)) {
    for (const key of Object.keys(total) as (keyof RankCounters)[]) total[key] += r[key];
  }
  let evictedBlocks = 0;
  let hostEvictedBlocks = 0;
  for (const rank of ranks) {
    evictedBlocks += rank.kv.pool.evictedBlocks();
    hostEvictedBlocks += rank.kv.host?.evictedBlocks() ?? 0;
  }
  return { ...total, evictedBlocks, hostEvictedBlocks, ranks: perRank };
}
