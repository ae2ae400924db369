/** @module The `Engine` port: what the scheduler needs from a replica, real or simulated. */

/**
 * The OpenAI API a call speaks: chat completions, legacy completions, or the
 * Responses API (`POST /v1/responses`), whose engine keeps each response's state
 * for a later call's `previous_response_id`.
 */
export type CallEndpoint = "chat" | "completions" | "responses";

/** One call handed to an engine after admission. */
export interface EngineCall {
  requestId: string;
  model: string;
  /** Prompt token ids, as sluice's tokenizer counted them (the simulator runs on these). */
  promptTokens: readonly number[];
  /** Upper bound on generated tokens. */
  maxTokens: number;
  /** Data-parallel rank the call is bound to, when the engine has several. */
  rank?: number;
  /** A `responses` call must be answered with `raw` bytes in the Responses API's own format (events, or one JSON body). */
  endpoint: CallEndpoint;
  /** The client's OpenAI request body; HTTP engines forward it, the simulator ignores it. */
  body?: Readonly<Record<string, unknown>>;
  /** Whether the client asked for a stream (HTTP engines forward raw SSE events then). */
  stream: boolean;
  /** Aborting it cancels the call at the engine, before or after its first byte. */
  signal: AbortSignal;
  /**
   * Disaggregated serving. vLLM's KV connector flow: on a prefill call,
   * `{ do_remote_decode: true, … }` asks the engine to keep the prompt's KV for
   * a decode replica to pull; on the decode call, the parameters the prefill
   * answered with, so the engine loads that KV instead of computing it.
   * SGLang's PD mode: on both calls, the pairing its prefill engine gave
   * ({@link Engine.pairedKvTransfer}).
   */
  kvTransferParams?: Readonly<Record<string, unknown>>;
}

/** A piece of generated output. */
export interface EngineChunk {
  /** Generated token ids in this chunk (empty when an HTTP engine does not expose them). */
  tokens: readonly number[];
  /** Number of generated tokens this chunk carries (≥ tokens.length). */
  tokenCount: number;
  /** Generated text in this chunk. */
  text: string;
  /**
   * Tool calls generated in this chunk, as pieces of `name␁arguments` joined by `␂` (no ids):
   * what the client will send back in its next prompt's assistant message. Optional.
   */
  toolCalls?: string;
  /**
   * The engine's own bytes, forwarded untouched: SSE events of a streaming call, or the whole
   * JSON body of a non-streaming Responses API call.
   */
  raw?: Uint8Array;
  /** Responses API: the id of the response this call produces, on the first chunk that names it. */
  responseId?: string;
}

export type FinishReason = "stop" | "length" | "abort" | "error";

/** What an engine reports at the end of a call. */
export interface EngineResult {
  promptTokens: number;
  completionTokens: number;
  /** Prompt tokens served from the prefix cache. */
  cachedTokens: number;
  finishReason: FinishReason;
  /** All generated token ids, when known (fed into the router's prefix index). */
  outputTokens?: readonly number[];
  /** What a prefill call answered in `kv_transfer_params`: the decode call sends it back (disaggregated serving). */
  kvTransferParams?: Record<string, unknown>;
  /** Responses API: the id of the response the engine produced and holds the state of. */
  responseId?: string;
}

/**
 * A running call. Iterate it for chunks; iteration throws `EngineError` when
 * the engine fails mid-stream. `return()` on the iterator (a `break`) cancels it.
 */
export interface EngineStream extends AsyncIterable<EngineChunk> {
  /** Settles at the first generated token or at completion, whichever comes first. */
  readonly firstToken: Promise<void>;
  /** Settles when the call ends; rejects with `EngineError` on failure. Never unhandled. */
  readonly result: Promise<EngineResult>;
}

/** What a replica says about itself; counters are cumulative since the engine started. */
export interface EngineSignals {
  /** Clock time (ms) when these signals were read; `-Infinity` when never read. */
  readAtMs: number;
  /** False after a failed scrape or a lost connection. */
  healthy: boolean;
  /** KV blocks held by running calls over all blocks (0–1), excluding evictable cache. */
  kvUsage: number;
  /** Prompt tokens looked up in the prefix cache (cumulative). */
  prefixQueryTokens: number;
  /** Prompt tokens found in the prefix cache (cumulative). */
  prefixHitTokens: number;
  running: number;
  waiting: number;
  /** Preemptions so far (cumulative). */
  preemptions: number;
  /** KV cache capacity in tokens (blocks × block size), 0 when unknown. */
  kvCapacityTokens: number;
  /** Engine KV block size in tokens, 0 when unknown. */
  blockSize: number;
  /** Engine `max_num_seqs`, 0 when unknown. */
  maxNumSeqs: number;
  /** Data-parallel size, 1 when unknown. */
  dataParallelSize: number;
  /** Prefill throughput the engine states or was calibrated with (tokens/s), when known. */
  prefillTokensPerSecond?: number;
  /** A decode replica's KV transfer rate from prefill replicas (tokens/s), stated or measured, when known. */
  kvTransferTokensPerSecond?: number;
  /**
   * Which engine profile the adapter recognised (`vllm-v1`, `sglang-legacy`, …),
   * when it reads another system's metrics; absent for engines that report themselves.
   */
  profile?: string;
  /**
   * Signals the engine did not publish, by field name (`kvUsage`, `prefixCache`,
   * `kvCapacityTokens`, …): their values above are placeholders, not measurements.
   * A `prefixCache` left unknown is reported as 0 queries, which the hit-rate
   * meter already treats as "not measured".
   */
  unknown?: readonly string[];
  /** Where `kvCapacityTokens` came from: the engine's own statement, derived from other series, an operator's setting, or nowhere. */
  kvCapacitySource?: "engine" | "derived" | "configured" | "unknown";
  /** The prefix-cache hit rate the engine itself states as a gauge (0–1, whatever unit it used), for display only. */
  statedHitRate?: number;
  /**
   * What an operator must know about how this engine is read, in words: set when its metrics
   * cannot be read at all (which signals are unknown, which flags stand in for them).
   */
  warning?: string;
  /*
   * A second KV tier in host memory (vLLM's CPU offloading connector, LMCache,
   * SGLang HiCache): prefixes evicted from GPU memory that load back over
   * PCIe instead of being recomputed. All absent for an engine with one tier
   * or one that does not say; `prefixQueryTokens`/`prefixHitTokens` above
   * count the GPU tier (SGLang's cached tokens include its host hits).
   */
  /** Host-tier capacity, tokens; absent when there is no host tier, 0 when it exists but its size is not stated. */
  hostKvCapacityTokens?: number;
  /** Host-tier blocks held over its capacity (0–1), when stated. */
  hostKvUsage?: number;
  /** Prompt tokens looked up in the host tier (cumulative): each prompt less its GPU hits, as vLLM counts external prefix-cache queries. */
  hostPrefixQueryTokens?: number;
  /** Prompt tokens loaded from the host tier instead of recomputed (cumulative). */
  hostPrefixHitTokens?: number;
  /** Tokens per second one call loads from the host tier (one rank's links), stated or measured, when known. */
  hostLoadTokensPerSecond?: number;
}

/**
 * What a replica does in a disaggregated fleet: `prefill` computes prompts and
 * hands their KV over, `decode` receives it and generates, `both` (every
 * replica of a fleet that is not disaggregated) does the whole call.
 */
export type ReplicaRole = "prefill" | "decode" | "both";

/** A replica: the scheduler forwards admitted calls to it and reads its signals. */
export interface Engine {
  /** Stable replica id, used as the `replica`/`worker` label. */
  readonly id: string;
  /** Its role in a disaggregated fleet; absent means `both`. */
  readonly role?: ReplicaRole;
  /** Model names this replica serves. */
  models(): readonly string[];
  /**
   * A prefill replica whose decode call must start with its prefill call
   * (SGLang's PD mode: the prefill server waits for the decode server to join
   * it) gives, for each call, the parameters both calls carry. Absent or
   * undefined: the decode call carries what the prefill answered (vLLM's flow).
   */
  pairedKvTransfer?(): Readonly<Record<string, unknown>> | undefined;
  /**
   * Starts a call. Resolves once the engine accepted it (an HTTP engine: once
   * the upstream answered 200); rejects with a `Refusal` when the engine refused
   * before any output, or with `EngineError` when it could not be reached.
   */
  generate(call: EngineCall): Promise<EngineStream>;
  /** The latest signals (cheap; adapters refresh them in the background). */
  signals(): EngineSignals;
  /** Context window (max model length) in tokens, when the engine reports it. */
  contextWindow?(model?: string): number | undefined;
  /** Stops background work (scrapes, timers) and cancels running calls. */
  close?(): Promise<void>;
}

/** Signals of an engine that has never reported. */
export function unknownSignals(): EngineSignals {
  return {
    readAtMs: Number.NEGATIVE_INFINITY,
    healthy: false,
    kvUsage: 0,
    prefixQueryTokens: 0,
    prefixHitTokens: 0,
    running: 0,
    waiting: 0,
    preemptions: 0,
    kvCapacityTokens: 0,
    blockSize: 0,
    maxNumSeqs: 0,
    dataParallelSize: 1,
  };
}
