/** @module The `instant` preset's call: served whole inside `generate()`, leaving the prefix cache as a finished call would. */

import type { RankSim } from "./rank.js";
import type { SimCall } from "./sim-call.js";
import type { VocabularyEntry } from "./vocabulary.js";

/** Prefix lookup (both tiers), all output, caching and completion in one go, at `now`. */
export function runInstant(
  rank: RankSim,
  sim: SimCall,
  vocabulary: readonly VocabularyEntry[],
  now: number,
): void {
  const { kv, counters } = rank;
  const { pool, blockSize: bs } = kv;
  const { blocks: hits, hostBlocks } = kv.prefixHits(sim);
  // The host tier continues the chain where GPU memory lost it (loaded at no time here).
  if (hostBlocks > 0) kv.host!.touch(sim.hashes, hits.length, hostBlocks);
  sim.hostCachedTokens = hostBlocks * bs;
  sim.cachedTokens = hits.length * bs + sim.hostCachedTokens;
  kv.countLookup(sim.promptLen, hits.length * bs, sim.hostCachedTokens);
  counters.hostLoadedTokens += sim.hostCachedTokens;
  counters.promptTokens += sim.promptLen;
  let text = "";
  for (let i = 0; i < sim.maxTokens; i++) text += sim.sample(vocabulary).text;
  counters.generationTokens += sim.maxTokens;
  counters.prefillTokens += sim.promptLen - sim.cachedTokens;
  counters.decodeTokens += sim.maxTokens;
  // Leave the whole sequence in the cache, as a finished call would.
  const full = sim.hashes.length;
  const need = full - hits.length;
  if (need <= pool.freeBlocks() - pool.countFree(hits)) {
    pool.touch(hits);
    const blocks = hits.slice();
    for (let i = hits.length; i < full; i++) {
      const b = pool.allocate();
      blocks.push(b);
      pool.register(b, sim.hashes[i]!);
    }
    pool.release(blocks);
  }
  counters.finished++;
  sim.state = "done";
  sim.firstTokenMs = now;
  sim.stream.push(sim.output, text);
  sim.stream.end(sim.result("length"));
}
