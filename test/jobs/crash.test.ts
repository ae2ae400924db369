/** @module A real `sluice serve` killed with SIGKILL mid-batch and started again on its data directory: every line answered exactly once. */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import OpenAI, { toFile } from "openai";
import { type SluiceChild, spawnSluice } from "../reliability/helpers.js";

const MODEL = "meta-llama/Llama-3.1-8B-Instruct";
const LINES = 48;
const dataDir = mkdtempSync(join(tmpdir(), "sluice-crash-"));
const children: SluiceChild[] = [];

after(async () => {
  for (const child of children) {
    if (child.child.exitCode === null && child.child.signalCode === null) {
      child.child.kill("SIGKILL");
      await child.exited;
    }
  }
  rmSync(dataDir, { recursive: true, force: true });
});

async function serve(): Promise<{ child: SluiceChild; url: string }> {
  const child = spawnSluice([
    "serve",
    "--port",
    "0",
    "--host",
    "127.0.0.1",
    "--sim-replicas",
    "2",
    "--data-dir",
    dataDir,
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
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

test("SIGKILL mid-batch, restart: lines running at the crash run again, none is lost or reported twice", async () => {
  const first = await serve();
  const client = sdk(first.url);
  // Long answers (hundreds of engine steps each) and more lines than run at once: the batch is still
  // running when its first answers are recorded, however slow the machine.
  const lines = Array.from({ length: LINES }, (_, i) =>
    JSON.stringify({
      custom_id: `line-${i}`,
      method: "POST",
      url: "/v1/chat/completions",
      body: { model: MODEL, messages: [{ role: "user", content: `item ${i}` }], max_tokens: 300 },
    }),
  );
  const input = await client.files.create({
    file: await toFile(Buffer.from(`${lines.join("\n")}\n`), "crash.jsonl"),
    purpose: "batch",
  });
  const batch = await client.batches.create({
    input_file_id: input.id,
    endpoint: "/v1/chat/completions",
    completion_window: "24h",
  });
  // An asynchronous single call in flight at the crash must survive it too.
  const accepted = await fetch(`${first.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", prefer: "respond-async" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "async" }], max_tokens: 300 }),
  });
  assert.equal(accepted.status, 202);
  const location = accepted.headers.get("location")!;

  const atCrash = await pollUntil(
    () => client.batches.retrieve(batch.id),
    (b) => (b.request_counts?.completed ?? 0) >= 1 || b.status === "completed",
    120_000,
    "the first recorded line",
  );
  first.child.child.kill("SIGKILL");
  assert.equal((await first.child.exited).signal, "SIGKILL");
  assert.equal(atCrash.status, "in_progress", "the batch must still be running when sluice is killed");
  assert.ok((atCrash.request_counts?.completed ?? 0) < LINES);

  const second = await serve();
  const again = sdk(second.url);
  const done = await pollUntil(
    () => again.batches.retrieve(batch.id),
    (b) => b.status === "completed",
    180_000,
    "the batch to complete after the restart",
  );
  assert.deepEqual(done.request_counts, { total: LINES, completed: LINES, failed: 0 });
  assert.equal(done.error_file_id, null);
  const output = (await (await again.files.content(done.output_file_id!)).text())
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as { id: string; custom_id: string; response: { status_code: number } });
  assert.equal(output.length, LINES);
  const ids = output.map((line) => line.custom_id).sort();
  assert.deepEqual(ids, lines.map((_, i) => `line-${i}`).sort());
  assert.equal(new Set(output.map((line) => line.id)).size, LINES);
  for (const line of output) assert.equal(line.response.status_code, 200);

  const job = await pollUntil(
    () => fetch(`${second.url}${location}`),
    (response) => response.status !== 202,
    120_000,
    "the asynchronous call",
  );
  assert.equal(job.status, 200);
  assert.equal(((await job.json()) as { object: string }).object, "chat.completion");

  second.child.child.kill("SIGTERM");
  const exit = await second.child.exited;
  assert.equal(exit.code, 0, second.child.output());
  // A graceful stop releases everything it held.
  assert.match(second.child.output(), /permits 0, reservations 0, window slots 0, queued 0/);
});
