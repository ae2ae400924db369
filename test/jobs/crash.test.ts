/** @module A real `sluice serve` killed with SIGKILL mid-batch and started again on its data directory: every line answered exactly once. */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { toFile } from "openai";
import type { SluiceChild } from "../reliability/helpers.js";
import { killAll, longBatchLines, MODEL, parseJsonl, pollUntil, sdk, serveChild } from "./batch-helpers.js";

const LINES = 48;
const dataDir = mkdtempSync(join(tmpdir(), "sluice-crash-"));
const children: SluiceChild[] = [];

after(async () => {
  await killAll(children);
  rmSync(dataDir, { recursive: true, force: true });
});

const serve = () => serveChild(["--data-dir", dataDir], children);

test("SIGKILL mid-batch, restart: lines running at the crash run again, none is lost or reported twice", async () => {
  const first = await serve();
  const client = sdk(first.url);
  const lines = longBatchLines(LINES);
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
  const output = parseJsonl(await (await again.files.content(done.output_file_id!)).text());
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
