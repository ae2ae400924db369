/** @module One call inside a simulated rank: its tokens, KV blocks, progress and output stream. */

import type { EngineCall, EngineResult, FinishReason } from "../../../src/engine.js";
import type { CallStream } from "./call-stream.js";
import { hashTokens, xorshift32 } from "./hash.js";
import type { VocabularyEntry } from "./vocabulary.js";

/** Where a call is in its rank. */
export type SimCallState = "waiting" | "running" | "done";

/**
 * The engine-side state of one call. Tokens are the prompt (the caller's
 * array, not copied) followed by the generated ids; KV progress is
 * `numComputed` (tokens whose KV is in the cache). Block hashes are kept for
 * every full block of known tokens and extended one block at a time as
 * output grows, so nothing is ever re-hashed.
 */
export class SimCall {
  readonly requestId: string;
  readonly prompt: readonly number[];
  readonly promptLen: number;
  readonly maxTokens: number;
  readonly arrivalMs: number;
  readonly output: number[] = [];
  /** Chained hashes of the full blocks of known tokens. */
  readonly hashes: number[];
  state: SimCallState = "waiting";
  /** Tokens whose KV is computed (prefix hits included). */
  numComputed = 0;
  /** Most tokens ever computed: what lies below it after a preemption is recomputed work. */
  highWater = 0;
  /** KV blocks held, in token order. */
  blocks: number[] = [];
  /** Leading blocks already offered to the prefix cache. */
  registered = 0;
  /** Prompt tokens served from the prefix cache at first scheduling (GPU and host tiers). */
  cachedTokens = 0;
  /** Of those, tokens loaded from the host tier. */
  hostCachedTokens = 0;
  /**
   * Prompt tokens whose KV a prefill replica computed and sent here
   * (disaggregated decode): at first scheduling they count as computed. A
   * preempted call recomputes them, as vLLM does once the pulled blocks are freed.
   */
  remoteTokens = 0;
  /** What a prefill answers in `kv_transfer_params` when it ends as asked (one token, `length`). */
  kvTransferOut: Record<string, unknown> | undefined;
  scheduledOnce = false;
  preemptions = 0;
  firstTokenMs: number | undefined;
  /** xorshift32 state of the output generator. */
  private rng: number;
  private readonly blockSize: number;
  private readonly scratch: number[];

  constructor(
    readonly call: EngineCall,
    readonly rank: number,
    readonly stream: CallStream,
    init: { blockSize: number; seed: number; arrivalMs: number },
  ) {
    this.requestId = call.requestId;
    this.prompt = call.promptTokens;
    this.promptLen = call.promptTokens.length;
    this.maxTokens = call.maxTokens;
    this.arrivalMs = init.arrivalMs;
    this.blockSize = init.blockSize;
    this.scratch = new Array<number>(init.blockSize).fill(0);
    const full = Math.floor(this.promptLen / this.blockSize);
    this.hashes = new Array<number>(full);
    let parent = 0;
    for (let i = 0; i < full; i++) {
      parent = hashTokens(parent, this.prompt, i * this.blockSize, (i + 1) * this.blockSize);
      this.hashes[i] = parent;
    }
    // Greedy decoding: the same prompt (and seed) always yields the same output.
    const promptHash = hashTokens(parent, this.prompt, full * this.blockSize, this.promptLen);
    this.rng = (promptHash ^ init.seed) >>> 0 || 0x9e3779b9;
  }

  /** Prompt plus generated tokens. */
  get numTokens(): number {
    return this.promptLen + this.output.length;
  }

  /** Whether this call's next computation is a decode (one token on top of its own output). */
  isDecoding(): boolean {
    return this.output.length > 0 && this.numComputed + 1 === this.numTokens;
  }

  /** Tokens generated until the call reaches `maxTokens`. */
  remainingOutput(): number {
    return this.maxTokens - this.output.length;
  }

  /** Draws the next output token, appends it and hashes the block it completes. */
  sample(vocabulary: readonly VocabularyEntry[]): VocabularyEntry {
    this.rng = xorshift32(this.rng);
    const entry = vocabulary[this.rng % vocabulary.length]!;
    this.output.push(entry.id);
    const n = this.promptLen + this.output.length;
    const bs = this.blockSize;
    if (n % bs === 0) {
      const start = n - bs;
      const parent = this.hashes.length > 0 ? this.hashes[this.hashes.length - 1]! : 0;
      if (start >= this.promptLen) {
        this.hashes.push(hashTokens(parent, this.output, start - this.promptLen, n - this.promptLen));
      } else {
        const s = this.scratch;
        for (let i = 0; i < bs; i++) {
          const j = start + i;
          s[i] = j < this.promptLen ? this.prompt[j]! : this.output[j - this.promptLen]!;
        }
        this.hashes.push(hashTokens(parent, s, 0, bs));
      }
    }
    return entry;
  }

  /** The result reported when the call ends. */
  result(finishReason: FinishReason): EngineResult {
    return {
      promptTokens: this.promptLen,
      completionTokens: this.output.length,
      cachedTokens: this.cachedTokens,
      finishReason,
      outputTokens: this.output,
      // vLLM's connector hands the KV over only for a prefill that stopped at its length cap.
      ...(this.kvTransferOut && finishReason === "length" ? { kvTransferParams: this.kvTransferOut } : {}),
    };
  }
}
