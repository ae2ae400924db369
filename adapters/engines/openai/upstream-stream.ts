/** @module A running upstream call as an `EngineStream`: reads the upstream's SSE (or whole JSON) and settles once. */

import type {
  EngineCall,
  EngineChunk,
  EngineResult,
  EngineStream,
  FinishReason,
} from "../../../src/engine.js";
import { EngineError } from "../../../src/errors.js";
import { toolCallsText } from "../../../src/sessions/message-digest.js";
import { CallStop, stopCause } from "./call-stop.js";
import { upstreamErrorOf } from "./error-mapping.js";
import { clientAskedForUsage, inspect, mapFinish, type Usage, usageOf } from "./event-interpretation.js";
import {
  inspectResponsesEvent,
  responseFinishOf,
  responseOutputText,
  responseUsageOf,
} from "./responses-events.js";
import { type SseEvent, SseSplitter } from "./sse.js";
import type { UpstreamResponse } from "./transport.js";
import { describeNetworkError, isRecord, readText } from "./upstream-http.js";

/** A chunk as this engine yields it: the port's chunk plus the upstream's parsed event, for transports that need more than text. */
export interface UpstreamChunk extends EngineChunk {
  /** The parsed JSON of the upstream event (tool-call deltas, logprobs, …); absent for comments. */
  event?: Record<string, unknown>;
}

/**
 * The running call: iterated once by its consumer; settles `result` exactly once.
 *
 * Everything that can stop it early arrives through one signal (the client's
 * abort, the engine closing, a consumer that stopped iterating); the signal's
 * reason says which (`stopCause`).
 */
export class UpstreamStream implements EngineStream {
  readonly firstToken: Promise<void>;
  readonly result: Promise<EngineResult>;
  private resolveFirst!: () => void;
  private resolveResult!: (result: EngineResult) => void;
  private rejectResult!: (error: unknown) => void;
  private settled = false;
  private released = false;
  /** The failure `result` rejected with, rethrown by iteration after an abort. */
  private failure: EngineError | undefined;
  private iterated = false;
  private counted = 0;
  private readonly outputTokens: number[] = [];
  private usage: Usage | undefined;
  private kvTransferParams: Record<string, unknown> | undefined;
  /** Responses API: the id the engine gave this call's response. */
  private responseId: string | undefined;
  private finish: FinishReason | undefined;
  private readonly seenChoices = new Set<number>();
  private readonly finishedChoices = new Set<number>();
  private readonly wantsUsageEvents: boolean;
  private readonly onAbort = (): void => this.aborted();

  constructor(
    private readonly call: EngineCall,
    private readonly response: UpstreamResponse,
    /** The call's one signal: aborts the upstream request and its body. */
    private readonly signal: AbortSignal,
    /** Aborts the signal with sluice's own reason. */
    private readonly stop: (why: CallStop) => void,
    /** Called once when the call ends, however it ends. */
    private readonly onEnd: () => void,
    /** Told the usage a call that succeeded reported (the engine's per-call hit signal). */
    private readonly onUsage?: (usage: Usage) => void,
  ) {
    this.firstToken = new Promise((resolve) => {
      this.resolveFirst = resolve;
    });
    this.result = new Promise((resolve, reject) => {
      this.resolveResult = resolve;
      this.rejectResult = reject;
    });
    // A failure is reported through iteration too; the result must never surface as unhandled.
    this.result.catch(() => undefined);
    this.wantsUsageEvents = clientAskedForUsage(call);
    signal.addEventListener("abort", this.onAbort, { once: true });
    if (signal.aborted) this.aborted(); // aborted between the headers and here
  }

  /** The signal fired: settle now, even if nobody iterates, and release the connection. */
  private aborted(): void {
    const cause = stopCause(this.signal);
    if (cause instanceof CallStop && cause.kind === "closed") {
      this.fail(new EngineError(`replica closed while call ${this.call.requestId} ran`));
    } else if (cause instanceof CallStop && cause.kind === "timeout") {
      this.fail(new EngineError(cause.message));
    } else this.succeed("abort");
    if (!this.iterated) this.response.cancel();
  }

  /**
   * The iterator's `return()` aborts the upstream at once: an async
   * generator would queue it behind a pending `next()`, i.e. until the
   * upstream's next event, which may be far off.
   */
  [Symbol.asyncIterator](): AsyncIterator<UpstreamChunk> {
    if (this.iterated) throw new Error(`call ${this.call.requestId} can be iterated only once`);
    this.iterated = true;
    const generator = this.iterate();
    return {
      next: () => generator.next(),
      return: (value?: unknown) => {
        this.stopByConsumer();
        return generator.return(value as undefined);
      },
      throw: (error?: unknown) => {
        this.stopByConsumer();
        return generator.throw(error);
      },
    };
  }

  private stopByConsumer(): void {
    if (!this.settled && !this.signal.aborted) this.stop(new CallStop("consumer"));
  }

  private async *iterate(): AsyncGenerator<UpstreamChunk, void, undefined> {
    try {
      const contentType = this.response.header("content-type") ?? "";
      if (!contentType.includes("text/event-stream") && contentType.includes("json")) {
        yield* this.wholeJson();
      } else {
        yield* this.events();
      }
    } finally {
      // Reached on normal end, failure, and `break`; a `break` before the end cancels the upstream call.
      this.stopByConsumer();
      this.release();
    }
  }

  private async *events(): AsyncGenerator<UpstreamChunk, void, undefined> {
    const reader = this.response.body[Symbol.asyncIterator]();
    const splitter = new SseSplitter();
    let sawDone = false;
    try {
      while (!sawDone) {
        let read: IteratorResult<Uint8Array>;
        try {
          read = await reader.next();
        } catch (error) {
          this.throwUnlessConsumerStopped(error);
          return;
        }
        if (read.done) break;
        for (const event of splitter.push(read.value)) {
          if (event.data === "[DONE]") {
            sawDone = true;
            break;
          }
          const chunk = this.chunkOf(event);
          if (chunk) yield chunk;
        }
      }
      if (this.signal.aborted) {
        this.throwUnlessConsumerStopped(undefined);
        return;
      }
      if (!sawDone && !this.finishedAll()) {
        throw this.fail(new EngineError("upstream ended the stream before the call finished"));
      }
      this.succeed(this.finish ?? "stop");
    } finally {
      // After `[DONE]` nothing more is wanted and the connection can be reused; otherwise it is closed.
      if (sawDone) this.response.release();
      else this.response.cancel();
    }
  }

  /**
   * After a read failed or the signal fired: a consumer that stopped just
   * ends (the result says `abort`); anything else throws — the client's abort
   * reason, or the `EngineError` the result rejected with.
   */
  private throwUnlessConsumerStopped(error: unknown): void {
    const cause = stopCause(this.signal);
    if (!cause) {
      throw this.fail(
        new EngineError(`upstream connection lost mid-stream (${describeNetworkError(error)})`, undefined, {
          cause: error,
        }),
      );
    }
    this.aborted();
    if (cause instanceof CallStop && cause.kind === "consumer") return;
    if (cause === "client") {
      throw this.call.signal.reason ?? new DOMException("This operation was aborted", "AbortError");
    }
    throw this.failure ?? new EngineError("upstream call aborted");
  }

  private finishedAll(): boolean {
    if (this.finishedChoices.size === 0) return false;
    for (const index of this.seenChoices) if (!this.finishedChoices.has(index)) return false;
    return true;
  }

  /** Turns one event into a chunk to yield, or undefined when it carries nothing the consumer needs. */
  private chunkOf(event: SseEvent): UpstreamChunk | undefined {
    let payload: Record<string, unknown> | undefined;
    if (event.data !== undefined) {
      try {
        const parsed: unknown = JSON.parse(event.data);
        if (isRecord(parsed)) payload = parsed;
      } catch {
        // Not JSON: forwarded untouched below; it carries no token we can count.
      }
    }
    const upstreamError = upstreamErrorOf(event, payload);
    if (upstreamError !== undefined) {
      throw this.fail(new EngineError(`upstream failed mid-stream: ${upstreamError}`));
    }
    const raw = this.call.stream ? event.raw : undefined;
    if (!payload) return raw ? { tokens: [], tokenCount: 0, text: "", raw } : undefined;
    let namedId: string | undefined;
    let info: ReturnType<typeof inspect>;
    if (this.call.endpoint === "responses") {
      const read = inspectResponsesEvent(payload);
      if (read.failure !== undefined)
        throw this.fail(new EngineError(`upstream failed mid-stream: ${read.failure}`));
      if (read.responseId !== undefined && this.responseId === undefined) {
        this.responseId = read.responseId;
        namedId = read.responseId;
      }
      info = read;
    } else info = inspect(payload);
    if (info.usage) this.usage = info.usage;
    for (const index of info.choices) this.seenChoices.add(index);
    for (const index of info.finishedChoices) this.finishedChoices.add(index);
    if (info.finish) this.finish = info.finish;
    this.counted += info.tokenCount;
    this.outputTokens.push(...info.tokens);
    if (info.generated) this.resolveFirst();
    // Usage was requested on the client's behalf; a client that did not ask never sees that event.
    if (info.usageOnly && !this.wantsUsageEvents) return undefined;
    const chunk: UpstreamChunk = {
      tokens: info.tokens,
      tokenCount: info.tokenCount,
      text: info.text,
      event: payload,
    };
    if (info.toolCalls !== "") chunk.toolCalls = info.toolCalls;
    if (namedId !== undefined) chunk.responseId = namedId;
    if (raw) chunk.raw = raw;
    else if (!info.generated && info.finish === undefined && namedId === undefined) return undefined;
    return chunk;
  }

  /** A 2xx JSON answer (an upstream that ignored `stream: true`): one chunk with the whole output. */
  private async *wholeJson(): AsyncGenerator<UpstreamChunk, void, undefined> {
    let text: string;
    try {
      text = await readText(this.response, 64 * 1024 * 1024, this.signal);
    } catch (error) {
      this.throwUnlessConsumerStopped(error);
      return;
    }
    let payload: Record<string, unknown>;
    try {
      const parsed: unknown = JSON.parse(text);
      if (!isRecord(parsed)) throw new Error("not a JSON object");
      payload = parsed;
    } catch (error) {
      throw this.fail(new EngineError("upstream answered unreadable JSON", undefined, { cause: error }));
    }
    const upstreamError = upstreamErrorOf({ raw: new Uint8Array(0), data: text, event: undefined }, payload);
    if (upstreamError !== undefined) throw this.fail(new EngineError(`upstream failed: ${upstreamError}`));
    if (this.call.endpoint === "responses") {
      yield* this.wholeResponse(text, payload);
      return;
    }
    const choices = Array.isArray(payload.choices) ? payload.choices.filter(isRecord) : [];
    const first = choices[0];
    const message = first && isRecord(first.message) ? first.message : undefined;
    const out =
      typeof first?.text === "string"
        ? first.text
        : typeof message?.content === "string"
          ? message.content
          : "";
    this.usage = usageOf(payload.usage, undefined, payload.timings);
    // A prefill's hand-over parameters (vLLM's KV connectors), passed back on the decode call.
    if (isRecord(payload.kv_transfer_params)) this.kvTransferParams = payload.kv_transfer_params;
    this.finish = mapFinish(first?.finish_reason);
    const tokenCount = this.usage?.completion ?? (out === "" ? 0 : 1);
    this.counted = tokenCount;
    this.resolveFirst();
    const toolCalls = toolCallsText(message?.tool_calls);
    yield { tokens: [], tokenCount, text: out, event: payload, ...(toolCalls !== "" ? { toolCalls } : {}) };
    this.succeed(this.finish ?? "stop");
  }

  /** A whole Response object (a Responses API call that does not stream): one chunk carrying its exact bytes. */
  private *wholeResponse(
    text: string,
    payload: Record<string, unknown>,
  ): Generator<UpstreamChunk, void, undefined> {
    const finish = responseFinishOf(payload);
    if (finish === "error") {
      const error =
        isRecord(payload.error) && typeof payload.error.message === "string" ? payload.error.message : "";
      throw this.fail(new EngineError(`upstream failed: ${error || "the response failed"}`));
    }
    if (typeof payload.id === "string") this.responseId = payload.id;
    const out = responseOutputText(payload);
    this.usage = responseUsageOf(payload.usage);
    this.finish = finish;
    const tokenCount = this.usage?.completion ?? (out === "" ? 0 : 1);
    this.counted = tokenCount;
    this.resolveFirst();
    const chunk: UpstreamChunk = {
      tokens: [],
      tokenCount,
      text: out,
      event: payload,
      raw: new TextEncoder().encode(text),
    };
    if (this.responseId !== undefined) chunk.responseId = this.responseId;
    yield chunk;
    this.succeed(this.finish ?? "stop");
  }

  /** Ends the call's bookkeeping once: stops listening to the signal and tells the engine. */
  private release(): void {
    if (this.released) return;
    this.released = true;
    this.signal.removeEventListener("abort", this.onAbort);
    this.onEnd();
  }

  private succeed(finishReason: FinishReason): void {
    if (this.settled) return;
    this.settled = true;
    this.release();
    this.resolveFirst();
    const usage = this.usage;
    if (usage) this.onUsage?.(usage);
    const result: EngineResult = {
      promptTokens: usage?.prompt ?? this.call.promptTokens.length,
      completionTokens: usage
        ? Math.max(usage.completion, finishReason === "abort" ? this.counted : 0)
        : this.counted,
      cachedTokens: usage?.cached ?? 0,
      finishReason,
    };
    if (this.outputTokens.length > 0) result.outputTokens = this.outputTokens;
    if (this.kvTransferParams) result.kvTransferParams = this.kvTransferParams;
    if (this.responseId !== undefined) result.responseId = this.responseId;
    this.resolveResult(result);
  }

  /** Settles `result` with the failure (first settlement wins) and returns the error iteration should throw. */
  private fail(error: EngineError): EngineError {
    if (!this.settled) {
      this.settled = true;
      this.failure = error;
      this.release();
      this.resolveFirst();
      this.rejectResult(error);
    }
    return error;
  }
}
