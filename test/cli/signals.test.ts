/**
 * @module `npm start` stops the server on SIGTERM and SIGINT sent to npm, the
 * wrapper a process manager sees: npm forwards the signal to its script, whose
 * shell execs node, so the server itself receives it and shuts down.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { connect } from "node:net";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

/** Resolves true once nothing accepts connections on the port (checked a bounded number of times). */
async function refused(port: number): Promise<boolean> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = connect({ port, host: "127.0.0.1" });
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
    if (!open) return true;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return false;
}

for (const signal of ["SIGTERM", "SIGINT"] as const) {
  test(`${signal} to the npm start wrapper stops the server`, async () => {
    const npm = spawn("npm", ["start", "--", "--port", "0", "--host", "127.0.0.1", "--sim-replicas", "1"], {
      cwd: ROOT,
      // Its own process group, so a failed test can still clean up everything it started.
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    // "close": npm exited and every process holding its output pipes (the server) is gone too.
    const closed = new Promise<void>((resolve) => npm.once("close", () => resolve()));
    try {
      const port = await new Promise<number>((resolve, reject) => {
        const read = (chunk: Buffer) => {
          output += chunk.toString();
          const match = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(output);
          if (match) resolve(Number(match[1]));
        };
        npm.stdout!.on("data", read);
        npm.stderr!.on("data", read);
        npm.once("exit", () => reject(new Error(`npm start exited before listening:\n${output}`)));
      });
      process.kill(npm.pid!, signal);
      let timer: NodeJS.Timeout | undefined;
      const stuck = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`the server outlived npm by 30 s:\n${output}`)), 30_000);
      });
      await Promise.race([closed, stuck]).finally(() => clearTimeout(timer));
      assert.ok(await refused(port), `the server still accepts connections on ${port}:\n${output}`);
      assert.match(output, new RegExp(`${signal}, shutting down`));
      assert.match(output, /stopped \(permits 0, reservations 0, window slots 0, queued 0\)/);
    } finally {
      try {
        process.kill(-npm.pid!, "SIGKILL");
      } catch {
        // The group is already gone: the expected case.
      }
    }
  });
}
