/**
 * @module The simulated replica's Responses API: response ids, the state `previous_response_id` continues
 * (held on this replica only, as vLLM holds it in its process), and the engine's own bytes (the
 * streaming events, or the whole Response object).
 */

import { randomUUID } from "node:crypto";
import type { EngineCall, EngineChunk, EngineResult, EngineStream } from "../../../src/engine.js";
import { Refusal } from "../../../src/errors.js";
import {
  ResponseEventWriter,
  type ResponseShape,
  responseObject,
} from "../../openai-api/responses-format.js";

/** Default number of responses a simulated replica holds the state of (vLLM keeps every one; a simulator is bounded). */
export const DEFAULT_HELD_RESPONSES = 4096;

const encoder = new TextEncoder();

function idPart(): string {
  return randomUUID().replaceAll("-", "");
}

/**
 * The responses one replica holds: id → the conversation's tokens (every prompt and output so far),
 * which a call continuing it (`previous_response_id`) runs in front of its own input, as an engine
 * renders the stored conversation before the new items. The least recently stored are dropped first.
 */
export class SimResponses {
  private readonly held = new Map<string, readonly number[]>();

  constructor(
    private readonly model: string,
    readonly capacity: number = DEFAULT_HELD_RESPONSES,
  ) {
    if (!(Number.isInteger(capacity) && capacity >= 1)) {
      throw new RangeError(`SimResponses: capacity must be a positive integer, got ${capacity}`);
    }
  }

  /** Responses held. */
  get size(): number {
    return this.held.size;
  }

  /** Whether this replica holds a response's state. */
  holds(responseId: string): boolean {
    return this.held.has(responseId);
  }

  /**
   * Starts a Responses API call through `run` (the replica's own call path). A previous response
   * this replica does not hold is refused as vLLM refuses it (`serving_responses.py`,
   * `_make_not_found_error`: 404, "Response with id '…' not found.").
   */
  start(call: EngineCall, run: (call: EngineCall) => EngineStream): EngineStream {
    const body = call.body ?? {};
    const previous = typeof body.previous_response_id === "string" ? body.previous_response_id : undefined;
    let context: readonly number[] = [];
    if (previous !== undefined) {
      const held = this.held.get(previous);
      if (held === undefined) {
        throw new Refusal("response_state_lost", `Response with id '${previous}' not found.`, {
          param: "response_id",
        });
      }
      context = held;
    }
    const promptTokens = context.length > 0 ? [...context, ...call.promptTokens] : call.promptTokens;
    const shape: ResponseShape = {
      id: `resp_${idPart()}`,
      messageId: `msg_${idPart()}`,
      createdAt: Math.floor(Date.now() / 1000),
      model: this.model,
      previousResponseId: previous ?? null,
      instructions: typeof body.instructions === "string" ? body.instructions : null,
      maxOutputTokens: call.maxTokens,
      store: body.store !== false,
    };
    const store = shape.store;
    const inner = run({ ...call, promptTokens });
    const result = inner.result.then((r): EngineResult => {
      if (store && r.finishReason !== "abort" && r.finishReason !== "error") {
        this.remember(shape.id, [...promptTokens, ...(r.outputTokens ?? [])]);
      }
      return { ...r, responseId: shape.id };
    });
    return new ResponseStream(inner, result, shape, call.stream);
  }

  private remember(id: string, tokens: readonly number[]): void {
    this.held.set(id, tokens);
    if (this.held.size > this.capacity) this.held.delete(this.held.keys().next().value as string);
  }
}

/** A call's output as the Responses API writes it: events as they are generated, or one Response object at the end. */
class ResponseStream implements EngineStream {
  readonly firstToken: Promise<void>;

  constructor(
    private readonly inner: EngineStream,
    readonly result: Promise<EngineResult>,
    private readonly shape: ResponseShape,
    private readonly streaming: boolean,
  ) {
    this.firstToken = inner.firstToken;
  }

  [Symbol.asyncIterator](): AsyncIterator<EngineChunk> {
    const iterator = this.inner[Symbol.asyncIterator]();
    const generator = this.streaming ? this.events(iterator) : this.whole(iterator);
    return {
      next: () => generator.next(),
      // Stopping early stops the call underneath at once, not at its next chunk.
      return: async (value?: unknown) => {
        await iterator.return?.();
        return generator.return(value as undefined);
      },
    };
  }

  private async *events(iterator: AsyncIterator<EngineChunk>): AsyncGenerator<EngineChunk, void, undefined> {
    const writer = new ResponseEventWriter(this.shape);
    // vLLM and OpenAI name the response before generating: `response.created` goes out at once.
    yield { tokens: [], tokenCount: 0, text: "", raw: writer.opening(), responseId: this.shape.id };
    for (;;) {
      const next = await iterator.next();
      if (next.done) break;
      const chunk = next.value;
      yield {
        tokens: chunk.tokens,
        tokenCount: chunk.tokenCount,
        text: chunk.text,
        raw: writer.delta(chunk.text),
      };
    }
    const result = await this.result;
    if (result.finishReason === "abort") return;
    yield { tokens: [], tokenCount: 0, text: "", raw: writer.closing(result) };
  }

  private async *whole(iterator: AsyncIterator<EngineChunk>): AsyncGenerator<EngineChunk, void, undefined> {
    let text = "";
    const tokens: number[] = [];
    let tokenCount = 0;
    for (;;) {
      const next = await iterator.next();
      if (next.done) break;
      text += next.value.text;
      for (const token of next.value.tokens) tokens.push(token);
      tokenCount += next.value.tokenCount;
    }
    const result = await this.result;
    if (result.finishReason === "abort") return;
    const raw = encoder.encode(JSON.stringify(responseObject(this.shape, text, result)));
    yield { tokens, tokenCount, text, raw, responseId: this.shape.id };
  }
}
