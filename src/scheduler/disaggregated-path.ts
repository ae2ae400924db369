/**
 * @module The request path of a disaggregated fleet (prefill and decode
 * replicas), after the call was routed to its prefill replica: both budgets
 * and the deadline are checked before the prefill starts, then the two calls
 * of vLLM's disaggregated serving run — a prefill with `max_tokens` 1 and
 * `kv_transfer_params.do_remote_decode`, whose answer's `kv_transfer_params`
 * the decode call carries (vllm-project/vllm,
 * tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) — each through
 * its own replica's gate.
 */

import { followAbort } from "../abort.js";
import { checkDeadline } from "../budget/feasibility.js";
import type { Reservation } from "../budget/token-budget.js";
import type { Clock } from "../clock.js";
import { type DecodeCheck, LANE_DEFAULTS, type SchedulerConfig } from "../config/scheduler-config.js";
import type { EngineCall, EngineResult, EngineStream } from "../engine.js";
import { EngineError, Refusal } from "../errors.js";
import type { Permit } from "../gate/backend-gate.js";
import { chooseDecode, type DecodeCandidate, type DecodeDemand } from "../routing/decode-placement.js";
import { predictTtftMs } from "../routing/placement.js";
import type { SessionRecord } from "../sessions/session-admission.js";
import type { AdmittedCall, CallRequest, Lane, SchedulerEvents } from "../types.js";
import { AdmittedCallImpl, type CallHoldings } from "./admitted-call.js";
import type { ReplicaRuntime } from "./replica-runtime.js";

/** What the prefill call sends in `kv_transfer_params`, as vLLM's toy proxy does. */
export const PREFILL_TRANSFER_REQUEST: Readonly<Record<string, unknown>> = Object.freeze({
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
});

/** The call as routed to its prefill replica. */
export interface RoutedCall {
  req: CallRequest;
  model: string;
  tokens: readonly number[];
  maxTokens: number;
  lane: Lane;
  session: SessionRecord | undefined;
  prefill: ReplicaRuntime;
  /** Uncached prompt tokens on the prefill replica, as the router predicts them. */
  uncached: number;
  hashes: string[];
  /** When admission began (clock ms). */
  startedAt: number;
}

/** What the scheduler lends this path: its gate step, its call bookkeeping and its events. */
export interface DisaggregatedContext {
  clock: Clock;
  config: SchedulerConfig;
  /** Decode replicas of the fleet, in fleet order. */
  decodeReplicas: readonly ReplicaRuntime[];
  /** SPEC 2 step 7 on one replica (queues, rejections, busy marks). */
  passGate(req: CallRequest, replica: ReplicaRuntime, lane: Lane, uncached: number): Promise<Permit | null>;
  /** The holdings of an admitted call: what its end gives back (permit, reservation, session step …). */
  holdings(held: {
    replica: ReplicaRuntime;
    lane: Lane;
    session: SessionRecord | undefined;
    tokens: readonly number[];
    hashes: string[];
    permit: Permit | null;
    reservation: Reservation | null;
    uncached: number;
    admittedAt: number;
    unlinkSignal: () => void;
  }): CallHoldings;
  /** Records the prompt's blocks as held by `replica` (the prefix index), after a prefill. */
  recordPrefix(replica: ReplicaRuntime, hashes: readonly string[]): void;
  emit<K extends keyof SchedulerEvents>(name: K, event: Parameters<NonNullable<SchedulerEvents[K]>>[0]): void;
}

/** Calls admitted for a decode replica, by where their KV is. */
interface DecodeCounts {
  coming: number;
  decoding: number;
}

/** Decode-side holds of one call, given back once. */
interface DecodeHold {
  replica: ReplicaRuntime;
  reservation: Reservation | null;
  counted: "coming" | "decoding" | null;
}

/**
 * The path itself. Mechanics only: which decode replica has room is
 * `chooseDecode`'s decision (`routing/decode-placement.ts`).
 */
export class DisaggregatedPath {
  readonly decodeCheck: DecodeCheck;
  private readonly counts = new Map<string, DecodeCounts>();
  private refusedAfterPrefillCalls = 0;
  private wastedTokens = 0;

  constructor(private readonly ctx: DisaggregatedContext) {
    this.decodeCheck = ctx.config.disaggregation.decodeCheck;
    for (const replica of ctx.decodeReplicas) this.counts.set(replica.id, { coming: 0, decoding: 0 });
  }

  /** For the admin state. */
  summary(): { decodeCheck: DecodeCheck; refusedAfterPrefill: number; wastedPrefillTokens: number } {
    return {
      decodeCheck: this.decodeCheck,
      refusedAfterPrefill: this.refusedAfterPrefillCalls,
      wastedPrefillTokens: this.wastedTokens,
    };
  }

  /** Calls counted on decode replicas (coming or decoding): zero once idle. */
  outstanding(): number {
    let n = 0;
    for (const c of this.counts.values()) n += c.coming + c.decoding;
    return n;
  }

  /**
   * SPEC 2 steps 6–8 for a routed call. The prefill side's reservation and
   * permit are put in `holds` as they are taken, so the caller's release on
   * failure covers them; the decode side's are this method's to give back.
   */
  async admit(
    call: RoutedCall,
    holds: { reservation: Reservation | null; permit: Permit | null; inflight: number },
  ): Promise<AdmittedCall> {
    const { req, prefill, uncached, lane } = call;
    const decodeTokens = call.tokens.length + call.maxTokens;
    // The prefill side's budget: its uncached prompt and the one token it generates.
    if (prefill.budget) {
      holds.reservation = prefill.budget.reserveOrRefuse(uncached + 1, {
        queued: true,
        lane,
        callTokens: call.tokens.length + 1,
        retryAfterSeconds: prefill.drainSeconds(prefill.running),
      });
    }
    const prefillDoneInMs = predictTtftMs({
      uncachedPrefillTokens: uncached,
      queuedPrefillTokens: prefill.queuedPrefillTokens,
      inflightPrefillTokens: prefill.inflightPrefillTokens,
      prefillTokensPerSecond: prefill.prefillRate.rate(),
      kvUsage: prefill.signals.kvUsage,
    });
    const demand: DecodeDemand = {
      tokens: decodeTokens,
      transferTokens: Math.max(0, call.tokens.length - 1),
      prefillDoneInMs,
    };
    let decode: DecodeHold | undefined;
    let arrivalInMs = prefillDoneInMs;
    if (this.decodeCheck !== "none") {
      const placed = this.placeDecode(demand, this.decodeCheck, lane);
      arrivalInMs = placed.arrivalInMs;
      if (this.decodeCheck === "predicted") {
        decode = this.holdDecode(placed.replica, decodeTokens, placed.creditTokens);
      }
    }
    try {
      this.checkDeadline(req, lane, arrivalInMs, prefill);
      holds.permit = await this.ctx.passGate(req, prefill, lane, uncached);
      const prefillAdmittedAt = this.ctx.clock.now();
      this.ctx.emit("admitted", {
        lane,
        replica: prefill.id,
        queueWaitMs: prefillAdmittedAt - call.startedAt,
      });
      const handover = await this.runPrefill(call, holds);
      holds.permit?.release();
      holds.permit = null;
      holds.reservation?.release();
      holds.reservation = null;
      try {
        decode ??= this.holdDecode(
          this.placeDecode({ ...demand, prefillDoneInMs: 0 }, "current", lane).replica,
          decodeTokens,
          0,
        );
        return await this.runDecode(call, decode, handover, prefillAdmittedAt);
      } catch (error) {
        if (error instanceof Refusal) this.wasted(prefill, uncached, error.reason);
        throw error;
      }
    } catch (error) {
      if (decode) this.releaseDecode(decode);
      throw error;
    }
  }

  /** The decode replica with room for the call (by `check`), or a 429 `decode_budget_exhausted`. */
  private placeDecode(
    demand: DecodeDemand,
    check: DecodeCheck,
    lane: Lane,
  ): { replica: ReplicaRuntime; arrivalInMs: number; creditTokens: number } {
    const now = this.ctx.clock.now();
    const candidates = this.ctx.decodeReplicas.map((replica) => this.candidate(replica, now));
    const choice = chooseDecode(candidates, demand, check);
    if (choice.replica !== undefined) {
      const replica = this.ctx.decodeReplicas.find((r) => r.id === choice.replica)!;
      return { replica, arrivalInMs: choice.room.arrivalInMs, creditTokens: choice.room.creditTokens };
    }
    const best = this.ctx.decodeReplicas.find((r) => r.id === choice.bestId);
    const room = choice.best;
    const short = room ? Math.max(0, demand.tokens - room.tokens) : demand.tokens;
    let retryAfterSeconds = 1;
    if (best) {
      // The decoding calls that must finish to free the shortfall, at their mean reservation, drained at the measured rate.
      const counts = this.counts.get(best.id)!;
      const mean = counts.decoding > 0 ? (best.budget?.reservedActive ?? 0) / counts.decoding : demand.tokens;
      const calls = Math.max(
        room && room.slots < 1 ? 1 - room.slots : 1,
        Math.ceil(short / Math.max(1, mean)),
      );
      retryAfterSeconds = best.drainSeconds(calls - 1);
    }
    const what = room
      ? `the most room predicted is ${Math.max(0, Math.floor(room.tokens))} tokens and ${Math.max(0, room.slots)} batch slot(s) on ${choice.bestId}`
      : "no decode replica is healthy";
    throw new Refusal(
      "decode_budget_exhausted",
      `the call needs ${demand.tokens} tokens of decode KV (input + max_tokens) and a batch slot when its KV arrives; ${what}`,
      { lane, scope: "fleet", retryAfterSeconds },
    );
  }

  private candidate(replica: ReplicaRuntime, now: number): DecodeCandidate {
    const signals = replica.signals;
    const counts = this.counts.get(replica.id)!;
    const budget = replica.budget;
    const capacity = budget?.ceiling ?? signals.kvCapacityTokens;
    const limits = replica.gate?.limits();
    const ranks = Math.max(1, signals.dataParallelSize);
    return {
      id: replica.id,
      eligible: replica.healthy(),
      busy: replica.busy(now),
      usableTokens: budget ? budget.maxReservable : capacity,
      comingCalls: counts.coming,
      comingTokens: budget?.reservedQueued ?? 0,
      decodingCalls: counts.decoding,
      decodingTokens: budget?.reservedActive ?? 0,
      completionsPerSecond: replica.completionRate(),
      kvUsage: signals.kvUsage,
      running: signals.running,
      capacityTokens: capacity,
      batchSlots:
        signals.maxNumSeqs > 0 ? signals.maxNumSeqs * ranks : (limits?.engineRequestLimit ?? 1) * ranks,
      transferTokensPerSecond: signals.kvTransferTokensPerSecond ?? 0,
    };
  }

  /** Takes the decode side's reservation (predicted check: before the prefill) and counts the call as coming. */
  private holdDecode(replica: ReplicaRuntime, tokens: number, creditTokens: number): DecodeHold {
    let reservation: Reservation | null = null;
    if (replica.budget && this.decodeCheck === "predicted") {
      reservation = replica.budget.tryReserve(tokens, { queued: true, creditTokens });
      if (!reservation) {
        // chooseDecode found the room; only a budget whose ceiling moved since could say otherwise.
        throw new Refusal(
          "decode_budget_exhausted",
          `decode replica ${replica.id} has no room for ${tokens} tokens`,
          {
            scope: "worker",
            retryAfterSeconds: replica.drainSeconds(1),
          },
        );
      }
    }
    this.counts.get(replica.id)!.coming++;
    return { replica, reservation, counted: "coming" };
  }

  private releaseDecode(hold: DecodeHold): void {
    hold.reservation?.release();
    hold.reservation = null;
    if (hold.counted) this.counts.get(hold.replica.id)![hold.counted]--;
    hold.counted = null;
  }

  /** The deadline covers what the client waits for its first token: prefill, then the KV transfer. */
  private checkDeadline(req: CallRequest, lane: Lane, arrivalInMs: number, prefill: ReplicaRuntime): void {
    const refusal = checkDeadline({
      predictedTtftMs: arrivalInMs,
      deadlineMs: req.deadlineMs,
      laneDeadlineMs: this.ctx.config.lanes[lane].deadlineMs ?? LANE_DEFAULTS[lane].deadlineMs,
      lane,
      retryAfterSeconds: prefill.drainSeconds(prefill.running),
    });
    if (refusal) throw refusal;
  }

  /** The prefill leg: one token, the KV kept for the decode side; resolves with the hand-over parameters. */
  private async runPrefill(
    call: RoutedCall,
    holds: { reservation: Reservation | null; inflight: number },
  ): Promise<Record<string, unknown>> {
    const { req, prefill, uncached } = call;
    holds.reservation?.activate();
    prefill.startPrefill(uncached);
    holds.inflight = uncached;
    const startedAt = this.ctx.clock.now();
    const abort = new AbortController();
    const unlink = followAbort(req.signal, abort);
    let result: EngineResult;
    prefill.callStarted();
    try {
      const stream = await this.start(prefill, {
        requestId: req.requestId,
        model: call.model,
        promptTokens: call.tokens,
        maxTokens: 1,
        endpoint: req.endpoint,
        ...(req.body ? { body: req.body } : {}),
        stream: false,
        signal: abort.signal,
        kvTransferParams: PREFILL_TRANSFER_REQUEST,
      });
      result = await drain(stream);
    } catch (error) {
      if (req.signal?.aborted) throw req.signal.reason;
      if (error instanceof EngineError) {
        throw new Refusal("unavailable", `prefill replica ${prefill.id} failed: ${error.message}`, {
          retryAfterSeconds: 1,
          scope: "worker",
          cause: error,
        });
      }
      throw error;
    } finally {
      unlink();
      prefill.endPrefill(holds.inflight);
      holds.inflight = 0;
      prefill.callEnded();
      prefill.recordCompletion();
    }
    if (req.signal?.aborted) throw req.signal.reason;
    const elapsed = this.ctx.clock.now() - startedAt;
    if (uncached > 0 && elapsed > 0) prefill.prefillRate.observe(uncached, elapsed);
    this.ctx.recordPrefix(prefill, call.hashes);
    if (!result.kvTransferParams) {
      throw new Refusal(
        "unavailable",
        `prefill replica ${prefill.id} handed no KV over (no kv_transfer_params in its answer: is it started with a KV connector?)`,
        { retryAfterSeconds: 1, scope: "worker" },
      );
    }
    return result.kvTransferParams;
  }

  /** The decode leg, through the decode replica's gate; from its start the admitted call owns every hold. */
  private async runDecode(
    call: RoutedCall,
    hold: DecodeHold,
    handover: Record<string, unknown>,
    admittedAt: number,
  ): Promise<AdmittedCall> {
    const { req, lane } = call;
    const replica = hold.replica;
    const gateStart = this.ctx.clock.now();
    let permit = await this.ctx.passGate(req, replica, lane, 0);
    const abort = new AbortController();
    const unlinkSignal = followAbort(req.signal, abort);
    let stream: EngineStream;
    try {
      hold.reservation?.activate();
      stream = await this.start(replica, {
        requestId: req.requestId,
        model: call.model,
        promptTokens: call.tokens,
        maxTokens: call.maxTokens,
        endpoint: req.endpoint,
        ...(req.body ? { body: req.body } : {}),
        stream: req.stream,
        signal: abort.signal,
        kvTransferParams: handover,
        ...(permit?.rank !== undefined ? { rank: permit.rank } : {}),
      });
    } catch (error) {
      unlinkSignal();
      permit?.release();
      permit = null;
      throw error;
    }
    replica.callStarted();
    const counts = this.counts.get(replica.id)!;
    counts.coming--;
    counts.decoding++;
    hold.counted = "decoding";
    const held = this.ctx.holdings({
      replica,
      lane,
      session: call.session,
      tokens: call.tokens,
      hashes: call.hashes,
      permit,
      reservation: hold.reservation,
      uncached: 0,
      admittedAt,
      unlinkSignal,
    });
    // From here the admitted call gives back the reservation; the count is this path's.
    hold.reservation = null;
    const holdings: CallHoldings = {
      firstToken: () => held.firstToken(),
      finish: (outcome, result, outputTokens) => {
        held.finish(outcome, result, outputTokens);
        this.releaseDecode(hold);
      },
    };
    return new AdmittedCallImpl({
      requestId: req.requestId,
      lane,
      replica: replica.id,
      queueMs: admittedAt - call.startedAt + (this.ctx.clock.now() - gateStart),
      inputTokens: call.tokens.length,
      maxTokens: call.maxTokens,
      sessionId: call.session?.id,
      stream,
      abort,
      holdings,
    });
  }

  /** Starts an engine call; an engine that cannot be reached is a 503 `unavailable` for this call. */
  private async start(replica: ReplicaRuntime, engineCall: EngineCall): Promise<EngineStream> {
    try {
      return await replica.engine.generate(engineCall);
    } catch (error) {
      if (error instanceof Refusal && error.reason === "worker_overloaded") {
        replica.markBusy(this.ctx.clock.now() + this.ctx.config.routing.busyMarkMs);
      }
      if (error instanceof EngineError) {
        replica.markUnreachable(this.ctx.clock.now());
        throw new Refusal("unavailable", `replica ${replica.id} could not be reached: ${error.message}`, {
          retryAfterSeconds: 1,
          scope: "worker",
          cause: error,
        });
      }
      throw error;
    }
  }

  private wasted(prefill: ReplicaRuntime, tokens: number, reason: string): void {
    this.refusedAfterPrefillCalls++;
    this.wastedTokens += tokens;
    this.ctx.emit("wastedPrefill", { replica: prefill.id, tokens, reason });
  }
}

/** Reads a call to its end and returns its result (the prefill leg's output is one token nobody sees). */
async function drain(stream: EngineStream): Promise<EngineResult> {
  for await (const _ of stream) {
    // The prefill's single token is discarded; the decode leg generates the answer.
  }
  return await stream.result;
}
