/**
 * @module The HTTP sessions case: N one-call conversations at once, each with its own `x-session-id`, through a
 * real `sluice serve` (a child process on a free port, simulated replicas in real time), under policy sluice
 * and under gate-prefix. Reports the total time of each and their ratio (goal: sluice ≤ 1.2 × gate-prefix):
 * where every session is one call, a session window must not cost more than request-level admission.
 */

import { type ChildProcess, spawn } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const SLUICE = resolve(dirname(fileURLToPath(import.meta.url)), "../adapters/cli/sluice.js");

/** Options of {@link runHttpSessionsBench}. */
export interface HttpSessionsOptions {
  /** Concurrent one-call conversations. Default 200. */
  sessions?: number;
  /** Simulated replicas behind `sluice serve`. Default 2. */
  replicas?: number;
  /** Output tokens per call. Default 64. */
  maxTokens?: number;
  /** Policies run, in order; the first two are compared (sluice ÷ gate-prefix). */
  policies?: readonly string[];
  onProgress?: (line: string) => void;
}

/** One policy's run. */
export interface HttpSessionsRun {
  policy: string;
  /** Wall time from the first request sent to the last response read, s. */
  total_s: number;
  ok: number;
  failed: number;
  /** Refusals with Retry-After that were retried, by HTTP status. */
  retried: Record<string, number>;
  /** Per conversation, from its first attempt to its response, s. */
  latency_p50_s: number;
  latency_p99_s: number;
}

/** What the case records in bench/results/http-sessions.json. */
export interface HttpSessionsResult {
  sessions: number;
  replicas: number;
  max_tokens: number;
  runs: HttpSessionsRun[];
  sluice_over_gate_prefix: number;
  goal: string;
  met: boolean;
}

/** A running `sluice serve` child and its base URL. */
interface Served {
  child: ChildProcess;
  url: string;
}

/** Starts `sluice serve` on a free loopback port and waits for the line that names it. */
function serve(policy: string, replicas: number): Promise<Served> {
  const child = spawn(
    process.execPath,
    [
      SLUICE,
      "serve",
      "--port",
      "0",
      "--host",
      "127.0.0.1",
      "--sim-replicas",
      String(replicas),
      "--policy",
      policy,
    ],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  return new Promise((ready, fail) => {
    let stderr = "";
    const onData = (chunk: Buffer) => {
      stderr += chunk.toString();
      const match = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(stderr);
      if (match) {
        child.stderr?.off("data", onData);
        child.off("exit", onExit);
        // Keep draining stderr so the child never blocks on a full pipe.
        child.stderr?.resume();
        ready({ child, url: match[1]! });
      }
    };
    const onExit = (code: number | null) =>
      fail(new Error(`sluice serve exited (${code}) before listening: ${stderr}`));
    child.stderr?.on("data", onData);
    child.once("exit", onExit);
  });
}

/** Stops the child with SIGTERM (it drains) and waits for it to exit. */
function stop(served: Served): Promise<void> {
  return new Promise((done) => {
    if (served.child.exitCode !== null || served.child.signalCode !== null) return done();
    const timer = setTimeout(() => served.child.kill("SIGKILL"), 10_000);
    served.child.once("exit", () => {
      clearTimeout(timer);
      done();
    });
    served.child.kill("SIGTERM");
  });
}

async function modelOf(url: string): Promise<string> {
  const response = await fetch(`${url}/v1/models`);
  const body = (await response.json()) as { data?: { id: string }[] };
  const id = body.data?.[0]?.id;
  if (!id) throw new Error(`GET /v1/models returned no model: ${JSON.stringify(body)}`);
  return id;
}

const SYSTEM = "You are a careful assistant. Answer the user's question in a few sentences.";

/** A user question unique to conversation i (so prompts share only the system prompt). */
function question(i: number): string {
  const topics = [
    "rivers",
    "bridges",
    "compilers",
    "tides",
    "orchards",
    "glaciers",
    "printing",
    "lighthouses",
  ];
  return `Conversation ${i}: tell me three facts about ${topics[i % topics.length]} and one about the number ${i * 7919}.`;
}

function quantile(values: number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  const position = p * (sorted.length - 1);
  const lower = Math.floor(position);
  const upper = Math.ceil(position);
  return sorted[lower]! + (sorted[upper]! - sorted[lower]!) * (position - lower);
}

function round3(value: number): number {
  return Math.round(value * 1000) / 1000;
}

/** One conversation: its single call, retried after Retry-After on 429, 503 or 529. */
async function converse(
  url: string,
  model: string,
  i: number,
  maxTokens: number,
  retried: Record<string, number>,
): Promise<{ ok: boolean; seconds: number }> {
  const started = performance.now();
  const body = JSON.stringify({
    model,
    messages: [
      { role: "system", content: SYSTEM },
      { role: "user", content: question(i) },
    ],
    max_tokens: maxTokens,
    stream: false,
  });
  for (let attempt = 0; attempt < 50; attempt++) {
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-session-id": `http-sessions-${i}` },
      body,
    });
    await response.arrayBuffer();
    if (response.ok) return { ok: true, seconds: (performance.now() - started) / 1000 };
    const retryAfter = Number(response.headers.get("retry-after"));
    if ([429, 503, 529].includes(response.status) && Number.isFinite(retryAfter)) {
      retried[response.status] = (retried[response.status] ?? 0) + 1;
      await new Promise((wake) => setTimeout(wake, retryAfter * 1000));
      continue;
    }
    return { ok: false, seconds: (performance.now() - started) / 1000 };
  }
  return { ok: false, seconds: (performance.now() - started) / 1000 };
}

async function runOne(
  policy: string,
  options: Required<Omit<HttpSessionsOptions, "onProgress" | "policies">>,
): Promise<HttpSessionsRun> {
  const served = await serve(policy, options.replicas);
  try {
    const model = await modelOf(served.url);
    // One warm-up call so module loading and JIT are not timed.
    await converse(served.url, model, -1, 4, {});
    const retried: Record<string, number> = {};
    const started = performance.now();
    const results = await Promise.all(
      Array.from({ length: options.sessions }, (_, i) =>
        converse(served.url, model, i, options.maxTokens, retried),
      ),
    );
    const total = (performance.now() - started) / 1000;
    const latencies = results.filter((r) => r.ok).map((r) => r.seconds);
    return {
      policy,
      total_s: round3(total),
      ok: latencies.length,
      failed: results.length - latencies.length,
      retried,
      latency_p50_s: round3(quantile(latencies, 0.5)),
      latency_p99_s: round3(quantile(latencies, 0.99)),
    };
  } finally {
    await stop(served);
  }
}

/** Runs the case under each policy in turn (one server at a time) and compares sluice with gate-prefix. */
export async function runHttpSessionsBench(options: HttpSessionsOptions = {}): Promise<HttpSessionsResult> {
  const settings = {
    sessions: options.sessions ?? 200,
    replicas: options.replicas ?? 2,
    maxTokens: options.maxTokens ?? 64,
  };
  const policies = options.policies ?? ["sluice", "gate-prefix"];
  const runs: HttpSessionsRun[] = [];
  for (const policy of policies) {
    const run = await runOne(policy, settings);
    options.onProgress?.(
      `[http-sessions] ${policy}: ${run.ok}/${settings.sessions} ok in ${run.total_s} s ` +
        `(p50 ${run.latency_p50_s} s, p99 ${run.latency_p99_s} s, retried ${JSON.stringify(run.retried)})`,
    );
    runs.push(run);
  }
  const sluice = runs.find((r) => r.policy === "sluice");
  const gatePrefix = runs.find((r) => r.policy === "gate-prefix");
  const ratio =
    sluice && gatePrefix && gatePrefix.total_s > 0 ? round3(sluice.total_s / gatePrefix.total_s) : Number.NaN;
  return {
    sessions: settings.sessions,
    replicas: settings.replicas,
    max_tokens: settings.maxTokens,
    runs,
    sluice_over_gate_prefix: ratio,
    goal: "≤ 1.2",
    met: ratio <= 1.2 && runs.every((r) => r.failed === 0),
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const result = await runHttpSessionsBench({ onProgress: (line) => process.stderr.write(`${line}\n`) });
  process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
}
