/** @module The operator's log: start-up URLs and limits, a sampled access and refusal log, window law decisions, stage and health changes with their cause; JSON off a terminal, readable lines on one; `--log-level`. */

import assert from "node:assert/strict";
import { afterEach, test } from "node:test";
import { type RunningServer, serveOptionsFromArgs, startServer } from "../../adapters/cli/serve.js";
import { StateHistory } from "../../adapters/dashboard/history.js";
import { createApp } from "../../adapters/http/app.js";
import { createLogger, prettyLine } from "../../adapters/log/logger.js";
import { VirtualClock } from "../../src/clock.js";
import { ConfigError } from "../../src/config/config-error.js";
import type { SchedulerEvents } from "../../src/types.js";
import { assertIdle, assertRefusal, chat, type Harness, makeHarness } from "../http/harness.js";
import { replicaState, StubScheduler } from "../http/stub-scheduler.js";

type Line = Record<string, unknown> & { level: number; msg: string };

function capture() {
  const raw: string[] = [];
  // Plain lines an embedder's `log` receives as they are sit beside the structured ones.
  const lines = () => raw.filter((line) => line.startsWith("{")).map((line) => JSON.parse(line) as Line);
  return { raw, lines, write: (line: string) => raw.push(line) };
}

let h: Harness | undefined;
let server: RunningServer | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
  await server?.close();
  server = undefined;
});

test("start-up says where the API, dashboard and metrics are, what is served and the limits", async () => {
  const out = capture();
  server = await startServer({ port: 0, host: "127.0.0.1", simReplicas: 2, log: out.write });
  const startup = out.lines().find((line) => /listening/.test(line.msg));
  assert.ok(startup, "a start-up line");
  assert.equal(startup.level, 30);
  assert.equal(startup.api, `${server.url}/v1`);
  assert.equal(startup.dashboard, `${server.url}/dashboard`);
  assert.equal(startup.metrics, `${server.url}/metrics`);
  assert.match(String(startup.upstreams), /2 simulated replica/);
  assert.equal((startup.replicas as unknown[]).length, 2);
  const replica = (startup.replicas as Record<string, unknown>[])[0]!;
  assert.equal(replica.engine, "sim");
  assert.ok(Number(replica.kvCapacityTokens) > 0);
  assert.ok((replica.gate as { engineRequestLimit: number }).engineRequestLimit > 0);
  assert.ok((startup.models as string[]).length > 0);
  assert.ok(Number((startup.limits as { bodyLimitBytes: number }).bodyLimitBytes) > 0);
  // Served calls are logged over a real socket too.
  const response = await fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-session-id": "log-me" },
    body: JSON.stringify(chat({ max_tokens: 3 })),
  });
  assert.equal(response.status, 200);
  await response.text();
  for (let i = 0; i < 50 && !out.lines().some((l) => l.msg === "served"); i++)
    await new Promise((resolve) => setTimeout(resolve, 20));
  const served = out.lines().find((l) => l.msg === "served")!;
  assert.equal(served.session, "log-me");
  assert.equal(served.status, 200);
  assert.match(String(served.replica), /^sim-[01]$/);
  assert.equal(typeof served.queue_ms, "number");
  server.scheduler.closeSession("log-me");
});

test("refusals are logged with reason, replica, lane, session and queue time, sampled to one a second per reason", async () => {
  const out = capture();
  const harness = makeHarness({
    replicas: 1,
    // No budget queue: each of these calls is refused at once.
    config: { budget: { ceilingTokens: 10_000, queueLimit: 0 } },
    logger: createLogger({ write: out.write, isTTY: false }),
  });
  h = harness;
  const holder = await harness.drive(
    harness.request("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 5000, stream: true }),
    }),
  );
  for (let i = 0; i < 12; i++) {
    const { response, text } = await harness.call("/v1/chat/completions", {
      method: "POST",
      json: chat({ max_tokens: 5000 }),
      headers: { "x-session-id": `waiting-${i}` },
    });
    assertRefusal(response, text, 429, "token_budget_exhausted");
  }
  let refused = out.lines().filter((l) => l.reason === "token_budget_exhausted");
  assert.ok(refused.length < 12, `sampled: ${refused.length} lines for 12 refusals`);
  const first = refused[0]!;
  assert.equal(first.level, 40);
  assert.equal(first.status, 429);
  assert.equal(first.replica, "sim-0");
  assert.equal(first.lane, "bulk", "max_tokens 5000 is bulk");
  assert.equal(first.session, "waiting-0");
  assert.equal(typeof first.queue_ms, "number");
  assert.match(first.msg, /refused 429 token_budget_exhausted: .*tokens reserved of a ceiling/);
  // Every refusal is at debug level, so nothing is lost for whoever asks for it.
  assert.equal(out.raw.length, refused.length + out.lines().filter((l) => l.level === 30).length);

  await harness.clock.advanceAsync(1000);
  const { response, text } = await harness.call("/v1/chat/completions", {
    method: "POST",
    json: chat({ max_tokens: 5000 }),
  });
  assertRefusal(response, text, 429, "token_budget_exhausted");
  refused = out.lines().filter((l) => l.reason === "token_budget_exhausted");
  const counted = refused.reduce((sum, l) => sum + 1 + Number(l.unlogged_since_last ?? 0), 0);
  assert.equal(counted, 13, "each line says how many like it were left out since the last one");
  await holder.body!.cancel();
  for (let i = 0; i < 12; i++) harness.scheduler.closeSession(`waiting-${i}`);
  assertIdle(harness.scheduler);
});

test("window law decisions, stage and health changes are logged with their cause", async () => {
  const out = capture();
  const clock = new VirtualClock();
  const scheduler = new StubScheduler([replicaState("gpu-a"), replicaState("gpu-b")]);
  const history = new StateHistory({ scheduler, clock, sampleMs: 1000 });
  createApp({ scheduler, history, clock, logger: createLogger({ write: out.write, isTTY: false }) });
  const emit = <K extends keyof SchedulerEvents>(
    name: K,
    e: Parameters<NonNullable<SchedulerEvents[K]>>[0],
  ) => scheduler.emit(name, e);

  emit("window", {
    replica: "gpu-a",
    unit: "tokens",
    from: 64_000,
    to: 32_000,
    action: "decrease",
    cause: "thrash: KV usage 0.93 > U_high 0.5 and hit rate 0.12 < H_low 0.2",
  });
  const window = out.lines().find((l) => l.event === "window")!;
  assert.equal(window.level, 30);
  assert.equal(window.replica, "gpu-a");
  assert.match(window.msg, /gpu-a W 64000 → 32000 tokens \(decrease\)/);
  assert.match(String(window.cause), /thrash/);

  // The scheduler reports stage and health changes as events, with their causes.
  await clock.advanceAsync(1000);
  scheduler.emit("stage", {
    from: "normal",
    to: "shedding",
    cause: "p95 interactive queue age 3000 ms over 40 calls in the last window",
  });
  scheduler.emit("health", {
    replica: "gpu-b",
    healthy: false,
    cause: "its signals are stale (last read 7.5 s ago): its /metrics endpoint cannot be read",
  });
  await clock.advanceAsync(1000);
  const stage = out.lines().find((l) => l.event === "stage")!;
  assert.equal(stage.level, 40);
  assert.match(stage.msg, /overload stage normal → shedding/);
  assert.match(String(stage.cause), /interactive queue age/);
  const health = out.lines().find((l) => l.event === "health")!;
  assert.equal(health.level, 40);
  assert.equal(health.replica, "gpu-b");
  assert.match(health.msg, /replica gpu-b unhealthy/);
  assert.match(String(health.cause), /stale \(last read 7\.5 s ago\)/);

  scheduler.emit("health", { replica: "gpu-b", healthy: true, cause: "its signals are fresh again" });
  await clock.advanceAsync(1000);
  const back = out.lines().filter((l) => l.event === "health");
  assert.equal(back.length, 2);
  assert.equal(back[1]!.level, 30);
  assert.match(back[1]!.msg, /gpu-b healthy/);
  history.stop();
});

test("JSON off a terminal, readable lines on one; levels filter", () => {
  const json = capture();
  createLogger({ write: json.write, isTTY: false }).info({ replica: "r1" }, "hello");
  const parsed = JSON.parse(json.raw[0]!);
  assert.equal(parsed.msg, "hello");
  assert.equal(parsed.replica, "r1");
  assert.equal(typeof parsed.time, "number");

  const tty: string[] = [];
  createLogger({ write: (l) => tty.push(l), isTTY: true }).warn({ reason: "queue_full", n: 3 }, "refused");
  assert.match(tty[0]!, /^\d\d:\d\d:\d\d\.\d{3} WARN {2}refused reason=queue_full n=3$/);
  assert.equal(prettyLine("not json"), "not json");

  const quiet = capture();
  const logger = createLogger({ write: quiet.write, level: "warn", isTTY: false });
  logger.info("not shown");
  logger.warn("shown");
  assert.deepEqual(
    quiet.lines().map((l) => l.msg),
    ["shown"],
  );
  assert.throws(() => createLogger({ level: "loud" as never }), /log level must be one of/);
});

test("--log-level and SLUICE_LOG_LEVEL reach the server; a wrong value names the flag", async () => {
  assert.equal((await serveOptionsFromArgs(["--log-level", "debug"], {})).logLevel, "debug");
  assert.equal((await serveOptionsFromArgs([], { SLUICE_LOG_LEVEL: "warn" })).logLevel, "warn");
  await assert.rejects(
    serveOptionsFromArgs(["--log-level", "chatty"], {}),
    (err: Error) =>
      err instanceof ConfigError && /--log-level/.test(err.message) && /chatty/.test(err.message),
  );
});

test("W growing every control interval is one info line per 30 s per replica; a cut is always one", async () => {
  const out = capture();
  const clock = new VirtualClock();
  const scheduler = new StubScheduler([replicaState("gpu-a")]);
  const history = new StateHistory({ scheduler, clock });
  createApp({ scheduler, history, clock, logger: createLogger({ write: out.write, isTTY: false }) });
  const grow = (from: number) =>
    scheduler.emit("window", {
      replica: "gpu-a",
      unit: "tokens",
      from,
      to: from * 2,
      action: "increase",
      cause: "slow start: sessions wait, KV usage 0.1 < U_low",
    });
  for (let i = 0; i < 10; i++) {
    grow(1000 * 2 ** i);
    await clock.advanceAsync(2000);
  }
  const windowLines = () => out.lines().filter((l) => l.event === "window");
  assert.equal(windowLines().length, 1, "ten doublings in 20 s: one line");
  scheduler.emit("window", {
    replica: "gpu-a",
    unit: "tokens",
    from: 1_024_000,
    to: 512_000,
    action: "decrease",
    cause: "thrash",
  });
  grow(512_000);
  assert.deepEqual(
    windowLines().map((l) => /\((\w+)\)$/.exec(l.msg)?.[1]),
    ["increase", "decrease", "increase"],
    "a cut, and the first growth after it, are news",
  );
  history.stop();
});

test("an unreachable upstream is a warning with its cause soon after start-up", async () => {
  const out = capture();
  // Port 9 (discard) on loopback: nothing listens, every scrape is refused at once.
  server = await startServer({
    port: 0,
    host: "127.0.0.1",
    upstreams: ["http://127.0.0.1:9"],
    log: out.write,
  });
  const startup = out.lines().find((l) => /listening/.test(l.msg))!;
  assert.deepEqual(startup.models, []);
  let warning: Line | undefined;
  for (let i = 0; i < 100 && !warning; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    warning = out.lines().find((l) => l.event === "health");
  }
  assert.ok(warning, "a health line within 5 s");
  assert.equal(warning.level, 40);
  assert.match(warning.msg, /replica 127\.0\.0\.1:9 unhealthy/);
  assert.match(String(warning.cause), /since start-up/);
  assert.match(String(warning.cause), /\/metrics endpoint cannot be reached/);
});
