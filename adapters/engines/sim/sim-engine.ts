/** @module `SimEngine`: the simulated vLLM-like replica behind the `Engine` port, in real or virtual time. */

import { type Clock, VirtualClock } from "../../../src/clock.js";
import type { Engine, EngineCall, EngineSignals, EngineStream, ReplicaRole } from "../../../src/engine.js";
import { Refusal } from "../../../src/errors.js";
import type { KvBlockEvent } from "./block-pool.js";
import { CallStream } from "./call-stream.js";
import { mixSeed } from "./hash.js";
import { runInstant } from "./instant.js";
import { KvLink, type KvTransferStats } from "./kv-link.js";
import {
  kvTransferMsPerToken,
  PRESET_MODELS,
  type PresetName,
  type PresetOverrides,
  resolveSimParams,
  type SimParams,
} from "./presets.js";
import { RankSim } from "./rank.js";
import type { SimCallEvent, SimStepEvent } from "./rank-types.js";
import { SimCall } from "./sim-call.js";
import { SimResponses } from "./sim-responses.js";
import { type RankSignals, rankSignals, replicaSignals, replicaStats, type SimStats } from "./sim-signals.js";
import { DEFAULT_VOCABULARY, type VocabularyEntry } from "./vocabulary.js";

/** Options of {@link SimEngine}; any {@link SimParams} field overrides the preset. */
export interface SimEngineOptions extends Partial<SimParams> {
  /** Replica id (the `replica`/`worker` label). */
  id: string;
  /** Time source: `VirtualClock` for benchmarks, `RealClock` for a live server. */
  clock: Clock;
  /** A preset name or overrides on top of one (`base`); default `h100-llama3-8b`. */
  preset?: PresetName | PresetOverrides;
  /** Served model name; default per preset. */
  model?: string;
  /** Seed of the generated tokens; default 0. */
  seed?: number;
  /** Data-parallel ranks, each with its own batch and KV pool; default 1. */
  dataParallelSize?: number;
  /**
   * Role in a disaggregated fleet (default `both`). A `prefill` replica answers
   * a call sent with `kv_transfer_params.do_remote_decode` with the parameters
   * a decode replica pulls its KV by; a `decode` replica given those
   * parameters receives the prompt's KV over its link before it queues the
   * call. Either still serves a plain call whole, as vLLM with a KV connector does.
   */
  role?: ReplicaRole;
  /**
   * Simulate a run of pure-decode steps with one timer when nothing can join
   * the batch before the next completion. Default: on for a `VirtualClock`,
   * off otherwise (in real time every step is its own timer, so chunks
   * stream at each step's time).
   */
  skipDecodeSteps?: boolean;
  /** Tokens generated (id and text); default {@link DEFAULT_VOCABULARY}. */
  vocabulary?: readonly VocabularyEntry[];
  /** Called for every step, or run of decode steps, as it is simulated. Must not throw or call back into the engine. */
  onStep?: (event: SimStepEvent) => void;
  /**
   * Called when a call arrives, is first scheduled, gets its first token, is preempted or finishes.
   * Must not throw or call back into the engine synchronously (defer with a microtask).
   */
  onCall?: (event: SimCallEvent) => void;
  /** Called when a block hash enters or leaves a rank's prefix cache (vLLM's KV events). Must not throw or call back into the engine. */
  onKvEvent?: (rank: number, event: KvBlockEvent) => void;
  /**
   * Called when a block hash enters or leaves a rank's host tier (`medium: "CPU"`, as vLLM's
   * offloading connector reports them). Kept apart from `onKvEvent` so that a consumer of GPU
   * events never mistakes a host block for a GPU one. Must not throw or call back into the engine.
   */
  onHostKvEvent?: (rank: number, event: KvBlockEvent) => void;
}

/**
 * A discrete-event model of a vLLM replica (docs/benchmarks.md and docs/simulator.md): paged KV in
 * blocks, automatic prefix caching with LRU eviction of unreferenced blocks,
 * continuous batching with chunked prefill, preemption by recompute, and the
 * step-time model of the chosen preset. It runs on the injected clock only.
 *
 * Output: each call generates exactly `maxTokens` pseudo-tokens (finish
 * reason `length`), drawn from the vocabulary by a generator seeded with the
 * engine seed and the prompt — the same prompt always yields the same output,
 * as greedy decoding would.
 *
 * Timing: a call's first token arrives at the end of the step that computes
 * its last prompt token; each later token at the end of a decode step. With
 * `skipDecodeSteps`, a run of decode steps is applied at once when it ends
 * (or when an arrival or abort interrupts it): the tokens of the run arrive
 * together in one chunk at the run's end, but first-token and completion
 * times are exact, as is every step boundary, so time per output token is
 * `(completion − firstToken) / (completionTokens − 1)` exactly.
 *
 * The `instant` preset completes every call inside `generate()`.
 */
export class SimEngine implements Engine {
  readonly id: string;
  readonly model: string;
  readonly params: Readonly<SimParams>;
  readonly dataParallelSize: number;
  readonly seed: number;
  readonly clock: Clock;
  readonly role: ReplicaRole;
  /** KV transfers received (a decode replica's). */
  readonly transfers: KvTransferStats;
  private readonly ranks: RankSim[];
  /** The link prompts' KV is pulled over: transfers queue on it. */
  private readonly link: KvLink;
  private readonly vocabulary: readonly VocabularyEntry[];
  private readonly active = new Set<SimCall>();
  /** Responses API state this replica holds (`previous_response_id`). */
  readonly responses: SimResponses;
  private closed = false;

  constructor(options: SimEngineOptions) {
    const {
      id,
      clock,
      preset,
      model,
      seed = 0,
      dataParallelSize = 1,
      role = "both",
      skipDecodeSteps,
      vocabulary = DEFAULT_VOCABULARY,
      onStep,
      onCall,
      onKvEvent,
      onHostKvEvent,
      ...overrides
    } = options;
    if (typeof id !== "string" || id === "")
      throw new RangeError(`id should be a non-empty string, got ${JSON.stringify(id)}`);
    if (!clock || typeof clock.now !== "function" || typeof clock.setTimeout !== "function") {
      throw new TypeError(`clock should be a Clock, got ${String(clock)}`);
    }
    if (!(Number.isInteger(dataParallelSize) && dataParallelSize >= 1 && dataParallelSize <= 1024)) {
      throw new RangeError(`dataParallelSize should be an integer in [1, 1024], got ${dataParallelSize}`);
    }
    if (!Number.isSafeInteger(seed)) throw new RangeError(`seed should be a safe integer, got ${seed}`);
    if (!Array.isArray(vocabulary) || vocabulary.length === 0) {
      throw new RangeError(`vocabulary should be a non-empty array, got ${JSON.stringify(vocabulary)}`);
    }
    if (role !== "prefill" && role !== "decode" && role !== "both") {
      throw new RangeError(`role should be prefill, decode or both, got ${JSON.stringify(role)}`);
    }
    this.role = role;
    this.params = resolveSimParams(preset, overrides);
    const presetName = typeof preset === "string" ? preset : (preset?.base ?? "h100-llama3-8b");
    this.id = id;
    this.model = model ?? PRESET_MODELS[presetName];
    this.responses = new SimResponses(this.model);
    this.dataParallelSize = dataParallelSize;
    this.seed = seed;
    this.clock = clock;
    this.link = new KvLink(clock);
    this.transfers = this.link.stats;
    this.vocabulary = vocabulary;
    const skip = skipDecodeSteps ?? clock instanceof VirtualClock;
    this.ranks = [];
    for (let rank = 0; rank < dataParallelSize; rank++) {
      this.ranks.push(
        new RankSim({
          rank,
          clock,
          params: this.params,
          vocabulary,
          skipDecodeSteps: skip,
          onStep,
          onCall,
          onKvEvent,
          onHostKvEvent,
        }),
      );
    }
  }

  models(): readonly string[] {
    return [this.model];
  }

  /**
   * Starts a call on `call.rank`, or on the least loaded rank (fewest running
   * plus waiting, lowest index on ties) when it has none or an unknown one.
   * Rejects with a `Refusal` (`invalid_request`, or `context_limit` when
   * prompt + maxTokens exceeds `maxModelLen`) before anything is queued.
   * A call whose signal is already aborted resolves to a stream that ended with `abort`.
   */
  generate(call: EngineCall): Promise<EngineStream> {
    try {
      if (call.endpoint === "responses") {
        if (this.closed) throw new Refusal("unavailable", `replica ${this.id} is closed`);
        return Promise.resolve(this.responses.start(call, (running) => this.start(running)));
      }
      return Promise.resolve(this.start(call));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private start(call: EngineCall): EngineStream {
    if (this.closed) throw new Refusal("unavailable", `replica ${this.id} is closed`);
    const promptLen = call.promptTokens?.length ?? 0;
    if (promptLen < 1)
      throw new Refusal("invalid_request", "the prompt must have at least one token", { param: "prompt" });
    if (!(Number.isInteger(call.maxTokens) && call.maxTokens >= 1)) {
      throw new Refusal("invalid_request", `max_tokens must be an integer ≥ 1, got ${call.maxTokens}`, {
        param: "max_tokens",
      });
    }
    const maxLen = this.params.maxModelLen;
    if (promptLen + call.maxTokens > maxLen) {
      throw new Refusal(
        "context_limit",
        `This model's maximum context length is ${maxLen} tokens. However, you requested ${promptLen + call.maxTokens} tokens (${promptLen} in the messages, ${call.maxTokens} in the completion).`,
        { limits: { max_total_tokens: maxLen, max_input_tokens: maxLen - 1 } },
      );
    }
    const rank = this.pickRank(call.rank);
    const ranker = this.ranks[rank]!;
    let sim: SimCall | undefined;
    const stream = new CallStream(() => {
      if (sim) this.abortCall(sim);
    });
    sim = new SimCall(call, rank, stream, {
      blockSize: this.params.blockSize,
      seed: mixSeed(this.seed),
      arrivalMs: this.clock.now(),
    });
    if (call.signal?.aborted) {
      sim.state = "done";
      stream.end(sim.result("abort"));
      return stream;
    }
    const transfer = call.kvTransferParams;
    if (transfer?.do_remote_decode === true && this.role !== "decode") {
      sim.kvTransferOut = this.kvTransferParamsFor(sim);
    }
    const pulls = transfer?.do_remote_prefill === true && this.role !== "prefill";
    if (this.params.instant) {
      runInstant(ranker, sim, this.vocabulary, this.clock.now());
      return stream;
    }
    const created = sim;
    const onAbort = (): void => this.abortCall(created);
    call.signal?.addEventListener("abort", onAbort, { once: true });
    this.active.add(created);
    void stream.result.then(() => {
      call.signal?.removeEventListener("abort", onAbort);
      this.active.delete(created);
    });
    if (pulls && promptLen > 1) this.receive(created, ranker);
    else ranker.submit(created);
    return stream;
  }

  /**
   * The parameters a prefill answers with, shaped as vLLM's NIXL connector
   * returns them from `request_finished` (vllm-project/vllm,
   * vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py): the
   * decode side pulls the blocks from `remote_host:remote_port`.
   */
  private kvTransferParamsFor(sim: SimCall): Record<string, unknown> {
    return {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: this.id,
      remote_request_id: sim.requestId,
      remote_block_ids: Array.from({ length: Math.ceil(sim.promptLen / this.params.blockSize) }, (_, i) => i),
      remote_host: "127.0.0.1",
      remote_port: 5600,
      tp_size: this.params.tensorParallelSize,
    };
  }

  /**
   * A decode call given a prefill's parameters: its prompt's KV (all but the
   * last token, which vLLM's connector leaves for the decode side to compute)
   * crosses this replica's link, one transfer after another at
   * {@link kvTransferMsPerToken}; the call queues once it arrived. Unlike vLLM,
   * which allocates the blocks before it pulls, the blocks are taken when the
   * call is scheduled: a full replica delays the call after its transfer, not before.
   */
  private receive(sim: SimCall, rank: RankSim): void {
    const tokens = sim.promptLen - 1;
    const ms = tokens * kvTransferMsPerToken(this.params);
    this.link.receive(sim, tokens, ms, tokens * this.params.kvBytesPerToken, () => rank.submit(sim));
  }

  /** The rank a call goes to. */
  private pickRank(requested: number | undefined): number {
    if (
      requested !== undefined &&
      Number.isInteger(requested) &&
      requested >= 0 &&
      requested < this.ranks.length
    ) {
      return requested;
    }
    let best = 0;
    for (let r = 1; r < this.ranks.length; r++)
      if (this.ranks[r]!.load() < this.ranks[best]!.load()) best = r;
    return best;
  }

  private abortCall(sim: SimCall): void {
    if (this.link.cancel(sim)) {
      // Still on the link: nothing in the rank to free.
      sim.state = "done";
      sim.stream.end(sim.result("abort"));
      return;
    }
    this.ranks[sim.rank]!.abort(sim);
  }

  /** Signals of the whole replica: KV usage over all ranks' blocks, counts summed. */
  signals(): EngineSignals {
    return replicaSignals(this.ranks, {
      params: this.params,
      role: this.role,
      dataParallelSize: this.dataParallelSize,
      healthy: !this.closed,
      readAtMs: this.clock.now(),
    });
  }

  /** Signals per rank (what vLLM labels with `engine`). */
  rankSignals(): RankSignals[] {
    return rankSignals(this.ranks);
  }

  /** Work counters (steps, busy time, recomputed tokens, …), summed over ranks and per rank. */
  stats(): SimStats {
    return replicaStats(this.ranks);
  }

  /** Blocks per rank. */
  blocksPerRank(): number {
    return this.ranks[0]!.kv.pool.numBlocks;
  }

  /** Host-tier blocks per rank (0 without a host tier). */
  hostBlocksPerRank(): number {
    return this.ranks[0]!.kv.host?.capacity ?? 0;
  }

  /** Whether a block with this chained hash is in `rank`'s host tier (for tests). */
  hasHostBlock(hash: number, rank = 0): boolean {
    return this.ranks[rank]?.kv.host?.has(hash) ?? false;
  }

  /** Whether a block with this chained hash is in `rank`'s prefix cache (for tests). */
  hasCachedBlock(hash: number, rank = 0): boolean {
    return this.ranks[rank]?.kv.pool.has(hash) ?? false;
  }

  /** The KV pool of one rank (read-only use: tests and diagnostics). */
  poolOf(rank = 0): RankSim["kv"]["pool"] {
    const r = this.ranks[rank];
    if (!r) throw new RangeError(`rank should be in [0, ${this.ranks.length - 1}], got ${rank}`);
    return r.kv.pool;
  }

  /** Aborts every call and stops all timers. Later `generate` calls are refused (`unavailable`). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const sim of this.link.calls()) this.abortCall(sim);
    for (const rank of this.ranks) rank.close();
    this.active.clear();
  }
}
