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
import { toFile } from "openai";
import { type NatsServerProcess, startNatsServer } from "../../../adapters/nats/nats-server-process.js";
import { killAll, longBatchLines, parseJsonl, pollUntil, sdk, serveChild } from "../../jobs/batch-helpers.js";
import type { SluiceChild } from "../helpers.js";

const LINES = 48;
const scratch = mkdtempSync(join(tmpdir(), "sluice-js-kill-"));
const children: SluiceChild[] = [];
let nats: NatsServerProcess;

before(async () => {
  nats = await startNatsServer();
});

after(async () => {
  await killAll(children);
  await nats?.close();
  rmSync(scratch, { recursive: true, force: true });
});

/** A frontend on the shared NATS; its data directory is unused with --nats, and never shared. */
const serve = (name: string) => serveChild(["--nats", nats.url, "--data-dir", join(scratch, name)], children);

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
  const lines = longBatchLines(LINES);
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
  const output = parseJsonl(await (await sdk(other.url).files.content(done.output_file_id!)).text());
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
