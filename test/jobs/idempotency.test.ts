/** @module Idempotency-Key and `Prefer: respond-async` over a real socket: replays, conflicts, tenants, restarts, the client's retries. */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, describe, test } from "node:test";
import { type RunningServer, type ServeOptions, startServer } from "../../adapters/cli/serve.js";
import { HttpTransport, SluiceClient } from "../../adapters/client/index.js";
import { ApiKeys } from "../../adapters/http/api-keys.js";
import { IdempotencyKeys, LmdbJobStore } from "../../adapters/jobs/index.js";

const MODEL = "meta-llama/Llama-3.1-8B-Instruct";
const dirs: string[] = [];
let server: RunningServer | undefined;

function newDataDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "sluice-idem-"));
  dirs.push(dir);
  return dir;
}

async function start(options: ServeOptions = {}): Promise<RunningServer> {
  server = await startServer({
    port: 0,
    host: "127.0.0.1",
    simReplicas: 1,
    log: () => {},
    drainTimeoutMs: 1000,
    ...options,
  });
  return server;
}

afterEach(async () => {
  await server?.close();
  server = undefined;
});

after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
}

const chat = (content: string, extra: Record<string, unknown> = {}) => ({
  model: MODEL,
  messages: [{ role: "user", content }],
  max_tokens: 8,
  ...extra,
});

async function idle(s: RunningServer): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const held = s.scheduler.idleCheck();
    if (held.permits + held.reservations + held.queued === 0) return;
    if (Date.now() > deadline) assert.fail(`scheduler still holds ${JSON.stringify(held)}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("Idempotency-Key", () => {
  test("a retry with the same key and body gets the stored response, not a second run", async () => {
    const s = await start();
    const first = await post(`${s.url}/v1/chat/completions`, chat("hello"), { "idempotency-key": "k-1" });
    assert.equal(first.status, 200);
    const firstBody = (await first.json()) as { id: string };
    const again = await post(`${s.url}/v1/chat/completions`, chat("hello"), { "idempotency-key": "k-1" });
    assert.equal(again.status, 200);
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal(again.headers.get("x-sluice-lane"), first.headers.get("x-sluice-lane"));
    assert.deepEqual(await again.json(), firstBody);
    // Without a key every call runs.
    const fresh = (await (await post(`${s.url}/v1/chat/completions`, chat("hello"))).json()) as {
      id: string;
    };
    assert.notEqual(fresh.id, firstBody.id);
    await idle(s);
  });

  test("the same key with another body is 422 idempotency_key_reused in the project's envelope", async () => {
    const s = await start();
    await (await post(`${s.url}/v1/chat/completions`, chat("one"), { "idempotency-key": "k-2" })).text();
    const reused = await post(`${s.url}/v1/chat/completions`, chat("two"), { "idempotency-key": "k-2" });
    assert.equal(reused.status, 422);
    const body = (await reused.json()) as { error: Record<string, unknown> };
    assert.equal(body.error.code, "idempotency_key_reused");
    assert.equal(body.error.type, "invalid_request_error");
    assert.equal(body.error.param, "idempotency-key");
    assert.equal(typeof body.error.request_id, "string");
    // The same key on another path is another request too.
    const otherPath = await post(
      `${s.url}/v1/completions`,
      { model: MODEL, prompt: "one", max_tokens: 4 },
      {
        "idempotency-key": "k-2",
      },
    );
    assert.equal(otherPath.status, 422);
  });

  test("a retry while the first still runs is 409 idempotency_in_progress with Retry-After; then the replay", async () => {
    // Slow steps keep the first call running while the retry arrives.
    const s = await start({ simPreset: { base: "h100-llama3-8b", c0: 20 } });
    const body = chat("a long answer", { max_tokens: 60, stream: true });
    const first = await post(`${s.url}/v1/chat/completions`, body, { "idempotency-key": "k-3" });
    assert.equal(first.status, 200);
    const retry = await post(`${s.url}/v1/chat/completions`, body, { "idempotency-key": "k-3" });
    assert.equal(retry.status, 409);
    assert.ok(Number(retry.headers.get("retry-after")) >= 1);
    const envelope = (await retry.json()) as { error: { code: string } };
    assert.equal(envelope.error.code, "idempotency_in_progress");
    const streamed = await first.text();
    assert.match(streamed, /data: \[DONE\]/);
    let replay: Response | undefined;
    const deadline = Date.now() + 10_000;
    for (;;) {
      replay = await post(`${s.url}/v1/chat/completions`, body, { "idempotency-key": "k-3" });
      if (replay.status !== 409 || Date.now() > deadline) break;
      await replay.text();
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal(replay.status, 200);
    assert.match(replay.headers.get("content-type") ?? "", /text\/event-stream/);
    assert.equal(await replay.text(), streamed);
    await idle(s);
  });

  test("a client that leaves mid-stream frees its key: the retry runs anew", async () => {
    const s = await start({ simPreset: { base: "h100-llama3-8b", c0: 20 } });
    const body = chat("a long answer", { max_tokens: 200, stream: true });
    const leaving = new AbortController();
    const first = await fetch(`${s.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "idempotency-key": "k-leave" },
      body: JSON.stringify(body),
      signal: leaving.signal,
    });
    const reader = first.body!.getReader();
    await reader.read();
    leaving.abort();
    await reader.cancel().catch(() => {});
    let retry: Response;
    const deadline = Date.now() + 10_000;
    for (;;) {
      retry = await post(
        `${s.url}/v1/chat/completions`,
        { ...body, max_tokens: 200 },
        { "idempotency-key": "k-leave" },
      );
      if (retry.status !== 409 || Date.now() > deadline) break;
      await retry.text();
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.equal(retry.status, 200);
    assert.equal(retry.headers.get("idempotent-replayed"), null);
    assert.match(await retry.text(), /data: \[DONE\]/);
    await idle(s);
  });

  test("refusals that say 'later' free the key; validation errors are kept", async () => {
    const s = await start();
    const bad = await post(
      `${s.url}/v1/chat/completions`,
      { model: MODEL, messages: [] },
      { "idempotency-key": "k-4" },
    );
    assert.equal(bad.status, 400);
    const badAgain = await post(
      `${s.url}/v1/chat/completions`,
      { model: MODEL, messages: [] },
      {
        "idempotency-key": "k-4",
      },
    );
    assert.equal(badAgain.status, 400);
    assert.equal(badAgain.headers.get("idempotent-replayed"), "true");
    const invalidKey = await post(`${s.url}/v1/chat/completions`, chat("x"), { "idempotency-key": "" });
    assert.equal(invalidKey.status, 400);
  });

  test("keys are scoped to the API key's tenant", async () => {
    const keys = await ApiKeys.fromEnv({
      SLUICE_API_KEYS: JSON.stringify({
        "key-alpha-123": { tenant: "alpha" },
        "key-beta-456": { tenant: "beta" },
      }),
    });
    const s = await start({ keys });
    const alpha = await post(`${s.url}/v1/chat/completions`, chat("alpha"), {
      "idempotency-key": "shared",
      authorization: "Bearer key-alpha-123",
    });
    assert.equal(alpha.status, 200);
    await alpha.text();
    // Another tenant, another body, same key: its own request, not a reuse.
    const beta = await post(`${s.url}/v1/chat/completions`, chat("beta"), {
      "idempotency-key": "shared",
      authorization: "Bearer key-beta-456",
    });
    assert.equal(beta.status, 200);
    assert.equal(beta.headers.get("idempotent-replayed"), null);
    await beta.text();
    const unauthorized = await post(`${s.url}/v1/chat/completions`, chat("alpha"), {
      "idempotency-key": "shared",
    });
    assert.equal(unauthorized.status, 401);
  });

  test("a stored response survives a restart on the same data directory", async () => {
    const dataDir = newDataDir();
    const s1 = await start({ dataDir });
    const first = (await (
      await post(`${s1.url}/v1/chat/completions`, chat("durable"), { "idempotency-key": "k-5" })
    ).json()) as { id: string };
    await s1.close();
    server = undefined;
    const s2 = await start({ dataDir });
    const replay = await post(`${s2.url}/v1/chat/completions`, chat("durable"), { "idempotency-key": "k-5" });
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(((await replay.json()) as { id: string }).id, first.id);
  });

  test("two creations of one batch with one key at once make one batch", async () => {
    const s = await start();
    const form = new FormData();
    form.set("purpose", "batch");
    const line = { custom_id: "x", method: "POST", url: "/v1/chat/completions", body: chat("x") };
    form.set("file", new Blob([`${JSON.stringify(line)}\n`]), "in.jsonl");
    const file = (await (await fetch(`${s.url}/v1/files`, { method: "POST", body: form })).json()) as {
      id: string;
    };
    const create = () =>
      post(
        `${s.url}/v1/batches`,
        { input_file_id: file.id, endpoint: "/v1/chat/completions", completion_window: "24h" },
        { "idempotency-key": "batch-once" },
      );
    const [a, b] = await Promise.all([create(), create()]);
    assert.equal(a.status, 200);
    assert.equal(b.status, 200);
    const [batchA, batchB] = (await Promise.all([a.json(), b.json()])) as { id: string }[];
    assert.equal(batchA?.id, batchB?.id);
    const list = (await (await fetch(`${s.url}/v1/batches`)).json()) as { data: { id: string }[] };
    assert.equal(list.data.length, 1);
  });

  test("the client sends one key for all attempts of a call: a lost answer is replayed, not run again", async () => {
    const s = await start();
    const seen: { key: string | null; status: number; body: string }[] = [];
    let dropped = false;
    const fetchOnce: typeof fetch = async (input, init) => {
      const response = await fetch(input, init);
      const key = new Headers(init?.headers).get("idempotency-key");
      const body = await response.text();
      seen.push({ key, status: response.status, body });
      if (!dropped) {
        // The server ran the call; its answer is lost on the way back.
        dropped = true;
        throw new TypeError("fetch failed: connection reset");
      }
      return new Response(body, { status: response.status, headers: response.headers });
    };
    const client = new SluiceClient({
      transport: new HttpTransport({ baseUrl: s.url, fetch: fetchOnce }),
      retry: { baseDelayMs: 1, maxDelayMs: 5 },
    });
    const completion = await client.step(undefined, chat("lost answer"));
    assert.equal(seen.length, 2);
    assert.ok(seen[0]?.key);
    assert.equal(seen[1]?.key, seen[0]?.key);
    assert.equal(completion.id, (JSON.parse(seen[0]!.body) as { id: string }).id);
    await idle(s);
  });

  test("responses kept are bounded: the oldest is forgotten first", async () => {
    const store = await LmdbJobStore.open();
    try {
      const keys = new IdempotencyKeys({ store, maxRecords: 2 });
      for (const key of ["a", "b", "c"]) {
        const state = await keys.begin("t", key, `print-${key}`);
        assert.equal(state.kind, "new");
        if (state.kind === "new") {
          await state.finish({ fingerprint: `print-${key}`, status: 200, headers: {}, body: key });
        }
      }
      assert.equal(keys.size, 2);
      assert.equal(keys.inProgress, 0);
      assert.equal((await keys.begin("t", "c", "print-c")).kind, "replay");
      const forgotten = await keys.begin("t", "a", "print-a");
      assert.equal(forgotten.kind, "new");
      if (forgotten.kind === "new") forgotten.abandon();
      assert.equal(keys.inProgress, 0);
    } finally {
      await store.close();
    }
  });
});

describe("Prefer: respond-async", () => {
  async function poll(url: string): Promise<Response> {
    const deadline = Date.now() + 30_000;
    for (;;) {
      const response = await fetch(url);
      if (response.status !== 202) return response;
      assert.ok(Number(response.headers.get("retry-after")) >= 1);
      await response.text();
      if (Date.now() > deadline) assert.fail("the job did not finish");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  test("202 with Location and Retry-After; the finished job returns the completion", async () => {
    const s = await start();
    const accepted = await post(`${s.url}/v1/chat/completions`, chat("later please"), {
      prefer: "respond-async, wait=0",
      "x-sluice-lane": "bulk",
    });
    assert.equal(accepted.status, 202);
    assert.equal(accepted.headers.get("preference-applied"), "respond-async");
    assert.ok(Number(accepted.headers.get("retry-after")) >= 1);
    const location = accepted.headers.get("location");
    assert.match(location ?? "", /^\/v1\/jobs\/job_/);
    const job = (await accepted.json()) as { id: string; status: string };
    assert.equal(job.status, "queued");
    const done = await poll(`${s.url}${location}`);
    assert.equal(done.status, 200);
    assert.equal(done.headers.get("x-sluice-lane"), "bulk");
    const completion = (await done.json()) as { object: string; choices: unknown[] };
    assert.equal(completion.object, "chat.completion");
    assert.equal(completion.choices.length, 1);
    await idle(s);
  });

  test("legacy completions and the Responses API too; a bad body is refused at once; an unknown job is 404", async () => {
    const s = await start();
    const accepted = await post(
      `${s.url}/v1/completions`,
      { model: MODEL, prompt: "once upon", max_tokens: 4 },
      { prefer: "respond-async" },
    );
    assert.equal(accepted.status, 202);
    const done = await poll(`${s.url}${accepted.headers.get("location")}`);
    assert.equal(((await done.json()) as { object: string }).object, "text_completion");
    const responses = await post(
      `${s.url}/v1/responses`,
      { model: MODEL, input: "once upon", max_output_tokens: 4 },
      { prefer: "respond-async" },
    );
    assert.equal(responses.status, 202);
    const answered = await poll(`${s.url}${responses.headers.get("location")}`);
    assert.equal(((await answered.json()) as { object: string }).object, "response");
    const oddConversation = await post(
      `${s.url}/v1/responses`,
      { model: MODEL, input: "x", conversation: "has space" },
      { prefer: "respond-async" },
    );
    assert.equal(oddConversation.status, 400);
    assert.equal(
      ((await oddConversation.json()) as { error: { param: string } }).error.param,
      "conversation",
    );
    const bad = await post(
      `${s.url}/v1/chat/completions`,
      { model: MODEL, messages: [] },
      { prefer: "respond-async" },
    );
    assert.equal(bad.status, 400);
    const unknown = await fetch(`${s.url}/v1/jobs/job_nope`);
    assert.equal(unknown.status, 404);
    assert.equal(((await unknown.json()) as { error: { code: string } }).error.code, "job_not_found");
    await idle(s);
  });

  test("a retried respond-async request with the same key gets the same job", async () => {
    const s = await start();
    const headers = { prefer: "respond-async", "idempotency-key": "job-key" };
    const a = await post(`${s.url}/v1/chat/completions`, chat("once"), headers);
    const b = await post(`${s.url}/v1/chat/completions`, chat("once"), headers);
    assert.equal(a.status, 202);
    assert.equal(b.status, 202);
    assert.equal(b.headers.get("location"), a.headers.get("location"));
    await poll(`${s.url}${a.headers.get("location")}`);
    await idle(s);
  });
});
