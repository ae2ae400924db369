/** @module One data-parallel rank of the simulated replica: vLLM V1-style continuous batching over a paged, prefix-cached KV pool. */

import type { Cancel } from "../../../src/clock.js";
import type { FinishReason } from "../../../src/engine.js";
import { type DecodeRun, runEnd, stepsBefore } from "./decode-run.js";
import { hostLoadMsPerToken, stepTimeMs } from "./presets.js";
import { RankKv } from "./rank-kv.js";
import { emptyRankCounters, type RankContext, type RankCounters, type SimCallEvent } from "./rank-types.js";
import type { SimCall } from "./sim-call.js";
import { WaitQueue } from "./wait-queue.js";

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
 * One rank: a waiting queue, a running batch and a KV pool. Each step
 * follows vLLM V1's scheduler: running calls first, in admission order
 * (decodes and unfinished chunked prefills: one token each for decodes, up
 * to the token budget for prefills), then waiting calls while the batch has
 * room under `maxNumSeqs` and `maxNumBatchedTokens`. When a running call
 * cannot get a block, the youngest running call is preempted (its blocks
 * freed, its KV recomputed later) and no waiting call is admitted that step.
 */
export class RankSim {
  readonly counters: RankCounters = emptyRankCounters();
  /** Its GPU pool and the host tier behind it, if any. */
  readonly kv: RankKv;
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
    this.kv = new RankKv(ctx, this.counters);
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
    return this.kv.pool.usedBlocks() / this.kv.pool.numBlocks;
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
    const k = stepsBefore(run, this.ctx.clock.now(), this.ctx.params.cKv);
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
      this.kv.registerFull(call);
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
      while (!this.kv.grow(call, call.numComputed + n)) {
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
        const hits = this.kv.prefixHits(call);
        const gpuHitTokens = hits.blocks.length * bs;
        const hostBlocks = hits.hostBlocks;
        // KV pulled from a prefill replica is in place at first scheduling (the transfer ran before it queued here).
        const remote = call.scheduledOnce ? 0 : call.remoteTokens;
        const hitTokens = Math.max(gpuHitTokens + hostBlocks * bs, remote);
        const n = Math.min(call.numTokens - hitTokens, budget);
        if (!this.kv.admit(call, hits, hitTokens, hitTokens + n)) {
          waitingBlocked = true;
          break;
        }
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
          this.kv.countLookup(call.numTokens, gpuHitTokens, hostBlocks * bs);
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
      n = this.kv.feasibleSteps(this.running, n);
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
        run.endAt = runEnd(run, n, params.cKv);
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
    const k = stepsBefore(run, this.ctx.clock.now(), this.ctx.params.cKv);
    if (k > 0) this.applyRun(run, k);
    const calls = run.calls.filter((c) => c.state === "running");
    if (!run.slotsTaken) for (const call of calls) this.takeDecodeSlot(call);
    const K = run.K;
    const duration = run.a + this.ctx.params.cKv * K;
    const endAt = run.base + duration;
    this.counters.steps++;
    this.counters.busyMs += duration;
    this.counters.decodeTokens += run.D;
    this.emitDecodeSteps(run.base, endAt, 1, run.D, K);
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
    this.emitDecodeSteps(startMs, t, k, run.D, firstK);
    for (let i = 0; i < calls.length; i++) {
      const call = calls[i]!;
      call.stream.push(call.output.slice(startLen[i]), texts[i]!);
      if (call.remainingOutput() <= 0) this.finish(call, "length");
    }
  }

  /** Reports `steps` pure-decode steps of `D` sequences from `startMs` to `endMs`, the first with `K` context tokens. */
  private emitDecodeSteps(startMs: number, endMs: number, steps: number, D: number, K: number): void {
    this.ctx.onStep?.({
      rank: this.ctx.rank,
      startMs,
      endMs,
      steps,
      prefillTokens: 0,
      decodeSeqs: D,
      decodeContextTokens: K,
      prefillPairs: 0,
      hostLoadTokens: 0,
      preempted: 0,
      running: this.running.length,
      waiting: this.waitingCount,
    });
  }

  /** Reserves the KV slot of one decode token (a new block when the last one is full). */
  private takeDecodeSlot(call: SimCall): void {
    if (!this.kv.grow(call, call.numComputed + 1)) {
      throw new Error("decode run outgrew the KV pool (feasibility check is wrong)");
    }
    call.numComputed++;
    if (call.numComputed > call.highWater) call.highWater = call.numComputed;
    this.kv.registerFull(call);
  }

  // ---- blocks and lifecycle ------------------------------------------------------------------

  private preempt(call: SimCall, now: number): void {
    this.kv.release(call);
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
    this.kv.release(call);
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
      if (this.kv.host) event.hostCachedTokens = call.hostCachedTokens;
    }
    onCall(event);
  }
}
