/**
 * @module Routing and tokenization overhead: (b) one placement decision for a 32,000-token prompt
 * against 8 replicas with warm prefix indexes; (c) the tokenization work of a 30-step agent session
 * growing to ~60,000 tokens, incremental vs whole-context. Run: `npx tsx bench/overhead-routing.ts`.
 */

import { pathToFileURL } from "node:url";
import { createO200kTokenizer } from "../adapters/tokenizers/o200k.js";
import { blockHashes, blockHashesFrom } from "../src/routing/block-hash.js";
import { choosePlacement, type PlacementCandidate } from "../src/routing/placement.js";
import { PrefixIndex } from "../src/routing/prefix-index.js";
import { PromptTokenizer, renderChatMessage } from "../src/tokens/prompt-tokenizer.js";
import type { ChatMessage } from "../src/types.js";
import { PerReplicaIndexes } from "./per-replica-index.js";

const BLOCK = 64;
const REPLICAS = 8;
/** h100-llama3-8b: 439k tokens of KV, in router blocks. */
const CAPACITY_BLOCKS = Math.floor(439_000 / BLOCK);

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

function timeUs(iterations: number, fn: () => void): number {
  for (let i = 0; i < Math.min(200, iterations); i++) fn();
  const start = performance.now();
  for (let i = 0; i < iterations; i++) fn();
  return ((performance.now() - start) * 1000) / iterations;
}

/** (b) Decision cost: hash + match against 8 warm indexes + score. */
function routingDecision(): Record<string, number> {
  const random = rng(1);
  const system = tokenIds(2000, random);
  const indexes = Array.from({ length: REPLICAS }, () => new PrefixIndex(CAPACITY_BLOCKS));
  // Warm every replica to capacity with other sessions that share the system prompt.
  for (const index of indexes) {
    while (index.size < index.capacity)
      index.record(blockHashes([...system, ...tokenIds(20_000, random)], BLOCK));
  }
  // The session under test: its previous step (30,000 tokens) ran on replica 3.
  const previous = [...system, ...tokenIds(28_000, random)];
  const prompt = [...previous, ...tokenIds(2000, random)];
  const previousHashes = blockHashes(previous, BLOCK);
  indexes[3]!.record(previousHashes);
  const perReplica = new PerReplicaIndexes();
  for (const [i, index] of indexes.entries()) perReplica.set(`r${i}`, index);
  const candidates: PlacementCandidate[] = indexes.map((_, i) => ({
    id: `r${i}`,
    queuedPrefillTokens: 1000 * i,
    inflightPrefillTokens: 2000,
    prefillTokensPerSecond: 45_000,
    kvUsage: 0.3 + 0.05 * i,
    busy: false,
    eligible: true,
  }));
  const decide = (hashes: readonly string[], pinned?: string) =>
    choosePlacement({
      promptTokens: prompt.length,
      hashes,
      candidates,
      fleetIndex: perReplica,
      blockSize: BLOCK,
      usePrefix: true,
      pinned,
    });

  const check = decide(blockHashes(prompt, BLOCK));
  if (check?.replica !== "r3" || check.predictedHitTokens !== previousHashes.length * BLOCK) {
    throw new Error(`unexpected placement ${JSON.stringify(check)}`);
  }
  const hashes = blockHashes(prompt, BLOCK);
  const n = 2000;
  return {
    routing_prompt_tokens: prompt.length,
    routing_replicas: REPLICAS,
    routing_index_blocks_per_replica: CAPACITY_BLOCKS,
    routing_hash_us: timeUs(n, () => blockHashes(prompt, BLOCK)),
    routing_hash_incremental_us: timeUs(n, () => blockHashesFrom(previousHashes, prompt, BLOCK)),
    routing_match_score_us: timeUs(n, () => decide(hashes)),
    routing_decision_us: timeUs(n, () => decide(blockHashes(prompt, BLOCK))),
    routing_decision_incremental_us: timeUs(n, () => decide(blockHashesFrom(previousHashes, prompt, BLOCK))),
    routing_decision_pinned_incremental_us: timeUs(n, () =>
      decide(blockHashesFrom(previousHashes, prompt, BLOCK), "r3"),
    ),
  };
}

const WORDS =
  "the of build test error file line function return value config module import export async await request response token cache replica session window queue permit lane budget index hash block prefix route".split(
    " ",
  );

/** Text of roughly `tokens` o200k tokens: words, identifiers, numbers and punctuation, like tool output. */
function text(tokens: number, random: () => number): string {
  const out: string[] = [];
  let approx = 0;
  while (approx < tokens) {
    const r = random();
    if (r < 0.7) out.push(WORDS[Math.floor(random() * WORDS.length)]!);
    else if (r < 0.85)
      out.push(`${WORDS[Math.floor(random() * WORDS.length)]}_${Math.floor(random() * 1000)}`);
    else if (r < 0.95) out.push(String(Math.floor(random() * 100_000)));
    else out.push(random() < 0.5 ? "\n" : "();");
    approx += r < 0.7 ? 1 : r < 0.95 ? 2.5 : 1;
  }
  return out.join(" ");
}

/** (c) Tokenization work of a 30-step session: incremental (per-message cache) vs whole-context. */
function tokenizationWork(): Record<string, number> {
  const random = rng(2);
  const steps = 30;
  const conversation: ChatMessage[][] = [];
  const messages: ChatMessage[] = [
    { role: "system", content: text(2000, random) },
    { role: "user", content: text(200, random) },
  ];
  for (let step = 0; step < steps; step++) {
    conversation.push([...messages]);
    messages.push({
      role: "assistant",
      content: text(150, random),
      tool_calls: [
        { id: `call_${step}`, type: "function", function: { name: "run", arguments: '{"cmd":"make"}' } },
      ],
    });
    messages.push({ role: "tool", tool_call_id: `call_${step}`, content: text(1580, random) });
  }
  conversation.push([...messages]);

  const tokenizer = createO200kTokenizer();
  const render = (prompt: readonly ChatMessage[]) => prompt.map(renderChatMessage).join("");
  // Warm the tokenizer's own merge cache first, so neither side is timed against a cold one.
  tokenizer.encode(render(messages));
  const incremental = new PromptTokenizer(tokenizer);
  let start = performance.now();
  let finalTokens = 0;
  for (const prompt of conversation) finalTokens = incremental.chat(prompt).length;
  const incrementalMs = performance.now() - start;
  const inc = incremental.stats();

  // Whole context: every step tokenizes the full rendered conversation from scratch.
  let wholeTokens = 0;
  start = performance.now();
  for (const prompt of conversation) wholeTokens += tokenizer.encode(render(prompt)).length;
  const wholeMs = performance.now() - start;

  return {
    tokenize_steps: conversation.length,
    tokenize_final_context_tokens: finalTokens,
    tokenize_incremental_tokens: inc.tokenizedTokens,
    tokenize_incremental_ratio: inc.tokenizedTokens / finalTokens,
    tokenize_incremental_ms: incrementalMs,
    tokenize_whole_tokens: wholeTokens,
    tokenize_whole_ratio: wholeTokens / finalTokens,
    tokenize_whole_ms: wholeMs,
  };
}

/** Runs both measurements; keys end in their unit (`_us`, `_ms`) or are counts and ratios. */
export async function runRoutingBench(): Promise<Record<string, number>> {
  return { ...routingDecision(), ...tokenizationWork() };
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const results = await runRoutingBench();
  for (const [key, value] of Object.entries(results)) {
    console.log(`${key.padEnd(42)} ${Number.isInteger(value) ? value : value.toFixed(2)}`);
  }
}
