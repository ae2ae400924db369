/** @module One data-parallel rank of the simulated replica: vLLM V1-style continuous batching over a paged, prefix-cached KV pool. */

import type { Cancel, Clock } from "../../../src/clock.js";
import type { FinishReason } from "../../../src/engine.js";
import { BlockPool, type KvBlockEvent } from "./block-pool.js";
import { HostTier } from "./host-tier.js";
import { hostLoadMsPerToken, type SimParams, stepTimeMs } from "./presets.js";
import type { SimCall } from "./sim-call.js";
import type { VocabularyEntry } from "./vocabulary.js";

/** One engine step (or a run of identical-shape decode steps simulated in one timer). */
export interface SimStepEvent {
  rank: number;
  /** Start of the first step, clock ms. */
  startMs: number;
  /** End of the last step, clock ms. */
  endMs: number;
  /** Steps covered: 1, or more for a run of pure-decode steps. */
  steps: number;
  /** Uncached prefill tokens computed (P). */
  prefillTokens: number;
  /** Decode sequences per step (D). */
  decodeSeqs: number;
  /** Σ context tokens of the decode sequences in the first step covered (K; grows by D per step). */
  decodeContextTokens: number;
  /** Σ t_i·(s_i + t_i/2) over prefill chunks. */
  prefillPairs: number;
  /** Tokens loaded from the host tier (prefix hits there), 0 without one. */
  hostLoadTokens: number;
  /** Calls preempted while scheduling this step. */
  preempted: number;
  /** Calls running and waiting once the step was scheduled. */
  running: number;
  waiting: number;
}

/** Something that happened to one call, with the clock time it happened at. */
export interface SimCallEvent {
  type: "arrival" | "scheduled" | "first_token" | "preempted" | "finished";
  requestId: string;
  rank: number;
  atMs: number;
  /** For `scheduled`: prompt tokens served from the prefix cache (GPU and host tiers). */
  cachedTokens?: number;
  /** For `scheduled`: of those, tokens loaded from the host tier. */
  hostCachedTokens?: number;
  /** For `finished`. */
  finishReason?: FinishReason;
  /** For `finished`: tokens generated. */
  completionTokens?: number;
}

/** Cumulative counters of one rank. */
export interface RankCounters {
  steps: number;
  timers: number;
  busyMs: number;
  prefillTokens: number;
  decodeTokens: number;
  recomputedTokens: number;
  preemptions: number;
  finished: number;
  aborted: number;
  /** Prompt tokens looked up in the GPU prefix cache, at each call's first scheduling. */
  prefixQueryTokens: number;
  /** Of those, tokens found in the GPU prefix cache. */
  prefixHitTokens: number;
  /** Prompt tokens looked up in the host tier (the prompt less its GPU hits), at first scheduling. */
  hostQueryTokens: number;
  /** Of those, tokens found in the host tier. */
  hostHitTokens: number;
  /** Tokens loaded from the host tier, resumed preempted calls included. */
  hostLoadedTokens: number;
  /** Time spent loading them, ms. */
  hostLoadMs: number;
  /** Blocks written to the host tier when evicted from GPU memory. */
  hostStoredBlocks: number;
  promptTokens: number;
  generationTokens: number;
}

/** What a rank needs from its engine. */
export interface RankContext {
  rank: number;
  clock: Clock;
  params: SimParams;
  vocabulary: readonly VocabularyEntry[];
  /** Simulate runs of pure-decode steps in one timer (virtual time). */
  skipDecodeSteps: boolean;
  onStep?: ((event: SimStepEvent) => void) | undefined;
  onCall?: ((event: SimCallEvent) => void) | undefined;
  onKvEvent?: ((rank: number, event: KvBlockEvent) => void) | undefined;
  onHostKvEvent?: ((rank: number, event: KvBlockEvent) => void) | undefined;
}

/**
 * How far behind its own schedule a rank may fall before it re-anchors on the
 * clock, ms. In real time a timer fires a little late (Node timers have 1 ms
 * granularity); the next step still starts at the modelled end of the last
 * one, so lateness does not accumulate into a slower engine. A longer stall
 * (a paused process) is not caught up.
 */
const MAX_LAG_MS = 50;

interface InflightStep {
  calls: SimCall[];
  endAt: number;
}

/**
 * A run of pure-decode steps simulated with one timer. Valid while nothing
 * can change the batch: no call is waiting that could be admitted, no
 * prefill, and enough free blocks for every step. Step j of the run (from
 * `base`) lasts `a + cKv·(K + j·D)` ms. Steps are applied lazily: at the end,
 * or up to the present when an arrival, abort or signal read interrupts.
 */
interface DecodeRun {
  calls: SimCall[];
  /** Start of the next step not yet applied. */
  base: number;
  /** Steps not yet applied, including the one in progress. */
  remaining: number;
  /** Whether the next step's slots are already allocated (true for the first step of the run). */
  slotsTaken: boolean;
  /** Per-step constant part, ms. */
  a: number;
  /** Decode context tokens of the next step. */
  K: number;
  D: number;
  endAt: number;
}

/** A FIFO of waiting calls that also takes preempted calls back at its front. Done calls are skipped lazily. */
class WaitQueue {
  private items: SimCall[] = [];
  private head = 0;

  push(call: SimCall): void {
    this.items.push(call);
  }

  unshift(call: SimCall): void {
    if (this.head > 0) this.items[--this.head] = call;
    else this.items.unshift(call);
  }

  peek(): SimCall | undefined {
    while (this.head < this.items.length) {
      const call = this.items[this.head]!;
      if (call.state === "waiting") return call;
      this.head++;
    }
    this.compact();
    return undefined;
  }

  shift(): void {
    this.head++;
    if (this.head > 1024 && this.head * 2 > this.items.length) this.compact();
  }

  all(): SimCall[] {
    return this.items.slice(this.head).filter((c) => c.state === "waiting");
  }

  private compact(): void {
    this.items = this.items.slice(this.head);
    this.head = 0;
  }
}

/**
 * One rank: a waiting queue, a running batch and a KV pool. Each step
 * follows vLLM V1's scheduler: running calls first, in admission order
 * (decodes and unfinished chunked prefills: one token each for decodes, up
 * to the token budget for prefills), then waiting calls while the batch has
 * room under `maxNumSeqs` and `maxNumBatchedTokens`. When a running call
 * cannot get a block, the youngest running call is preempted (its blocks
 * freed, its KV recomputed later) and no waiting call is admitted that step.
 */
export class RankSim {
  readonly pool: BlockPool;
  readonly counters: RankCounters = {
    steps: 0,
    timers: 0,
    busyMs: 0,
    prefillTokens: 0,
    decodeTokens: 0,
    recomputedTokens: 0,
    preemptions: 0,
    finished: 0,
    aborted: 0,
    prefixQueryTokens: 0,
    prefixHitTokens: 0,
    hostQueryTokens: 0,
    hostHitTokens: 0,
    hostLoadedTokens: 0,
    hostLoadMs: 0,
    hostStoredBlocks: 0,
    promptTokens: 0,
    generationTokens: 0,
  };
  /** The host-memory tier, when the rank has one. */
  readonly host: HostTier | undefined;
  private readonly running: SimCall[] = [];
  private readonly waiting = new WaitQueue();
  private waitingCount = 0;
  private inflight: InflightStep | undefined;
  private run: DecodeRun | undefined;
  private timer: Cancel | undefined;
  private startPending = false;
  private emptySteps = 0;
  private readonly bs: number;
  private readonly creditMs: number;

  constructor(private readonly ctx: RankContext) {
    const { params } = ctx;
    this.bs = params.blockSize;
    this.creditMs = params.cPrefill * params.floorCreditTokens;
    const onKv = ctx.onKvEvent;
    const hostBlocks = Math.floor(params.hostKvTokens / params.blockSize);
    const onHostKv = ctx.onHostKvEvent;
    const host =
      hostBlocks > 0
        ? new HostTier(hostBlocks, onHostKv ? (event) => onHostKv(ctx.rank, event) : undefined)
        : undefined;
    this.host = host;
    const counters = this.counters;
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

  /** Calls in the running batch. */
  runningCount(): number {
    return this.running.length;
  }

  /** Calls waiting (new or preempted). */
  waitingCalls(): number {
    return this.waitingCount;
  }

  /** Running plus waiting calls: the load used to place calls without a rank. */
  load(): number {
    return this.running.length + this.waitingCount;
  }

  /** Blocks held by running calls over all blocks, after applying decode steps already past. */
  kvUsage(): number {
    this.catchUp();
    return this.pool.usedBlocks() / this.pool.numBlocks;
  }

  /** Queues a call; it is scheduled at the next step boundary. */
  submit(call: SimCall): void {
    this.counters.promptTokens += call.promptLen;
    this.waiting.push(call);
    this.waitingCount++;
    this.emitCall(call, "arrival");
    if (this.run) this.interrupt();
    else if (!this.inflight && !this.startPending) this.startSoon();
  }

  /** Ends a call at once, freeing its blocks; its result reports `abort`. */
  abort(call: SimCall): void {
    if (call.state === "done") return;
    if (call.state === "running" && this.run) this.interrupt();
    if (call.state === "waiting") {
      this.waitingCount--;
    } else {
      const i = this.running.indexOf(call);
      if (i >= 0) this.running.splice(i, 1);
    }
    this.counters.aborted++;
    this.finish(call, "abort");
  }

  /** Aborts every call and cancels the pending timer. */
  close(): void {
    this.timer?.();
    this.timer = undefined;
    this.run = undefined;
    this.inflight = undefined;
    for (const call of [...this.running, ...this.waiting.all()]) {
      if (call.state === "waiting") this.waitingCount--;
      this.counters.aborted++;
      this.finish(call, "abort");
    }
    this.running.length = 0;
  }

  /** Applies the decode steps of the current run that ended before now (never its last one). */
  catchUp(): void {
    const run = this.run;
    if (!run) return;
    const k = this.stepsBefore(run, this.ctx.clock.now());
    if (k > 0) this.applyRun(run, k);
  }

  // ---- stepping --------------------------------------------------------------------------

  private startSoon(): void {
    this.startPending = true;
    // A zero-delay timer: calls that arrive at the same instant share the first step.
    this.timer = this.ctx.clock.setTimeout(() => {
      this.startPending = false;
      this.counters.timers++;
      this.step(this.ctx.clock.now());
    }, 0);
  }

  /** Starts the next step at `boundary` (the end of the last one) if there is work. */
  private next(boundary: number): void {
    if (this.running.length > 0 || this.waitingCount > 0) {
      this.step(Math.max(boundary, this.ctx.clock.now() - MAX_LAG_MS));
    }
  }

  /** Schedules one step starting at `now` and arms the timer for its end. */
  private step(now: number): void {
    const { params, clock } = this.ctx;
    const bs = this.bs;
    let budget = params.maxNumBatchedTokens;
    const calls: SimCall[] = [];
    let P = 0;
    let D = 0;
    let K = 0;
    let pairs = 0;
    let hostLoad = 0;
    let preempted = 0;
    let waitingBlocked = false;

    const record = (call: SimCall, n: number): void => {
      const s = call.numComputed;
      if (call.output.length > 0 && n === 1 && s + 1 === call.numTokens) {
        D++;
        K += call.numTokens;
      } else {
        P += n;
        pairs += n * (s + n / 2);
      }
      if (s < call.highWater) this.counters.recomputedTokens += Math.min(s + n, call.highWater) - s;
      call.numComputed = s + n;
      if (call.numComputed > call.highWater) call.highWater = call.numComputed;
      this.registerFull(call);
      calls.push(call);
      budget -= n;
    };

    // Running calls, in admission order.
    for (let i = 0; i < this.running.length && budget > 0; ) {
      const call = this.running[i]!;
      const n = Math.min(call.numTokens - call.numComputed, budget);
      if (n <= 0) {
        i++;
        continue;
      }
      let scheduled = true;
      while (!this.growBlocks(call, call.numComputed + n)) {
        const victim = this.running.pop()!;
        this.preempt(victim, now);
        preempted++;
        if (victim === call) {
          scheduled = false;
          break;
        }
      }
      if (!scheduled) break;
      record(call, n);
      i++;
    }

    // Waiting calls, oldest first, unless this step had to preempt.
    if (preempted === 0) {
      while (budget > 0 && this.running.length < params.maxNumSeqs) {
        const call = this.waiting.peek();
        if (!call) break;
        // At least the last prompt token is computed (as vLLM does), so hits stop one short of it.
        const maxHitBlocks = Math.floor((call.numTokens - 1) / bs);
        const hits = this.pool.lookup(call.hashes, maxHitBlocks);
        // The chain continues in host memory where GPU memory lost it; those blocks are loaded, not computed.
        const gpuHitTokens = hits.length * bs;
        const hostBlocks = this.host ? this.host.matchFrom(call.hashes, hits.length, maxHitBlocks) : 0;
        // KV pulled from a prefill replica is in place at first scheduling (the transfer ran before it queued here).
        const remote = call.scheduledOnce ? 0 : call.remoteTokens;
        const hitTokens = Math.max(gpuHitTokens + hostBlocks * bs, remote);
        const n = Math.min(call.numTokens - hitTokens, budget);
        const need = Math.ceil((hitTokens + n) / bs) - hits.length;
        if (need > this.pool.freeBlocks() - this.pool.countFree(hits)) {
          waitingBlocked = true;
          break;
        }
        this.pool.touch(hits);
        // Touched before allocating: the evictions that allocation spills into the host tier must not push these out.
        if (hostBlocks > 0) this.host!.touch(call.hashes, hits.length, hostBlocks);
        call.blocks = hits;
        call.registered = hits.length;
        call.numComputed = hitTokens;
        for (let j = 0; j < need; j++) call.blocks.push(this.pool.allocate());
        if (hostBlocks > 0) {
          hostLoad += hostBlocks * bs;
          this.counters.hostLoadedTokens += hostBlocks * bs;
        }
        this.waiting.shift();
        this.waitingCount--;
        call.state = "running";
        this.running.push(call);
        if (!call.scheduledOnce) {
          call.scheduledOnce = true;
          call.cachedTokens = hitTokens;
          call.hostCachedTokens = hostBlocks * bs;
          this.counters.prefixQueryTokens += call.numTokens;
          this.counters.prefixHitTokens += gpuHitTokens;
          if (this.host) {
            this.counters.hostQueryTokens += call.numTokens - gpuHitTokens;
            this.counters.hostHitTokens += hostBlocks * bs;
          }
          this.emitCall(call, "scheduled");
        }
        record(call, n);
      }
    }

    if (calls.length === 0) {
      this.emptySteps++;
      // Only a call that can never fit would schedule nothing twice in a row; fail it rather than spin.
      if (this.emptySteps > 2) {
        const stuck = this.waiting.peek();
        if (stuck) {
          this.waitingCount--;
          this.finish(stuck, "error");
        }
      }
      if (this.running.length > 0 || this.waitingCount > 0) this.startSoon();
      return;
    }
    this.emptySteps = 0;

    const duration = stepTimeMs(params, {
      prefillTokens: P,
      decodeSeqs: D,
      decodeContextTokens: K,
      prefillPairs: pairs,
      hostLoadTokens: hostLoad,
    });
    if (hostLoad > 0) this.counters.hostLoadMs += hostLoad * hostLoadMsPerToken(params);

    // A pure-decode batch that nothing can join: simulate the run up to the next completion in one timer.
    if (
      this.ctx.skipDecodeSteps &&
      preempted === 0 &&
      P === 0 &&
      D === this.running.length &&
      (this.waitingCount === 0 || this.running.length >= params.maxNumSeqs || waitingBlocked)
    ) {
      let n = Number.POSITIVE_INFINITY;
      for (const call of this.running) n = Math.min(n, call.remainingOutput());
      n = this.feasibleSteps(n);
      if (n >= 2) {
        const a = params.c0 + Math.max(0, params.cDec * D - this.creditMs);
        const run: DecodeRun = {
          calls: this.running.slice(),
          base: now,
          remaining: n,
          slotsTaken: true,
          a,
          K,
          D,
          endAt: now,
        };
        run.endAt = this.runEnd(run, n);
        this.run = run;
        this.timer = clock.setTimeout(() => this.onRunEnd(run), run.endAt - clock.now());
        return;
      }
    }

    this.counters.steps++;
    this.counters.busyMs += duration;
    this.counters.prefillTokens += P;
    this.counters.decodeTokens += D;
    const endAt = now + duration;
    this.ctx.onStep?.({
      rank: this.ctx.rank,
      startMs: now,
      endMs: endAt,
      steps: 1,
      prefillTokens: P,
      decodeSeqs: D,
      decodeContextTokens: K,
      prefillPairs: pairs,
      hostLoadTokens: hostLoad,
      preempted,
      running: this.running.length,
      waiting: this.waitingCount,
    });
    this.arm({ calls, endAt });
  }

  private arm(step: InflightStep): void {
    this.inflight = step;
    this.timer = this.ctx.clock.setTimeout(() => this.onStepEnd(step), step.endAt - this.ctx.clock.now());
  }

  private onStepEnd(step: InflightStep): void {
    if (this.inflight !== step) return;
    this.inflight = undefined;
    this.timer = undefined;
    this.counters.timers++;
    const now = this.ctx.clock.now();
    let finished = false;
    for (const call of step.calls) {
      if (call.state !== "running" || call.numComputed !== call.numTokens) continue;
      const entry = call.sample(this.ctx.vocabulary);
      this.counters.generationTokens++;
      if (call.firstTokenMs === undefined) {
        call.firstTokenMs = now;
        this.emitCall(call, "first_token");
      }
      call.stream.push([entry.id], entry.text);
      if (call.remainingOutput() <= 0) {
        this.finish(call, "length");
        finished = true;
      }
    }
    if (finished) this.dropFinished();
    this.next(step.endAt);
  }

  // ---- decode runs -------------------------------------------------------------------------

  /** Largest n ≤ `limit` such that every running call can get the blocks for n decode steps. */
  private feasibleSteps(limit: number): number {
    const enough = (n: number): boolean => {
      let need = 0;
      // numComputed already includes the first step of the run.
      for (const call of this.running) {
        const extra = Math.ceil((call.numComputed + n - 1) / this.bs) - call.blocks.length;
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

  /** End time of the first `k` remaining steps of a run (summed step by step, as applied). */
  private runEnd(run: DecodeRun, k: number): number {
    const cKv = this.ctx.params.cKv;
    let t = run.base;
    for (let j = 0; j < k; j++) t += run.a + cKv * (run.K + j * run.D);
    return t;
  }

  /** Steps of the run that ended strictly before `now`, at most `remaining − 1`. */
  private stepsBefore(run: DecodeRun, now: number): number {
    const cKv = this.ctx.params.cKv;
    let t = run.base;
    let k = 0;
    while (k < run.remaining - 1) {
      const end = t + run.a + cKv * (run.K + k * run.D);
      if (end >= now) break;
      t = end;
      k++;
    }
    return k;
  }

  private onRunEnd(run: DecodeRun): void {
    if (this.run !== run) return;
    this.timer = undefined;
    this.counters.timers++;
    this.applyRun(run, run.remaining);
    this.run = undefined;
    this.dropFinished();
    this.next(run.endAt);
  }

  /**
   * Something changes the batch mid-run (an arrival, an abort): apply the
   * steps already past and turn the step in progress into an ordinary step,
   * so the next scheduling decision happens at its end, as without the run.
   */
  private interrupt(): void {
    const run = this.run;
    if (!run) return;
    this.timer?.();
    this.timer = undefined;
    this.run = undefined;
    const k = this.stepsBefore(run, this.ctx.clock.now());
    if (k > 0) this.applyRun(run, k);
    const calls = run.calls.filter((c) => c.state === "running");
    if (!run.slotsTaken) for (const call of calls) this.takeDecodeSlot(call);
    const K = run.K;
    const duration = run.a + this.ctx.params.cKv * K;
    const endAt = run.base + duration;
    this.counters.steps++;
    this.counters.busyMs += duration;
    this.counters.decodeTokens += run.D;
    this.ctx.onStep?.({
      rank: this.ctx.rank,
      startMs: run.base,
      endMs: endAt,
      steps: 1,
      prefillTokens: 0,
      decodeSeqs: run.D,
      decodeContextTokens: K,
      prefillPairs: 0,
      hostLoadTokens: 0,
      preempted: 0,
      running: this.running.length,
      waiting: this.waitingCount,
    });
    this.arm({ calls, endAt });
  }

  /** Applies the next `k` steps of a run: slots, blocks and one sampled token per call per step. */
  private applyRun(run: DecodeRun, k: number): void {
    const { params, vocabulary } = this.ctx;
    const calls = run.calls;
    const startLen = calls.map((c) => c.output.length);
    const texts = calls.map(() => "");
    const startMs = run.base;
    const firstK = run.K;
    let t = run.base;
    for (let j = 0; j < k; j++) {
      const duration = run.a + params.cKv * run.K;
      t += duration;
      this.counters.busyMs += duration;
      for (let i = 0; i < calls.length; i++) {
        const call = calls[i]!;
        if (j > 0 || !run.slotsTaken) this.takeDecodeSlot(call);
        texts[i] += call.sample(vocabulary).text;
      }
      run.K += run.D;
    }
    this.counters.steps += k;
    this.counters.decodeTokens += k * run.D;
    this.counters.generationTokens += k * run.D;
    run.base = t;
    run.remaining -= k;
    run.slotsTaken = false;
    this.ctx.onStep?.({
      rank: this.ctx.rank,
      startMs,
      endMs: t,
      steps: k,
      prefillTokens: 0,
      decodeSeqs: run.D,
      decodeContextTokens: firstK,
      prefillPairs: 0,
      hostLoadTokens: 0,
      preempted: 0,
      running: this.running.length,
      waiting: this.waitingCount,
    });
    for (let i = 0; i < calls.length; i++) {
      const call = calls[i]!;
      call.stream.push(call.output.slice(startLen[i]), texts[i]!);
      if (call.remainingOutput() <= 0) this.finish(call, "length");
    }
  }

  /** Reserves the KV slot of one decode token (a new block when the last one is full). */
  private takeDecodeSlot(call: SimCall): void {
    if (!this.growBlocks(call, call.numComputed + 1)) {
      throw new Error("decode run outgrew the KV pool (feasibility check is wrong)");
    }
    call.numComputed++;
    if (call.numComputed > call.highWater) call.highWater = call.numComputed;
    this.registerFull(call);
  }

  // ---- blocks and lifecycle ------------------------------------------------------------------

  /** Gives the call enough blocks for `tokens` tokens; false (and nothing taken) when the pool is short. */
  private growBlocks(call: SimCall, tokens: number): boolean {
    const need = Math.ceil(tokens / this.bs) - call.blocks.length;
    if (need <= 0) return true;
    if (need > this.pool.freeBlocks()) return false;
    for (let j = 0; j < need; j++) call.blocks.push(this.pool.allocate());
    return true;
  }

  /** Offers the call's newly full blocks to the prefix cache. */
  private registerFull(call: SimCall): void {
    const full = Math.floor(call.numComputed / this.bs);
    for (let i = call.registered; i < full; i++) this.pool.register(call.blocks[i]!, call.hashes[i]!);
    if (full > call.registered) call.registered = full;
  }

  private preempt(call: SimCall, now: number): void {
    this.pool.release(call.blocks);
    call.blocks = [];
    call.registered = 0;
    call.numComputed = 0;
    call.state = "waiting";
    call.preemptions++;
    this.waiting.unshift(call);
    this.waitingCount++;
    this.counters.preemptions++;
    this.ctx.onCall?.({ type: "preempted", requestId: call.requestId, rank: this.ctx.rank, atMs: now });
  }

  private finish(call: SimCall, reason: FinishReason): void {
    if (call.blocks.length > 0) this.pool.release(call.blocks);
    call.blocks = [];
    call.state = "done";
    if (reason !== "abort") this.counters.finished++;
    this.ctx.onCall?.({
      type: "finished",
      requestId: call.requestId,
      rank: this.ctx.rank,
      atMs: this.ctx.clock.now(),
      finishReason: reason,
      completionTokens: call.output.length,
    });
    call.stream.end(call.result(reason));
  }

  private dropFinished(): void {
    let w = 0;
    for (let r = 0; r < this.running.length; r++) {
      const call = this.running[r]!;
      if (call.state === "running") this.running[w++] = call;
    }
    this.running.length = w;
  }

  private emitCall(call: SimCall, type: "arrival" | "scheduled" | "first_token"): void {
    const onCall = this.ctx.onCall;
    if (!onCall) return;
    const event: SimCallEvent = {
      type,
      requestId: call.requestId,
      rank: this.ctx.rank,
      atMs: this.ctx.clock.now(),
    };
    if (type === "scheduled") {
      event.cachedTokens = call.cachedTokens;
      if (this.host) event.hostCachedTokens = call.hostCachedTokens;
    }
    onCall(event);
  }
}
