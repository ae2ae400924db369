/**
 * @module A local `nats-server` child process with JetStream, on a free
 * loopback port and a private store directory: for tests, benchmarks and
 * trying the NATS API on one machine. It can be stopped and started again on
 * the same port and store, which is how an outage is rehearsed.
 */

import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** Options of {@link startNatsServer}. */
export interface NatsServerOptions {
  /** The server binary. Default `$NATS_SERVER_BIN`, else `/usr/sbin/nats-server`. */
  binary?: string;
  /** Port; default a free one. */
  port?: number;
  /** JetStream store directory; default a fresh temporary one, removed by `close()`. */
  storeDir?: string;
  /** Longest wait for the server to accept connections, ms. Default 10000. */
  startTimeoutMs?: number;
}

/** A running (or stopped, restartable) local nats-server. */
export interface NatsServerProcess {
  /** `nats://127.0.0.1:<port>`. */
  readonly url: string;
  readonly port: number;
  readonly storeDir: string;
  /** Whether the process is running. */
  readonly running: boolean;
  /** Stops the process (SIGTERM, then SIGKILL after 5 s); resolves when it exited. */
  stop(): Promise<void>;
  /** Starts it again on the same port and store (JetStream state survives). */
  start(): Promise<void>;
  /** Stops it and removes a store directory it created. */
  close(): Promise<void>;
}

/** A port nothing listens on right now (the kernel's pick). */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => {
        if (address && typeof address === "object") resolve(address.port);
        else reject(new Error(`could not read the port of a probe listener, got ${String(address)}`));
      });
    });
  });
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = new Socket();
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.once("connect", () => done(true));
    socket.once("error", () => done(false));
    socket.connect(port, "127.0.0.1");
  });
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Spawns `nats-server -a 127.0.0.1 -p <port> -js -sd <dir>` and resolves once
 * it accepts connections. Throws with the server's own output when it exits
 * or does not come up in time.
 */
export async function startNatsServer(options: NatsServerOptions = {}): Promise<NatsServerProcess> {
  const binary = options.binary ?? process.env.NATS_SERVER_BIN ?? "/usr/sbin/nats-server";
  const port = options.port ?? (await freePort());
  if (!(Number.isInteger(port) && port > 0 && port < 65536)) {
    throw new RangeError(`port must be an integer in 1–65535, got ${port}`);
  }
  const ownsStore = options.storeDir === undefined;
  const storeDir = options.storeDir ?? (await mkdtemp(join(tmpdir(), "sluice-nats-")));
  const startTimeoutMs = options.startTimeoutMs ?? 10_000;
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();

  const start = async (): Promise<void> => {
    if (child) return;
    let output = "";
    const proc = spawn(binary, ["-a", "127.0.0.1", "-p", String(port), "-js", "-sd", storeDir], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    child = proc;
    proc.stderr?.on("data", (data: Buffer) => {
      if (output.length < 16_384) output += data.toString();
    });
    let gone = false;
    exited = new Promise<void>((resolve) => {
      proc.once("exit", () => {
        gone = true;
        if (child === proc) child = undefined;
        resolve();
      });
      proc.once("error", (err) => {
        output += `\n${err.message}`;
        gone = true;
        if (child === proc) child = undefined;
        resolve();
      });
    });
    const until = Date.now() + startTimeoutMs;
    // "Server is ready" is printed before JetStream finished recovering its store; a connect and a short
    // settle are what clients actually need.
    while (!gone) {
      if (output.includes("Server is ready") && (await canConnect(port))) return;
      if (Date.now() > until) break;
      await delay(25);
    }
    const stopped = gone;
    if (!stopped) await stop();
    throw new Error(
      `nats-server ${stopped ? "exited" : "did not start"} (port ${port}, store ${storeDir}):\n${output.trim()}`,
    );
  };

  const stop = async (): Promise<void> => {
    const proc = child;
    if (!proc) return;
    const done = exited;
    proc.kill("SIGTERM");
    const timer = setTimeout(() => proc.kill("SIGKILL"), 5000);
    await done;
    clearTimeout(timer);
  };

  await start();
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    storeDir,
    get running() {
      return child !== undefined;
    },
    start,
    stop,
    async close() {
      await stop();
      if (ownsStore) await rm(storeDir, { recursive: true, force: true });
    },
  };
}
