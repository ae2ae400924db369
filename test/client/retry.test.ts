/** @module The client's retry policy in virtual time: Retry-After, jittered backoff, deadlines, 413s, streams. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { SluiceClient } from "../../adapters/client/client.js";
import {
  type ChatChunk,
  type ChatCompletion,
  type SessionInfo,
  SluiceError,
  type SluiceTransport,
  type TransportCall,
} from "../../adapters/client/types.js";
import { VirtualClock } from "../../src/clock.js";

type Outcome = SluiceError | "ok";

/** A transport that answers each attempt with the next scripted outcome and records when it was called. */
class ScriptedTransport implements SluiceTransport {
  readonly kind = "http" as const;
  readonly calls: { at: number; call: TransportCall }[] = [];
  constructor(
    private readonly clock: VirtualClock,
    private readonly script: Outcome[],
    private readonly chunksBeforeFailure = 0,
  ) {}

  private next(call: TransportCall): Outcome {
    this.calls.push({ at: this.clock.now(), call });
    return this.script.shift() ?? "ok";
  }

  async chat(call: TransportCall): Promise<ChatCompletion> {
    const outcome = this.next(call);
    if (outcome !== "ok") throw outcome;
    return { id: "c", object: "chat.completion", model: "m", choices: [] };
  }

  async *chatStream(call: TransportCall): AsyncGenerator<ChatChunk> {
    const outcome = this.next(call);
    for (let i = 0; i < (outcome === "ok" ? 3 : this.chunksBeforeFailure); i++) {
      yield {
        id: "c",
        object: "chat.completion.chunk",
        choices: [{ index: 0, delta: { content: `${i}` }, finish_reason: null }],
      };
    }
    if (outcome !== "ok") throw outcome;
  }

  async openSession(): Promise<SessionInfo> {
    const outcome = this.next({ body: { messages: [] }, requestId: "open", timeoutMs: 0 });
    if (outcome !== "ok") throw outcome;
    return { id: "s1", state: "waiting" };
  }

  async getSession(id: string): Promise<SessionInfo> {
    return { id, state: "active" };
  }

  async closeSession(): Promise<void> {}
}

function refusal(status: number, code: string, retryAfterSeconds?: number): SluiceError {
  return new SluiceError(`${status} ${code}`, {
    status,
    code,
    ...(retryAfterSeconds ? { retryAfterSeconds } : {}),
  });
}

function setup(
  script: Outcome[],
  options: { random?: number; chunksBeforeFailure?: number; maxAttempts?: number } = {},
) {
  const clock = new VirtualClock(1_000_000);
  const transport = new ScriptedTransport(clock, script, options.chunksBeforeFailure);
  const client = new SluiceClient({
    transport,
    clock,
    random: () => options.random ?? 0.5,
    retry: {
      baseDelayMs: 100,
      maxDelayMs: 1000,
      ...(options.maxAttempts ? { maxAttempts: options.maxAttempts } : {}),
    },
  });
  /** Runs virtual time until the promise settles. */
  async function drive<T>(promise: Promise<T>): Promise<T> {
    let settled = false;
    const watched = promise.finally(() => {
      settled = true;
    });
    watched.catch(() => {});
    await clock.runAsyncUntil(() => settled);
    return watched;
  }
  return { clock, transport, client, drive };
}

const body = { messages: [{ role: "user", content: "hi" }] };

describe("retries", () => {
  test("wait at least Retry-After, plus jittered exponential backoff, then succeed", async () => {
    const { transport, client, drive } = setup(
      [refusal(429, "queue_full", 2), refusal(529, "worker_overloaded", 1)],
      {
        random: 0,
      },
    );
    await drive(client.step("s1", body));
    const [first, second, third] = transport.calls.map((c) => c.at);
    // Attempt 0 backs off 100 ms (half fixed with random() = 0): 2 s + 50 ms; attempt 1: 1 s + 100 ms.
    assert.equal(second! - first!, 2050);
    assert.equal(third! - second!, 1100);
    assert.equal(transport.calls.length, 3);
    // Every attempt of one call carries the same request id, and a session header.
    assert.equal(new Set(transport.calls.map((c) => c.call.requestId)).size, 1);
    assert.equal(transport.calls[0]!.call.sessionId, "s1");
  });

  test("jitter spreads clients refused together", async () => {
    const low = setup([refusal(503, "unavailable", 1)], { random: 0 });
    const high = setup([refusal(503, "unavailable", 1)], { random: 0.999 });
    await low.drive(low.client.step(undefined, body));
    await high.drive(high.client.step(undefined, body));
    const gap = (s: ReturnType<typeof setup>) => s.transport.calls[1]!.at - s.transport.calls[0]!.at;
    assert.ok(gap(low) >= 1000 && gap(high) >= 1000, "never sooner than Retry-After");
    assert.ok(gap(high) > gap(low), `jitter should differ: ${gap(low)} vs ${gap(high)}`);
    assert.ok(gap(high) <= 1100);
  });

  test("backoff grows exponentially and is capped", () => {
    const { client } = setup([], { random: 1 - Number.EPSILON });
    const waits = [0, 1, 2, 3, 4, 5].map((k) => Math.round(client.backoffMs(k, undefined)));
    assert.deepEqual(waits, [100, 200, 400, 800, 1000, 1000]);
  });

  test("never retry a 413, nor any other 4xx but 429", async () => {
    for (const [status, code] of [
      [413, "context_limit"],
      [413, "overflow"],
      [400, "invalid_request"],
      [404, "session_not_found"],
    ] as const) {
      const { transport, client, drive } = setup([refusal(status, code)]);
      const err = await drive(client.step("s1", body)).catch((e: unknown) => e);
      assert.ok(err instanceof SluiceError);
      assert.equal(err.code, code);
      assert.equal(err.attempts, 1);
      assert.equal(transport.calls.length, 1);
    }
  });

  test("give up at the absolute deadline rather than wait past it", async () => {
    const { clock, transport, client, drive } = setup([refusal(429, "queue_full", 10)]);
    const start = clock.now();
    const err = await drive(client.step("s1", body, { deadline: start + 5000 })).catch((e: unknown) => e);
    assert.ok(err instanceof SluiceError);
    assert.equal(err.code, "queue_full");
    assert.equal(transport.calls.length, 1);
    assert.equal(clock.now(), start, "no time was spent waiting for a retry that could not happen");
    // The per-attempt limit is the time left before the deadline.
    assert.equal(transport.calls[0]!.call.timeoutMs, 5000);
  });

  test("stop after maxAttempts with the last refusal", async () => {
    const script = Array.from({ length: 10 }, () => refusal(503, "unavailable", 1));
    const { transport, client, drive } = setup(script, { maxAttempts: 3 });
    const err = await drive(client.openSession()).catch((e: unknown) => e);
    assert.ok(err instanceof SluiceError);
    assert.equal(err.attempts, 3);
    assert.equal(transport.calls.length, 3);
  });

  test("an abort during the backoff wait rejects at once with its reason", async () => {
    const { clock, client } = setup([refusal(429, "queue_full", 30)]);
    const controller = new AbortController();
    const pending = client.step("s1", body, { signal: controller.signal });
    await clock.advanceAsync(1000);
    controller.abort(new Error("agent stopped"));
    await assert.rejects(pending, /agent stopped/);
  });
});

describe("streams", () => {
  test("are retried before their first chunk", async () => {
    const { transport, client, drive } = setup([refusal(529, "worker_overloaded", 1)]);
    const chunks = await drive(
      (async () => {
        const out: string[] = [];
        for await (const chunk of client.stream("s1", body))
          out.push(String(chunk.choices[0]!.delta.content));
        return out;
      })(),
    );
    assert.deepEqual(chunks, ["0", "1", "2"]);
    assert.equal(transport.calls.length, 2);
  });

  test("are not retried once a chunk arrived", async () => {
    const { transport, client, drive } = setup([refusal(502, "unavailable")], { chunksBeforeFailure: 2 });
    const seen: string[] = [];
    const err = await drive(
      (async () => {
        for await (const chunk of client.stream("s1", body))
          seen.push(String(chunk.choices[0]!.delta.content));
      })(),
    ).catch((e: unknown) => e);
    assert.ok(err instanceof SluiceError);
    assert.deepEqual(seen, ["0", "1"]);
    assert.equal(transport.calls.length, 1);
  });
});
