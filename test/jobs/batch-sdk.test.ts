/** @module OpenAI's Files and Batch APIs driven by the official `openai` SDK against a real `startServer` on simulated replicas. */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI, { toFile } from "openai";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";

const MODEL = "meta-llama/Llama-3.1-8B-Instruct";

let server: RunningServer;
let client: OpenAI;
let dataDir: string;

before(async () => {
  dataDir = mkdtempSync(join(tmpdir(), "sluice-batch-sdk-"));
  server = await startServer({
    port: 0,
    host: "127.0.0.1",
    simReplicas: 2,
    dataDir,
    log: () => {},
    drainTimeoutMs: 2000,
  });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "not-checked", maxRetries: 0, timeout: 30_000 });
});

after(async () => {
  await server.close();
  rmSync(dataDir, { recursive: true, force: true });
});

function chatLine(customId: string, content: string, extra: Record<string, unknown> = {}) {
  return JSON.stringify({
    custom_id: customId,
    method: "POST",
    url: "/v1/chat/completions",
    body: { model: MODEL, messages: [{ role: "user", content }], max_tokens: 8 },
    ...extra,
  });
}

async function upload(lines: string[]) {
  return client.files.create({
    file: await toFile(Buffer.from(`${lines.join("\n")}\n`), "input.jsonl"),
    purpose: "batch",
  });
}

/** Polls a batch until it reaches a status that ends it (real time: the server runs on its own). */
async function settle(id: string, limitMs = 60_000): Promise<OpenAI.Batches.Batch> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const batch = await client.batches.retrieve(id);
    if (["completed", "failed", "expired", "cancelled"].includes(batch.status)) return batch;
    if (Date.now() > deadline) throw new Error(`batch ${id} still ${batch.status} after ${limitMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** One line of an output or error file. */
interface OutputLine {
  id: string;
  custom_id: string;
  response: {
    status_code: number;
    request_id: string;
    body: {
      object?: string;
      choices: { message: { role: string } }[];
      error: { code: string };
    };
  } | null;
  error: { code: string; message: string } | null;
}

async function jsonl(fileId: string): Promise<OutputLine[]> {
  const text = await (await client.files.content(fileId)).text();
  return text
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line));
}

async function idle(): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const held = server.scheduler.idleCheck();
    if (held.permits + held.reservations + held.queued === 0) return;
    if (Date.now() > deadline) assert.fail(`scheduler still holds ${JSON.stringify(held)}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("files and batches through the openai SDK", () => {
  test("a 30-line batch runs every line once and reports it in OpenAI's output format", async () => {
    const lines = Array.from({ length: 30 }, (_, i) =>
      chatLine(
        `req-${i}`,
        `say something about ${i}`,
        i % 3 === 0 ? { headers: { "x-session-id": `s-${i % 2}` } } : {},
      ),
    );
    const input = await upload(lines);
    assert.equal(input.object, "file");
    assert.equal(input.purpose, "batch");
    assert.equal((await client.files.retrieve(input.id)).bytes, input.bytes);

    const created = await client.batches.create({
      input_file_id: input.id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
      metadata: { purpose: "test" },
    });
    assert.equal(created.object, "batch");
    assert.ok(["validating", "in_progress"].includes(created.status));
    assert.equal(created.input_file_id, input.id);
    assert.ok(created.expires_at && created.expires_at >= created.created_at + 24 * 3600);

    const done = await settle(created.id);
    assert.equal(done.status, "completed");
    assert.deepEqual(done.request_counts, { total: 30, completed: 30, failed: 0 });
    assert.ok(done.in_progress_at && done.finalizing_at && done.completed_at);
    assert.equal(done.error_file_id, null);
    assert.deepEqual(done.metadata, { purpose: "test" });

    const output = await jsonl(done.output_file_id!);
    assert.equal(output.length, 30);
    assert.deepEqual(output.map((line) => line.custom_id).sort(), lines.map((_, i) => `req-${i}`).sort());
    for (const line of output) {
      assert.match(line.id, /^batch_req_/);
      assert.equal(line.error, null);
      assert.equal(line.response?.status_code, 200);
      assert.equal(typeof line.response?.request_id, "string");
      assert.equal(line.response?.body.object, "chat.completion");
      assert.equal(line.response?.body.choices[0]?.message.role, "assistant");
    }
    // Lines naming a session ran as that session's steps (admission and pinning included).
    for (const session of ["s-0", "s-1"]) {
      const view = (await (await fetch(`${server.url}/v1/sessions/${session}`)).json()) as {
        steps: number;
        replica: string | null;
      };
      assert.equal(view.steps, 5);
      assert.ok(view.replica);
    }
    const outputFile = await client.files.retrieve(done.output_file_id!);
    assert.equal(outputFile.purpose, "batch_output");
    await idle();
  });

  test("a Responses API batch: each line's answer is the replica's Response object; conversation is a key", async () => {
    const lines = Array.from({ length: 6 }, (_, i) =>
      JSON.stringify({
        custom_id: `resp-${i}`,
        method: "POST",
        url: "/v1/responses",
        body: {
          model: MODEL,
          input: `write a line about ${i}`,
          max_output_tokens: 8,
          ...(i < 3 ? { conversation: "conv-batch" } : {}),
        },
      }),
    );
    const input = await upload(lines);
    const created = await client.batches.create({
      input_file_id: input.id,
      endpoint: "/v1/responses",
      completion_window: "24h",
    });
    const done = await settle(created.id);
    assert.equal(done.status, "completed");
    assert.deepEqual(done.request_counts, { total: 6, completed: 6, failed: 0 });
    const output = await jsonl(done.output_file_id!);
    for (const line of output) {
      assert.equal(line.response?.status_code, 200);
      const body = line.response?.body as unknown as {
        object: string;
        id: string;
        output: { type: string }[];
      };
      assert.equal(body.object, "response");
      assert.match(body.id, /^resp_/);
      assert.equal(body.output[0]?.type, "message");
    }
    const view = (await (await fetch(`${server.url}/v1/sessions/conv-batch`)).json()) as { steps: number };
    assert.equal(view.steps, 3, "the lines naming the conversation ran as its steps");
    await idle();
  });

  test("lines the engine cannot run are answered in the error file; the rest in the output file", async () => {
    const lines = [
      chatLine("ok-1", "hello"),
      JSON.stringify({
        custom_id: "too-big",
        method: "POST",
        url: "/v1/chat/completions",
        body: { model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 10_000_000 },
      }),
      JSON.stringify({
        custom_id: "no-messages",
        method: "POST",
        url: "/v1/chat/completions",
        body: { model: MODEL, messages: [] },
      }),
      chatLine("ok-2", "hello again"),
    ];
    const batch = await client.batches.create({
      input_file_id: (await upload(lines)).id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
    });
    const done = await settle(batch.id);
    assert.equal(done.status, "completed");
    assert.deepEqual(done.request_counts, { total: 4, completed: 2, failed: 2 });
    const output = await jsonl(done.output_file_id!);
    assert.deepEqual(output.map((line) => line.custom_id).sort(), ["ok-1", "ok-2"]);
    const errors = await jsonl(done.error_file_id!);
    const byId = new Map(errors.map((line) => [line.custom_id, line]));
    assert.equal(byId.get("too-big")?.response?.status_code, 413);
    assert.equal(byId.get("too-big")?.response?.body.error.code, "context_limit");
    assert.equal(byId.get("no-messages")?.response?.status_code, 400);
    assert.equal(byId.get("no-messages")?.response?.body.error.code, "invalid_request");
    await idle();
  });

  test("an input file with bad lines fails validation with OpenAI's errors list and runs nothing", async () => {
    const lines = [
      chatLine("a", "x"),
      "{not json",
      chatLine("a", "duplicate id"),
      JSON.stringify({ custom_id: "c", method: "POST", url: "/v1/completions", body: {} }),
    ];
    const batch = await client.batches.create({
      input_file_id: (await upload(lines)).id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
    });
    const done = await settle(batch.id);
    assert.equal(done.status, "failed");
    assert.ok(done.failed_at);
    const codes = done.errors?.data?.map((error) => [error.code, error.line]);
    assert.deepEqual(codes, [
      ["invalid_json_line", 2],
      ["duplicate_custom_id", 3],
      ["mismatched_endpoint", 4],
    ]);
    assert.equal(done.output_file_id, null);
  });

  test("a cancelled batch ends cancelled; every line is answered once across the two files", async () => {
    const lines = Array.from({ length: 40 }, (_, i) =>
      JSON.stringify({
        custom_id: `c-${i}`,
        method: "POST",
        url: "/v1/completions",
        body: { model: MODEL, prompt: `count to ${i}`, max_tokens: 200 },
      }),
    );
    const batch = await client.batches.create({
      input_file_id: (await upload(lines)).id,
      endpoint: "/v1/completions",
      completion_window: "24h",
    });
    const cancelling = await client.batches.cancel(batch.id);
    assert.ok(["cancelling", "cancelled", "completed"].includes(cancelling.status), cancelling.status);
    const done = await settle(batch.id);
    assert.ok(["cancelled", "completed"].includes(done.status), done.status);
    const answered = [
      ...(done.output_file_id ? await jsonl(done.output_file_id) : []),
      ...(done.error_file_id ? await jsonl(done.error_file_id) : []),
    ];
    assert.deepEqual(answered.map((line) => line.custom_id).sort(), lines.map((_, i) => `c-${i}`).sort());
    assert.equal(done.request_counts?.total, 40);
    assert.equal((done.request_counts?.completed ?? 0) + (done.request_counts?.failed ?? 0), 40);
    if (done.status === "cancelled") {
      assert.ok(answered.some((line) => line.error?.code === "batch_cancelled"));
    }
    await idle();
  });

  test("batches list newest first and page with after/limit", async () => {
    const input = await upload([chatLine("p", "x")]);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      ids.push(
        (
          await client.batches.create({
            input_file_id: input.id,
            endpoint: "/v1/chat/completions",
            completion_window: "24h",
          })
        ).id,
      );
    }
    const first = await client.batches.list({ limit: 2 });
    assert.deepEqual(
      first.data.map((batch) => batch.id),
      [ids[2], ids[1]],
    );
    assert.equal(first.has_more, true);
    const second = await client.batches.list({ limit: 2, after: ids[1] });
    assert.equal(second.data[0]?.id, ids[0]);
    const seen: string[] = [];
    for await (const batch of client.batches.list({ limit: 2 })) seen.push(batch.id);
    for (const id of ids) assert.ok(seen.includes(id));
    for (const id of ids) await settle(id);
  });

  test("unknown ids are 404 in the project's envelope; bad parameters are 400", async () => {
    await assert.rejects(
      client.batches.retrieve("batch_missing"),
      (err: InstanceType<typeof OpenAI.APIError>) => {
        assert.equal(err.status, 404);
        assert.equal(err.code, "batch_not_found");
        return true;
      },
    );
    await assert.rejects(
      client.files.retrieve("file-missing"),
      (err: InstanceType<typeof OpenAI.APIError>) => err.status === 404,
    );
    const input = await upload([chatLine("x", "y")]);
    await assert.rejects(
      client.batches.create({
        input_file_id: input.id,
        endpoint: "/v1/embeddings",
        completion_window: "24h",
      }),
      (err: InstanceType<typeof OpenAI.APIError>) => err.status === 400 && err.param === "endpoint",
    );
    await assert.rejects(
      client.batches.create({
        input_file_id: input.id,
        endpoint: "/v1/chat/completions",
        completion_window: "1h" as "24h",
      }),
      (err: InstanceType<typeof OpenAI.APIError>) => err.status === 400,
    );
  });
});
