/**
 * @module Speed of the simulated replica in virtual time: simulated seconds per wall second (a) for one
 * replica under heavy load (256 calls with 30,000-token contexts) and (b) for 4 replicas replaying the whole
 * Mooncake conversation trace (arrivals at trace times, each conversation on the replica its key hashes to,
 * no scheduler in front). Goal: the trace's hour on 4 replicas in ≤ 60 s wall.
 * Run: `npx tsx bench/sim.ts [--preset NAME]`.
 */

import { setMaxListeners } from "node:events";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import {
  expandMooncakeTokens,
  loadMooncakeTrace,
  mooncakeTracePath,
} from "../adapters/bench/workloads/mooncake.js";
import { fmix32 } from "../adapters/engines/sim/hash.js";
import type { PresetName, PresetOverrides } from "../adapters/engines/sim/presets.js";
import { SimEngine } from "../adapters/engines/sim/sim-engine.js";
import { VirtualClock } from "../src/clock.js";
import type { EngineResult } from "../src/engine.js";

/** Deterministic pseudo-token ids. */
function tokens(n: number, seed: number): number[] {
  const out = new Array<number>(n);
  let s = seed | 0;
  for (let i = 0; i < n; i++) {
    s = (s + 0x6d2b79f5) | 0;
    out[i] = fmix32(s) % 100_000;
  }
  return out;
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

/**
 * (a) One replica, 256 calls submitted at once, each a 30,000-token context
 * (a 26,000-token shared prefix plus 4,000 own tokens) and 300–699 output tokens
 * (so completions are spread out and every one of them ends a decode run).
 * On `h100x8-llama3-70b` (1.35M tokens of KV) all 256 fit and run together;
 * on smaller presets the batch is bounded by KV and preempts.
 */
async function heavyLoad(preset: PresetName, skipDecodeSteps = true): Promise<Record<string, number>> {
  const clock = new VirtualClock();
  const engine = new SimEngine({ id: "heavy", clock, preset, skipDecodeSteps });
  const shared = tokens(26_000, 1);
  const signal = new AbortController().signal;
  // One signal shared by every call here; each call listens to it.
  setMaxListeners(0, signal);
  const wallStart = performance.now();
  let done = 0;
  const ttfts: number[] = [];
  for (let i = 0; i < 256; i++) {
    const stream = await engine.generate({
      requestId: `h${i}`,
      model: engine.model,
      promptTokens: [...shared, ...tokens(4_000, 1000 + i)],
      maxTokens: 300 + ((i * 37) % 400),
      endpoint: "completions",
      stream: false,
      signal,
    });
    void stream.firstToken.then(() => ttfts.push(clock.now()));
    void stream.result.then(() => done++);
  }
  await clock.runAsyncUntil(() => done === 256);
  const wallS = (performance.now() - wallStart) / 1000;
  const simS = clock.now() / 1000;
  const stats = engine.stats();
  ttfts.sort((a, b) => a - b);
  const name = `heavy_${preset}${skipDecodeSteps ? "" : "_stepwise"}`;
  return {
    [`${name}_sim_s`]: simS,
    [`${name}_wall_s`]: wallS,
    [`${name}_sim_s_per_wall_s`]: simS / wallS,
    [`${name}_steps`]: stats.steps,
    [`${name}_timers`]: stats.timers,
    [`${name}_preemptions`]: stats.preemptions,
    [`${name}_recomputed_tokens`]: stats.recomputedTokens,
    [`${name}_ttft_p50_s`]: percentile(ttfts, 0.5) / 1000,
  };
}

/** (b) The Mooncake conversation trace on 4 replicas, conversations placed by key hash. */
/**
 * The one-hour Mooncake conversation trace on 4 simulated replicas, conversations placed by key
 * hash, no scheduler in front: the simulator's own speed (`bench/tiers.ts` runs it with a host tier).
 */
export async function mooncakeOnSim(
  preset: PresetName | PresetOverrides,
  limit?: number,
): Promise<Record<string, number>> {
  const loadStart = performance.now();
  const requests = loadMooncakeTrace(mooncakeTracePath("conversation"), limit === undefined ? {} : { limit });
  const loadS = (performance.now() - loadStart) / 1000;
  const clock = new VirtualClock();
  const replicas = Array.from({ length: 4 }, (_, i) => new SimEngine({ id: `r${i}`, clock, preset }));
  const signal = new AbortController().signal;
  setMaxListeners(0, signal);
  let done = 0;
  let refused = 0;
  const ttfts: number[] = [];
  const tpots: number[] = [];
  let completionTokens = 0;
  let cachedTokens = 0;
  let promptTokens = 0;
  let next = 0;
  const wallStart = performance.now();
  const arrive = (): void => {
    const now = clock.now();
    while (next < requests.length && requests[next]!.arrivalMs <= now) {
      const request = requests[next++]!;
      const engine = replicas[fmix32(request.sessionKey) % replicas.length]!;
      const start = clock.now();
      engine
        .generate({
          requestId: `m${request.index}`,
          model: engine.model,
          promptTokens: expandMooncakeTokens(request.hashIds, request.inputLength),
          maxTokens: Math.max(1, request.outputLength),
          endpoint: "completions",
          stream: false,
          signal,
        })
        .then(
          (stream) => {
            let first = 0;
            void stream.firstToken.then(() => {
              first = clock.now();
              ttfts.push(first - start);
            });
            void stream.result.then((result: EngineResult) => {
              done++;
              completionTokens += result.completionTokens;
              cachedTokens += result.cachedTokens;
              promptTokens += result.promptTokens;
              if (result.completionTokens > 1)
                tpots.push((clock.now() - first) / (result.completionTokens - 1));
            });
          },
          () => {
            done++;
            refused++;
          },
        );
    }
    if (next < requests.length) clock.setTimeout(arrive, requests[next]!.arrivalMs - now);
  };
  clock.setTimeout(arrive, requests[0]?.arrivalMs ?? 0);
  await clock.runAsyncUntil(() => done === requests.length);
  const wallS = (performance.now() - wallStart) / 1000;
  const simS = clock.now() / 1000;
  let steps = 0;
  let timers = 0;
  let preemptions = 0;
  let busyMs = 0;
  let queryTokens = 0;
  let hostHitTokens = 0;
  let gpuHitTokens = 0;
  for (const engine of replicas) {
    const s = engine.stats();
    steps += s.steps;
    timers += s.timers;
    preemptions += s.preemptions;
    busyMs += s.busyMs;
    queryTokens += s.prefixQueryTokens;
    hostHitTokens += s.hostHitTokens;
    gpuHitTokens += s.prefixHitTokens;
  }
  ttfts.sort((a, b) => a - b);
  tpots.sort((a, b) => a - b);
  return {
    mooncake_requests: requests.length,
    mooncake_load_wall_s: loadS,
    mooncake_sim_s: simS,
    mooncake_wall_s: wallS,
    mooncake_sim_s_per_wall_s: simS / wallS,
    mooncake_refused: refused,
    mooncake_steps: steps,
    mooncake_timers: timers,
    mooncake_preemptions: preemptions,
    mooncake_busy_fraction: busyMs / (4 * clock.now()),
    mooncake_prefix_hit_rate: cachedTokens / promptTokens,
    mooncake_gpu_hit_rate: queryTokens > 0 ? gpuHitTokens / queryTokens : 0,
    mooncake_host_hit_rate: queryTokens > 0 ? hostHitTokens / queryTokens : 0,
    mooncake_output_tokens: completionTokens,
    mooncake_ttft_p50_s: percentile(ttfts, 0.5) / 1000,
    mooncake_ttft_p99_s: percentile(ttfts, 0.99) / 1000,
    mooncake_tpot_p50_s: percentile(tpots, 0.5) / 1000,
    mooncake_tpot_p99_s: percentile(tpots, 0.99) / 1000,
  };
}

/** Runs both measurements and returns their numbers (seconds, ratios, counts). */
export async function runSimBench(
  options: { preset?: PresetName; heavyPresets?: PresetName[]; mooncakeLimit?: number } = {},
): Promise<Record<string, number>> {
  const preset = options.preset ?? "h100-llama3-8b";
  const out: Record<string, number> = {};
  for (const heavy of options.heavyPresets ?? ["h100x8-llama3-70b", "h100-llama3-8b"]) {
    Object.assign(out, await heavyLoad(heavy));
  }
  // The same load stepping one timer per step, to show what decode runs save.
  Object.assign(out, await heavyLoad(options.heavyPresets?.[0] ?? "h100x8-llama3-70b", false));
  Object.assign(out, await mooncakeOnSim(preset, options.mooncakeLimit));
  return out;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const { values } = parseArgs({
    options: { preset: { type: "string" }, limit: { type: "string" } },
  });
  const result = await runSimBench({
    ...(values.preset ? { preset: values.preset as PresetName } : {}),
    ...(values.limit ? { mooncakeLimit: Number(values.limit) } : {}),
  });
  for (const [key, value] of Object.entries(result)) {
    process.stdout.write(`${key.padEnd(40)} ${Number.isInteger(value) ? value : value.toFixed(4)}\n`);
  }
}
