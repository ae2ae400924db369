/**
 * @module What the NATS API costs, against an instant simulated replica (the
 * engine takes no time, so everything measured is sluice and its transport):
 * steps per second and step latency through `sluice.v1.chat` with the same
 * calls over HTTP as the baseline in the same run, the latency of one
 * compare-and-set on JetStream KV (what a shared window update adds), the
 * CAS rate two racing writers get with their conflicts, and a new session's
 * first step with the shared window against a window kept in process.
 * Spawns its own nats-server. Run: `npx tsx bench/nats.ts [--seconds N] [--agents N]`.
 */

import type { AddressInfo } from "node:net";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { serve } from "@hono/node-server";
import { connect, type KV } from "nats";
import { Registry } from "prom-client";
import { quantile, round } from "../adapters/bench/stats.js";
import type { SluiceClient } from "../adapters/client/client.js";
import { httpClient, natsClient } from "../adapters/client/index.js";
import { SimEngine } from "../adapters/engines/sim/sim-engine.js";
import { createApp } from "../adapters/http/app.js";
import { connectNatsFrontend } from "../adapters/nats/frontend.js";
import { startNatsServer } from "../adapters/nats/nats-server-process.js";
import { isRevisionConflict } from "../adapters/nats/window-authority.js";
import { createTokenizer } from "../adapters/tokenizers/index.js";
import { realClock } from "../src/clock.js";
import { Scheduler, type SchedulerOptions } from "../src/scheduler.js";

/** Options of {@link runNatsBench}. */
export interface NatsBenchOptions {
  /** Seconds each throughput run lasts. Default 3. */
  seconds?: number;
  /** Agents stepping at once (each a session, one step at a time). Default 16. */
  agents?: number;
  /** Compare-and-set updates timed one after another. Default 1000. */
  casUpdates?: number;
}

const tokenizer = createTokenizer();

function instantScheduler(extra: Partial<SchedulerOptions> = {}) {
  const engine = new SimEngine({ id: "instant-0", clock: realClock, preset: "instant" });
  const scheduler = new Scheduler({
    engines: [engine],
    clock: realClock,
    tokenizer,
    config: { window: { initial: 256 }, sessions: { controlIntervalMs: 500 } },
    ...extra,
  });
  scheduler.start();
  return scheduler;
}

/** Closed-loop agents: each runs steps of its own session back to back until time is up. */
async function closedLoop(
  client: SluiceClient,
  agents: number,
  seconds: number,
  prefix: string,
): Promise<{ stepsPerSecond: number; p50: number; p99: number; steps: number }> {
  const latencies: number[] = [];
  const until = performance.now() + seconds * 1000;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: agents }, async (_, a) => {
      const session = `${prefix}-${a}`;
      await client.openSession({ id: session });
      const messages = [{ role: "user", content: `agent ${a} works on its task` }];
      while (performance.now() < until) {
        const t0 = performance.now();
        await client.step(session, { model: "sim-instant", messages, max_tokens: 8 });
        latencies.push(performance.now() - t0);
      }
      await client.closeSession(session);
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  return {
    steps: latencies.length,
    stepsPerSecond: latencies.length / elapsed,
    p50: quantile(latencies, 0.5),
    p99: quantile(latencies, 0.99),
  };
}

/** Sequential compare-and-set updates on one key: read the revision once, then update on it each time. */
async function casLatency(kv: KV, updates: number): Promise<{ p50: number; p99: number }> {
  const key = "bench-cas";
  let revision = await kv.put(key, new TextEncoder().encode("0"));
  const times: number[] = [];
  for (let i = 1; i <= updates; i++) {
    const t0 = performance.now();
    revision = await kv.update(key, new TextEncoder().encode(String(i)), revision);
    times.push(performance.now() - t0);
  }
  await kv.delete(key);
  return { p50: quantile(times, 0.5), p99: quantile(times, 0.99) };
}

/** Two writers incrementing one counter by read-then-CAS, racing for `ms`; how many commits and how many lost races. */
async function casContention(
  kv: KV,
  ms: number,
): Promise<{ updatesPerSecond: number; conflictRatio: number; lost: number }> {
  const key = "bench-race";
  await kv.put(key, new TextEncoder().encode("0"));
  let commits = 0;
  let conflicts = 0;
  const until = performance.now() + ms;
  const writer = async () => {
    while (performance.now() < until) {
      const entry = await kv.get(key);
      const value = Number(entry?.string() ?? "0");
      try {
        await kv.update(key, new TextEncoder().encode(String(value + 1)), entry?.revision ?? 0);
        commits++;
      } catch (err) {
        if (!isRevisionConflict(err)) throw err;
        conflicts++;
      }
    }
  };
  await Promise.all([writer(), writer()]);
  const final = Number((await kv.get(key))?.string() ?? "0");
  await kv.delete(key);
  return {
    updatesPerSecond: commits / (ms / 1000),
    conflictRatio: conflicts / Math.max(1, commits + conflicts),
    // The counter must equal the commits: a lost update would show here.
    lost: commits - final,
  };
}

/** A new session's open + first step, one after another: the window shared on KV against one kept in process. */
async function firstSteps(client: SluiceClient, count: number, prefix: string): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < count; i++) {
    const id = `${prefix}-${i}`;
    const t0 = performance.now();
    await client.openSession({ id });
    await client.step(id, {
      model: "sim-instant",
      messages: [{ role: "user", content: `first step ${i}` }],
      max_tokens: 4,
    });
    times.push(performance.now() - t0);
    await client.closeSession(id);
  }
  return quantile(times, 0.5);
}

/** Runs every measurement; keys are `<what>_<unit>`. */
export async function runNatsBench(options: NatsBenchOptions = {}): Promise<Record<string, number>> {
  const seconds = options.seconds ?? 3;
  const agents = options.agents ?? 16;
  const server = await startNatsServer();
  const out: Record<string, number> = {};
  try {
    // NATS: one frontend with scale-out on (shared window and directory), a client on its own connection.
    const frontend = await connectNatsFrontend({ servers: server.url, frontendId: "bench" });
    const shared = instantScheduler({
      ...(frontend.windowAuthority ? { windowAuthority: frontend.windowAuthority } : {}),
      ...(frontend.sessionDirectory ? { sessionDirectory: frontend.sessionDirectory } : {}),
    });
    await frontend.attach(shared);
    const clientNc = await connect({ servers: server.url });
    const nats = natsClient({ nc: clientNc });
    await closedLoop(nats, agents, 0.5, "warm-nats");
    const overNats = await closedLoop(nats, agents, seconds, "nats");
    out.nats_steps_per_s = round(overNats.stepsPerSecond, 1);
    out.nats_step_p50_ms = round(overNats.p50, 3);
    out.nats_step_p99_ms = round(overNats.p99, 3);
    out.nats_first_step_shared_window_p50_ms = round(await firstSteps(nats, 50, "first-nats"), 3);

    // HTTP baseline: the same kind of scheduler (window in process) behind the HTTP app on a real socket.
    const local = instantScheduler();
    const app = createApp({ scheduler: local, registry: new Registry() });
    const httpServer = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" });
    await new Promise<void>((resolve) =>
      httpServer.listening ? resolve() : httpServer.once("listening", () => resolve()),
    );
    const port = (httpServer.address() as AddressInfo).port;
    const http = httpClient({ baseUrl: `http://127.0.0.1:${port}` });
    await closedLoop(http, agents, 0.5, "warm-http");
    const overHttp = await closedLoop(http, agents, seconds, "http");
    out.http_steps_per_s = round(overHttp.stepsPerSecond, 1);
    out.http_step_p50_ms = round(overHttp.p50, 3);
    out.http_step_p99_ms = round(overHttp.p99, 3);
    out.http_first_step_local_window_p50_ms = round(await firstSteps(http, 50, "first-http"), 3);
    out.nats_over_http_throughput_ratio = round(overNats.stepsPerSecond / overHttp.stepsPerSecond, 3);

    // The KV compare-and-set a shared window update is made of.
    const kv = await clientNc.jetstream().views.kv("sluice-bench", { history: 1 });
    const cas = await casLatency(kv, options.casUpdates ?? 1000);
    out.kv_cas_update_p50_ms = round(cas.p50, 3);
    out.kv_cas_update_p99_ms = round(cas.p99, 3);
    const race = await casContention(kv, 1000);
    out.kv_cas_two_writers_commits_per_s = round(race.updatesPerSecond, 1);
    out.kv_cas_two_writers_conflict_ratio = round(race.conflictRatio, 3);
    out.kv_cas_two_writers_lost_updates = race.lost;

    await new Promise<void>((resolve) => httpServer.close(() => resolve()));
    await local.stop();
    await frontend.close();
    await shared.stop();
    await clientNc.close();
  } finally {
    await server.close();
  }
  return out;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const { values } = parseArgs({ options: { seconds: { type: "string" }, agents: { type: "string" } } });
  const result = await runNatsBench({
    ...(values.seconds ? { seconds: Number(values.seconds) } : {}),
    ...(values.agents ? { agents: Number(values.agents) } : {}),
  });
  for (const [key, value] of Object.entries(result)) process.stdout.write(`${key.padEnd(44)} ${value}\n`);
}
