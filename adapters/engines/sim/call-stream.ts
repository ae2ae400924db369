/** @module The `EngineStream` of one simulated call: buffered chunks, a first-token promise and a result promise. */

import type { EngineChunk, EngineResult, EngineStream } from "../../../src/engine.js";

interface OpenChunk {
  tokens: number[];
  tokenCount: number;
  text: string;
}

/**
 * Chunks are queued as the engine produces them; while the consumer has not
 * taken the last queued chunk, new tokens are appended to it (as an engine's
 * output coalescing does), so a slow or absent reader costs one chunk object,
 * not one per token. Iterate it once.
 */
export class CallStream implements EngineStream {
  readonly firstToken: Promise<void>;
  readonly result: Promise<EngineResult>;
  private resolveFirst!: () => void;
  private resolveResult!: (result: EngineResult) => void;
  private queue: OpenChunk[] = [];
  private read = 0;
  private waiter: ((next: IteratorResult<EngineChunk>) => void) | undefined;
  private ended = false;
  private firstSeen = false;

  /** @param onCancel called when the consumer stops iterating before the end (`break`, `return()`) */
  constructor(private readonly onCancel: () => void) {
    this.firstToken = new Promise<void>((resolve) => {
      this.resolveFirst = resolve;
    });
    this.result = new Promise<EngineResult>((resolve) => {
      this.resolveResult = resolve;
    });
  }

  /** Whether the call has ended (any finish reason). */
  get done(): boolean {
    return this.ended;
  }

  /** Queues generated tokens (and settles `firstToken` on the first). */
  push(tokens: readonly number[], text: string): void {
    if (this.ended || tokens.length === 0) return;
    if (!this.firstSeen) {
      this.firstSeen = true;
      this.resolveFirst();
    }
    const waiter = this.waiter;
    if (waiter) {
      this.waiter = undefined;
      waiter({ value: { tokens: tokens.slice(), tokenCount: tokens.length, text }, done: false });
      return;
    }
    const last = this.queue.length > this.read ? this.queue[this.queue.length - 1] : undefined;
    if (last) {
      for (const t of tokens) last.tokens.push(t);
      last.tokenCount += tokens.length;
      last.text += text;
    } else {
      this.queue.push({ tokens: tokens.slice(), tokenCount: tokens.length, text });
    }
  }

  /** Ends the call: settles `firstToken` (if still pending) and `result`, then ends iteration. Idempotent. */
  end(result: EngineResult): void {
    if (this.ended) return;
    this.ended = true;
    if (!this.firstSeen) {
      this.firstSeen = true;
      this.resolveFirst();
    }
    this.resolveResult(result);
    const waiter = this.waiter;
    if (waiter) {
      this.waiter = undefined;
      waiter({ value: undefined, done: true });
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<EngineChunk> {
    return {
      next: () => {
        if (this.read < this.queue.length) {
          const chunk = this.queue[this.read++]!;
          if (this.read === this.queue.length) {
            this.queue = [];
            this.read = 0;
          }
          return Promise.resolve({ value: chunk, done: false });
        }
        if (this.ended) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => {
          this.waiter = resolve;
        });
      },
      return: () => {
        if (!this.ended) this.onCancel();
        this.queue = [];
        this.read = 0;
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }
}
