/**
 * @module The cost of session inference (docs/routing.md, "Session inference"): the time of one
 * decision and its recording, and the memory of the chain index, at 10,000 live chains.
 *
 * Each chain is an agent loop that has run `STEPS` steps (one point a step, so 10k chains fill the
 * default capacity of 100,000 points). A decision is digesting the prompt (every message, or every
 * block of tokens), matching it, and recording the point its output reaches. Scenarios: `chat`
 * (messages of ~1,600 characters, a 32-message prompt, ~12k tokens) and `tokens` (a 32,000-token
 * prompt, as the benchmark and token clients send), each for a continuing step and for a new
 * session (a prompt that matches nothing, so every entry is looked up).
 *
 * Run: `npx tsx bench/inference-cost.ts [--chains 10000] [--quick]`; writes
 * bench/results/inference-cost.json.
 */

import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { blockHashes } from "../src/routing/block-hash.js";
import { digestPrompt } from "../src/sessions/message-digest.js";
import { DEFAULT_INFERENCE_CAPACITY, SessionInference } from "../src/sessions/session-inference.js";
import type { ChatMessage } from "../src/types.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

const args = process.argv.slice(2);
const quick = args.includes("--quick");
const chainsAt = args.indexOf("--chains");
const CHAINS = chainsAt >= 0 ? Number(args[chainsAt + 1]) : quick ? 2_000 : 10_000;
const STEPS = 10;
const DECISIONS = quick ? 300 : 2_000;

function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const random = rng(7);
const WORDS = Array.from({ length: 4096 }, (_, i) => `w${i.toString(36)}`);
function text(chars: number): string {
  let out = "";
  while (out.length < chars) out += `${WORDS[Math.floor(random() * WORDS.length)]} `;
  return out;
}

const SYSTEM: ChatMessage = { role: "system", content: text(8_000) };

function quantiles(values: number[]): { p50: number; p99: number } {
  const sorted = values.slice().sort((a, b) => a - b);
  const at = (q: number) =>
    Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]! * 100) / 100;
  return { p50: at(0.5), p99: at(0.99) };
}

function heapBytes(): number {
  gc();
  gc();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

/** The heap the index holds: measured with it, then without it (the benchmark's own prompts stay held both times). */
function indexBytesOf(box: { inference?: SessionInference }): number {
  const held = heapBytes();
  box.inference = undefined;
  return held - heapBytes();
}

/** Chat: each chain's history of tool outputs and answers; the index after every chain ran STEPS steps. */
function chatScenario() {
  const box: { inference?: SessionInference } = { inference: new SessionInference({ mode: "on" }) };
  const histories: ChatMessage[][] = [];
  for (let c = 0; c < CHAINS; c++) {
    const history: ChatMessage[] = [SYSTEM, { role: "user", content: `task ${c}: ${text(200)}` }];
    for (let s = 0; s < STEPS; s++) {
      const answer = `step ${s} of ${c}: ${text(300)}`;
      const decision = box.inference!.decide(digestPrompt({ kind: "chat", messages: history }));
      if (decision.pending) box.inference!.settle(decision.pending, { text: answer });
      history.push({ role: "assistant", content: answer }, { role: "tool", content: text(1_600) });
    }
    histories.push(history);
  }
  const timing = (makePrompt: (c: number) => ChatMessage[]) => {
    const samples: number[] = [];
    for (let i = 0; i < DECISIONS; i++) {
      const prompt = makePrompt(i % CHAINS);
      const t0 = performance.now();
      const decision = box.inference!.decide(digestPrompt({ kind: "chat", messages: prompt }));
      if (decision.pending) box.inference!.settle(decision.pending, { text: "a short answer" });
      samples.push((performance.now() - t0) * 1000);
    }
    return quantiles(samples);
  };
  // Histories are measured once each: a continuing step, then a fork of the same point would follow.
  const continuing = timing((c) => histories[c]!);
  const fresh = timing((c) => [
    SYSTEM,
    { role: "user", content: `another task ${c}` },
    ...histories[c]!.slice(2, 32),
  ]);
  const points = box.inference!.size;
  const indexBytes = indexBytesOf(box);
  const promptMessages = histories[0]!.length;
  const promptChars = histories[0]!.reduce((n, m) => n + String(m.content).length, 0);
  return {
    scenario: "chat",
    prompt: { messages: promptMessages, characters: promptChars },
    points,
    decision_us: { continuing, new_session: fresh },
    index_bytes_per_point: Math.round(indexBytes / Math.max(1, points)),
  };
}

/** Tokens: a 32,000-token prompt continuing one chain of 10k. */
function tokenScenario() {
  const box: { inference?: SessionInference } = { inference: new SessionInference({ mode: "on" }) };
  const contexts: number[][] = [];
  for (let c = 0; c < CHAINS; c++) {
    // Each chain's points (its last step's context is kept to continue it).
    let context = Array.from({ length: 2_000 }, () => Math.floor(random() * 128_000));
    for (let s = 0; s < STEPS; s++) {
      const output = Array.from({ length: 200 }, () => Math.floor(random() * 128_000));
      const decision = box.inference!.decide(digestPrompt({ kind: "tokens", tokens: context }));
      if (decision.pending) box.inference!.settle(decision.pending, { tokens: output });
      context = context.concat(output, [c, s, 1, 2, 3]);
    }
    if (c < DECISIONS) contexts.push(context);
  }
  const long = (c: number) => {
    const base = contexts[c % contexts.length]!;
    const pad = Array.from({ length: Math.max(0, 32_000 - base.length) }, (_, i) => (i * 7919) % 128_000);
    return { base, pad };
  };
  const samples = { continuing: [] as number[], new_session: [] as number[] };
  for (let i = 0; i < DECISIONS; i++) {
    const { base, pad } = long(i);
    // A continuing step: the chain's context plus a long tool output up to 32k tokens.
    const prompt = base.concat(pad);
    let t0 = performance.now();
    let decision = box.inference!.decide(digestPrompt({ kind: "tokens", tokens: prompt }));
    if (decision.pending) box.inference!.settle(decision.pending, { tokens: [1, 2, 3, 4] });
    samples.continuing.push((performance.now() - t0) * 1000);
    const fresh = pad.concat(base);
    t0 = performance.now();
    decision = box.inference!.decide(digestPrompt({ kind: "tokens", tokens: fresh }));
    if (decision.pending) box.inference!.settle(decision.pending, { tokens: [5, 6, 7, 8] });
    samples.new_session.push((performance.now() - t0) * 1000);
  }
  const points = box.inference!.size;
  const indexBytes = indexBytesOf(box);
  return {
    scenario: "tokens",
    prompt: { tokens: 32_000 },
    points,
    decision_us: { continuing: quantiles(samples.continuing), new_session: quantiles(samples.new_session) },
    index_bytes_per_point: Math.round(indexBytes / Math.max(1, points)),
  };
}

/** The router's own cold hashing of a 32,000-token prompt in this run, as a yardstick on a shared machine. */
function routingHashUs(): { p50: number; p99: number } {
  const prompt = Array.from({ length: 32_000 }, (_, i) => (i * 7919) % 128_000);
  const samples: number[] = [];
  for (let i = 0; i < DECISIONS; i++) {
    const t0 = performance.now();
    blockHashes(prompt, 64);
    samples.push((performance.now() - t0) * 1000);
  }
  return quantiles(samples);
}

const results = {
  chains: CHAINS,
  steps_per_chain: STEPS,
  capacity_points: DEFAULT_INFERENCE_CAPACITY,
  decisions: DECISIONS,
  node: process.version,
  routing_cold_hash_32k_us: routingHashUs(),
  scenarios: [chatScenario(), tokenScenario()],
};
process.stdout.write(`${JSON.stringify(results, null, 2)}\n`);
if (!quick) {
  const out = join(dirname(fileURLToPath(import.meta.url)), "results", "inference-cost.json");
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
}
