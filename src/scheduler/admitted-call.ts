/** @module An admitted call: the engine stream with every hold it took attached, released exactly once. */

import type { EngineChunk, EngineResult, EngineStream } from "../engine.js";
import type { ReturnedOutput } from "../sessions/message-digest.js";
import type { AdmittedCall, CallOutcome, Lane } from "../types.js";

/** What a call holds from admission to its end, and how to give each back. */
export interface CallHoldings {
  /** Ends the permit's waiting part (first token). */
  firstToken(): void;
  /** Output the call generated, as each chunk passes (the disaggregated path follows its decode KV's growth). */
  generated?(tokens: number): void;
  /** Responses API: the engine named the response this call produces (its state lives on this call's replica). */
  responded?(responseId: string): void;
  /** Gives back everything: permit, reservation, session step, in-flight accounting. */
  finish(outcome: CallOutcome, result: EngineResult | undefined, outputTokens: readonly number[]): void;
}

export interface AdmittedCallInit {
  requestId: string;
  lane: Lane;
  replica: string;
  queueMs: number;
  inputTokens: number;
  maxTokens: number;
  sessionId: string | undefined;
  stream: EngineStream;
  abort: AbortController;
  holdings: CallHoldings;
}

/**
 * Wraps an engine stream. Whichever comes first — the stream ending, the
 * engine's result settling, a failure, a `break` or `cancel()` — finishes the
 * call; later ones find it finished.
 */
export class AdmittedCallImpl implements AdmittedCall {
  readonly requestId: string;
  readonly lane: Lane;
  readonly replica: string;
  readonly queueMs: number;
  readonly inputTokens: number;
  readonly maxTokens: number;
  readonly sessionId: string | undefined;
  readonly result: Promise<EngineResult>;
  private readonly stream: EngineStream;
  private readonly abort: AbortController;
  private readonly holdings: CallHoldings;
  private readonly outputTokens: number[] = [];
  private sawFirstToken = false;
  private finished = false;
  private finishedOutcome: CallOutcome | undefined;
  private iterated = false;
  /** Whether the session was inferred from the prompt rather than named by the client. */
  sessionInferred = false;
  /** Told once what the consumer received in full, or undefined when it did not (see `observeOutput`). */
  private outputObserver: ((output: ReturnedOutput | undefined) => void) | undefined;
  private outputText = "";
  private toolCallText = "";

  constructor(init: AdmittedCallInit) {
    this.requestId = init.requestId;
    this.lane = init.lane;
    this.replica = init.replica;
    this.queueMs = init.queueMs;
    this.inputTokens = init.inputTokens;
    this.maxTokens = init.maxTokens;
    this.sessionId = init.sessionId;
    this.stream = init.stream;
    this.abort = init.abort;
    this.holdings = init.holdings;
    this.result = init.stream.result;
    // The result is observed here, so an engine failure is never an unhandled rejection.
    this.result.then(
      (result) => this.finish(result.finishReason === "abort" ? "cancelled" : "ok", result),
      () => this.finish(this.abort.signal.aborted ? "cancelled" : "error", undefined),
    );
    init.stream.firstToken.then(
      () => this.markFirstToken(),
      () => undefined,
    );
  }

  [Symbol.asyncIterator](): AsyncIterator<EngineChunk> {
    if (this.iterated) throw new Error(`call ${this.requestId} can be iterated only once`);
    this.iterated = true;
    return this.iterate();
  }

  /**
   * Tells `observer` once what was returned: the generated tokens, text and tool calls when the
   * consumer iterated the whole stream of a call that completed; undefined when the call failed,
   * was cancelled or the consumer stopped early (what the client holds is then not known).
   */
  observeOutput(observer: (output: ReturnedOutput | undefined) => void): void {
    if (this.finished && this.finishedOutcome !== "ok") {
      observer(undefined);
      return;
    }
    this.outputObserver = observer;
  }

  private tellOutput(output: ReturnedOutput | undefined): void {
    const observer = this.outputObserver;
    if (observer === undefined) return;
    this.outputObserver = undefined;
    observer(output);
  }

  cancel(): void {
    this.tellOutput(undefined);
    if (this.finished) return;
    this.abort.abort(new DOMException("the call was cancelled", "AbortError"));
    this.finish("cancelled", undefined);
  }

  private async *iterate(): AsyncGenerator<EngineChunk> {
    let completed = false;
    try {
      for await (const chunk of this.stream) {
        if (chunk.tokenCount > 0) {
          this.markFirstToken();
          this.holdings.generated?.(chunk.tokenCount);
        }
        for (const token of chunk.tokens) this.outputTokens.push(token);
        if (this.outputObserver !== undefined) {
          this.outputText += chunk.text;
          if (chunk.toolCalls !== undefined) this.toolCallText += chunk.toolCalls;
        }
        if (chunk.responseId !== undefined) this.holdings.responded?.(chunk.responseId);
        yield chunk;
      }
      completed = true;
      if (this.outputObserver !== undefined) {
        this.result.then(
          (result) =>
            this.tellOutput(
              result.finishReason === "error" || result.finishReason === "abort"
                ? undefined
                : {
                    tokens: result.outputTokens ?? this.outputTokens,
                    text: this.outputText,
                    toolCalls: this.toolCallText,
                  },
            ),
          () => this.tellOutput(undefined),
        );
      }
    } catch (error) {
      this.tellOutput(undefined);
      this.finish(this.abort.signal.aborted ? "cancelled" : "error", undefined);
      throw error;
    } finally {
      // A consumer that stops early (break, return) cancels the call.
      if (!completed) this.cancel();
    }
  }

  private markFirstToken(): void {
    if (this.sawFirstToken) return;
    this.sawFirstToken = true;
    this.holdings.firstToken();
  }

  private finish(outcome: CallOutcome, result: EngineResult | undefined): void {
    if (outcome !== "ok") this.tellOutput(undefined);
    if (this.finished) return;
    this.finished = true;
    this.finishedOutcome = outcome;
    this.holdings.finish(outcome, result, result?.outputTokens ?? this.outputTokens);
  }
}
