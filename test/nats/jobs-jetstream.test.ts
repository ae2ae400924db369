/**
 * @module Jobs on JetStream with two frontends in one process against a real nats-server: files,
 * batches, asynchronous calls and Idempotency-Keys seen from either frontend, and a frontend that
 * dies mid-batch, whose batch the other finishes with every line answered exactly once.
 */

import assert from "node:assert/strict";
import { after, afterEach, before, describe, test } from "node:test";
import { connect, type NatsConnection } from "nats";
import { createApp } from "../../adapters/http/app.js";
import { Jobs } from "../../adapters/jobs/index.js";
import { LINES_BUCKET, openJetStreamJobs } from "../../adapters/nats/jetstream-jobs.js";
import { KvIdempotencyKeys } from "../../adapters/nats/kv-idempotency.js";
import { type NatsServerProcess, startNatsServer } from "../../adapters/nats/nats-server-process.js";
import type { Scheduler } from "../../src/scheduler.js";
import { eventually, fastSim, MODEL, makeScheduler } from "./nats-harness.js";

/** Short enough that a dead frontend's batch comes back within the test, long enough for a loaded machine's heartbeats. */
const ACK_WAIT_MS = 3000;

interface Frontend {
  name: string;
  nc: NatsConnection;
  scheduler: Scheduler;
  jobs: Jobs;
  call(path: string, init?: RequestInit): Promise<Response>;
  dead: boolean;
}

let server: NatsServerProcess;
let frontends: Frontend[] = [];

before(async () => {
  server = await startNatsServer();
});

after(async () => {
  await server?.close();
});

afterEach(async () => {
  for (const f of frontends) {
    if (!f.dead) {
      // A close that hangs names itself rather than running into the file's time limit.
      let timer: NodeJS.Timeout | undefined;
      const hung = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`${f.name}: jobs.close() still waiting after 30 s`)),
          30_000,
        );
      });
      await Promise.race([f.jobs.close(), hung]).finally(() => clearTimeout(timer));
    }
    await f.scheduler.stop();
    if (!f.nc.isClosed()) await f.nc.close();
  }
  frontends = [];
  // Each test starts from an empty JetStream: the work queue and buckets of the last one are gone.
  const nc = await connect({ servers: server.url });
  const jsm = await nc.jetstreamManager();
  for await (const stream of jsm.streams.list()) await jsm.streams.delete(stream.config.name);
  await nc.close();
});

async function startFrontend(name: string, concurrency = 4): Promise<Frontend> {
  const nc = await connect({ servers: server.url, name });
  const { scheduler } = makeScheduler({ engines: [fastSim(`${name}-sim`)] });
  const backend = await openJetStreamJobs({ nc, ackWaitMs: ACK_WAIT_MS, takeWaitMs: 1000 });
  const jobs = await Jobs.open({ scheduler, backend, concurrency });
  const app = createApp({ scheduler, plugins: [jobs] });
  await jobs.start();
  const frontend: Frontend = {
    name,
    nc,
    scheduler,
    jobs,
    call: async (path, init) => app.request(path, init),
    dead: false,
  };
  frontends.push(frontend);
  return frontend;
}

function lineOf(id: string, maxTokens: number): string {
  return JSON.stringify({
    custom_id: id,
    method: "POST",
    url: "/v1/chat/completions",
    body: { model: MODEL, messages: [{ role: "user", content: `line ${id}` }], max_tokens: maxTokens },
  });
}

async function upload(f: Frontend, lines: string[]): Promise<string> {
  const form = new FormData();
  form.set("purpose", "batch");
  form.set("file", new Blob([`${lines.join("\n")}\n`]), "input.jsonl");
  const response = await f.call("/v1/files", { method: "POST", body: form });
  assert.equal(response.status, 200);
  return ((await response.json()) as { id: string }).id;
}

async function createBatch(f: Frontend, fileId: string): Promise<string> {
  const created = await f.call("/v1/batches", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      input_file_id: fileId,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
    }),
  });
  assert.equal(created.status, 200, await created.clone().text());
  return ((await created.json()) as { id: string }).id;
}

interface BatchView {
  id: string;
  status: string;
  request_counts: { total: number; completed: number; failed: number };
  output_file_id: string | null;
  error_file_id: string | null;
}

async function batchOf(f: Frontend, id: string): Promise<BatchView> {
  const response = await f.call(`/v1/batches/${id}`);
  assert.equal(response.status, 200);
  return (await response.json()) as BatchView;
}

async function pollBatch(f: Frontend, id: string, done: (b: BatchView) => boolean): Promise<BatchView> {
  // Well inside the file's time limit, so a batch stuck on the way fails here with its state.
  const deadline = Date.now() + 60_000;
  for (;;) {
    const batch = await batchOf(f, id);
    if (done(batch)) return batch;
    if (Date.now() > deadline) throw new Error(`batch ${id} never got there: ${JSON.stringify(batch)}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

async function outputLines(f: Frontend, fileId: string | null) {
  if (fileId === null) return [];
  const response = await f.call(`/v1/files/${fileId}/content`);
  assert.equal(response.status, 200);
  return (await response.text())
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as { id: string; custom_id: string; response: { status_code: number } });
}

/** Accepts a chat call `Prefer: respond-async` at a frontend; resolves to the job's Location. */
async function acceptAsync(f: Frontend, content: string, maxTokens: number): Promise<string> {
  const accepted = await f.call("/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json", prefer: "respond-async" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content }], max_tokens: maxTokens }),
  });
  assert.equal(accepted.status, 202);
  return accepted.headers.get("location")!;
}

/** Polls a job at a frontend until it is no longer pending. */
async function jobAnswer(f: Frontend, location: string): Promise<Response> {
  // Well inside the file's time limit, so a batch stuck on the way fails here with its state.
  const deadline = Date.now() + 60_000;
  let answer = await f.call(location);
  while (answer.status === 202) {
    if (Date.now() > deadline) assert.fail(`the call at ${location} never ran at ${f.name}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
    answer = await f.call(location);
  }
  return answer;
}

/** Every counter of a live frontend back at zero: runs, keys, permits, reservations, window slots. */
async function assertIdle(f: Frontend): Promise<void> {
  // A run ends (and its work is acknowledged) a moment after its answer is readable.
  await eventually(
    () => f.jobs.runner.running === 0 && f.jobs.runner.activeBatches === 0,
    `${f.name}: job calls and batches to end (running ${f.jobs.runner.running}, batches ${f.jobs.runner.activeBatches})`,
  );
  assert.equal(f.jobs.idempotency.inProgress, 0, `${f.name}: keys still running`);
  await eventually(
    () => {
      const held = f.scheduler.idleCheck();
      return held.permits + held.reservations + held.windowSlots + held.queued === 0;
    },
    `${f.name}: the scheduler to hold nothing (${JSON.stringify(f.scheduler.idleCheck())})`,
  );
}

describe("jobs on JetStream, two frontends", () => {
  test("a file uploaded at one frontend, its batch created at the other, read from both", async () => {
    const a = await startFrontend("a");
    const b = await startFrontend("b");
    const ids = Array.from({ length: 12 }, (_, i) => `s${i}`);
    const fileId = await upload(
      a,
      ids.map((id) => lineOf(id, 8)),
    );
    const batchId = await createBatch(b, fileId);
    const done = await pollBatch(a, batchId, (batch) => batch.status === "completed");
    assert.deepEqual(done.request_counts, { total: 12, completed: 12, failed: 0 });
    assert.deepEqual(await batchOf(b, batchId), done);
    const fromA = await outputLines(a, done.output_file_id);
    const fromB = await outputLines(b, done.output_file_id);
    assert.deepEqual(fromA, fromB);
    assert.deepEqual(fromA.map((line) => line.custom_id).sort(), [...ids].sort());
    assert.equal(done.error_file_id, null);
    // Lists are the fleet's, not one frontend's.
    const listed = (await (await b.call("/v1/batches")).json()) as { data: { id: string }[] };
    assert.deepEqual(
      listed.data.map((batch) => batch.id),
      [batchId],
    );
    const files = (await (await b.call("/v1/files")).json()) as { data: { id: string }[] };
    assert.ok(files.data.some((file) => file.id === fileId));
    assert.equal((await b.call(`/v1/files/${fileId}`, { method: "DELETE" })).status, 200);
    assert.equal((await a.call(`/v1/files/${fileId}`)).status, 404);
    for (const f of [a, b]) await assertIdle(f);
  });

  test("an asynchronous call accepted at one frontend is polled at the other", async () => {
    const a = await startFrontend("a");
    const b = await startFrontend("b");
    const location = await acceptAsync(a, "later", 8);
    const answer = await jobAnswer(b, location);
    assert.equal(answer.status, 200);
    assert.equal(answer.headers.get("x-sluice-job-status"), "completed");
    assert.equal(((await answer.json()) as { object: string }).object, "chat.completion");
    for (const f of [a, b]) await assertIdle(f);
  });

  test("an Idempotency-Key used at one frontend is known at the other", async () => {
    const a = await startFrontend("a");
    const b = await startFrontend("b");
    const post = (f: Frontend, key: string, content: string) =>
      f.call("/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": key },
        body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content }], max_tokens: 8 }),
      });
    const first = await post(a, "k-1", "once");
    assert.equal(first.status, 200);
    const firstBody = await first.text();
    const replay = await post(b, "k-1", "once");
    assert.equal(replay.status, 200);
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(await replay.text(), firstBody);
    const reused = await post(b, "k-1", "another body");
    assert.equal(reused.status, 422);
    assert.equal(((await reused.json()) as { error: { code: string } }).error.code, "idempotency_key_reused");
    // A batch created twice with one key, at two frontends, is one batch.
    const fileId = await upload(a, [lineOf("only", 4)]);
    const create = (f: Frontend) =>
      f.call("/v1/batches", {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": "batch-key" },
        body: JSON.stringify({
          input_file_id: fileId,
          endpoint: "/v1/chat/completions",
          completion_window: "24h",
        }),
      });
    const [one, two] = await Promise.all([create(a), create(b)]);
    const created = [one, two].filter((r) => r.status === 200);
    assert.ok(created.length >= 1, `statuses ${one.status} ${two.status}`);
    const batchIds = new Set(
      await Promise.all(created.map(async (r) => ((await r.json()) as { id: string }).id)),
    );
    assert.equal(batchIds.size, 1, "one batch for one key");
    for (const r of [one, two]) if (r.status !== 200) assert.equal(r.status, 409);
    const listed = (await (await b.call("/v1/batches")).json()) as { data: { id: string }[] };
    assert.equal(listed.data.length, 1);
    await pollBatch(b, [...batchIds][0]!, (batch) => batch.status === "completed");
    for (const f of [a, b]) await assertIdle(f);
  });

  test("a batch cancelled at the frontend that does not run it stops where it runs", async () => {
    const a = await startFrontend("a", 2);
    const b = await startFrontend("b", 2);
    const ids = Array.from({ length: 30 }, (_, i) => `c${i}`);
    const batchId = await createBatch(
      a,
      await upload(
        a,
        ids.map((id) => lineOf(id, 200)),
      ),
    );
    await eventually(
      () => a.jobs.runner.activeBatches + b.jobs.runner.activeBatches === 1,
      "a frontend to take the batch",
      30_000,
    );
    const [holder, other] = a.jobs.runner.activeBatches === 1 ? [a, b] : [b, a];
    await pollBatch(other, batchId, (batch) => batch.request_counts.completed >= 1);
    const cancelling = await other.call(`/v1/batches/${batchId}/cancel`, { method: "POST" });
    assert.equal(cancelling.status, 200);
    assert.equal(((await cancelling.json()) as BatchView).status, "cancelling");
    const done = await pollBatch(holder, batchId, (batch) => batch.status === "cancelled");
    assert.equal(done.request_counts.total, 30);
    const answered = [
      ...(await outputLines(other, done.output_file_id)),
      ...(await outputLines(other, done.error_file_id)),
    ];
    assert.deepEqual(answered.map((line) => line.custom_id).sort(), [...ids].sort());
    assert.ok(done.request_counts.completed < 30, "the cancel stopped lines that had not run");
    for (const f of [a, b]) await assertIdle(f);
  });

  test("an asynchronous call running at a frontend that dies is answered by the other", async () => {
    const a = await startFrontend("a");
    const location = await acceptAsync(a, "long", 3000);
    await eventually(() => a.jobs.runner.running === 1, "the call to run at the only frontend", 30_000);
    const b = await startFrontend("b");
    await a.nc.close();
    a.dead = true;
    // Its process stops too; the call's run is cut, unrecorded.
    await a.jobs.close();
    const answer = await jobAnswer(b, location);
    assert.equal(answer.status, 200);
    const completion = (await answer.json()) as { object: string; usage: { completion_tokens: number } };
    assert.equal(completion.object, "chat.completion");
    assert.ok(completion.usage.completion_tokens > 0);
    await assertIdle(b);
  });

  test("a frontend that dies mid-batch loses no line: the other finishes the batch, every line answered once", async () => {
    const a = await startFrontend("a");
    const b = await startFrontend("b");
    const LINES = 40;
    const ids = Array.from({ length: LINES }, (_, i) => `d${i}`);
    const fileId = await upload(
      a,
      ids.map((id) => lineOf(id, 200)),
    );
    const batchId = await createBatch(a, fileId);
    // Whichever frontend took the batch dies once it has recorded an answer and before it has all.
    await eventually(
      () => a.jobs.runner.activeBatches + b.jobs.runner.activeBatches === 1,
      "a frontend to take the batch",
      30_000,
    );
    const [holder, other] = a.jobs.runner.activeBatches === 1 ? [a, b] : [b, a];
    const atDeath = await pollBatch(other, batchId, (batch) => batch.request_counts.completed >= 1);
    assert.equal(atDeath.status, "in_progress", "the batch must still be running when its frontend dies");
    // Dying: the connection goes first (nothing more is recorded or acknowledged), then the process's work stops.
    await holder.nc.close();
    holder.dead = true;
    await holder.jobs.close().catch(() => {});

    const done = await pollBatch(other, batchId, (batch) => batch.status === "completed");
    assert.deepEqual(done.request_counts, { total: LINES, completed: LINES, failed: 0 });
    const output = await outputLines(other, done.output_file_id);
    assert.equal(output.length, LINES);
    assert.deepEqual(output.map((line) => line.custom_id).sort(), [...ids].sort());
    assert.equal(new Set(output.map((line) => line.id)).size, LINES);
    for (const line of output) assert.equal(line.response.status_code, 200);
    // One recorded answer per line in the bucket, however many times a line ran.
    const js = other.nc.jetstream();
    const lines = await js.views.kv(LINES_BUCKET);
    const keys: string[] = [];
    for await (const key of await lines.keys(`${batchId}.>`)) keys.push(key);
    assert.equal(keys.length, LINES);
    await assertIdle(other);
  });
});

describe("Idempotency-Keys in KV", () => {
  test("a key whose frontend died is free again once its claim lapses; a key still renewed is not", async () => {
    const dyingNc = await connect({ servers: server.url });
    const aliveNc = await connect({ servers: server.url });
    const dying = await KvIdempotencyKeys.open({ nc: dyingNc, runningLeaseMs: 1000 });
    const alive = await KvIdempotencyKeys.open({ nc: aliveNc, runningLeaseMs: 1000 });
    try {
      const renewed = await alive.begin("t", "renewed", "fp");
      assert.equal(renewed.kind, "new");
      assert.equal((await dying.begin("t", "orphan", "fp")).kind, "new");
      // Dies holding the key: no renewal, no finish.
      dying.close();
      await dyingNc.close();
      assert.equal((await alive.begin("t", "orphan", "fp")).kind, "in_progress");
      assert.equal((await alive.begin("t", "orphan", "another body")).kind, "reused");
      const deadline = Date.now() + 30_000;
      let retry = await alive.begin("t", "orphan", "fp");
      while (retry.kind !== "new") {
        if (Date.now() > deadline) assert.fail(`the lapsed claim was never free: ${retry.kind}`);
        await new Promise((resolve) => setTimeout(resolve, 100));
        retry = await alive.begin("t", "orphan", "fp");
      }
      // Past the dead claim's lease, the claim renewed all along still holds.
      assert.equal((await alive.begin("t", "renewed", "fp")).kind, "in_progress");
      await retry.finish({ fingerprint: "fp", status: 200, headers: {}, body: "answer" });
      const replay = await alive.begin("t", "orphan", "fp");
      assert.equal(replay.kind, "replay");
      assert.equal(replay.kind === "replay" && replay.record.body, "answer");
      if (renewed.kind === "new") renewed.abandon();
      await eventually(() => alive.inProgress === 0, "the abandoned key to be freed");
      // Another tenant's same key is another key.
      const other = await alive.begin("u", "orphan", "fp");
      assert.equal(other.kind, "new");
      if (other.kind === "new") other.abandon();
      assert.equal(alive.inProgress, 0);
    } finally {
      alive.close();
      await aliveNc.close();
    }
  });
});
