/** @module The simulated replica's `POST /v1/responses`: the engine writes its own events (or Response object), sent as they are. */

import type { Context, Hono } from "hono";
import { responsesMessages } from "../../openai-api/responses-input.js";
import {
  chatTokens,
  defaultedMaxTokens,
  HttpError,
  positiveInt,
  prepareCall,
  type RouteContext,
  requestedRank,
  sseHeaders,
} from "./http-common.js";

/** Adds `POST /v1/responses` (stream or not) to `app`. */
export function addResponsesRoute(app: Hono, routes: RouteContext): void {
  const { engine, prompts } = routes;
  app.post("/v1/responses", async function responses(c: Context): Promise<Response> {
    const body = await routes.servedBody(c);
    const input = body.input;
    if (typeof input !== "string" && !(Array.isArray(input) && input.length > 0)) {
      throw new HttpError("input must be a string or a non-empty array of items", 400, "input");
    }
    const promptTokens = chatTokens(prompts, responsesMessages(body));
    const maxTokens =
      positiveInt(body.max_output_tokens, "max_output_tokens") ?? defaultedMaxTokens(routes, promptTokens);
    const rank = requestedRank(c, body);
    const { call, requestId, stream, local } = prepareCall(c, engine, body, {
      endpoint: "responses",
      promptTokens,
      maxTokens,
      rank,
    });
    const running = await engine.generate(call);
    if (!stream) {
      let raw = "";
      const decoder = new TextDecoder();
      for await (const chunk of running) if (chunk.raw) raw += decoder.decode(chunk.raw);
      return c.body(raw, 200, { "content-type": "application/json" });
    }
    const iterator = running[Symbol.asyncIterator]();
    const events = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const next = await iterator.next();
        if (next.done) controller.close();
        else if (next.value.raw) controller.enqueue(next.value.raw);
      },
      async cancel() {
        local.abort();
        await iterator.return?.();
      },
    });
    return new Response(events, { headers: sseHeaders(requestId) });
  });
}
