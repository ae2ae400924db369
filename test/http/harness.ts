/** @module In-process harness for the HTTP API: a real scheduler over simulated replicas in virtual time. */

import assert from "node:assert/strict";
import { Registry } from "prom-client";
import type { PresetOverrides } from "../../adapters/engines/sim/presets.js";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { ApiKeys } from "../../adapters/http/api-keys.js";
import { createApp } from "../../adapters/http/app.js";
import type { Logger } from "../../adapters/log/logger.js";
import { createTokenizer } from "../../adapters/tokenizers/index.js";
import { VirtualClock } from "../../src/clock.js";
import type { SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import type { Engine, EngineCall, EngineResult, EngineStream } from "../../src/engine.js";
import { EngineError } from "../../src/errors.js";
import { Scheduler } from "../../src/scheduler.js";

export interface HarnessOptions {
  replicas?: number;
  preset?: PresetOverrides;
  config?: SchedulerConfigInput;
  keys?: Record<string, { tenant: string; priority?: number; rps?: number; burst?: number; admin?: boolean }>;
  adminKey?: string;
  bodyLimitBytes?: number;
  cors?: { origins: string[] | "*" };
  /** Wraps each engine (fault injection). */
  wrap?: (engine: Engine) => Engine;
  /** The operator's log the app writes to (silent when omitted). */
  logger?: Logger;
  /** `--tenant-header`: the trusted gateway's tenant header. */
  tenantHeader?: string;
}

export const MODEL = "meta-llama/Llama-3.1-8B-Instruct";

const tokenizer = createTokenizer();

export function makeHarness(options: HarnessOptions = {}) {
  const clock = new VirtualClock();
  const engines: Engine[] = Array.from({ length: options.replicas ?? 2 }, (_, i) => {
    const engine = new SimEngine({
      id: `sim-${i}`,
      clock,
      preset: { base: "h100-llama3-8b", ...options.preset },
    });
    return options.wrap ? options.wrap(engine) : engine;
  });
  const scheduler = new Scheduler({
    engines,
    clock,
    tokenizer,
    ...(options.config ? { config: options.config } : {}),
  });
  scheduler.start();
  const registry = new Registry();
  const keys = options.keys ? new ApiKeys(options.keys, { clock }) : undefined;
  const app = createApp({
    scheduler,
    registry,
    clock,
    ...(options.logger ? { logger: options.logger } : {}),
    ...(keys ? { keys } : {}),
    ...(options.adminKey ? { adminKey: options.adminKey } : {}),
    ...(options.bodyLimitBytes ? { bodyLimitBytes: options.bodyLimitBytes } : {}),
    ...(options.cors ? { cors: options.cors } : {}),
    ...(options.tenantHeader ? { tenantHeader: options.tenantHeader } : {}),
  });

  /** Runs virtual time (and the promise continuations it wakes) until `promise` settles. */
  async function drive<T>(promise: Promise<T>): Promise<T> {
    let settled = false;
    const watched = promise.finally(() => {
      settled = true;
    });
    watched.catch(() => {});
    for (let rounds = 0; !settled; rounds++) {
      if (rounds > 1000) throw new Error("drive: the promise did not settle");
      await clock.runAsyncUntil(() => settled, 200_000);
    }
    return watched;
  }

  function request(path: string, init: RequestInit & { json?: unknown } = {}): Promise<Response> {
    const { json, ...rest } = init;
    const headers = new Headers(rest.headers);
    if (json !== undefined && !headers.has("content-type")) headers.set("content-type", "application/json");
    return Promise.resolve(
      app.request(path, { ...rest, headers, ...(json !== undefined ? { body: JSON.stringify(json) } : {}) }),
    );
  }

  /** Sends a request and runs virtual time until its response (head and, with `read`, body) is there. */
  async function call(path: string, init: RequestInit & { json?: unknown } = {}) {
    const response = await drive(request(path, init));
    const text = await drive(response.text());
    return { response, text, json: () => JSON.parse(text) };
  }

  async function close() {
    app.close();
    await scheduler.stop();
    await Promise.all(engines.map((engine) => engine.close?.()));
  }

  return { clock, scheduler, registry, app, engines, drive, request, call, close };
}

export type Harness = ReturnType<typeof makeHarness>;

/** A chat body; `words` repeats a word to make the prompt long. */
export function chat(extra: Record<string, unknown> = {}, words = 3): Record<string, unknown> {
  return {
    model: MODEL,
    messages: [{ role: "user", content: Array.from({ length: words }, (_, i) => `word${i % 50}`).join(" ") }],
    max_tokens: 8,
    ...extra,
  };
}

/** Parses an SSE body into its events. */
export function parseSse(text: string): { event: string; data: string }[] {
  const events: { event: string; data: string }[] = [];
  for (const block of text.split("\n\n")) {
    if (block.trim() === "") continue;
    let event = "message";
    const data: string[] = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
    }
    events.push({ event, data: data.join("\n") });
  }
  return events;
}

/** Checks a refusal response: status, envelope code, request id and (for 429/503/529) Retry-After. */
export function assertRefusal(
  response: Response,
  text: string,
  status: number,
  code: string,
  extra: { param?: string | null; requestId?: string } = {},
): Record<string, unknown> {
  assert.equal(response.status, status, `expected ${status} ${code}, got ${response.status}: ${text}`);
  const body = JSON.parse(text) as { error: Record<string, unknown> };
  assert.equal(body.error.code, code, text);
  assert.equal(typeof body.error.message, "string");
  assert.ok((body.error.message as string).length > 0);
  assert.equal(typeof body.error.type, "string");
  const requestId = response.headers.get("x-request-id");
  assert.ok(requestId, "x-request-id header missing");
  assert.equal(body.error.request_id, requestId);
  if (extra.requestId !== undefined) assert.equal(requestId, extra.requestId);
  if (extra.param !== undefined) assert.equal(body.error.param, extra.param);
  assert.match(response.headers.get("content-type") ?? "", /application\/json/);
  if (status === 429 || status === 503 || status === 529) {
    const retryAfter = response.headers.get("retry-after");
    assert.ok(retryAfter !== null, `${status} ${code} without Retry-After`);
    assert.match(retryAfter, /^[1-9][0-9]*$/, `Retry-After must be whole seconds ≥ 1, got ${retryAfter}`);
  } else if (status < 500) {
    assert.equal(response.headers.get("retry-after"), null, `${status} ${code} must not carry Retry-After`);
  }
  return body.error;
}

/** Asserts every counter of the scheduler is back at zero. */
export function assertIdle(scheduler: Scheduler): void {
  assert.deepEqual(scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
}

/** Wraps an engine so that each call's stream fails with `EngineError` after `chunks` chunks. */
export function failingAfter(engine: Engine, chunks: number): Engine {
  return Object.assign(Object.create(engine) as Engine, {
    async generate(call: EngineCall): Promise<EngineStream> {
      const inner = await engine.generate(call);
      const failure = new EngineError("upstream connection reset");
      let fail!: (err: unknown) => void;
      const result = new Promise<EngineResult>((_, reject) => {
        fail = reject;
      });
      result.catch(() => {});
      inner.result.catch(() => {});
      return {
        firstToken: inner.firstToken,
        result,
        async *[Symbol.asyncIterator]() {
          let seen = 0;
          for await (const chunk of inner) {
            if (seen++ >= chunks) break;
            yield chunk;
          }
          fail(failure);
          throw failure;
        },
      };
    },
  });
}

/** Wraps an engine so that its chunks carry `raw` upstream SSE bytes, ending with the upstream's own `[DONE]`. */
export function rawSse(engine: Engine): Engine {
  const encoder = new TextEncoder();
  return Object.assign(Object.create(engine) as Engine, {
    async generate(call: EngineCall): Promise<EngineStream> {
      const inner = await engine.generate(call);
      return {
        firstToken: inner.firstToken,
        result: inner.result,
        async *[Symbol.asyncIterator]() {
          let n = 0;
          for await (const chunk of inner) {
            yield {
              ...chunk,
              raw: encoder.encode(`data: {"upstream":${n++},"text":${JSON.stringify(chunk.text)}}\n\n`),
            };
          }
          yield { tokens: [], tokenCount: 0, text: "", raw: encoder.encode("data: [DONE]\n\n") };
        },
      };
    },
  });
}
