/** @module One simulated replica as an OpenAI-compatible HTTP server with vLLM-named `/metrics` (real time by default). */

import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { createTokenizer } from "../../../adapters/tokenizers/index.js";
import { type Clock, realClock } from "../../../src/clock.js";
import type { ReplicaRole } from "../../../src/engine.js";
import { Refusal } from "../../../src/errors.js";
import { PromptTokenizer } from "../../../src/tokens/prompt-tokenizer.js";
import { addCompletionRoutes } from "./http-chat.js";
import { errorBody, HttpError, type RouteContext, servedBodyOf } from "./http-common.js";
import { addInfoRoutes } from "./http-info.js";
import { addResponsesRoute } from "./http-responses.js";
import type { PresetName, PresetOverrides } from "./presets.js";
import { BootstrapRooms } from "./sglang-bootstrap.js";
import { SimEngine, type SimEngineOptions } from "./sim-engine.js";
import { vocabularyFromTokenizer } from "./vocabulary.js";

/** Options of {@link startSimServer} and {@link createSimApp}. */
export interface SimServerOptions {
  /** TCP port; 0 (default) picks a free one. */
  port?: number;
  /** Interface to listen on; default 127.0.0.1. */
  host?: string;
  preset?: PresetName | PresetOverrides;
  model?: string;
  /** Default: real time. */
  clock?: Clock;
  /** Data-parallel ranks; a call picks one with the `x-data-parallel-rank` header. Default 1. */
  dataParallelSize?: number;
  seed?: number;
  /** Tokenizer spec for prompts (`o200k` default, or a `tokenizer.json` path). */
  tokenizer?: string;
  /**
   * Output tokens when a request gives no `max_tokens`/`max_completion_tokens`,
   * capped by what the context window leaves. Default 1024 (vLLM would take
   * the whole remaining window; a simulator generating 100k tokens helps nobody).
   */
  defaultMaxTokens?: number;
  /** Further engine options (preset overrides such as `maxNumSeqs`, hooks). */
  engine?: Partial<Omit<SimEngineOptions, "id" | "clock">>;
  /** Engine id; default `sim`. */
  id?: string;
  /** Role in a disaggregated fleet (`prefill`, `decode`); default `both`. */
  role?: ReplicaRole;
  /**
   * The request flow a `prefill` or `decode` replica speaks: `vllm` (default,
   * `kv_transfer_params`) or `sglang` (SGLang's PD mode: `bootstrap_host`,
   * `bootstrap_port`, `bootstrap_room` on both requests; `sglang-bootstrap.ts`).
   */
  pd?: "vllm" | "sglang";
}

/** A running simulated replica server. */
export interface SimServer {
  /** Base URL, e.g. `http://127.0.0.1:9000`. */
  url: string;
  engine: SimEngine;
  /** SGLang's PD mode: rooms a prefill replica holds open (a request waiting for its other half); 0 once idle. */
  openRooms(): number;
  close(): Promise<void>;
}

/**
 * The hono app of a simulated replica: `POST /v1/chat/completions`,
 * `POST /v1/completions`, `POST /v1/responses` (stream or not), `GET /v1/models`,
 * `GET /metrics`, `GET /health`. A client that disconnects aborts its call.
 */
export function createSimApp(
  engine: SimEngine,
  options: Pick<SimServerOptions, "tokenizer" | "defaultMaxTokens" | "pd"> & {
    prompts?: PromptTokenizer;
    /** The port the server listens on, once it does (its SGLang bootstrap port too). */
    port?: () => number;
    /** SGLang's PD mode on a prefill replica: the rooms its requests meet in. */
    rooms?: BootstrapRooms;
  } = {},
): Hono {
  const sglang = options.pd === "sglang";
  if (sglang && engine.role === "both") {
    throw new RangeError("pd sglang is for a prefill or a decode replica (role prefill or decode)");
  }
  const rooms = options.rooms ?? new BootstrapRooms();
  const prompts = options.prompts ?? new PromptTokenizer(createTokenizer(options.tokenizer));
  const defaultMaxTokens = options.defaultMaxTokens ?? 1024;
  if (!(Number.isInteger(defaultMaxTokens) && defaultMaxTokens >= 1)) {
    throw new RangeError(`defaultMaxTokens should be a positive integer, got ${defaultMaxTokens}`);
  }
  const app = new Hono();

  app.onError((error, c) => {
    if (error instanceof HttpError)
      return c.json(errorBody(error.message, error.status, error.param), error.status as 400);
    if (error instanceof Refusal && error.reason === "response_state_lost") {
      // vLLM's answer to a previous_response_id it does not hold (serving_responses.py, `_make_not_found_error`).
      return c.json(
        { error: { message: error.message, type: "invalid_request_error", param: "response_id", code: 404 } },
        404,
      );
    }
    if (error instanceof Refusal) {
      // vLLM answers every request it cannot serve (too long, bad parameters) with 400.
      const status = error.reason === "unavailable" ? 503 : 400;
      return c.json(errorBody(error.message, status, error.param), status);
    }
    return c.json(errorBody(error instanceof Error ? error.message : String(error), 500), 500);
  });

  const bootstrapPort = sglang && engine.role === "prefill" ? () => options.port?.() ?? 0 : undefined;
  addInfoRoutes(app, engine, bootstrapPort);
  const routes: RouteContext = { engine, prompts, defaultMaxTokens, servedBody: servedBodyOf(engine) };
  addCompletionRoutes(app, routes, { sglang, rooms });
  addResponsesRoute(app, routes);
  return app;
}

/**
 * Starts a simulated replica on `host:port` (real time unless `clock` is
 * given) and resolves once it listens. Prompts are tokenized with sluice's
 * tokenizer, and generated words are single tokens of it, so a client that
 * sends the output back keeps its prefix cacheable.
 */
export async function startSimServer(options: SimServerOptions = {}): Promise<SimServer> {
  const { port = 0, host = "127.0.0.1", preset, model, clock = realClock, dataParallelSize, seed } = options;
  if (!(Number.isInteger(port) && port >= 0 && port <= 65535)) {
    throw new RangeError(`port should be an integer in [0, 65535], got ${port}`);
  }
  const tokenizer = createTokenizer(options.tokenizer);
  const engineOptions: SimEngineOptions = {
    vocabulary: vocabularyFromTokenizer((text) => tokenizer.encode(text)),
    ...options.engine,
    id: options.id ?? "sim",
    clock,
  };
  if (preset !== undefined) engineOptions.preset = preset;
  if (model !== undefined) engineOptions.model = model;
  if (dataParallelSize !== undefined) engineOptions.dataParallelSize = dataParallelSize;
  if (seed !== undefined) engineOptions.seed = seed;
  if (options.role !== undefined) engineOptions.role = options.role;
  const engine = new SimEngine(engineOptions);
  let listeningPort = 0;
  const rooms = new BootstrapRooms();
  const appOptions: Parameters<typeof createSimApp>[1] = {
    prompts: new PromptTokenizer(tokenizer),
    port: () => listeningPort,
    rooms,
  };
  if (options.pd !== undefined) appOptions.pd = options.pd;
  if (options.defaultMaxTokens !== undefined) appOptions.defaultMaxTokens = options.defaultMaxTokens;
  const app = createSimApp(engine, appOptions);
  const server = await new Promise<ReturnType<typeof serve>>((resolve, reject) => {
    const s = serve({ fetch: app.fetch, port, hostname: host }, () => resolve(s));
    s.once("error", reject);
  });
  const address = server.address() as AddressInfo;
  listeningPort = address.port;
  const urlHost = host.includes(":") ? `[${host}]` : host;
  let closed: Promise<void> | undefined;
  return {
    url: `http://${urlHost}:${address.port}`,
    engine,
    openRooms: () => rooms.size,
    close() {
      closed ??= (async () => {
        await engine.close();
        await new Promise<void>((resolve) => {
          server.close(() => resolve());
          (server as { closeAllConnections?: () => void }).closeAllConnections?.();
        });
      })();
      return closed;
    },
  };
}
