/** @module The client over sluice's real HTTP app (in process): a tool-call loop, streams, 413s, 529 retries. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Registry } from "prom-client";
import { runAgent } from "../../adapters/client/example-agent.js";
import { httpClient } from "../../adapters/client/index.js";
import { SluiceError } from "../../adapters/client/types.js";
import { createApp } from "../../adapters/http/app.js";
import type { Scheduler } from "../../src/scheduler.js";
import { fastSim, MODEL, makeScheduler } from "../nats/nats-harness.js";

function inProcessFetch(app: ReturnType<typeof createApp>): typeof globalThis.fetch {
  return (input, init) => Promise.resolve(app.fetch(new Request(input, init)));
}

const IDLE = { permits: 0, reservations: 0, windowSlots: 0, queued: 0 };

describe("the client over HTTP", () => {
  let scheduler: Scheduler;
  let fetch: typeof globalThis.fetch;

  before(() => {
    scheduler = makeScheduler({ engines: [fastSim("http-0"), fastSim("http-1")] }).scheduler;
    fetch = inProcessFetch(createApp({ scheduler, registry: new Registry() }));
  });
  after(() => scheduler.stop());

  test("runs a tool-call loop of many steps on one session and closes it", async () => {
    const client = httpClient({ baseUrl: "http://sluice.test", fetch });
    const lines: string[] = [];
    const report = await runAgent({ client, steps: 12, maxTokens: 6, toolMs: 1, log: (l) => lines.push(l) });
    assert.equal(report.steps, 12);
    assert.equal(report.completionTokens, 72);
    assert.equal(lines.length, 12);
    const view = scheduler.getSession(report.sessionId);
    assert.equal(view?.state, "closed");
    assert.equal(view?.steps, 12);
    assert.deepEqual(scheduler.idleCheck(), IDLE);
  });

  test("streams a step chunk by chunk", async () => {
    const client = httpClient({ baseUrl: "http://sluice.test", fetch });
    const report = await runAgent({ client, steps: 3, maxTokens: 5, toolMs: 1, stream: true });
    assert.equal(report.steps, 3);
    assert.ok(report.chunks >= 3 * 5, `expected a chunk per token, got ${report.chunks}`);
    assert.equal(report.completionTokens, 15);
    assert.deepEqual(scheduler.idleCheck(), IDLE);
  });

  test("never retries a 413", async () => {
    let requests = 0;
    const counting: typeof globalThis.fetch = (input, init) => {
      requests++;
      return fetch(input, init);
    };
    const client = httpClient({ baseUrl: "http://sluice.test", fetch: counting });
    const err = await client
      .step(undefined, { model: MODEL, messages: [{ role: "user", content: "x" }], max_tokens: 500_000 })
      .catch((e: unknown) => e);
    assert.ok(err instanceof SluiceError);
    assert.equal(err.status, 413);
    assert.equal(err.code, "context_limit");
    assert.equal(err.attempts, 1);
    assert.equal(requests, 1);
    assert.ok(err.envelope?.error.limits, "the envelope's limits reach the caller");
  });

  test("fails fast with 503 when sluice cannot be reached", async () => {
    const client = httpClient({ baseUrl: "http://127.0.0.1:9", retry: { maxAttempts: 1 } });
    const err = await client.openSession().catch((e: unknown) => e);
    assert.ok(err instanceof SluiceError);
    assert.equal(err.status, 503);
    assert.equal(err.transportFailure, true);
  });
});

describe("the client against a gate with tiny limits", () => {
  let scheduler: Scheduler;
  let fetch: typeof globalThis.fetch;

  before(() => {
    scheduler = makeScheduler({
      engines: [fastSim("tiny-0")],
      config: { gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 0 } },
    }).scheduler;
    fetch = inProcessFetch(createApp({ scheduler, registry: new Registry() }));
  });
  after(() => scheduler.stop());

  test("retries a 529 after Retry-After and gets through once the gate frees", async () => {
    const client = httpClient({ baseUrl: "http://sluice.test", fetch, retry: { baseDelayMs: 10 } });
    // Retry-After comes from the gate's drain estimate; let it see completions first so the estimate is measured.
    for (let i = 0; i < 70; i++) {
      await client.step(undefined, {
        model: MODEL,
        messages: [{ role: "user", content: `warm ${i}` }],
        max_tokens: 1,
      });
    }
    const holder = client.step(undefined, {
      model: MODEL,
      messages: [{ role: "user", content: "hold" }],
      max_tokens: 150,
    });
    // Let the holder take the only permit before the second call arrives.
    while (scheduler.idleCheck().permits === 0) await new Promise((resolve) => setTimeout(resolve, 2));
    const second = await client.step(
      undefined,
      { model: MODEL, messages: [{ role: "user", content: "me too" }], max_tokens: 4 },
      { withinMs: 30_000 },
    );
    assert.equal(second.object, "chat.completion");
    await holder;
    const rejections = scheduler.state().rejections;
    assert.ok(
      (rejections.worker_overloaded ?? 0) >= 1,
      `expected a 529 on the way: ${JSON.stringify(rejections)}`,
    );
    assert.deepEqual(scheduler.idleCheck(), IDLE);
  });
});
