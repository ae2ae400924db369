/**
 * @module Two real `sluice serve --nats` frontends sharing jobs on JetStream; the one running a
 * batch is killed with SIGKILL mid-batch. The other takes the batch once its ack wait has passed and
 * finishes it: every line answered exactly once, the batch readable from every frontend.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import OpenAI, { toFile } from "openai";
import { type NatsServerProcess, startNatsServer } from "../../../adapters/nats/nats-server-process.js";
import { type SluiceChild, spawnSluice } from "../helpers.js";

const MODEL = "meta-llama/Llama-3.1-8B-Instruct";
const LINES = 48;
const scratch = mkdtempSync(join(tmpdir(), "sluice-js-kill-"));
const children: SluiceChild[] = [];
let nats: NatsServerProcess;

before(async () => {
  nats = await startNatsServer();
});

after(async () => {
  for (const child of children) {
    if (child.child.exitCode === null && child.child.signalCode === null) {
      child.child.kill("SIGKILL");
      await child.exited;
    }
  }
  await nats?.close();
  rmSync(scratch, { recursive: true, force: true });
});

async function serve(name: string): Promise<{ child: SluiceChild; url: string }> {
  const child = spawnSluice([
    "serve",
    "--port",
    "0",
    "--host",
    "127.0.0.1",
    "--sim-replicas",
    "2",
    "--nats",
    nats.url,
    // Unused with --nats (jobs live in JetStream), and each frontend's own: never a shared directory.
    "--data-dir",
    join(scratch, name),
  ]);
  children.push(child);
  const match = await child.waitFor(/listening on (http:\/\/[0-9.]+:\d+)/, 60_000);
  return { child, url: match[1]! };
}

function sdk(url: string): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: "not-checked", maxRetries: 0, timeout: 30_000 });
}

async function pollUntil<T>(
  read: () => Promise<T>,
  done: (value: T) => boolean,
  limitMs: number,
  what: string,
) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(value)}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The frontend's `sluice_batches_active` gauge: batches it runs now. */
async function batchesActive(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("sluice_batches_active "));
  return Number(line?.split(" ")[1] ?? Number.NaN);
}

test("SIGKILL of the frontend running a batch: the other frontend finishes it, every line answered exactly once", async () => {
  const first = await serve("a");
  const second = await serve("b");
  assert.match(first.child.output(), /jobs and files on JetStream/);
  const lines = Array.from({ length: LINES }, (_, i) =>
    JSON.stringify({
      custom_id: `line-${i}`,
      method: "POST",
      url: "/v1/chat/completions",
      body: { model: MODEL, messages: [{ role: "user", content: `item ${i}` }], max_tokens: 300 },
    }),
  );
  // Uploaded at one frontend, created at the other: files and batches are the fleet's.
  const input = await sdk(first.url).files.create({
    file: await toFile(Buffer.from(`${lines.join("\n")}\n`), "kill.jsonl"),
    purpose: "batch",
  });
  const batch = await sdk(second.url).batches.create({
    input_file_id: input.id,
    endpoint: "/v1/chat/completions",
    completion_window: "24h",
  });
  const holderUrl = await pollUntil(
    async () => {
      for (const f of [first, second]) if ((await batchesActive(f.url)) === 1) return f.url;
      return undefined;
    },
    (url) => url !== undefined,
    60_000,
    "a frontend to take the batch",
  );
  const [holder, other] = holderUrl === first.url ? [first, second] : [second, first];
  const atCrash = await pollUntil(
    () => sdk(other.url).batches.retrieve(batch.id),
    (b) => (b.request_counts?.completed ?? 0) >= 1,
    120_000,
    "the first recorded line",
  );
  assert.deepEqual(
    await sdk(holder.url).batches.retrieve(batch.id),
    await sdk(other.url).batches.retrieve(batch.id),
  );
  holder.child.child.kill("SIGKILL");
  assert.equal((await holder.child.exited).signal, "SIGKILL");
  assert.equal(atCrash.status, "in_progress", "the batch must still be running when its frontend is killed");

  // JetStream gives the batch to the survivor once the dead frontend's ack wait (30 s) has passed.
  const done = await pollUntil(
    () => sdk(other.url).batches.retrieve(batch.id),
    (b) => b.status === "completed",
    240_000,
    "the surviving frontend to complete the batch",
  );
  assert.deepEqual(done.request_counts, { total: LINES, completed: LINES, failed: 0 });
  assert.equal(done.error_file_id, null);
  const output = (await (await sdk(other.url).files.content(done.output_file_id!)).text())
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as { id: string; custom_id: string; response: { status_code: number } });
  assert.equal(output.length, LINES);
  assert.deepEqual(output.map((line) => line.custom_id).sort(), lines.map((_, i) => `line-${i}`).sort());
  assert.equal(new Set(output.map((line) => line.id)).size, LINES);
  for (const line of output) assert.equal(line.response.status_code, 200);

  // A frontend started afterwards reads the same batch.
  const third = await serve("c");
  assert.deepEqual(await sdk(third.url).batches.retrieve(batch.id), done);

  for (const f of [other, third]) {
    f.child.child.kill("SIGTERM");
    const exit = await f.child.exited;
    assert.equal(exit.code, 0, f.child.output());
    // A graceful stop releases everything it held.
    assert.match(f.child.output(), /permits 0, reservations 0, window slots 0, queued 0/);
  }
});
