/**
 * @module Overhead of sluice's HTTP path (a): `sluice serve` in front of an instant upstream against a minimal
 * pass-through proxy in front of the same upstream, at the same concurrency (autocannon in a child process),
 * plus unloaded added latency measured with sequential requests. Goals: rps ratio ≥ 0.7, added p50 ≤ 1 ms.
 */

import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { createRequire } from "node:module";
import type { AddressInfo } from "node:net";
import { dirname, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { quantile, round } from "../adapters/bench/stats.js";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..");

/** Options of {@link runOverheadBench}. */
export interface OverheadOptions {
  /** Concurrent connections of the load run. Default 32. */
  connections?: number;
  /** Measured seconds of each load run (after a 2 s warm-up). Default 8. */
  durationS?: number;
  /** Sequential requests per target for the unloaded latency. Default 1000. */
  sequential?: number;
}

const BODY = JSON.stringify({
  model: "sim-instant",
  messages: [
    { role: "system", content: "You are a terse assistant." },
    { role: "user", content: "Say hello in five words." },
  ],
  max_tokens: 16,
  stream: false,
});

/** The baseline: a pass-through proxy with nothing in it but node:http and fetch. */
function startPassThrough(upstream: string): Promise<Server> {
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    try {
      const up = await fetch(upstream + (req.url ?? "/"), {
        method: req.method ?? "GET",
        headers: { "content-type": req.headers["content-type"] ?? "application/json" },
        ...(chunks.length > 0 ? { body: Buffer.concat(chunks) } : {}),
      });
      res.writeHead(up.status, { "content-type": up.headers.get("content-type") ?? "application/json" });
      const reader = up.body?.getReader();
      for (let part = await reader?.read(); part && !part.done; part = await reader?.read())
        res.write(part.value);
      res.end();
    } catch (error) {
      res.writeHead(502).end(String(error));
    }
  });
  return new Promise((ready) => server.listen(0, "127.0.0.1", () => ready(server)));
}

function urlOf(server: Server): string {
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

interface Unloaded {
  p50: number;
  p99: number;
  failed: number;
}

/**
 * Latency of requests sent one at a time, ms, for several targets. Rounds
 * alternate between the targets so drift (GC, JIT, CPU frequency) hits all
 * alike; a warm-up round is not measured.
 */
async function sequentialLatency(urls: readonly string[], count: number, rounds = 5): Promise<Unloaded[]> {
  const times = urls.map((): number[] => []);
  const failed = urls.map(() => 0);
  const perRound = Math.max(1, Math.ceil(count / rounds));
  for (let round = 0; round <= rounds; round++) {
    for (const [t, url] of urls.entries()) {
      for (let i = 0; i < perRound; i++) {
        const started = performance.now();
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: BODY,
        });
        await res.arrayBuffer();
        if (res.status !== 200) failed[t]!++;
        if (round > 0) times[t]!.push(performance.now() - started);
      }
    }
  }
  return urls.map((_, t) => ({
    p50: quantile(times[t]!, 0.5),
    p99: quantile(times[t]!, 0.99),
    failed: failed[t]!,
  }));
}

interface LoadResult {
  rps: number;
  p50: number;
  p99: number;
  non2xx: number;
  errors: number;
}

// autocannon treats any worker thread as one of its own, so the load generator is a child process.
const LOAD_SCRIPT = `
const [autocannonPath, options] = [process.argv[1], JSON.parse(process.argv[2])];
require(autocannonPath)(options, (error, result) => {
  process.stdout.write(JSON.stringify(error ? { error: String(error) } : { rps: result.requests.average,
    p50: result.latency.p50, p99: result.latency.p99, non2xx: result.non2xx, errors: result.errors }));
});`;

/** autocannon in a child process, so the load generator does not share the servers' event loop. */
function load(url: string, connections: number, durationS: number): Promise<LoadResult> {
  const autocannonPath = createRequire(import.meta.url).resolve("autocannon");
  const options = {
    url: `${url}/v1/chat/completions`,
    method: "POST",
    headers: { "content-type": "application/json" },
    body: BODY,
    connections,
    duration: durationS,
  };
  return new Promise((done, fail) => {
    execFile(
      process.execPath,
      ["-e", LOAD_SCRIPT, autocannonPath, JSON.stringify(options)],
      { maxBuffer: 1 << 20 },
      (error, stdout) => {
        if (error) return fail(error);
        const message = JSON.parse(stdout) as LoadResult & { error?: string };
        if (message.error) fail(new Error(message.error));
        else done(message);
      },
    );
  });
}

async function loaded(url: string, options: Required<OverheadOptions>): Promise<LoadResult> {
  await load(url, options.connections, 2);
  return load(url, options.connections, options.durationS);
}

/**
 * Runs the overhead comparison; returns flat numbers for `bench/results/overhead.json`.
 * Skips (returns `{ skipped }`) when the HTTP app is not there yet.
 */
export async function runOverheadBench(
  options: OverheadOptions = {},
): Promise<Record<string, number | string>> {
  if (!existsSync(resolve(REPO, "adapters/http/app.ts")))
    return { skipped: "adapters/http/app.ts is missing" };
  const settings: Required<OverheadOptions> = {
    connections: options.connections ?? 32,
    durationS: options.durationS ?? 8,
    sequential: options.sequential ?? 1000,
  };
  const { startSimServer } = (await import(
    pathToFileURL(resolve(REPO, "adapters/engines/sim/http-server.ts")).href
  )) as typeof import("../adapters/engines/sim/http-server.js");
  const { startServer } = (await import(
    pathToFileURL(resolve(REPO, "adapters/cli/serve.ts")).href
  )) as typeof import("../adapters/cli/serve.js");

  const upstream = await startSimServer({ preset: "instant", model: "sim-instant" });
  const proxy = await startPassThrough(upstream.url);
  const sluice = await startServer({ port: 0, host: "127.0.0.1", upstreams: [upstream.url], log: () => {} });
  try {
    // The upstream engine is eligible once its first /metrics scrape has landed.
    for (let i = 0; i < 100 && sluice.scheduler.readyReplicas() === 0; i++) {
      await new Promise((r) => setTimeout(r, 50));
    }
    const targets = [upstream.url, urlOf(proxy), sluice.url];
    const [directIdle, baselineIdle, oursIdle] = await sequentialLatency(targets, settings.sequential);
    const direct = { unloaded: directIdle!, loaded: await loaded(targets[0]!, settings) };
    const baseline = { unloaded: baselineIdle!, loaded: await loaded(targets[1]!, settings) };
    const ours = { unloaded: oursIdle!, loaded: await loaded(targets[2]!, settings) };
    const rpsRatio = baseline.loaded.rps > 0 ? ours.loaded.rps / baseline.loaded.rps : 0;
    const addedP50 = ours.unloaded.p50 - baseline.unloaded.p50;
    return {
      connections: settings.connections,
      duration_s: settings.durationS,
      upstream_rps: round(direct.loaded.rps, 1),
      proxy_rps: round(baseline.loaded.rps, 1),
      sluice_rps: round(ours.loaded.rps, 1),
      rps_ratio: round(rpsRatio, 3),
      rps_ratio_goal: 0.7,
      proxy_loaded_p50_ms: baseline.loaded.p50,
      sluice_loaded_p50_ms: ours.loaded.p50,
      proxy_loaded_p99_ms: baseline.loaded.p99,
      sluice_loaded_p99_ms: ours.loaded.p99,
      upstream_unloaded_p50_ms: round(direct.unloaded.p50, 3),
      proxy_unloaded_p50_ms: round(baseline.unloaded.p50, 3),
      sluice_unloaded_p50_ms: round(ours.unloaded.p50, 3),
      sluice_unloaded_p99_ms: round(ours.unloaded.p99, 3),
      added_p50_ms: round(addedP50, 3),
      added_p50_goal_ms: 1,
      proxy_non2xx: baseline.loaded.non2xx + baseline.unloaded.failed,
      sluice_non2xx: ours.loaded.non2xx + ours.unloaded.failed,
      errors: direct.loaded.errors + baseline.loaded.errors + ours.loaded.errors,
    };
  } finally {
    await sluice.close();
    await new Promise((r) => proxy.close(r));
    (proxy as { closeAllConnections?: () => void }).closeAllConnections?.();
    await upstream.close();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const result = await runOverheadBench();
  process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
}
