/** @module The job runner on a real scheduler: refused lines wait and run again, batches expire, input files are checked line by line. */

import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, test } from "node:test";
import {
  type RunningServer,
  type ServeOptions,
  serveHelp,
  serveOptionsFromArgs,
  startServer,
} from "../../adapters/cli/serve.js";
import { createApp } from "../../adapters/http/app.js";
import { DEFAULT_DATA_DIR, Jobs, LmdbJobStore, parseBatchInput } from "../../adapters/jobs/index.js";

const MODEL = "meta-llama/Llama-3.1-8B-Instruct";
let server: RunningServer | undefined;
const closers: (() => Promise<void>)[] = [];

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
  for (const close of closers.splice(0)) await close();
  await server?.close();
  server = undefined;
});

function lineOf(id: string, maxTokens: number, extra: Record<string, unknown> = {}) {
  return JSON.stringify({
    custom_id: id,
    method: "POST",
    url: "/v1/chat/completions",
    body: { model: MODEL, messages: [{ role: "user", content: `line ${id}` }], max_tokens: maxTokens },
    ...extra,
  });
}

/** Uploads a file and creates a batch through `fetch` against any app (socket or in-process). */
async function createBatch(call: (path: string, init?: RequestInit) => Promise<Response>, lines: string[]) {
  const form = new FormData();
  form.set("purpose", "batch");
  form.set("file", new Blob([`${lines.join("\n")}\n`]), "input.jsonl");
  const file = (await (await call("/v1/files", { method: "POST", body: form })).json()) as { id: string };
  const created = await call("/v1/batches", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      input_file_id: file.id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
    }),
  });
  assert.equal(created.status, 200);
  return (await created.json()) as { id: string };
}

interface BatchView {
  status: string;
  request_counts: { total: number; completed: number; failed: number };
  output_file_id: string | null;
  error_file_id: string | null;
  expired_at: number | null;
}

async function until(
  call: (path: string, init?: RequestInit) => Promise<Response>,
  id: string,
  done: (batch: BatchView) => boolean,
  limitMs = 60_000,
): Promise<BatchView> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const batch = (await (await call(`/v1/batches/${id}`)).json()) as BatchView;
    if (done(batch)) return batch;
    if (Date.now() > deadline) throw new Error(`batch ${id}: ${JSON.stringify(batch)}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

async function lines(call: (path: string) => Promise<Response>, fileId: string | null) {
  if (!fileId) return [];
  const text = await (await call(`/v1/files/${fileId}/content`)).text();
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map(
      (line) =>
        JSON.parse(line) as {
          custom_id: string;
          response: { status_code: number } | null;
          error: { code: string } | null;
        },
    );
}

describe("running lines", () => {
  test("lines the gate refuses (no queue, one engine slot) wait their Retry-After and run: none fails", async () => {
    const s = await start({
      config: { gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 0 } },
    });
    const call = (path: string, init?: RequestInit) => fetch(`${s.url}${path}`, init);
    const ids = ["r0", "r1", "r2", "r3"];
    const batch = await createBatch(
      call,
      ids.map((id) => lineOf(id, 16)),
    );
    const done = await until(call, batch.id, (b) => b.status === "completed");
    assert.deepEqual(done.request_counts, { total: 4, completed: 4, failed: 0 });
    const output = await lines(call, done.output_file_id);
    assert.deepEqual(output.map((line) => line.custom_id).sort(), ids);
    const exposition = await s.metrics.registry.metrics();
    const refused = exposition
      .split("\n")
      .filter((line) => line.startsWith("sluice_rejections_total{") && line.includes('lane="bulk"'))
      .reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0);
    assert.ok(refused > 0, "some lines were refused before they ran");
    const sample = (name: string) =>
      exposition
        .split("\n")
        .filter((line) => line.startsWith(name))
        .reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0);
    assert.equal(sample('sluice_job_calls_total{kind="line",outcome="completed"}'), 4);
    assert.equal(sample('sluice_job_calls_total{kind="line",outcome="failed"}'), 0);
    assert.ok(sample("sluice_job_retries_total{") > 0, "the refusals were waited out");
    assert.equal(sample("sluice_job_calls_running"), 0);
    assert.equal(sample("sluice_batches_active"), 0);
    assert.equal(sample('sluice_idempotency_keys{state="running"}'), 0);
    const held = s.scheduler.idleCheck();
    assert.deepEqual(held, { permits: 0, reservations: 0, windowSlots: held.windowSlots, queued: 0 });
  });

  test("a batch past its window expires: answered lines in the output file, the rest batch_expired", async () => {
    const s = await start({ simPreset: { base: "h100-llama3-8b", c0: 10 } });
    let skewMs = 0;
    const jobs = await Jobs.open({ scheduler: s.scheduler, concurrency: 1, now: () => Date.now() + skewMs });
    closers.push(() => jobs.close());
    const app = createApp({ scheduler: s.scheduler, plugins: [jobs] });
    await jobs.start();
    const call = async (path: string, init?: RequestInit) => app.request(path, init);
    const ids = Array.from({ length: 6 }, (_, i) => `e${i}`);
    const batch = await createBatch(call, [lineOf("e0", 4), ...ids.slice(1).map((id) => lineOf(id, 400))]);
    await until(call, batch.id, (b) => b.request_counts.completed >= 1);
    skewMs = 25 * 3600_000;
    const done = await until(call, batch.id, (b) => b.status === "expired");
    assert.ok(done.expired_at);
    const answered = [
      ...(await lines(call, done.output_file_id)),
      ...(await lines(call, done.error_file_id)),
    ];
    assert.deepEqual(answered.map((line) => line.custom_id).sort(), ids);
    assert.ok(answered.some((line) => line.error?.code === "batch_expired"));
    assert.equal(done.request_counts.total, 6);
    assert.equal(done.request_counts.completed + done.request_counts.failed, 6);
    await jobs.close();
    assert.equal(jobs.runner.running, 0);
    assert.equal(jobs.idempotency.inProgress, 0);
    const deadline = Date.now() + 10_000;
    for (;;) {
      const held = s.scheduler.idleCheck();
      if (held.permits + held.reservations + held.queued === 0) break;
      if (Date.now() > deadline) assert.fail(`scheduler still holds ${JSON.stringify(held)}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  });
});

describe("retention", () => {
  test("a finished batch is forgotten after the retention time, with its output file; its input file stays", async () => {
    const s = await start();
    let skewMs = 0;
    const jobs = await Jobs.open({
      scheduler: s.scheduler,
      now: () => Date.now() + skewMs,
      batchRetentionMs: 3600_000,
    });
    closers.push(() => jobs.close());
    const app = createApp({ scheduler: s.scheduler, plugins: [jobs] });
    await jobs.start();
    const call = async (path: string, init?: RequestInit) => app.request(path, init);
    const batch = await createBatch(call, [lineOf("r0", 4), lineOf("r1", 4)]);
    const done = await until(call, batch.id, (b) => b.status === "completed");
    const input = ((await (await call(`/v1/batches/${batch.id}`)).json()) as { input_file_id: string })
      .input_file_id;
    assert.equal((await call(`/v1/files/${done.output_file_id}`)).status, 200);
    skewMs = 2 * 3600_000;
    const deadline = Date.now() + 30_000;
    while ((await call(`/v1/batches/${batch.id}`)).status !== 404) {
      if (Date.now() > deadline) assert.fail("the finished batch was not forgotten");
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.equal((await call(`/v1/files/${done.output_file_id}`)).status, 404);
    assert.equal((await call(`/v1/files/${input}`)).status, 200, "the input file is the client's");
    assert.equal((await jobs.store.lineResults(batch.id)).size, 0);
  });
});

describe("restarts", () => {
  test("a graceful stop mid-batch records no partial answer; the restart finishes every line whole", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "sluice-stop-"));
    try {
      const first = await start({ dataDir });
      const call1 = (path: string, init?: RequestInit) => fetch(`${first.url}${path}`, init);
      const ids = Array.from({ length: 40 }, (_, i) => `g${i}`);
      const batch = await createBatch(
        call1,
        ids.map((id) => lineOf(id, 200)),
      );
      await until(call1, batch.id, (b) => b.request_counts.completed >= 1);
      await first.close();
      server = undefined;
      const second = await start({ dataDir });
      const call2 = (path: string, init?: RequestInit) => fetch(`${second.url}${path}`, init);
      const done = await until(call2, batch.id, (b) => b.status === "completed", 120_000);
      assert.deepEqual(done.request_counts, { total: 40, completed: 40, failed: 0 });
      const text = await (await call2(`/v1/files/${done.output_file_id}/content`)).text();
      const output = text
        .split("\n")
        .filter((line) => line !== "")
        .map(
          (line) =>
            JSON.parse(line) as {
              custom_id: string;
              response: { body: { usage: { completion_tokens: number } } };
            },
        );
      assert.deepEqual(output.map((line) => line.custom_id).sort(), [...ids].sort());
      for (const line of output)
        assert.equal(line.response.body.usage.completion_tokens, 200, line.custom_id);
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

describe("input files", () => {
  test("lines are checked one by one, blank lines skipped, session headers kept", () => {
    const text = [
      lineOf("a", 4, { headers: { "X-Session-Id": "agent-7" } }),
      "",
      lineOf("b", 4),
      "   ",
      JSON.stringify({
        custom_id: "c",
        method: "POST",
        url: "/v1/chat/completions",
        body: { model: MODEL, messages: [{ role: "user", content: "x" }], session_id: "agent-8" },
      }),
    ].join("\n");
    const { lines: parsed, errors } = parseBatchInput(text, "/v1/chat/completions");
    assert.deepEqual(errors, []);
    assert.equal(parsed.length, 3);
    assert.equal(parsed[2]?.call.sessionId, "agent-8");
    assert.equal("session_id" in (parsed[2]?.call.body ?? {}), false, "not forwarded to the engine");
    assert.equal(parsed[0]?.call.sessionId, "agent-7");
    assert.equal(parsed[0]?.call.declaredLane, "bulk");
    assert.equal(parsed[1]?.call.sessionId, undefined);
  });

  test("batch lines name sessions as HTTP calls do: order, Claude Code, body metadata, parents, final; odd keys fail the line", () => {
    const line = (id: string, headers: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
      JSON.stringify({
        custom_id: id,
        method: "POST",
        url: "/v1/chat/completions",
        headers,
        body: { model: MODEL, messages: [{ role: "user", content: "x" }], ...extra },
      });
    const text = [
      line("codex", { "session-id": "conv", "Thread-Id": "thread-9" }),
      line("claude", { "x-claude-code-session-id": "cc", "x-claude-code-agent-id": "sub" }),
      line("meta", {}, { metadata: { session_id: "in-meta" } }),
      line("child", {
        "x-session-id": "kid",
        "x-codex-parent-thread-id": "mom",
        "x-dynamo-session-final": "true",
      }),
      line("cache", {}, { prompt_cache_key: "p", user: "u" }),
      line("empty", { "x-session-id": "" }),
      line("long", { "x-session-id": "k".repeat(257) }),
      line("number", { "x-session-id": 7 }),
      line("ctl", {}, { metadata: { session_id: "a\u0007b" } }),
    ].join("\n");
    const { lines: parsed, errors } = parseBatchInput(text, "/v1/chat/completions");
    const byId = new Map(parsed.map((l) => [l.customId, l.call]));
    assert.equal(byId.get("codex")?.sessionId, "thread-9");
    assert.equal(byId.get("claude")?.sessionId, "cc/sub");
    assert.equal(byId.get("claude")?.parentSessionId, "cc");
    assert.equal(byId.get("meta")?.sessionId, "in-meta");
    assert.equal(byId.get("child")?.parentSessionId, "mom");
    assert.equal(byId.get("child")?.finalStep, true);
    assert.equal(byId.get("cache")?.sessionId, undefined, "prompt_cache_key and user are never keys");
    assert.deepEqual(
      errors.map((e) => [e.line, e.code, e.param]),
      [
        [6, "invalid_request", "x-session-id"],
        [7, "invalid_request", "x-session-id"],
        [8, "invalid_request", "x-session-id"],
        [9, "invalid_request", "metadata.session_id"],
      ],
    );
  });

  test("each kind of bad line is named with its line number; an empty file is an error", () => {
    const text = [
      "[1]",
      JSON.stringify({ method: "POST", url: "/v1/completions", body: {} }),
      JSON.stringify({ custom_id: "x", method: "GET", url: "/v1/completions", body: {} }),
      JSON.stringify({ custom_id: "y", method: "POST", url: "/v1/completions", body: [] }),
      JSON.stringify({ custom_id: "z", method: "POST", url: "/v1/completions", body: {}, headers: "no" }),
    ].join("\n");
    const { errors } = parseBatchInput(text, "/v1/completions");
    assert.deepEqual(
      errors.map((e) => [e.code, e.line]),
      [
        ["invalid_json_line", 1],
        ["missing_required_parameter", 2],
        ["invalid_method", 3],
        ["invalid_request", 4],
        ["invalid_request", 5],
      ],
    );
    assert.equal(parseBatchInput("\n\n", "/v1/completions").errors[0]?.code, "empty_file");
    const many = Array.from({ length: 3 }, (_, i) => lineOf(`m${i}`, 4)).join("\n");
    assert.equal(parseBatchInput(many, "/v1/chat/completions", 2).errors[0]?.code, "too_many_requests");
  });
});

describe("data directory", () => {
  test("--data-dir (and SLUICE_DATA_DIR) name it; ./.sluice-data by default", async () => {
    assert.equal(
      (await serveOptionsFromArgs(["--data-dir", "/srv/sluice"], {}, () => {})).dataDir,
      "/srv/sluice",
    );
    assert.equal(
      (await serveOptionsFromArgs([], { SLUICE_DATA_DIR: "/env/dir" }, () => {})).dataDir,
      "/env/dir",
    );
    assert.equal((await serveOptionsFromArgs([], {}, () => {})).dataDir, DEFAULT_DATA_DIR);
    assert.match(serveHelp(), /--data-dir <path>/);
  });

  test("a directory held by another store, or one that cannot be written, falls back to a temporary one", async () => {
    const dir = mkdtempSync(join(tmpdir(), "sluice-lock-"));
    const warnings: string[] = [];
    const first = await LmdbJobStore.open({ dataDir: dir, log: (line) => warnings.push(line) });
    const second = await LmdbJobStore.open({ dataDir: dir, log: (line) => warnings.push(line) });
    const blocked = join(dir, "a-file");
    writeFileSync(blocked, "not a directory");
    const third = await LmdbJobStore.open({
      dataDir: join(blocked, "sub"),
      log: (line) => warnings.push(line),
    });
    try {
      assert.equal(first.durable, true);
      assert.equal(second.durable, false);
      assert.notEqual(second.dataDir, first.dataDir);
      assert.equal(third.durable, false);
      assert.equal(warnings.length, 2);
      assert.match(warnings[0]!, /in use by another running sluice/);
      assert.match(warnings[1]!, /cannot be used/);
    } finally {
      await third.close();
      await second.close();
      await first.close();
      rmSync(dir, { recursive: true, force: true });
    }
    assert.equal(existsSync(second.dataDir), false, "a temporary store is removed on close");
  });
});
