/**
 * @module What scale-out costs and gives: with 1, 2 and 4 frontends sharing
 * one window (JetStream KV, compare-and-set) over an instant simulated
 * replica, closed-loop agents each open a new session, run one step and
 * close it, round robin over the frontends. Reports sessions per second and
 * the window-claim latency of a new session's first step (arrival to
 * admission), and the cost of taking a session over from another frontend
 * (what a step pays behind a non-sticky balancer). Spawns its own
 * nats-server; everything else runs in this process.
 * Run: `npx tsx bench/scale-out.ts [--seconds N] [--agents N]`.
 */

import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { quantile, round } from "../adapters/bench/stats.js";
import { SimEngine } from "../adapters/engines/sim/sim-engine.js";
import { connectNatsFrontend, type NatsFrontend } from "../adapters/nats/frontend.js";
import { fleetSessionsFetch } from "../adapters/nats/http-sessions.js";
import { startNatsServer } from "../adapters/nats/nats-server-process.js";
import { createTokenizer } from "../adapters/tokenizers/index.js";
import { realClock } from "../src/clock.js";
import { Scheduler } from "../src/scheduler.js";

/** Options of {@link runScaleOutBench}. */
export interface ScaleOutBenchOptions {
  /** Seconds each run lasts. Default 3. */
  seconds?: number;
  /** Agents at once, across all frontends. Default 32. */
  agents?: number;
  /** Frontend counts to compare. Default 1, 2, 4. */
  frontends?: number[];
  /** The shared window, sessions. Default 16 (smaller than the agents, so claims move). */
  window?: number;
}

const tokenizer = createTokenizer();

interface Member {
  frontend: NatsFrontend;
  scheduler: Scheduler;
}

async function startFleet(url: string, count: number, window: number, engine: SimEngine, run: string) {
  const members: Member[] = [];
  for (let i = 0; i < count; i++) {
    const frontend = await connectNatsFrontend({ servers: url, frontendId: `${run}-fe-${i}` });
    const scheduler = new Scheduler({
      engines: [engine],
      clock: realClock,
      tokenizer,
      config: {
        window: { unit: "sessions", initial: window, min: window, max: window },
        sessions: { controlIntervalMs: 200 },
      },
      ...(frontend.windowAuthority ? { windowAuthority: frontend.windowAuthority } : {}),
      ...(frontend.sessionDirectory ? { sessionDirectory: frontend.sessionDirectory } : {}),
    });
    scheduler.start();
    await frontend.attach(scheduler);
    members.push({ frontend, scheduler });
  }
  // Each frontend takes new sessions once its first control tick saw the replica and its share was written.
  const deadline = performance.now() + 30_000;
  while (!members.every(({ frontend }) => frontend.windowAuthority?.view(engine.id)?.accepting)) {
    if (performance.now() > deadline) throw new Error("the shared window never opened");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return members;
}

async function stopFleet(members: Member[]): Promise<void> {
  for (const { frontend, scheduler } of members) {
    await frontend.close();
    await scheduler.stop();
  }
}

/** Runs one step; resolves with the time it waited for admission (its window claim), ms. */
async function step(scheduler: Scheduler, sessionId: string, requestId: string): Promise<number> {
  const call = await scheduler.submit({
    requestId,
    endpoint: "chat",
    stream: false,
    sessionId,
    input: { kind: "chat", messages: [{ role: "user", content: `step of ${sessionId}` }] },
    maxTokens: 2,
  });
  for await (const _ of call) {
    // drain
  }
  await call.result;
  return call.queueMs;
}

/** Closed loop: each agent opens a session on the next frontend, runs one step, closes it. */
async function sessionsLoop(members: Member[], agents: number, seconds: number, run: string) {
  const until = performance.now() + seconds * 1000;
  const claims: number[] = [];
  let sessions = 0;
  let next = 0;
  await Promise.all(
    Array.from({ length: agents }, async (_, agent) => {
      for (let n = 0; performance.now() < until; n++) {
        const member = members[next++ % members.length]!;
        const id = `${run}-a${agent}-s${n}`;
        claims.push(await step(member.scheduler, id, `${id}-r`));
        member.scheduler.closeSession(id);
        sessions++;
      }
    }),
  );
  return { sessionsPerSecond: sessions / seconds, claims };
}

/** A session stepping on each frontend in turn: every step after the first takes it over. */
async function takeoverSteps(members: Member[], steps: number, run: string): Promise<number[]> {
  const times: number[] = [];
  const id = `${run}-moving`;
  const fetches = members.map(({ frontend, scheduler }) =>
    fleetSessionsFetch(
      async (request: Request) => {
        await step(scheduler, id, `${id}-${request.headers.get("x-request-id")}`);
        return new Response("{}");
      },
      { scheduler, directory: frontend.sessionDirectory!, nc: frontend.nc },
    ),
  );
  for (let i = 0; i < steps; i++) {
    const request = new Request("http://bench/v1/chat/completions", {
      method: "POST",
      headers: { "x-session-id": id, "x-request-id": String(i) },
      body: "{}",
    });
    const started = performance.now();
    await fetches[i % fetches.length]!(request);
    if (i > 0) times.push(performance.now() - started);
  }
  for (const { scheduler } of members) scheduler.closeSession(id);
  return times;
}

/** Runs every measurement; keys are `<what>_<unit>`. */
export async function runScaleOutBench(options: ScaleOutBenchOptions = {}): Promise<Record<string, number>> {
  const seconds = options.seconds ?? 3;
  const agents = options.agents ?? 32;
  const window = options.window ?? 16;
  const server = await startNatsServer();
  const out: Record<string, number> = {};
  try {
    for (const count of options.frontends ?? [1, 2, 4]) {
      const engine = new SimEngine({ id: `instant-${count}`, clock: realClock, preset: "instant" });
      const members = await startFleet(server.url, count, window, engine, `f${count}`);
      await sessionsLoop(members, agents, 0.5, `f${count}-warm`);
      const measured = await sessionsLoop(members, agents, seconds, `f${count}`);
      out[`frontends_${count}_sessions_per_s`] = round(measured.sessionsPerSecond, 1);
      out[`frontends_${count}_window_claim_p50_ms`] = round(quantile(measured.claims, 0.5), 3);
      out[`frontends_${count}_window_claim_p99_ms`] = round(quantile(measured.claims, 0.99), 3);
      if (count > 1) {
        const takeovers = await takeoverSteps(members, 60, `f${count}`);
        out[`frontends_${count}_takeover_step_p50_ms`] = round(quantile(takeovers, 0.5), 3);
        out[`frontends_${count}_takeover_step_p99_ms`] = round(quantile(takeovers, 0.99), 3);
      }
      await stopFleet(members);
      await engine.close();
    }
  } finally {
    await server.close();
  }
  return out;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const { values } = parseArgs({ options: { seconds: { type: "string" }, agents: { type: "string" } } });
  const result = await runScaleOutBench({
    ...(values.seconds ? { seconds: Number(values.seconds) } : {}),
    ...(values.agents ? { agents: Number(values.agents) } : {}),
  });
  for (const [key, value] of Object.entries(result)) process.stdout.write(`${key.padEnd(44)} ${value}\n`);
}
