/** @module `sluice serve` flags, environment, help and exit statuses; a real process stopped by SIGTERM. */

import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { SERVE_SETTINGS, serveHelp, serveOptionsFromArgs } from "../../adapters/cli/serve.js";
import { ConfigError } from "../../src/config/config-error.js";
import { resolveSchedulerConfig } from "../../src/config/scheduler-config.js";
import { defaultShown } from "../../src/config/settings.js";

const SLUICE = fileURLToPath(new URL("../../adapters/cli/sluice.js", import.meta.url));

function options(argv: string[], env: Record<string, string> = {}, warnings: string[] = []) {
  return serveOptionsFromArgs(argv, env, (message) => warnings.push(message));
}

describe("flags", () => {
  test("flags become scheduler configuration", async () => {
    const o = await options([
      "--port",
      "9090",
      "--host",
      "127.0.0.1",
      "--policy",
      "gate-prefix",
      "--block-size",
      "32",
      "--default-max-tokens",
      "256",
      "--engine-request-limit",
      " 8 ",
      "--request-queue-limit",
      "0",
      "--overload-status",
      "503",
      "--bulk-max-total-tokens",
      "65536",
      "--affinity-break-kv",
      "0.9",
      "--affinity-break-ms",
      "2500",
      "--stale-signals",
      "open",
      "--control-interval-ms",
      "500",
      "--idle-timeout-ms",
      "60000",
      "--session-queue-limit",
      "16",
      "--body-limit-bytes",
      "1048576",
      "--drain-timeout-ms",
      "1000",
      "--stream-stall-timeout-ms",
      "15000",
      "--sim-replicas",
      "3",
      "--sim-preset",
      "h100x2-qwen3-32b",
      "--admin-key",
      "operator-secret",
    ]);
    assert.equal(o.port, 9090);
    assert.equal(o.host, "127.0.0.1");
    assert.equal(o.simReplicas, 3);
    assert.equal(o.simPreset, "h100x2-qwen3-32b");
    assert.equal(o.bodyLimitBytes, 1_048_576);
    assert.equal(o.drainTimeoutMs, 1000);
    assert.equal(o.streamStallTimeoutMs, 15000);
    assert.equal(o.adminKey, "operator-secret");
    assert.deepEqual(o.config, {
      policy: "gate-prefix",
      blockSize: 32,
      defaultMaxTokens: 256,
      gate: { engineRequestLimit: 8, requestQueueLimit: 0, overloadStatus: 503 },
      lanes: { bulkMaxTotalTokens: 65536 },
      routing: { affinityBreakKv: 0.9, affinityBreakMs: 2500 },
      sessions: { staleSignals: "open", controlIntervalMs: 500, idleTimeoutMs: 60000, queueLimit: 16 },
    });
  });

  test("the window law's parameters are flags too; an initial window left unset follows min and max", async () => {
    const o = await options([
      "--window-max",
      "4",
      "--window-increase",
      "1",
      "--window-decrease",
      "0.75",
      "--window-kv-low",
      "0.1",
      "--window-kv-high",
      "0.6",
      "--window-hit-low",
      "0.02",
    ]);
    assert.deepEqual(o.config?.window, {
      max: 4,
      increase: 1,
      decrease: 0.75,
      kvLow: 0.1,
      kvHigh: 0.6,
      hitLow: 0.02,
    });
    const resolved = resolveSchedulerConfig(o.config);
    assert.equal(resolved.window.initial, 4, "the default 8 clamped into [1, 4]");
    assert.equal(resolveSchedulerConfig({ window: { min: 12 } }).window.initial, 12);
    assert.throws(() => resolveSchedulerConfig({ window: { initial: 9, max: 4 } }), /window\.initial \(9\)/);
  });

  test("gate limits not given stay unset, so they follow the engine's max_num_seqs", async () => {
    const o = await options([]);
    assert.deepEqual(o.config, {});
  });

  test("environment variables fill in, flags win, Dynamo aliases work, bad env values only warn", async () => {
    const warnings: string[] = [];
    const o = await options(
      ["--port", "7000"],
      {
        SLUICE_PORT: "7001",
        SLUICE_POLICY: "rr",
        SLUICE_UPSTREAM: "http://10.0.0.1:8000, http://10.0.0.2:8000",
        DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT: "12",
        SLUICE_REQUEST_QUEUE_LIMIT: "lots",
      },
      warnings,
    );
    assert.equal(o.port, 7000);
    assert.equal(o.config?.policy, "rr");
    assert.deepEqual(o.upstreams, ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]);
    assert.deepEqual(o.config?.gate, { engineRequestWaitingLimit: 12 });
    assert.equal(warnings.length, 1);
    assert.match(warnings[0]!, /SLUICE_REQUEST_QUEUE_LIMIT/);
  });

  test("an invalid flag is a ConfigError naming the flag and the value", async () => {
    const cases: [string[], RegExp][] = [
      [["--engine-request-limit", "0"], /--engine-request-limit.*"0"/],
      [["--engine-request-waiting-limit", "1.5"], /--engine-request-waiting-limit.*"1\.5"/],
      [["--request-queue-limit=-1"], /--request-queue-limit.*"-1"/],
      [["--port", "http"], /--port.*"http"/],
      [["--port", "70000"], /--port/],
      [["--policy", "fastest"], /--policy.*"fastest"/],
      [["--stale-signals", "maybe"], /--stale-signals.*"maybe"/],
      [["--affinity-break-kv", "2"], /--affinity-break-kv.*"2"/],
      [["--window-decrease", "1"], /--window-decrease.*"1"/],
      [["--window-hit-low", "1.5"], /--window-hit-low.*"1\.5"/],
      [["--window-max", "0"], /--window-max.*"0"/],
      [["--overload-status", "200"], /--overload-status.*"200"/],
      [["--upstream", "ftp://x"], /--upstream.*"ftp:\/\/x"/],
      [["--sim-preset", "a100"], /--sim-preset.*"a100"/],
      [["--tokenizer", "bpe"], /--tokenizer/],
      [["--bogus"], /bogus/],
    ];
    for (const [argv, message] of cases) {
      await assert.rejects(options(argv), (err: unknown) => {
        assert.ok(err instanceof ConfigError, `${argv.join(" ")}: ${String(err)}`);
        assert.match(err.message, message);
        return true;
      });
    }
  });

  test("an API key file is loaded; a broken one is a ConfigError naming it", async () => {
    const dir = mkdtempSync(join(tmpdir(), "sluice-keys-"));
    const good = join(dir, "keys.json");
    writeFileSync(good, JSON.stringify({ "sk-live-000001": { tenant: "a", priority: 2, rps: 5 } }));
    const o = await options(["--api-keys", good]);
    assert.equal(o.keys?.size, 1);
    assert.equal(o.keys?.lookup("sk-live-000001")?.priority, 2);
    const inline = await options([], { SLUICE_API_KEYS: '{"sk-env-0000001":{"tenant":"b"}}' });
    assert.equal(inline.keys?.lookup("sk-env-0000001")?.tenant, "b");
    const bad = join(dir, "bad.json");
    writeFileSync(bad, JSON.stringify({ short: { tenant: "a" } }));
    await assert.rejects(options(["--api-keys", bad]), /bad\.json/);
    await assert.rejects(options(["--api-keys", join(dir, "missing.json")]), /missing\.json/);
  });

  test("--help lists every flag with its placeholder, default and variable", () => {
    const help = serveHelp();
    for (const setting of SERVE_SETTINGS) {
      assert.ok(help.includes(`--${setting.flag} ${setting.placeholder}`), `--${setting.flag}`);
      if (setting.env) assert.ok(help.includes(`env ${setting.env}`), setting.env);
      const shown = defaultShown(setting);
      if (shown !== undefined) assert.ok(help.includes(`default ${shown}`), `${setting.flag} default`);
    }
    const flags = new Set(SERVE_SETTINGS.map((setting) => setting.flag));
    for (const flag of [
      "port",
      "host",
      "upstream",
      "sim-replicas",
      "sim-preset",
      "nats",
      "policy",
      "block-size",
      "default-max-tokens",
      "engine-request-limit",
      "engine-request-waiting-limit",
      "request-queue-limit",
      "overload-status",
      "bulk-max-total-tokens",
      "affinity-break-kv",
      "affinity-break-ms",
      "stale-signals",
      "control-interval-ms",
      "idle-timeout-ms",
      "session-queue-limit",
      "api-keys",
      "admin-key",
      "body-limit-bytes",
      "drain-timeout-ms",
      "stream-stall-timeout-ms",
      "window-initial",
      "window-min",
      "window-max",
      "window-increase",
      "window-decrease",
      "window-kv-low",
      "window-kv-high",
      "window-hit-low",
      "window-unit",
      "window-initial-tokens",
      "window-min-tokens",
      "window-max-tokens",
      "window-increase-tokens",
      "retention-quantile",
      "tokenizer",
      "cors-origin",
    ]) {
      assert.ok(flags.has(flag), `--${flag} is missing`);
    }
  });
});

describe("the process", () => {
  test("an invalid flag exits with status 2 and a message naming flag and value", () => {
    const result = spawnSync(process.execPath, [SLUICE, "serve", "--engine-request-limit", "zero"], {
      encoding: "utf8",
    });
    assert.equal(result.status, 2);
    assert.match(result.stderr, /--engine-request-limit takes a positive integer, got "zero"/);
    const help = spawnSync(process.execPath, [SLUICE, "serve", "--help"], { encoding: "utf8" });
    assert.equal(help.status, 0);
    assert.match(help.stdout, /--drain-timeout-ms/);
  });

  test("serves, then exits 0 on SIGTERM after a graceful shutdown", async () => {
    const child: ChildProcess = spawn(
      process.execPath,
      [SLUICE, "serve", "--port", "0", "--host", "127.0.0.1", "--sim-replicas", "1"],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let stderr = "";
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const url = await new Promise<string>((resolve, reject) => {
      child.stderr!.on("data", (chunk: Buffer) => {
        stderr += chunk.toString();
        const match = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr);
        if (match) resolve(`http://127.0.0.1:${match[1]}`);
      });
      child.once("exit", () => reject(new Error(`sluice exited before listening: ${stderr}`)));
    });
    const health = await fetch(`${url}/healthz`);
    assert.equal(health.status, 200);
    const completion = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hello" }], max_tokens: 4 }),
    });
    assert.equal(completion.status, 200);
    assert.equal((await completion.json()).usage.completion_tokens, 4);
    child.kill("SIGTERM");
    assert.equal(await exited, 0, stderr);
    assert.match(stderr, /SIGTERM, shutting down/);
    assert.match(
      stderr,
      /stopped \(permits 0, reservations 0, window slots 0, queued 0\)/,
      "nothing held at exit",
    );
  });
});
