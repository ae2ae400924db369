/**
 * @module Routing at fleet scale: the time of one placement decision for a 32,000-token prompt and
 * the memory of the prefix index at 8, 64, 256 and 1,024 replicas, for the fleet-wide index and
 * (for comparison) the per-replica indexes it replaced.
 *
 * Scenarios: `typical` — every replica holds the shared 2,000-token system prompt and its own
 * sessions up to its capacity, and the session under test ran its previous 30,000-token step on
 * replica r3; `worst` — a 30,000-token prefix is held on every replica (on top of their own
 * sessions), so every replica matches 469 blocks; `staggered` — the same 30,000-token prefix, held
 * whole by r0 and by every other replica cut at its own random depth (as LRU eviction leaves a
 * popular prefix across a fleet), so prefixes end at nearly every block of the walk. Decisions: a new session (no pin) and a pinned
 * step on r3, with cold hashes (the whole prompt hashed) and incremental ones (only the blocks
 * after the previous step's hashes).
 *
 * Run: `npx tsx bench/routing-scale.ts [--replicas 8,64,256,1024] [--scenarios typical,worst,staggered]
 * [--quick]`; writes
 * bench/results/routing-scale.json.
 */

import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { blockHashes, blockHashesFrom } from "../src/routing/block-hash.js";
import { FleetPrefixIndex } from "../src/routing/fleet-prefix-index.js";
import { choosePlacement, type PlacementCandidate } from "../src/routing/placement.js";
import { PrefixIndex } from "../src/routing/prefix-index.js";
import { PerReplicaIndexes } from "./per-replica-index.js";

const BLOCK = 64;
/** h100-llama3-8b: 439k tokens of KV, in router blocks. */
const CAPACITY_BLOCKS = Math.floor(439_000 / BLOCK);
/** Blocks of one filler session beyond the system prompt (~20k tokens). */
const FILL_SESSION_BLOCKS = 312;
const PINNED = "r3";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

/** Deterministic PRNG (mulberry32), so every run measures the same prompts. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function tokenIds(n: number, random: () => number): number[] {
  return Array.from({ length: n }, () => Math.floor(random() * 200_000));
}

let fillCounter = 0;
/** A chain of distinct synthetic block hashes (16 hex digits), standing for other sessions' blocks. */
function fillerChain(blocks: number): string[] {
  const out: string[] = [];
  for (let i = 0; i < blocks; i++) {
    const n = ++fillCounter;
    out.push(`f${n.toString(16).padStart(15, "0")}`);
  }
  return out;
}

/** Per-call latency in µs: p50 and p99 over `iterations` calls after a warm-up. */
function latency(iterations: number, fn: () => void): { p50: number; p99: number; mean: number } {
  for (let i = 0; i < Math.min(100, iterations); i++) fn();
  const samples = new Float64Array(iterations);
  const start = performance.now();
  for (let i = 0; i < iterations; i++) {
    const t0 = performance.now();
    fn();
    samples[i] = (performance.now() - t0) * 1000;
  }
  const mean = ((performance.now() - start) * 1000) / iterations;
  samples.sort();
  const at = (q: number) => samples[Math.min(iterations - 1, Math.floor(q * iterations))]!;
  return { p50: round(at(0.5)), p99: round(at(0.99)), mean: round(mean) };
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}

function candidatesFor(replicas: number): PlacementCandidate[] {
  return Array.from({ length: replicas }, (_, i) => ({
    id: `r${i}`,
    queuedPrefillTokens: 1000 * (i % 8),
    inflightPrefillTokens: 2000,
    prefillTokensPerSecond: 45_000,
    kvUsage: 0.3 + 0.05 * (i % 8),
    busy: false,
    eligible: true,
  }));
}

interface Prompt {
  tokens: number[];
  hashes: string[];
  previousHashes: string[];
}

interface Scenario {
  name: "typical" | "worst" | "staggered";
  /** Blocks every replica holds in common (the head of the prompt). */
  sharedBlocks: number;
}

function buildPrompt(scenario: Scenario, random: () => number): { prompt: Prompt; shared: string[] } {
  const head = tokenIds(scenario.sharedBlocks * BLOCK, random);
  const previous = [...head, ...tokenIds(30_000 - head.length, random)];
  const tokens = [...previous, ...tokenIds(2000, random)];
  const previousHashes = blockHashes(previous, BLOCK);
  return {
    prompt: { tokens, hashes: blockHashes(tokens, BLOCK), previousHashes },
    shared: previousHashes.slice(0, scenario.sharedBlocks),
  };
}

/** Fills a replica with filler sessions under `system` up to its capacity, then records `last`. */
function fillReplica(
  record: (hashes: string[]) => void,
  system: string[],
  fillBlocks: number,
  last: string[][],
) {
  let held = 0;
  while (held < fillBlocks) {
    const blocks = Math.min(FILL_SESSION_BLOCKS, fillBlocks - held);
    record([...system, ...fillerChain(blocks)]);
    held += blocks;
  }
  for (const chain of last) record(chain);
}

/**
 * The blocks of the shared prefix each replica holds on top of its own sessions: none (typical),
 * all of them (worst), or for staggered all on r0 and a random depth of at least 1 elsewhere.
 */
function sharedDepths(replicas: number, scenario: Scenario, shared: readonly string[]): number[] {
  const random = rng(replicas * 13 + 1);
  return Array.from({ length: replicas }, (_, i) => {
    if (scenario.name === "typical") return 0;
    if (scenario.name === "worst" || i === 0) return shared.length;
    return 1 + Math.floor(random() * (shared.length - 1));
  });
}

function measureFleet(replicas: number, scenario: Scenario, iterations: number) {
  const random = rng(replicas * 7 + scenario.sharedBlocks);
  const { prompt, shared } = buildPrompt(scenario, random);
  const system = scenario.name === "typical" ? shared : [];
  const depths = sharedDepths(replicas, scenario, shared);
  gc();
  const before = process.memoryUsage();
  const buildStart = performance.now();
  const index = new FleetPrefixIndex({ capacityBlocks: () => CAPACITY_BLOCKS });
  for (let i = 0; i < replicas; i++) {
    const id = `r${i}`;
    const last = depths[i]! > 0 ? [shared.slice(0, depths[i])] : [];
    if (id === PINNED && scenario.name !== "staggered") last.push(prompt.previousHashes);
    const fill = CAPACITY_BLOCKS - system.length - depths[i]!;
    fillReplica((hashes) => index.record(id, hashes), system, fill - (id === PINNED ? 500 : 0), last);
  }
  const buildMs = performance.now() - buildStart;
  gc();
  const after = process.memoryUsage();
  const stats = index.stats();
  const candidates = candidatesFor(replicas);
  const decide = (hashes: readonly string[], pinned?: string) =>
    choosePlacement({
      promptTokens: prompt.tokens.length,
      hashes,
      pinned,
      candidates,
      fleetIndex: index,
      blockSize: BLOCK,
      usePrefix: true,
    });
  const check = decide(prompt.hashes);
  const pinnedCheck = decide(prompt.hashes, PINNED);
  const matched = index.match(prompt.hashes);
  return {
    build_ms: round(buildMs),
    nodes: stats.nodes,
    entries: stats.entries,
    index_allocated_bytes: stats.allocatedBytes,
    index_allocated_bytes_per_entry: round(stats.allocatedBytes / stats.entries),
    index_live_bytes_per_entry: round(stats.liveBytes / stats.entries),
    heap_delta_bytes_per_entry: round(
      (after.heapUsed + after.arrayBuffers - before.heapUsed - before.arrayBuffers) / stats.entries,
    ),
    replicas_matched: matched.size,
    blocks_matched_by_pinned: matched.get(PINNED) ?? 0,
    decision_new_session: { replica: check?.replica, reason: check?.reason },
    decision_pinned: { replica: pinnedCheck?.replica, reason: pinnedCheck?.reason },
    match_only_us: latency(iterations, () => index.match(prompt.hashes)),
    hash_and_match_us: latency(iterations, () => index.match(blockHashes(prompt.tokens, BLOCK))),
    new_session_cold_us: latency(iterations, () => decide(blockHashes(prompt.tokens, BLOCK))),
    new_session_incremental_us: latency(iterations, () =>
      decide(blockHashesFrom(prompt.previousHashes, prompt.tokens, BLOCK)),
    ),
    pinned_step_cold_us: latency(iterations, () => decide(blockHashes(prompt.tokens, BLOCK), PINNED)),
    pinned_step_incremental_us: latency(iterations, () =>
      decide(blockHashesFrom(prompt.previousHashes, prompt.tokens, BLOCK), PINNED),
    ),
  };
}

/**
 * The per-replica indexes the fleet index replaced. Each holds only the blocks that can match the
 * prompt (the shared head and r3's session): its lookups are hash-map probes whose cost does not
 * depend on how full the index is, and full indexes at 1,024 replicas would need gigabytes.
 */
function measurePerReplica(replicas: number, scenario: Scenario, iterations: number) {
  const random = rng(replicas * 7 + scenario.sharedBlocks);
  const { prompt, shared } = buildPrompt(scenario, random);
  const depths = sharedDepths(replicas, scenario, shared);
  const candidates = candidatesFor(replicas);
  const indexes = new PerReplicaIndexes(() => CAPACITY_BLOCKS);
  for (const [i, c] of candidates.entries()) {
    const index = indexes.of(c.id);
    index.record(scenario.name === "typical" ? shared : shared.slice(0, depths[i]));
    if (c.id === PINNED && scenario.name !== "staggered") index.record(prompt.previousHashes);
  }
  const decide = (hashes: readonly string[], pinned?: string) =>
    choosePlacement({
      promptTokens: prompt.tokens.length,
      hashes,
      pinned,
      candidates,
      fleetIndex: indexes,
      blockSize: BLOCK,
      usePrefix: true,
    });
  return {
    match_all_us: latency(iterations, () => indexes.match(prompt.hashes)),
    new_session_cold_us: latency(iterations, () => decide(blockHashes(prompt.tokens, BLOCK))),
  };
}

/** Bytes per entry of one full per-replica index (LRU of rendered hash strings), for comparison. */
function perReplicaMemory(): number {
  const random = rng(99);
  const tokens = tokenIds(FILL_SESSION_BLOCKS * BLOCK, random);
  gc();
  const before = process.memoryUsage().heapUsed;
  const index = new PrefixIndex(CAPACITY_BLOCKS);
  // Each session's hashes are fresh strings, as they are when the router records a finished call.
  for (let session = 0; session < 20; session++) index.record(blockHashes(tokens, BLOCK, `s${session}`));
  gc();
  const bytes = (process.memoryUsage().heapUsed - before) / index.size;
  return round(bytes);
}

const args = process.argv.slice(2);
const replicaArg = args.indexOf("--replicas");
const fleetSizes = replicaArg >= 0 ? args[replicaArg + 1]!.split(",").map(Number) : [8, 64, 256, 1024];
const quick = args.includes("--quick");
const scenarioArg = args.indexOf("--scenarios");
const scenarios: Scenario[] = (
  [
    { name: "typical", sharedBlocks: Math.floor(2000 / BLOCK) },
    { name: "worst", sharedBlocks: Math.floor(30_000 / BLOCK) },
    { name: "staggered", sharedBlocks: Math.floor(30_000 / BLOCK) },
  ] satisfies Scenario[]
).filter((s) => scenarioArg < 0 || args[scenarioArg + 1]!.split(",").includes(s.name));

const hashRandom = rng(5);
const hashPrompt = tokenIds(32_000, hashRandom);
const hashPrevious = blockHashes(hashPrompt.slice(0, 30_000), BLOCK);
const results: Record<string, unknown> = {
  prompt_tokens: 32_000,
  block_size: BLOCK,
  capacity_blocks_per_replica: CAPACITY_BLOCKS,
  node: process.version,
  hash_cold_us: latency(quick ? 200 : 2000, () => blockHashes(hashPrompt, BLOCK)),
  hash_incremental_us: latency(quick ? 200 : 2000, () => blockHashesFrom(hashPrevious, hashPrompt, BLOCK)),
  per_replica_index_bytes_per_entry: perReplicaMemory(),
  fleet: {} as Record<string, unknown>,
};
for (const replicas of fleetSizes) {
  for (const scenario of scenarios) {
    const key = `${scenario.name}_${replicas}`;
    const iterations = quick ? 200 : 2000;
    const fleet = measureFleet(replicas, scenario, iterations);
    gc();
    const oldIterations = Math.max(20, Math.floor((quick ? 2000 : 20_000) / replicas));
    const perReplica = measurePerReplica(replicas, scenario, oldIterations);
    (results.fleet as Record<string, unknown>)[key] = {
      replicas,
      scenario: scenario.name,
      fleet,
      per_replica: perReplica,
    };
    console.log(
      `${key.padEnd(15)} new cold p50 ${fleet.new_session_cold_us.p50} µs (per-replica ${perReplica.new_session_cold_us.p50}), ` +
        `incremental ${fleet.new_session_incremental_us.p50}, pinned ${fleet.pinned_step_incremental_us.p50} ` +
        `(cold ${fleet.pinned_step_cold_us.p50}), match ${fleet.match_only_us.p50}, hash+match ${fleet.hash_and_match_us.p50}; ` +
        `${fleet.entries} entries, ${fleet.index_allocated_bytes_per_entry} B/entry allocated, build ${fleet.build_ms} ms`,
    );
    gc();
  }
}

/** The goals of the fleet index, checked against this run's medians (p50). */
function targets(): Record<string, { goal: string; measured: number | null; met: boolean | null }> {
  const fleet = results.fleet as Record<string, { fleet: ReturnType<typeof measureFleet> }>;
  const at = (key: string, pick: (f: ReturnType<typeof measureFleet>) => number) =>
    fleet[key] ? pick(fleet[key].fleet) : null;
  const check = (goal: string, measured: number | null, limit: number) => ({
    goal,
    measured,
    met: measured === null ? null : measured <= limit,
  });
  const keys = Object.keys(fleet);
  const pinned = keys.length
    ? Math.max(...keys.map((k) => fleet[k]!.fleet.pinned_step_incremental_us.p50))
    : null;
  const bytes = keys.length
    ? Math.max(...keys.map((k) => fleet[k]!.fleet.index_allocated_bytes_per_entry))
    : null;
  return {
    worst_256_cold: check(
      "≤ 150 µs",
      at("worst_256", (f) => f.new_session_cold_us.p50),
      150,
    ),
    worst_1024_cold: check(
      "≤ 400 µs",
      at("worst_1024", (f) => f.new_session_cold_us.p50),
      400,
    ),
    staggered_256_match: check(
      "≤ 50 µs",
      at("staggered_256", (f) => f.match_only_us.p50),
      50,
    ),
    staggered_256_match_vs_8: check(
      "≤ 2 × the 8-replica match",
      at("staggered_256", (f) => f.match_only_us.p50),
      2 * (at("staggered_8", (f) => f.match_only_us.p50) ?? Number.NaN),
    ),
    staggered_256_hash_and_match: check(
      "≤ 150 µs",
      at("staggered_256", (f) => f.hash_and_match_us.p50),
      150,
    ),
    staggered_1024_cold: check(
      "≤ 400 µs",
      at("staggered_1024", (f) => f.new_session_cold_us.p50),
      400,
    ),
    pinned_step_any_size: check("≤ 50 µs (incremental hashes)", pinned, 50),
    bytes_per_entry: check("≤ 64 B (nodes and entries, allocated)", bytes, 64),
  };
}
results.targets = targets();
console.log(JSON.stringify(results.targets));

const out = join(dirname(fileURLToPath(import.meta.url)), "results", "routing-scale.json");
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
console.log(`wrote ${out}`);
