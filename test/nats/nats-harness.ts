/** @module Helpers of the NATS tests: schedulers over fast simulated replicas in real time, request and stream helpers. */

import assert from "node:assert/strict";
import { headers as createHeaders, createInbox, type Msg, type MsgHdrs, type NatsConnection } from "nats";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { HEADERS } from "../../adapters/nats/protocol.js";
import { createTokenizer } from "../../adapters/tokenizers/index.js";
import { realClock } from "../../src/clock.js";
import type { SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import { Scheduler } from "../../src/scheduler.js";
import type { SessionDirectory, WindowAuthority } from "../../src/sessions/window-authority.js";

export const MODEL = "meta-llama/Llama-3.1-8B-Instruct";

const tokenizer = createTokenizer();

/**
 * A simulated replica fast enough for real-time tests: the 8B preset's
 * shape with a 2 ms step floor and per-token costs scaled down.
 */
export function fastSim(id = "sim-0", overrides: Record<string, unknown> = {}): SimEngine {
  return new SimEngine({
    id,
    clock: realClock,
    preset: { base: "h100-llama3-8b", c0: 2, cPrefill: 0.0005, cDec: 0.001, ...overrides },
  });
}

export interface SchedulerSetup {
  engines?: SimEngine[];
  config?: SchedulerConfigInput;
  windowAuthority?: WindowAuthority;
  sessionDirectory?: SessionDirectory;
}

/** A started scheduler (real clock) over the given simulated replicas (default one fast one). */
export function makeScheduler(setup: SchedulerSetup = {}): { scheduler: Scheduler; engines: SimEngine[] } {
  const engines = setup.engines ?? [fastSim()];
  const scheduler = new Scheduler({
    engines,
    tokenizer,
    config: { sessions: { controlIntervalMs: 200 }, ...setup.config },
    ...(setup.windowAuthority ? { windowAuthority: setup.windowAuthority } : {}),
    ...(setup.sessionDirectory ? { sessionDirectory: setup.sessionDirectory } : {}),
  });
  scheduler.start();
  return { scheduler, engines };
}

/** A chat body. */
export function chatBody(content: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { model: MODEL, messages: [{ role: "user", content }], max_tokens: 8, ...extra };
}

export function json(value: unknown): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(value));
}

export function hdrs(values: Record<string, string>): MsgHdrs {
  const h = createHeaders();
  for (const [key, value] of Object.entries(values)) h.set(key, value);
  return h;
}

/** Every message of a streamed call, up to and including the done marker. */
export async function streamMessages(
  nc: NatsConnection,
  subject: string,
  body: unknown,
  headerValues: Record<string, string> = {},
  timeoutMs = 20_000,
): Promise<Msg[]> {
  const inbox = createInbox();
  const sub = nc.subscribe(inbox, { timeout: timeoutMs });
  const messages: Msg[] = [];
  nc.publish(subject, json(body), {
    reply: inbox,
    headers: hdrs({ [HEADERS.stream]: "true", ...headerValues }),
  });
  for await (const msg of sub) {
    messages.push(msg);
    if (msg.headers?.get(HEADERS.done) === "true") break;
  }
  sub.unsubscribe();
  return messages;
}

/** Checks a service error: status, reason, envelope, and `Retry-After` on 429/503/529 only. */
export function assertServiceError(msg: Msg, status: number, code: string): Record<string, unknown> {
  const text = msg.string();
  assert.equal(
    msg.headers?.get(HEADERS.serviceErrorCode),
    String(status),
    `expected ${status} ${code}, got: ${text}`,
  );
  assert.equal(msg.headers?.get(HEADERS.serviceError), code);
  const body = JSON.parse(text) as { error: Record<string, unknown> };
  assert.equal(body.error.code, code);
  assert.equal(typeof body.error.type, "string");
  assert.ok(String(body.error.message).length > 0);
  assert.equal(body.error.request_id, msg.headers?.get(HEADERS.requestId));
  const retryAfter = msg.headers?.get(HEADERS.retryAfter) ?? "";
  if (status === 429 || status === 503 || status === 529) assert.match(retryAfter, /^[1-9][0-9]*$/);
  else assert.equal(retryAfter, "");
  return body.error;
}

/** Polls `done` on real time (never asserting on how long it took); throws with `what` when it never holds. */
export async function eventually(done: () => boolean, what: string, limitMs = 15_000): Promise<void> {
  const until = Date.now() + limitMs;
  while (!done()) {
    if (Date.now() > until) throw new Error(`never happened: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
