/** @module Turns an admitted call into an HTTP response: an SSE stream without buffering, or one JSON body. */

import type { EngineResult } from "../../src/engine.js";
import type { AdmittedCall } from "../../src/types.js";
import {
  completionBody,
  deltaChunk,
  finishChunk,
  isDoneEvent,
  type ResponseContext,
  SSE_DONE,
  sseData,
  sseEvent,
  usageChunk,
} from "./openai-format.js";

/** Options shared by both response kinds. */
export interface CallResponseOptions {
  call: AdmittedCall;
  ctx: ResponseContext;
  /** `stream_options.include_usage`: end the stream with a usage chunk. */
  includeUsage: boolean;
  /** Renders a failure as the SPEC 8 envelope (the one mapping of errors). */
  renderError: (err: unknown) => unknown;
  /** Runs once when the response is over, however it ended. */
  onEnd: () => void;
}

/** Options of a streamed response. */
export interface SseStreamOptions extends CallResponseOptions {
  /**
   * A client that takes nothing for this long while a chunk waits for it
   * loses the call (within 1.25 × this), ms; 0 never. Without it a client that stops reading
   * would hold its engine slot, permit and reservation for as long as it
   * keeps the connection open.
   */
  stallTimeoutMs?: number;
}

/**
 * The SSE body of a streaming call. Chunks are pulled from the call only as
 * the client reads, so nothing piles up in sluice. Upstream SSE bytes
 * (`chunk.raw`) are written untouched, except the upstream's own `[DONE]`:
 * sluice writes exactly one, last, after an `event: error` if the engine
 * failed mid-stream. A client that goes away cancels the call at once; one
 * that stays but stops reading cancels it after `stallTimeoutMs`.
 */
export function sseStream(options: SseStreamOptions): ReadableStream<Uint8Array> {
  const { call, ctx, includeUsage, renderError, onEnd } = options;
  const stallTimeoutMs = options.stallTimeoutMs ?? 0;
  const iterator = call[Symbol.asyncIterator]();
  // The outcome is read through iteration; this only keeps a failure from going unhandled.
  call.result.catch(() => {});
  let first = true;
  let sawRaw = false;
  let ended = false;
  // One watchdog per stream rather than a timer per chunk: every quarter of the timeout it looks
  // whether the client read anything (a pull) while a chunk waited for it, so a stall ends the
  // call within 1–1.25 × the timeout and the hot path only counts pulls.
  let watchdog: ReturnType<typeof setInterval> | undefined;
  let pulls = 0;
  const stopWatchdog = () => {
    if (watchdog !== undefined) clearInterval(watchdog);
    watchdog = undefined;
  };
  const stopCall = () => {
    stopWatchdog();
    call.cancel();
    void iterator.return?.()?.catch(() => {});
  };
  const startWatchdog = (controller: ReadableStreamDefaultController<Uint8Array>) => {
    if (!(stallTimeoutMs > 0) || watchdog !== undefined) return;
    const checks = 4;
    let seenPulls = pulls;
    let idleChecks = 0;
    watchdog = setInterval(() => {
      // A chunk waits when the stream's queue is full; an empty queue means sluice is waiting on the engine.
      const waiting = (controller.desiredSize ?? 1) <= 0;
      idleChecks = pulls === seenPulls && waiting ? idleChecks + 1 : 0;
      seenPulls = pulls;
      if (idleChecks < checks || ended) return;
      ended = true;
      stopCall();
      controller.error(new Error(`the client read nothing for ${stallTimeoutMs} ms`));
      onEnd();
    }, stallTimeoutMs / checks);
    watchdog.unref?.();
  };

  const end = (controller: ReadableStreamDefaultController<Uint8Array> | undefined) => {
    if (ended) return;
    ended = true;
    stopWatchdog();
    if (controller) {
      controller.enqueue(SSE_DONE);
      controller.close();
    }
    onEnd();
  };

  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      pulls++;
      startWatchdog(controller);
      if (ended) return;
      try {
        // Loop until something is written: a pull that enqueues nothing would stall the reader.
        for (;;) {
          const next = await iterator.next();
          if (ended) return;
          if (next.done) {
            if (!sawRaw) {
              const result: EngineResult = await call.result;
              if (ended) return;
              controller.enqueue(sseData(finishChunk(ctx, result.finishReason)));
              if (includeUsage) controller.enqueue(sseData(usageChunk(ctx, result)));
            }
            end(controller);
            return;
          }
          const chunk = next.value;
          if (chunk.raw) {
            sawRaw = true;
            if (isDoneEvent(chunk.raw)) continue;
            controller.enqueue(chunk.raw);
            return;
          }
          if (chunk.text === "" && !first) continue;
          controller.enqueue(sseData(deltaChunk(ctx, chunk.text, first)));
          first = false;
          return;
        }
      } catch (err) {
        if (ended) return;
        // Headers and 200 are gone already: the failure travels inside the stream.
        controller.enqueue(sseEvent("error", renderError(err)));
        end(controller);
      }
    },
    cancel() {
      if (ended) return;
      ended = true;
      stopCall();
      onEnd();
    },
  });
}

/** Reads a non-streaming call to its end and builds the OpenAI JSON body. Throws when the engine failed. */
export async function collectCall(
  options: Pick<CallResponseOptions, "call" | "ctx">,
): Promise<Record<string, unknown>> {
  const { call, ctx } = options;
  call.result.catch(() => {});
  let text = "";
  for await (const chunk of call) text += chunk.text;
  const result = await call.result;
  return completionBody(ctx, text, result);
}
