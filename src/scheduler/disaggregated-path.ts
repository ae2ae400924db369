/**
 * @module The request path of a disaggregated fleet (prefill and decode
 * replicas), after the call was routed to its prefill replica: both budgets
 * and the deadline are checked before the prefill starts, then the two calls
 * of vLLM's disaggregated serving run — a prefill with `max_tokens` 1 and
 * `kv_transfer_params.do_remote_decode`, whose answer's `kv_transfer_params`
 * the decode call carries (vllm-project/vllm,
 * tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) — each through
 * its own replica's gate. A prefill replica that pairs the two calls instead
 * (SGLang's PD mode, `Engine.pairedKvTransfer`) has both run at once.
 */

import { followAbort } from "../abort.js";
import { checkDeadline } from "../budget/feasibility.js";
import { type Reservation, reservationTokens } from "../budget/token-budget.js";
import type { Clock } from "../clock.js";
import { type DecodeCheck, LANE_DEFAULTS, type SchedulerConfig } from "../config/scheduler-config.js";
import type { EngineResult, EngineSignals, EngineStream } from "../engine.js";
import { EngineError, Refusal } from "../errors.js";
import type { Permit } from "../gate/backend-gate.js";
import {
  chooseDecode,
  type DecodeCandidate,
  type DecodeDemand,
  transferMs,
} from "../routing/decode-placement.js";
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
  /** Prompt tokens the router predicts in the prefill replica's GPU memory (not loaded from its host tier). */
  gpuCached: number;
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
  /** step 7 of docs/how-it-works.md#the-request-path on one replica (queues, rejections, busy marks). */
  passGate(req: CallRequest, replica: ReplicaRuntime, lane: Lane, uncached: number): Promise<Permit | null>;
  /** The holdings of an admitted call: what its end gives back (permit, reservation, session step …). */
  holdings(held: HeldCall): CallHoldings;
  /** Records the prompt's blocks as held by `replica` (the prefix index), after a prefill. */
  recordPrefix(replica: ReplicaRuntime, hashes: readonly string[]): void;
  /**
   * The budget step on one replica: 413 `context_limit` when the call could never fit, else its
   * reservation, waited for in the replica's budget queue when it does not fit now.
   */
  waitForBudget(
    req: CallRequest,
    replica: ReplicaRuntime,
    lane: Lane,
    tokens: number,
    callTokens: number,
  ): Promise<Reservation | null>;
  /** An admitted call's time queued at the gates, ms: the overload stages' signal. */
  recordGateWait(lane: Lane, queueMs: number): void;
  emit<K extends keyof SchedulerEvents>(name: K, event: Parameters<NonNullable<SchedulerEvents[K]>>[0]): void;
}

/** What an admitted call took on one replica, from which the scheduler builds its {@link CallHoldings}. */
export interface HeldCall {
  replica: ReplicaRuntime;
  lane: Lane;
  session: SessionRecord | undefined;
  tokens: readonly number[];
  hashes: string[];
  permit: Permit | null;
  reservation: Reservation | null;
  uncached: number;
  /** The KV tokens the call took anew on its replica (`ReplicaRuntime.callStarted`). */
  newKvTokens: number;
  admittedAt: number;
  unlinkSignal: () => void;
  /** The API key's tenant of the call, when it has one. */
  tenant?: string;
  /**
   * The replica's thrash-evidence epoch when the call was sent to it (`ThrashEvidence.sent`);
   * absent for a decode leg, which its replica's evidence never saw sent: its end is no evidence.
   */
  thrashEpoch?: number;
}

/**
 * The calls a decode replica has been promised, by where each call's KV is,
 * and how much of them the replica's last measured KV usage can show.
 */
class DecodeLedger {
  readonly coming = new Set<DecodeHold>();
  readonly decoding = new Set<DecodeHold>();
  /** KV of the decoding calls the last reading of the replica's signals could show, tokens. */
  shownTokens = 0;
  private readAt = Number.NEGATIVE_INFINITY;

  /**
   * On a new reading: which decoding calls it shows. A call shows once its KV
   * had time to cross the link before the reading, and is not one of the calls
   * the engine reported waiting (the latest started: still without KV blocks).
   * Output the engine generated before the reading but its stream had not
   * delivered yet reads as KV admission does not know of, until the next
   * reading: an error toward too little room.
   */
  sync(signals: EngineSignals): void {
    if (signals.readAtMs === this.readAt) return;
    this.readAt = signals.readAtMs;
    const rate = signals.kvTransferTokensPerSecond ?? 0;
    const arrived = [...this.decoding]
      .filter((hold) => hold.startedAt + transferMs(hold.tokens - hold.maxTokens, rate) <= signals.readAtMs)
      .sort((a, b) => a.startedAt - b.startedAt);
    const shown = arrived.slice(0, Math.max(0, arrived.length - signals.waiting));
    this.shownTokens = 0;
    for (const hold of shown) this.shownTokens += hold.tokens - hold.maxTokens + hold.generated;
  }
}

/** A call waiting before its prefill for decode room. */
interface DecodeWaiter {
  lane: Lane;
  /** The demand, recomputed at each look (its prefill's predicted end moves as the prefill queue does). */
  demand: () => DecodeDemand;
  check: DecodeCheck;
  resolve(placed: PlacedDecode): void;
  /** Stops its timer and signal listener. */
  settle(): void;
}

/** Where a call will decode: its hold (taken before prefill by the predicted check) and when its KV arrives. */
interface PlacedDecode {
  replica: ReplicaRuntime;
  hold: DecodeHold | undefined;
  arrivalInMs: number;
}

/** How often waiting calls look again for decode room between decode completions, ms (predicted room grows with time). */
const DECODE_WAIT_RECHECK_MS = 250;

/** Decode-side holds of one call, given back once. */
interface DecodeHold {
  replica: ReplicaRuntime;
  /** The call's KV on decode at most (input + max_tokens), its max_tokens, and the output it generated so far, tokens. */
  tokens: number;
  maxTokens: number;
  generated: number;
  /** When its decode leg started (clock ms). */
  startedAt: number;
  reservation: Reservation | null;
  /** Its place at the decode replica's gate; the admitted call owns it once the decode leg started. */
  permit: Permit | null;
  counted: "coming" | "decoding" | null;
}

/**
 * The path itself. Mechanics only: which decode replica has room is
 * `chooseDecode`'s decision (`routing/decode-placement.ts`).
 */
export class DisaggregatedPath {
  readonly decodeCheck: DecodeCheck;
  private readonly ledgers = new Map<string, DecodeLedger>();
  private readonly waiters: DecodeWaiter[] = [];
  private cancelWake: (() => void) | undefined;
  private refusedAfterPrefillCalls = 0;
  private wastedTokens = 0;

  constructor(private readonly ctx: DisaggregatedContext) {
    this.decodeCheck = ctx.config.disaggregation.decodeCheck;
    for (const replica of ctx.decodeReplicas) this.ledgers.set(replica.id, new DecodeLedger());
  }

  /** For the admin state. */
  summary(): { decodeCheck: DecodeCheck; refusedAfterPrefill: number; wastedPrefillTokens: number } {
    return {
      decodeCheck: this.decodeCheck,
      refusedAfterPrefill: this.refusedAfterPrefillCalls,
      wastedPrefillTokens: this.wastedTokens,
    };
  }

  /** Calls counted on decode replicas (coming or decoding) or waiting for decode room: zero once idle. */
  outstanding(): number {
    let n = this.waiters.length;
    for (const ledger of this.ledgers.values()) n += ledger.coming.size + ledger.decoding.size;
    return n;
  }

  /**
   * steps 6–8 of docs/how-it-works.md#the-request-path for a routed call. The prefill side's reservation and
   * permit are put in `holds` as they are taken, so the caller's release on
   * failure covers them; the decode side's are this method's to give back.
   */
  async admit(
    call: RoutedCall,
    holds: { reservation: Reservation | null; permit: Permit | null; inflight: number },
  ): Promise<AdmittedCall> {
    const { req, prefill, uncached, lane } = call;
    const demand = (): DecodeDemand => ({
      tokens: call.tokens.length + call.maxTokens,
      maxTokens: call.maxTokens,
      transferTokens: Math.max(0, call.tokens.length - 1),
      prefillDoneInMs: predictTtftMs({
        uncachedPrefillTokens: uncached,
        queuedPrefillTokens: prefill.queuedPrefillAheadOf(lane),
        inflightPrefillTokens: prefill.inflightPrefillTokens,
        prefillTokensPerSecond: prefill.prefillRate.rate(),
        kvUsage: prefill.signals.kvUsage,
      }),
    });
    let decode: DecodeHold | undefined;
    let arrivalInMs = demand().prefillDoneInMs;
    if (this.decodeCheck !== "none") {
      const placed = await this.awaitDecode(demand, this.decodeCheck, lane, req.signal);
      decode = placed.hold;
      arrivalInMs = placed.arrivalInMs;
    }
    try {
      // The prefill side's budget: its uncached prompt and the one token it generates.
      holds.reservation = await this.ctx.waitForBudget(
        req,
        prefill,
        lane,
        reservationTokens(call.tokens.length, call.gpuCached, 1),
        call.tokens.length + 1,
      );
      this.checkDeadline(req, lane, arrivalInMs, prefill);
      // The predicted check's decode admission is whole before the prefill: with its room it takes its place at the
      // decode replica's gate (queueing there if it must), so nothing on the decode side can refuse the call later.
      if (decode) decode.permit = await this.ctx.passGate(req, decode.replica, lane, 0);
      holds.permit = await this.ctx.passGate(req, prefill, lane, uncached);
      // Queued at both gates, the call waited as long as the two queues together.
      this.ctx.recordGateWait(lane, (decode?.permit?.queueMs ?? 0) + (holds.permit?.queueMs ?? 0));
      const prefillAdmittedAt = this.ctx.clock.now();
      this.ctx.emit("admitted", {
        lane,
        replica: prefill.id,
        queueWaitMs: prefillAdmittedAt - call.startedAt,
      });
      const pairing = prefill.engine.pairedKvTransfer?.();
      if (pairing) {
        // SGLang's flow starts the decode call with the prefill: without a hold taken before the prefill, the call
        // is admitted on current decode load now, before any prefill work, so a refusal here wastes nothing.
        const arrivedAt = this.ctx.clock.now();
        decode ??= await this.admitOnArrival(call, demand());
        const waitedMs = this.ctx.clock.now() - arrivedAt;
        return await this.runPaired(call, holds, decode, pairing, prefillAdmittedAt, waitedMs);
      }
      const result = await this.runPrefill(call, holds);
      holds.permit?.release();
      holds.permit = null;
      holds.reservation?.release();
      holds.reservation = null;
      try {
        const handover = this.handover(prefill, result);
        const arrivedAt = this.ctx.clock.now();
        decode ??= await this.admitOnArrival(call, demand());
        const waitedOnArrivalMs = this.ctx.clock.now() - arrivedAt;
        return await this.runDecode(call, decode, handover, prefillAdmittedAt, waitedOnArrivalMs);
      } catch (error) {
        // A cancel is the client's; anything else that ends the call here threw its prefill away.
        if (error instanceof Refusal) this.wasted(prefill, uncached, error.reason);
        throw error;
      }
    } catch (error) {
      if (decode) this.releaseDecode(decode);
      throw error;
    }
  }

  /**
   * SGLang's flow: the prefill and the decode call run at once, both carrying
   * the pairing (the prefill server waits for the decode server to join it).
   * A failure of either stops the other. The call is admitted once its decode
   * call answered and its prefill ended, so a failed prefill is still a
   * refusal before the first byte.
   */
  private async runPaired(
    call: RoutedCall,
    holds: { reservation: Reservation | null; permit: Permit | null; inflight: number },
    decode: DecodeHold,
    pairing: Readonly<Record<string, unknown>>,
    admittedAt: number,
    waitedForDecodeMs: number,
  ): Promise<AdmittedCall> {
    const stopPrefill = new AbortController();
    const stopDecode = new AbortController();
    let prefillFailure: unknown;
    let prefilled = false;
    const prefillLeg = this.runPrefill(call, holds, { pairing, signal: stopPrefill.signal }).then(
      () => {
        prefilled = true;
        holds.permit?.release();
        holds.permit = null;
        holds.reservation?.release();
        holds.reservation = null;
      },
      (error: unknown) => {
        if (!stopPrefill.signal.aborted) prefillFailure = error;
        stopDecode.abort(error);
        throw error;
      },
    );
    // Observed by the decode leg once it answered; a decode leg that fails first does not wait for it.
    prefillLeg.catch(() => undefined);
    try {
      return await this.runDecode(call, decode, pairing, admittedAt, waitedForDecodeMs, {
        signal: stopDecode.signal,
        prefillLeg,
      });
    } catch (error) {
      stopPrefill.abort(error);
      await prefillLeg.catch(() => undefined);
      if (prefillFailure !== undefined) throw prefillFailure;
      if (prefilled && error instanceof Refusal) this.wasted(call.prefill, call.uncached, error.reason);
      throw error;
    }
  }

  /**
   * `current` and `none`: nothing was held before the prefill, so the call is
   * checked on current decode load and passes the decode replica's gate now
   * that its prefill is done; a refusal here has wasted the prefill. These
   * two checks exist to measure that difference. (SGLang's flow starts both
   * legs together, so there it runs before either and wastes nothing.)
   */
  private async admitOnArrival(call: RoutedCall, demand: DecodeDemand): Promise<DecodeHold> {
    const here = { ...demand, prefillDoneInMs: 0 };
    const placed = this.place(here, "current");
    if (!placed) throw this.refusal(here, "current", call.lane);
    const hold = this.holdDecode(placed.replica, demand.tokens, demand.maxTokens, undefined)!;
    try {
      hold.permit = await this.ctx.passGate(call.req, hold.replica, call.lane, 0);
      return hold;
    } catch (error) {
      this.releaseDecode(hold);
      throw error;
    }
  }

  /**
   * Waits, before the prefill, until a decode replica has room for the call
   * (by `check`), in arrival order; refuses 429 `decode_budget_exhausted` when
   * the wait queue is full or the lane's residence limit passes first.
   */
  private awaitDecode(
    demand: () => DecodeDemand,
    check: DecodeCheck,
    lane: Lane,
    signal: AbortSignal | undefined,
  ): Promise<PlacedDecode> {
    signal?.throwIfAborted();
    // A call that fits goes at once, even past waiting ones: a large call at the head must not hold back
    // small ones that fit (it waits for room at most its lane's residence time).
    const placed = this.place(demand(), check);
    if (placed) return Promise.resolve(placed);
    if (this.waiters.length >= this.waitLimit()) return Promise.reject(this.refusal(demand(), check, lane));
    const maxWaitMs = this.ctx.config.lanes[lane].maxResidenceMs ?? LANE_DEFAULTS[lane].maxResidenceMs;
    return new Promise<PlacedDecode>((resolve, reject) => {
      const leave = () => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        waiter.settle();
      };
      const onAbort = () => {
        leave();
        reject(signal!.reason);
      };
      const cancelTimer = this.ctx.clock.setTimeout(() => {
        leave();
        reject(this.refusal(demand(), check, lane, maxWaitMs));
      }, maxWaitMs);
      const waiter: DecodeWaiter = {
        lane,
        demand,
        check,
        resolve,
        settle: () => {
          cancelTimer();
          signal?.removeEventListener("abort", onAbort);
        },
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
      this.armWake();
    });
  }

  /** Calls that may wait for decode room: the decode replicas' gate queue limits together (0: none waits). */
  private waitLimit(): number {
    let limit = 0;
    for (const replica of this.ctx.decodeReplicas) {
      const gate = replica.gate;
      if (gate) limit += gate.limits().requestQueueLimit * Math.max(1, gate.snapshot().ranks.length);
    }
    return limit;
  }

  /** Lets in every waiting call that finds room: interactive ones first, then bulk, oldest first in each lane. */
  private wake(): void {
    for (const lane of ["interactive", "bulk"] as const) {
      for (const waiter of this.waiters.filter((w) => w.lane === lane)) {
        const placed = this.place(waiter.demand(), waiter.check);
        if (!placed) continue;
        this.waiters.splice(this.waiters.indexOf(waiter), 1);
        waiter.settle();
        waiter.resolve(placed);
      }
    }
    if (this.waiters.length > 0) this.armWake();
  }

  private armWake(): void {
    if (this.cancelWake) return;
    this.cancelWake = this.ctx.clock.setTimeout(() => {
      this.cancelWake = undefined;
      this.wake();
    }, DECODE_WAIT_RECHECK_MS);
  }

  /**
   * The decode replica with room for the call (by `check`); for the predicted
   * check its hold is taken at once. Undefined when none has room.
   */
  private place(demand: DecodeDemand, check: DecodeCheck): PlacedDecode | undefined {
    const now = this.ctx.clock.now();
    const candidates = this.ctx.decodeReplicas.map((replica) => this.candidate(replica, now));
    const choice = chooseDecode(candidates, demand, check);
    if (choice.replica === undefined) return undefined;
    const replica = this.ctx.decodeReplicas.find((r) => r.id === choice.replica)!;
    const arrivalInMs = choice.room.arrivalInMs;
    // The current check holds nothing before the prefill: the call is checked again when it arrives.
    if (check !== "predicted") return { replica, hold: undefined, arrivalInMs };
    const hold = this.holdDecode(replica, demand.tokens, demand.maxTokens, choice.room.tokens);
    return hold ? { replica, hold, arrivalInMs } : undefined;
  }

  /** 429 `decode_budget_exhausted`, with the time the best decode replica needs to free the shortfall. */
  private refusal(demand: DecodeDemand, check: DecodeCheck, lane: Lane, waitedMs?: number): Refusal {
    const now = this.ctx.clock.now();
    const candidates = this.ctx.decodeReplicas.map((replica) => this.candidate(replica, now));
    const choice = chooseDecode(candidates, demand, check);
    const room = choice.replica === undefined ? choice.best : choice.room;
    const bestId = choice.replica ?? choice.bestId;
    const best = this.ctx.decodeReplicas.find((r) => r.id === bestId);
    const short = room ? Math.max(0, demand.tokens - room.tokens) : demand.tokens;
    let retryAfterSeconds = 1;
    if (best) {
      // The decoding calls that must finish to free the shortfall, at their mean reservation, drained at the measured rate.
      const ledger = this.ledgers.get(best.id)!;
      let decodingTokens = 0;
      for (const hold of ledger.decoding) decodingTokens += hold.tokens;
      const mean = ledger.decoding.size > 0 ? decodingTokens / ledger.decoding.size : demand.tokens;
      const calls = Math.max(
        room && room.slots < 1 ? 1 - room.slots : 1,
        Math.ceil(short / Math.max(1, mean)),
      );
      retryAfterSeconds = best.drainSeconds(calls - 1);
    }
    const what = room
      ? `the most room predicted is ${Math.max(0, Math.floor(room.tokens))} tokens and ${Math.max(0, room.slots)} batch slot(s) on ${bestId}`
      : "no decode replica is healthy";
    const waited = waitedMs === undefined ? "" : ` after waiting ${waitedMs} ms`;
    return new Refusal(
      "decode_budget_exhausted",
      `the call needs ${demand.tokens} tokens of decode KV (input + max_tokens) and a batch slot when its KV arrives; ${what}${waited}`,
      { lane, scope: "fleet", retryAfterSeconds },
    );
  }

  private candidate(replica: ReplicaRuntime, now: number): DecodeCandidate {
    const signals = replica.signals;
    const ledger = this.ledgers.get(replica.id)!;
    ledger.sync(signals);
    const budget = replica.budget;
    const capacity = budget?.ceiling ?? signals.kvCapacityTokens;
    const ranks = Math.max(1, signals.dataParallelSize);
    const perRank =
      signals.maxNumSeqs > 0 ? signals.maxNumSeqs : (replica.gate?.limits().engineRequestLimit ?? 1);
    return {
      id: replica.id,
      eligible: replica.healthy(),
      busy: replica.busy(now),
      capacityTokens: capacity,
      usableTokens: budget ? budget.maxReservable : capacity,
      batchSlots: perRank * ranks,
      kvUsage: signals.kvUsage,
      running: signals.running,
      shownTokens: ledger.shownTokens,
      coming: [...ledger.coming].map((hold) => ({
        promptTokens: hold.tokens - hold.maxTokens,
        maxTokens: hold.maxTokens,
      })),
      decoding: [...ledger.decoding].map((hold) => ({
        kvTokens: hold.tokens - hold.maxTokens + hold.generated,
        remainingTokens: Math.max(0, hold.maxTokens - hold.generated),
      })),
      transferTokensPerSecond: signals.kvTransferTokensPerSecond ?? 0,
    };
  }

  /**
   * Counts the call as coming to `replica`. The predicted check also takes
   * its reservation in the replica's token budget, up to the room it
   * predicted (`roomTokens`); undefined when the budget cannot give it.
   */
  private holdDecode(
    replica: ReplicaRuntime,
    tokens: number,
    maxTokens: number,
    roomTokens: number | undefined,
  ): DecodeHold | undefined {
    let reservation: Reservation | null = null;
    const budget = replica.budget;
    if (budget && roomTokens !== undefined) {
      // The budget counts every reservation as held now; what the prediction frees before the KV arrives is credit.
      reservation = budget.tryReserve(tokens, {
        queued: true,
        creditTokens: Math.max(0, Math.floor(roomTokens) - budget.available()),
      });
      if (!reservation) return undefined;
    }
    const hold: DecodeHold = {
      replica,
      tokens,
      maxTokens,
      generated: 0,
      startedAt: Number.NaN,
      reservation,
      permit: null,
      counted: "coming",
    };
    this.ledgers.get(replica.id)!.coming.add(hold);
    return hold;
  }

  /** The call's KV arrived on its decode replica: it decodes there now. */
  private startDecoding(hold: DecodeHold): void {
    const ledger = this.ledgers.get(hold.replica.id)!;
    ledger.coming.delete(hold);
    ledger.decoding.add(hold);
    hold.startedAt = this.ctx.clock.now();
    hold.counted = "decoding";
  }

  /** Output the decode leg generated: its KV grew by as much, and it has that much less to grow. */
  private grew(hold: DecodeHold, tokens: number): void {
    if (hold.counted !== "decoding") return;
    // A reading taken before this output shows only what the call had then.
    this.ledgers.get(hold.replica.id)!.sync(hold.replica.signals);
    hold.generated += tokens;
  }

  /** Gives a call's decode hold back; room freed there may let a waiting call in. */
  private releaseDecode(hold: DecodeHold): void {
    hold.permit?.release();
    hold.permit = null;
    hold.reservation?.release();
    hold.reservation = null;
    const ledger = this.ledgers.get(hold.replica.id)!;
    if (hold.counted === "coming") {
      ledger.coming.delete(hold);
    } else if (hold.counted === "decoding") {
      // A reading taken before the call ended still shows its KV: what it showed of it stays counted as shown.
      ledger.sync(hold.replica.signals);
      ledger.decoding.delete(hold);
    }
    hold.counted = null;
    if (this.waiters.length > 0) this.wake();
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

  /**
   * The prefill leg: one token, the KV kept for the decode side; resolves with
   * the engine's answer. Beside a paired decode leg it carries the pairing and
   * stops when `paired.signal` aborts.
   */
  private async runPrefill(
    call: RoutedCall,
    holds: { reservation: Reservation | null; inflight: number },
    paired?: { pairing: Readonly<Record<string, unknown>>; signal: AbortSignal },
  ): Promise<EngineResult> {
    const { req, prefill, uncached } = call;
    holds.reservation?.activate();
    prefill.startPrefill(uncached);
    holds.inflight = uncached;
    const startedAt = this.ctx.clock.now();
    const abort = new AbortController();
    const unlink = followAbort(req.signal, abort);
    const unlinkPaired = followAbort(paired?.signal, abort);
    let result: EngineResult;
    const newKvTokens = reservationTokens(call.tokens.length, call.gpuCached, 0);
    prefill.callStarted(newKvTokens);
    // Counted as sent, as on a replica that runs both phases: the prefill replica is where the
    // session's window and prefix are, so what its cache delivers is the window's evidence.
    const sentEpoch = prefill.thrashEvidenceSent(call.tokens.length, uncached, call.hashes.length > 0);
    try {
      const stream = await prefill.generate({
        requestId: req.requestId,
        model: call.model,
        promptTokens: call.tokens,
        maxTokens: 1,
        endpoint: req.endpoint,
        ...(req.body ? { body: req.body } : {}),
        stream: false,
        signal: abort.signal,
        kvTransferParams: paired?.pairing ?? PREFILL_TRANSFER_REQUEST,
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
      unlinkPaired();
      prefill.endPrefill(holds.inflight);
      holds.inflight = 0;
      prefill.callEnded(newKvTokens);
      prefill.recordCompletion();
    }
    if (req.signal?.aborted) throw req.signal.reason;
    const elapsed = this.ctx.clock.now() - startedAt;
    if (uncached > 0 && elapsed > 0) prefill.prefillRate.observe(uncached, elapsed);
    if (sentEpoch !== undefined) {
      prefill.settleThrashEvidence(
        call.session,
        call.tokens.length - uncached,
        result.cachedTokens,
        sentEpoch,
      );
    }
    this.ctx.recordPrefix(prefill, call.hashes);
    return result;
  }

  /** The hand-over parameters of a finished prefill; an engine without a KV connector answers none. */
  private handover(prefill: ReplicaRuntime, result: EngineResult): Readonly<Record<string, unknown>> {
    if (result.kvTransferParams) return result.kvTransferParams;
    throw new Refusal(
      "unavailable",
      `prefill replica ${prefill.id} handed no KV over (no kv_transfer_params in its answer: is it started with a KV connector?)`,
      { retryAfterSeconds: 1, scope: "worker" },
    );
  }

  /**
   * The decode leg, on the place at the decode replica's gate the hold already
   * has: nothing here can refuse the call, only the engine can fail. From the
   * leg's start the admitted call owns every hold. Beside a paired prefill leg,
   * it stops when `paired.signal` aborts and is admitted only once the prefill
   * leg ended.
   */
  private async runDecode(
    call: RoutedCall,
    hold: DecodeHold,
    handover: Readonly<Record<string, unknown>>,
    admittedAt: number,
    waitedOnArrivalMs: number,
    paired?: { signal: AbortSignal; prefillLeg: Promise<void> },
  ): Promise<AdmittedCall> {
    const { req, lane } = call;
    const replica = hold.replica;
    const permit = hold.permit;
    const abort = new AbortController();
    const unlinkSignal = followAbort(req.signal, abort);
    const unlinkPaired = followAbort(paired?.signal, abort);
    let stream: EngineStream;
    try {
      req.signal?.throwIfAborted();
      hold.reservation?.activate();
      stream = await replica.generate({
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
      await paired?.prefillLeg;
    } catch (error) {
      // Stops a decode call that answered beside a prefill leg that failed.
      abort.abort(error);
      unlinkSignal();
      unlinkPaired();
      throw error;
    }
    unlinkPaired();
    // The prompt's KV was handed over: all of it is new on the decode replica.
    const newKvTokens = call.tokens.length;
    replica.callStarted(newKvTokens);
    this.startDecoding(hold);
    const held = this.ctx.holdings({
      replica,
      lane,
      session: call.session,
      tokens: call.tokens,
      hashes: call.hashes,
      permit,
      reservation: hold.reservation,
      uncached: 0,
      newKvTokens,
      admittedAt,
      unlinkSignal,
    });
    // From here the admitted call gives back the permit and the reservation; the count is this path's.
    hold.permit = null;
    hold.reservation = null;
    const holdings: CallHoldings = {
      firstToken: () => held.firstToken(),
      generated: (tokens) => this.grew(hold, tokens),
      finish: (outcome, result, outputTokens) => {
        held.finish(outcome, result, outputTokens);
        this.releaseDecode(hold);
      },
    };
    return new AdmittedCallImpl({
      requestId: req.requestId,
      lane,
      replica: replica.id,
      queueMs: admittedAt - call.startedAt + waitedOnArrivalMs,
      inputTokens: call.tokens.length,
      maxTokens: call.maxTokens,
      sessionId: call.session?.id,
      stream,
      abort,
      holdings,
    });
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
