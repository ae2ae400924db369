/** @module Shared checks of the reliability suite: docs/http-api.md envelopes, counters back at zero, raw sockets, child processes. */

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Scheduler } from "../../src/scheduler.js";
import type { AdminState } from "../../src/types.js";

/** Repository root. */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
/** The `sluice` bin. */
export const SLUICE = join(ROOT, "adapters", "cli", "sluice.js");

/** docs/http-api.md: the reasons each refusal status may carry. */
export const SPEC8_REASONS: Readonly<Record<number, readonly string[]>> = {
  400: ["invalid_request"],
  401: ["unauthorized"],
  // Beyond the documented table: a known key without the right (admin routes), a wrong method on a known path.
  403: ["unauthorized"],
  405: ["invalid_request"],
  404: ["model_not_found", "session_not_found"],
  413: ["context_limit", "overflow", "body_too_large"],
  429: [
    "queue_full",
    "queue_timeout",
    "token_budget_exhausted",
    "deadline_infeasible",
    "session_queue_full",
    "rate_limited",
  ],
  503: ["unavailable"],
  529: ["worker_overloaded"],
};

const ERROR_TYPES = new Set([
  "overloaded_error",
  "invalid_request_error",
  "authentication_error",
  "not_found_error",
  "unavailable_error",
]);

/** A request id sluice may send back: printable ASCII, at most 128 characters. */
export const SAFE_REQUEST_ID = /^[\x20-\x7e]{1,128}$/;

type HeaderSource = Headers | Record<string, string | string[] | undefined>;

function header(headers: HeaderSource, name: string): string | null {
  if (headers instanceof Headers) return headers.get(name);
  const value = headers[name.toLowerCase()];
  if (value === undefined) return null;
  return Array.isArray(value) ? value.join(", ") : value;
}

/**
 * Checks that a refusal is the documented envelope: a known status with one of its
 * reasons, a known error type, the echoed request id, JSON content and, for
 * 429/503/529, a whole-seconds `Retry-After`. Returns the reason.
 */
export function checkRefusal(
  status: number,
  headers: HeaderSource,
  text: string,
  options: { overloadStatus?: number; context?: string; transport?: boolean } = {},
): string {
  const where = options.context ? ` (${options.context})` : "";
  const overloadStatus = options.overloadStatus ?? 529;
  // Before any route runs, the HTTP parser's own verdicts keep their HTTP status (408, 431) with reason invalid_request.
  const allowed =
    status === overloadStatus
      ? SPEC8_REASONS[529]
      : options.transport && (status === 408 || status === 431)
        ? ["invalid_request"]
        : SPEC8_REASONS[status];
  assert.ok(
    allowed,
    `status ${status} is not a docs/http-api.md refusal status${where}: ${text.slice(0, 300)}`,
  );
  let body: { error?: Record<string, unknown> };
  try {
    body = JSON.parse(text) as { error?: Record<string, unknown> };
  } catch {
    assert.fail(`refusal ${status} body is not JSON${where}: ${JSON.stringify(text.slice(0, 300))}`);
  }
  const error = body.error;
  assert.ok(
    error && typeof error === "object",
    `refusal without an error object${where}: ${text.slice(0, 300)}`,
  );
  const code = error.code as string;
  assert.ok(allowed.includes(code), `status ${status} with reason ${code}${where}`);
  assert.ok(ERROR_TYPES.has(error.type as string), `unknown error type ${String(error.type)}${where}`);
  assert.equal(typeof error.message, "string");
  assert.match(header(headers, "content-type") ?? "", /application\/json/);
  const requestId = header(headers, "x-request-id");
  assert.ok(requestId && SAFE_REQUEST_ID.test(requestId), `unsafe x-request-id ${JSON.stringify(requestId)}`);
  assert.equal(error.request_id, requestId, `envelope request_id differs from the header${where}`);
  if (status === 429 || status === 503 || status === overloadStatus) {
    const retryAfter = header(headers, "retry-after");
    assert.match(
      retryAfter ?? "",
      /^[1-9][0-9]*$/,
      `${status} ${code} without whole-seconds Retry-After${where}`,
    );
  }
  return code;
}

/** Totals over every replica of an admin state snapshot. */
export function holdings(state: AdminState) {
  const totals = {
    gateRequests: 0,
    gateWaiting: 0,
    gateQueued: 0,
    reservedTokens: 0,
    queuedPrefillTokens: 0,
    inflightPrefillTokens: 0,
    laneQueued: 0,
  };
  for (const replica of state.replicas) {
    totals.gateRequests += replica.gate.requests;
    totals.gateWaiting += replica.gate.waiting;
    totals.gateQueued += replica.gate.queued;
    totals.reservedTokens += replica.budget.reservedTokens;
    totals.queuedPrefillTokens += replica.queuedPrefillTokens;
    totals.inflightPrefillTokens += replica.inflightPrefillTokens;
    totals.laneQueued += replica.lanes.interactive.queued + replica.lanes.bulk.queued;
  }
  return totals;
}

/** the documented invariant on every gate: received = admittedDirect + admittedQueue + rejected + cancelled. */
export function assertGateInvariant(state: AdminState): void {
  for (const replica of state.replicas) {
    const c = replica.gate.counters;
    assert.equal(
      c.received,
      c.admittedDirect + c.admittedQueue + c.rejected + c.cancelled,
      `gate of ${replica.id} breaks received = admitted + rejected + cancelled: ${JSON.stringify(c)}`,
    );
  }
}

/**
 * Every call has ended: no permit, reservation, queue place or prefill token
 * is held anywhere and the gate counters balance. Window slots are checked
 * only when `sessionsClosed` (an idle open session keeps its slot by design).
 */
export function assertQuiescent(scheduler: Scheduler, options: { sessionsClosed?: boolean } = {}): void {
  const check = scheduler.idleCheck();
  const state = scheduler.state();
  const totals = holdings(state);
  const expected = {
    permits: 0,
    reservations: 0,
    queued: 0,
    gateRequests: 0,
    gateWaiting: 0,
    gateQueued: 0,
    reservedTokens: 0,
    queuedPrefillTokens: 0,
    inflightPrefillTokens: 0,
    laneQueued: 0,
    ...(options.sessionsClosed ? { windowSlots: 0 } : {}),
  };
  const actual = {
    permits: check.permits,
    reservations: check.reservations,
    queued: check.queued,
    ...totals,
    ...(options.sessionsClosed ? { windowSlots: check.windowSlots } : {}),
  };
  assert.deepEqual(actual, expected, "something is still held after every call ended");
  assertGateInvariant(state);
}

/** Waits for a condition the system reaches on its own in real time (bounded; never a timed assertion). */
export async function until(
  condition: () => boolean | Promise<boolean>,
  what: string,
  limitMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${limitMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A raw HTTP exchange: what came back and whether the server closed the connection. */
export interface RawExchange {
  status: number;
  headers: Record<string, string>;
  body: string;
  raw: string;
  /** The connection was closed by the server (or reset). */
  closed: boolean;
  /** Bytes this client managed to write before the server stopped it. */
  bytesWritten: number;
}

/** Splits `HTTP/1.1 …` text into status, headers and body (body left as received). */
export function parseRawResponse(raw: string): {
  status: number;
  headers: Record<string, string>;
  body: string;
} {
  const end = raw.indexOf("\r\n\r\n");
  const head = end < 0 ? raw : raw.slice(0, end);
  const [statusLine = "", ...lines] = head.split("\r\n");
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine)?.[1] ?? 0);
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const colon = line.indexOf(":");
    if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  let body = end < 0 ? "" : raw.slice(end + 4);
  if (headers["transfer-encoding"] === "chunked") body = dechunk(body);
  return { status, headers, body };
}

function dechunk(text: string): string {
  let out = "";
  let at = 0;
  for (;;) {
    const lineEnd = text.indexOf("\r\n", at);
    if (lineEnd < 0) break;
    const size = Number.parseInt(text.slice(at, lineEnd), 16);
    if (!Number.isFinite(size) || size === 0) break;
    out += text.slice(lineEnd + 2, lineEnd + 2 + size);
    at = lineEnd + 2 + size + 2;
  }
  return out;
}

/**
 * Writes raw bytes to 127.0.0.1:`port` and reads until the server closes the
 * connection, a complete response arrived, or `timeoutMs` passed (then the
 * exchange counts as hung: `status` 0). `body` may be a generator of more
 * bytes to write (large uploads), written with back-pressure until refused.
 */
export async function rawHttp(
  port: number,
  head: string | Buffer,
  options: { timeoutMs?: number; body?: () => Iterable<Buffer> } = {},
): Promise<RawExchange> {
  const socket = net.connect(port, "127.0.0.1");
  const chunks: Buffer[] = [];
  let closed = false;
  let failed = false;
  const closedPromise = new Promise<void>((resolve) =>
    socket.once("close", () => {
      closed = true;
      resolve();
    }),
  );
  socket.on("data", (data: Buffer) => chunks.push(data));
  socket.on("error", () => {
    failed = true;
  });
  await new Promise<void>((resolve) => {
    socket.once("connect", resolve);
    socket.once("close", resolve);
  });
  const complete = () => {
    const parsed = parseRawResponse(Buffer.concat(chunks).toString("latin1"));
    if (parsed.status === 0) return false;
    const length = Number(parsed.headers["content-length"]);
    if (Number.isFinite(length)) return Buffer.byteLength(parsed.body, "latin1") >= length;
    return false;
  };
  if (!closed) socket.write(head);
  if (options.body && !closed) {
    for (const piece of options.body()) {
      if (closed || failed || socket.destroyed) break;
      if (!socket.write(piece)) {
        await Promise.race([
          new Promise((resolve) => socket.once("drain", resolve)),
          closedPromise,
          new Promise((resolve) => setTimeout(resolve, 2000)),
        ]);
      }
    }
  }
  const deadline = Date.now() + (options.timeoutMs ?? 5000);
  while (!closed && !complete() && Date.now() < deadline) {
    await Promise.race([closedPromise, new Promise((resolve) => setTimeout(resolve, 5))]);
  }
  const bytesWritten = socket.bytesWritten;
  const done = closed || complete();
  socket.destroy();
  const raw = Buffer.concat(chunks).toString("latin1");
  const parsed = parseRawResponse(raw);
  return { ...parsed, status: done ? parsed.status : 0, raw, closed, bytesWritten };
}

/** A `sluice` child process with its output captured. */
export interface SluiceChild {
  child: ChildProcess;
  output(): string;
  /** Resolves with the first match of `pattern` in the output (stdout and stderr). */
  waitFor(pattern: RegExp, limitMs?: number): Promise<RegExpMatchArray>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** Spawns `sluice <args>` (the real bin) with stdout and stderr captured. */
export function spawnSluice(args: string[], env: Record<string, string> = {}): SluiceChild {
  const child = spawn(process.execPath, [SLUICE, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...env },
  });
  let output = "";
  const listeners = new Set<() => void>();
  const onData = (chunk: Buffer) => {
    output += chunk.toString();
    for (const listener of listeners) listener();
  };
  child.stdout!.on("data", onData);
  child.stderr!.on("data", onData);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => {
      resolve({ code, signal });
      for (const listener of listeners) listener();
    }),
  );
  let hasExited = false;
  void exited.then(() => {
    hasExited = true;
  });
  return {
    child,
    output: () => output,
    exited,
    waitFor(pattern, limitMs = 30_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const match = pattern.exec(output);
          if (match) {
            cleanup();
            resolve(match);
          } else if (hasExited || child.exitCode !== null) {
            cleanup();
            reject(new Error(`sluice ${args[0]} exited before printing ${pattern}: ${output}`));
          }
        };
        const timer = setTimeout(() => {
          cleanup();
          reject(new Error(`sluice ${args[0]} did not print ${pattern} within ${limitMs} ms: ${output}`));
        }, limitMs);
        const cleanup = () => {
          clearTimeout(timer);
          listeners.delete(check);
        };
        listeners.add(check);
        check();
      });
    },
  };
}

/** Starts `sluice sim` on `port` and resolves once it listens. */
export async function startSimChild(port: number, extra: string[] = []): Promise<SluiceChild> {
  const sim = spawnSluice(["sim", "--port", String(port), "--host", "127.0.0.1", ...extra]);
  await sim.waitFor(/listening on http:\/\/127\.0\.0\.1:\d+/);
  return sim;
}

/** Stops a child (SIGTERM, then SIGKILL if it lingers) and waits for it. */
export async function stopChild(child: SluiceChild | undefined): Promise<void> {
  if (!child || child.child.exitCode !== null || child.child.signalCode !== null) return;
  child.child.kill("SIGTERM");
  const timer = setTimeout(() => child.child.kill("SIGKILL"), 5000);
  await child.exited;
  clearTimeout(timer);
}

/** Parses an SSE text into its events. */
export function sseEvents(text: string): { event: string; data: string }[] {
  const events: { event: string; data: string }[] = [];
  for (const block of text.split("\n\n")) {
    if (block.trim() === "") continue;
    let event = "message";
    const data: string[] = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
    }
    events.push({ event, data: data.join("\n") });
  }
  return events;
}

/** Where the suite's measured figures go (gitignored), merged section by section. */
export const ARTIFACT = join(ROOT, "test", "artifacts", "reliability.json");

/** Records one section of measured figures in `test/artifacts/reliability.json` (files of the suite run in parallel: a lock directory serialises the read-modify-write). */
export async function recordFigures(section: string, figures: unknown): Promise<void> {
  mkdirSync(dirname(ARTIFACT), { recursive: true });
  const lock = `${ARTIFACT}.lock`;
  for (let attempt = 0; ; attempt++) {
    try {
      mkdirSync(lock);
      break;
    } catch {
      // A lock left by a killed run goes stale after a few seconds.
      if (attempt > 100) rmSync(lock, { recursive: true, force: true });
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }
  try {
    let current: Record<string, unknown> = {};
    try {
      current = JSON.parse(readFileSync(ARTIFACT, "utf8")) as Record<string, unknown>;
    } catch {
      current = {};
    }
    current[section] = { ...(figures as object), recordedAt: new Date().toISOString() };
    writeFileSync(ARTIFACT, `${JSON.stringify(current, null, 2)}\n`);
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}
