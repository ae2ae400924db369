/** @module Turns an admitted call into an HTTP response: an SSE stream without buffering, or one JSON body. */

import type { EngineResult } from "../../src/engine.js";
import { EngineError } from "../../src/errors.js";
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
  /** Renders a failure as the docs/http-api.md envelope (the one mapping of errors). */
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
 *
 * A Responses API call is the engine's events alone: they end with the engine's own
 * `response.completed` (no `[DONE]`, which that API does not have), and a failure
 * mid-stream is an `event: error` in that API's shape (`type`, `code`, `message`)
 * that also carries sluice's error envelope as `error`.
 */
export function sseStream(options: SseStreamOptions): ReadableStream<Uint8Array> {
  const { call, ctx, includeUsage, renderError, onEnd } = options;
  const stallTimeoutMs = options.stallTimeoutMs ?? 0;
  const responses = ctx.endpoint === "responses";
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
      if (!responses) controller.enqueue(SSE_DONE);
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
            if (!sawRaw && !responses) {
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
          // The Responses API is written by its engine only; sluice has no text events of its own for it.
          if (responses || (chunk.text === "" && !first)) continue;
          controller.enqueue(sseData(deltaChunk(ctx, chunk.text, first)));
          first = false;
          return;
        }
      } catch (err) {
        if (ended) return;
        // Headers and 200 are gone already: the failure travels inside the stream.
        const envelope = renderError(err);
        controller.enqueue(sseEvent("error", responses ? responsesErrorEvent(envelope) : envelope));
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

/** A failure mid-stream as the Responses API's `error` event, carrying the envelope's `error` too. */
function responsesErrorEvent(envelope: unknown): Record<string, unknown> {
  const error = (envelope as { error?: { code?: unknown; message?: unknown; param?: unknown } }).error ?? {};
  return {
    type: "error",
    code: error.code ?? null,
    message: error.message ?? "",
    param: error.param ?? null,
    error,
  };
}

/**
 * Reads a non-streaming Responses API call to its end: the engine's own body, byte for byte.
 * Throws when the engine failed, or gave no body of its own.
 */
export async function collectRaw(call: AdmittedCall): Promise<Uint8Array> {
  call.result.catch(() => {});
  const parts: Uint8Array[] = [];
  for await (const chunk of call) if (chunk.raw) parts.push(chunk.raw);
  await call.result;
  if (parts.length === 0) throw new EngineError(`replica ${call.replica} answered no Responses API body`);
  if (parts.length === 1) return parts[0]!;
  const joined = new Uint8Array(parts.reduce((sum, part) => sum + part.byteLength, 0));
  let at = 0;
  for (const part of parts) {
    joined.set(part, at);
    at += part.byteLength;
  }
  return joined;
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
