/**
 * @module The built package: `npm run build` compiles to dist/, and the `sluice` binary named in
 * package.json runs the compiled JavaScript — from another working directory, with the assets it
 * reads at run time (the dashboard's client script) found beside the compiled code.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const PACKAGE = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
  bin: Record<string, string>;
  dependencies: Record<string, string>;
};
const BIN = join(ROOT, PACKAGE.bin.sluice!);

/** Runs a command to its end, collecting its output. */
function run(command: string, args: string[], cwd: string): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.stderr.on("data", (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.once("error", reject);
    child.once("exit", (code) => resolve({ code, output }));
  });
}

describe("npm run build", () => {
  before(async () => {
    const build = await run("npm", ["run", "build", "--silent"], ROOT);
    assert.equal(build.code, 0, build.output);
  });

  test("the bin is the compiled command, and tsx is only a development dependency", async () => {
    assert.match(PACKAGE.bin.sluice!, /^dist\/.*\.js$/);
    assert.ok(existsSync(BIN), `${BIN} was built`);
    assert.ok(existsSync(join(ROOT, "dist/adapters/cli/main.js")), "main.js compiled beside the bin");
    assert.equal(PACKAGE.dependencies.tsx, undefined);
    const help = await run(process.execPath, [BIN, "--help"], tmpdir());
    assert.equal(help.code, 0, help.output);
    assert.match(help.output, /usage: sluice <command>/);
    for (const command of ["serve", "sim", "bench", "tune", "gate"])
      assert.match(help.output, new RegExp(command));
  });

  test("the compiled server serves a session and the dashboard with its client script, then stops on SIGTERM", async () => {
    const child = spawn(
      process.execPath,
      [BIN, "serve", "--port", "0", "--host", "127.0.0.1", "--sim-replicas", "1"],
      { cwd: tmpdir(), stdio: ["ignore", "pipe", "pipe"] },
    );
    let log = "";
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      const url = await new Promise<string>((resolve, reject) => {
        child.stderr.on("data", (chunk: Buffer) => {
          log += chunk.toString();
          const match = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(log);
          if (match) resolve(match[1]!);
        });
        child.once("exit", () => reject(new Error(`the built sluice exited before listening: ${log}`)));
      });
      const opened = await fetch(`${url}/v1/sessions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ id: "built-1" }),
      });
      assert.equal(opened.status, 201, await opened.clone().text());
      const step = await fetch(`${url}/v1/sessions/built-1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ messages: [{ role: "user", content: "hello" }], max_tokens: 4 }),
      });
      assert.equal(step.status, 200, await step.clone().text());
      assert.equal(
        ((await step.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens,
        4,
      );
      assert.equal((await fetch(`${url}/v1/sessions/built-1`, { method: "DELETE" })).status, 204);

      const page = await (await fetch(`${url}/dashboard`)).text();
      const client = readFileSync(join(ROOT, "adapters/dashboard/client.js"), "utf8");
      const line = client
        .split("\n")
        .find((l) => l.trim().length > 20)!
        .trim();
      assert.ok(page.includes(line), "the dashboard page carries the client script read from dist");
    } finally {
      child.kill("SIGTERM");
    }
    assert.equal(await exited, 0, log);
    assert.match(log, /stopped \(permits 0, reservations 0, window slots 0, queued 0\)/, log);
  });
});
