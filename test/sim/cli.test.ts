/** @module `sluice sim`: flags, help, and a real process that serves until SIGTERM. */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { describe, test } from "node:test";
import { run } from "../../adapters/cli/sim.js";

function capture() {
  const out: string[] = [];
  const err: string[] = [];
  return { out, err, io: { stdout: (t: string) => out.push(t), stderr: (t: string) => err.push(t) } };
}

describe("sluice sim", () => {
  test("--help prints the flags and returns 0", async () => {
    const c = capture();
    assert.equal(await run(["--help"], c.io), 0);
    const text = c.out.join("");
    for (const flag of [
      "--port",
      "--preset",
      "--model",
      "--data-parallel-size",
      "--max-num-seqs",
      "--max-num-batched-tokens",
      "--kv-capacity-tokens",
      "--sim-host-kv-tokens",
    ]) {
      assert.ok(text.includes(flag), flag);
    }
  });

  test("an invalid flag value names the flag and the value, and returns 2", async () => {
    const cases: [string[], RegExp][] = [
      [["--port", "abc"], /--port takes an integer from 0 to 65535, got "abc"/],
      [["--port", "70000"], /--port .* got "70000"/],
      [["--preset", "h200"], /--preset takes one of .* got "h200"/],
      [["--data-parallel-size", "0"], /--data-parallel-size .* got "0"/],
      [["--max-num-seqs=-3"], /--max-num-seqs takes a positive integer, got "-3"/],
      [["--kv-capacity-tokens", "1.5"], /--kv-capacity-tokens .* got "1.5"/],
      [["--sim-host-kv-tokens=-1"], /--sim-host-kv-tokens .* got "-1"/],
      [["--bogus"], /unknown flag --bogus/],
    ];
    for (const [argv, message] of cases) {
      const c = capture();
      assert.equal(await run(argv, c.io), 2, argv.join(" "));
      assert.match(c.err.join(""), message);
    }
  });

  test("in process: serves with the flags given until stopped, then returns 0", async () => {
    const c = capture();
    const stop = new AbortController();
    const running = run(
      [
        "--port",
        "0",
        "--preset",
        "h100x2-qwen3-32b",
        "--model",
        "tiny",
        "--max-num-seqs",
        "7",
        "--data-parallel-size",
        "2",
        "--kv-capacity-tokens",
        "1600",
        "--sim-host-kv-tokens",
        "6400",
      ],
      { ...c.io, stop: stop.signal },
    );
    // The listening line is written once the server is up.
    for (let i = 0; i < 200 && !c.out.join("").includes("listening on"); i++)
      await new Promise((r) => setImmediate(r));
    const url = /listening on (\S+)/.exec(c.out.join(""))?.[1];
    assert.ok(url, c.out.join("") + c.err.join(""));
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.match(
      metrics,
      /vllm:cache_config_info\{[^}]*num_gpu_blocks="200"[^}]*max_num_seqs="7"[^}]*engine="1"/,
    );
    // The host tier: 400 blocks per rank, and the KV connector's counters.
    assert.match(
      metrics,
      /vllm:cache_config_info\{[^}]*num_cpu_blocks="400"[^}]*kv_offloading_backend="native"/,
    );
    assert.match(metrics, /vllm:external_prefix_cache_hits_total\{[^}]*engine="1"\} 0/);
    const models = (await (await fetch(`${url}/v1/models`)).json()) as {
      data: { id: string; max_model_len: number }[];
    };
    assert.equal(models.data[0]!.id, "tiny");
    assert.equal(models.data[0]!.max_model_len, 1600);
    stop.abort();
    assert.equal(await running, 0);
  });

  test("as a process: `sluice sim` runs until SIGTERM and exits 0", async () => {
    const child = spawn(process.execPath, ["--import", "tsx", "adapters/cli/main.ts", "sim", "--port", "0"], {
      cwd: new URL("../..", import.meta.url),
      stdio: ["ignore", "pipe", "pipe"],
    });
    const lines = createInterface({ input: child.stdout! });
    let url: string | undefined;
    for await (const line of lines) {
      url = /listening on (\S+)/.exec(line)?.[1];
      if (url) break;
    }
    assert.ok(url);
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "hi", max_tokens: 2 }),
    });
    assert.equal(res.status, 200);
    child.kill("SIGTERM");
    const [code] = await once(child, "exit");
    assert.equal(code, 0);
  });
});
