/** @module Helpers for the simulator tests: a virtual-time engine, calls, and the idle check. */

import assert from "node:assert/strict";
import { setMaxListeners } from "node:events";
import type { SimCallEvent, SimStepEvent } from "../../adapters/engines/sim/rank-types.js";
import { SimEngine, type SimEngineOptions } from "../../adapters/engines/sim/sim-engine.js";
import { VirtualClock } from "../../src/clock.js";
import type { EngineCall, EngineResult, EngineStream } from "../../src/engine.js";

/** Deterministic token ids (a simple LCG per seed), never 0..999 (so they differ from generated ids). */
export function tokens(n: number, seed: number): number[] {
  const out: number[] = [];
  let s = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out.push(5000 + (s % 90_000));
  }
  return out;
}

export interface Harness {
  clock: VirtualClock;
  engine: SimEngine;
  steps: SimStepEvent[];
  calls: SimCallEvent[];
  /** Starts a call now; `rank`, `signal` optional. */
  call(
    id: string,
    prompt: readonly number[],
    maxTokens: number,
    extra?: Partial<EngineCall>,
  ): Promise<Tracked>;
  /** Runs virtual time until every timer has fired (promise continuations included). */
  drain(): Promise<void>;
}

/** A started call with its timings recorded as they happen. */
export interface Tracked {
  id: string;
  stream: EngineStream;
  firstTokenMs: number | undefined;
  endMs: number | undefined;
  result: EngineResult | undefined;
}

const shared = new AbortController().signal;
setMaxListeners(0, shared);

export function harness(options: Partial<SimEngineOptions> = {}): Harness {
  const clock = new VirtualClock();
  const steps: SimStepEvent[] = [];
  const calls: SimCallEvent[] = [];
  const engine = new SimEngine({
    id: "sim-test",
    clock,
    onStep: (e) => steps.push(e),
    onCall: (e) => calls.push(e),
    ...options,
  });
  return {
    clock,
    engine,
    steps,
    calls,
    async call(id, prompt, maxTokens, extra = {}) {
      const stream = await engine.generate({
        requestId: id,
        model: engine.model,
        promptTokens: prompt,
        maxTokens,
        endpoint: "completions",
        stream: true,
        signal: shared,
        ...extra,
      });
      const tracked: Tracked = { id, stream, firstTokenMs: undefined, endMs: undefined, result: undefined };
      void stream.firstToken.then(() => {
        tracked.firstTokenMs = clock.now();
      });
      void stream.result.then((r) => {
        tracked.endMs = clock.now();
        tracked.result = r;
      });
      return tracked;
    },
    async drain() {
      await clock.runAsyncUntil(() => false);
    },
  };
}

/** Nothing running, waiting or holding a block on any rank, and no timer left. */
export function assertIdle(h: Harness): void {
  const s = h.engine.signals();
  assert.equal(s.running, 0, "running calls left");
  assert.equal(s.waiting, 0, "waiting calls left");
  assert.equal(s.kvUsage, 0, "KV blocks still referenced");
  for (let r = 0; r < h.engine.dataParallelSize; r++) {
    const pool = h.engine.poolOf(r);
    assert.equal(pool.usedBlocks(), 0, `rank ${r} holds blocks`);
    assert.equal(pool.freeQueue().length, pool.numBlocks, `rank ${r} free queue lost blocks`);
  }
  assert.equal(h.clock.pending(), 0, "timers left");
}
