/** @module The simulated replica's `POST /v1/chat/completions` and `POST /v1/completions`, with SGLang's PD flow. */

import type { Context, Hono } from "hono";
import type { EngineCall, EngineResult, EngineStream } from "../../../src/engine.js";
import type { PromptTokenizer } from "../../../src/tokens/prompt-tokenizer.js";
import {
  chatTokens,
  defaultedMaxTokens,
  errorBody,
  HttpError,
  type Json,
  positiveInt,
  prepareCall,
  type RouteContext,
  requestedRank,
  sseHeaders,
} from "./http-common.js";
import { type BootstrapRooms, joinPrefill, RoomTaken } from "./sglang-bootstrap.js";
import type { SimEngine } from "./sim-engine.js";

type Kind = "chat" | "completions";

/**
 * Adds the completion routes (stream or not) to `app`. With `sglang`, a prefill
 * or decode replica speaks SGLang's PD flow, and a prefill replica also takes
 * its decode servers' joins on `POST /sim/bootstrap/join` (sglang-bootstrap.ts).
 */
export function addCompletionRoutes(
  app: Hono,
  routes: RouteContext,
  pd: { sglang: boolean; rooms: BootstrapRooms },
): void {
  const { engine, prompts } = routes;
  const { sglang, rooms } = pd;

  if (sglang && engine.role === "prefill") {
    app.post("/sim/bootstrap/join", async (c) => {
      const body = (await c.req.json().catch(() => undefined)) as Json | undefined;
      const room = roomOf(body?.bootstrap_room);
      try {
        const handover = await rooms.join(room, c.req.raw.signal);
        return c.json({ prompt_tokens: handover.promptTokens });
      } catch (error) {
        return c.json(errorBody(`bootstrap_room ${room}: ${(error as Error).message}`, 500), 500);
      }
    });
  }

  const handle = (kind: Kind) =>
    async function completion(c: Context): Promise<Response> {
      const body = await routes.servedBody(c);
      const promptTokens =
        kind === "chat" ? chatTokens(prompts, body.messages) : completionTokens(prompts, body.prompt);
      const requested =
        positiveInt(body.max_completion_tokens, "max_completion_tokens") ??
        positiveInt(body.max_tokens, "max_tokens");
      const maxTokens = requested ?? defaultedMaxTokens(routes, promptTokens);
      // The rank is checked before `n`: a request wrong in both is refused for its rank.
      const rank = requestedRank(c, body);
      const n = body.n;
      if (n !== undefined && n !== null && n !== 1) throw new HttpError("only n = 1 is supported", 400, "n");
      const transfer = body.kv_transfer_params;
      if (
        transfer !== undefined &&
        transfer !== null &&
        (typeof transfer !== "object" || Array.isArray(transfer))
      ) {
        throw new HttpError("kv_transfer_params must be an object", 400, "kv_transfer_params");
      }
      const { call, requestId, stream, local, signal } = prepareCall(c, engine, body, {
        endpoint: kind,
        promptTokens,
        maxTokens,
        rank,
      });
      if (transfer !== undefined && transfer !== null) call.kvTransferParams = transfer as Json;
      const running = sglang
        ? await sglangLeg(call, body, signal, engine, rooms)
        : await engine.generate(call);
      const id = `${kind === "chat" ? "chatcmpl" : "cmpl"}-${requestId}`;
      const created = Math.floor(Date.now() / 1000);
      if (!stream) return c.json(await fullResponse(kind, running, id, created, engine.model));
      return new Response(sseBody(kind, running, id, created, engine.model, streamOptions(body), local), {
        headers: sseHeaders(requestId),
      });
    };

  app.post("/v1/chat/completions", handle("chat"));
  app.post("/v1/completions", handle("completions"));
}

/** A `bootstrap_room`, as SGLang's scheduler requires one of every request in PD mode. */
function roomOf(value: unknown): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    // sgl-project/sglang, python/sglang/srt/managers/scheduler.py (handle_generate_request).
    throw new HttpError(
      "Invalid request: Disaggregated request received without bootstrap room id.",
      400,
      "bootstrap_room",
    );
  }
  return value;
}

/**
 * One leg of SGLang's PD mode. A prefill request waits for its decode server
 * to join its room, then computes the prompt to its first token (SGLang's
 * prefill stops there, `FINISH_LENGTH(length=0)`, whatever it was asked) and
 * hands the KV over. A decode request joins the prefill server named in it,
 * then receives the prompt's KV over its link before it queues; a failed join
 * is SGLang's 500 "Decode transfer failed for request …"
 * (python/sglang/srt/disaggregation/decode.py).
 */
async function sglangLeg(
  call: EngineCall,
  body: Json,
  signal: AbortSignal,
  engine: SimEngine,
  rooms: BootstrapRooms,
): Promise<EngineStream> {
  const room = roomOf(body.bootstrap_room);
  if (engine.role === "prefill") {
    call.maxTokens = 1;
    let computed: EngineStream | undefined;
    try {
      await rooms.prefill(room, signal, async () => {
        computed = await engine.generate(call);
        const result = await computed.result;
        if (result.finishReason === "abort") throw signal.reason ?? new Error("the prefill was aborted");
        return { promptTokens: call.promptTokens.length };
      });
    } catch (error) {
      if (error instanceof RoomTaken) throw new HttpError(error.message, 400, "bootstrap_room");
      throw error;
    }
    // The answer is its one token, read from the finished computation.
    return computed!;
  }
  const host = body.bootstrap_host;
  const port = body.bootstrap_port;
  if (typeof host !== "string" || host === "" || !Number.isInteger(port)) {
    throw new HttpError(
      "bootstrap_host and bootstrap_port must name the prefill server",
      400,
      "bootstrap_host",
    );
  }
  try {
    await joinPrefill(host, port as number, room, signal);
  } catch (error) {
    if (signal.aborted) throw signal.reason;
    throw new HttpError(
      `Decode transfer failed for request rid=${call.requestId} bootstrap_room=${room}: ${(error as Error).message}`,
      500,
    );
  }
  call.kvTransferParams = { do_remote_prefill: true };
  return await engine.generate(call);
}

function completionTokens(prompts: PromptTokenizer, prompt: unknown): number[] {
  if (typeof prompt === "string") return prompts.text(prompt);
  if (Array.isArray(prompt)) {
    if (prompt.length > 0 && prompt.every((t) => Number.isInteger(t) && t >= 0)) return prompt as number[];
    if (prompt.length === 1) return completionTokens(prompts, prompt[0]);
    throw new HttpError(
      "prompt must be one string or one array of token ids (batches are not supported)",
      400,
      "prompt",
    );
  }
  throw new HttpError("prompt must be a string or an array of token ids", 400, "prompt");
}

function usageOf(result: EngineResult): Json {
  return {
    prompt_tokens: result.promptTokens,
    total_tokens: result.promptTokens + result.completionTokens,
    completion_tokens: result.completionTokens,
    prompt_tokens_details: { cached_tokens: result.cachedTokens },
  };
}

function streamOptions(body: Json): { includeUsage: boolean } {
  const options = body.stream_options;
  return {
    includeUsage: !!options && typeof options === "object" && (options as Json).include_usage === true,
  };
}

async function fullResponse(
  kind: Kind,
  running: EngineStream,
  id: string,
  created: number,
  model: string,
): Promise<Json> {
  let text = "";
  for await (const chunk of running) text += chunk.text;
  const result = await running.result;
  const finish = result.finishReason;
  const choice =
    kind === "chat"
      ? {
          index: 0,
          message: { role: "assistant", content: text, tool_calls: [] },
          logprobs: null,
          finish_reason: finish,
          stop_reason: null,
        }
      : { index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null };
  return {
    id,
    object: kind === "chat" ? "chat.completion" : "text_completion",
    created,
    model,
    choices: [choice],
    usage: usageOf(result),
    // vLLM returns a prefill's hand-over parameters at the top level of a non-streamed answer
    // (vllm/entrypoints/openai/protocol.py, `kv_transfer_params` on the completion responses).
    ...(result.kvTransferParams ? { kv_transfer_params: result.kvTransferParams } : {}),
  };
}

/** The SSE body: one `data:` event per engine chunk, a final chunk with the finish reason, usage if asked, `[DONE]`. */
function sseBody(
  kind: Kind,
  running: EngineStream,
  id: string,
  created: number,
  model: string,
  { includeUsage }: { includeUsage: boolean },
  local: AbortController,
): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  const object = kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const event = (choices: Json[], extra: Json = {}): Uint8Array => {
    const payload: Json = { id, object, created, model, choices, ...extra };
    if (includeUsage && !("usage" in payload)) payload.usage = null;
    return encoder.encode(`data: ${JSON.stringify(payload)}\n\n`);
  };
  const choice = (text: string, finish: string | null): Json =>
    kind === "chat"
      ? {
          index: 0,
          delta: text === "" && finish ? {} : { content: text },
          logprobs: null,
          finish_reason: finish,
        }
      : { index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null };
  const iterator = running[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    start(controller) {
      if (kind === "chat") {
        controller.enqueue(
          event([
            { index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null },
          ]),
        );
      }
    },
    async pull(controller) {
      const next = await iterator.next();
      if (!next.done) {
        controller.enqueue(event([choice(next.value.text, null)]));
        return;
      }
      const result = await running.result;
      if (result.finishReason === "abort") {
        controller.close();
        return;
      }
      controller.enqueue(event([choice("", result.finishReason)]));
      if (includeUsage) controller.enqueue(event([], { usage: usageOf(result) }));
      controller.enqueue(encoder.encode("data: [DONE]\n\n"));
      controller.close();
    },
    async cancel() {
      local.abort();
      await iterator.return?.();
    },
  });
}
