/**
 * @module Overload soak: the embedded fleet (`sluice serve` with simulated replicas, in real time)
 * driven at a multiple of its sustainable load by open-loop Poisson arrivals over HTTP. Measures SLO
 * attainment of admitted calls, refusal latency, event-loop lag and heap growth, and checks that
 * every permit, reservation, queue place and window slot is back at zero once the load stops.
 * Run: `npx tsx bench/soak.ts` (10 minutes; `SOAK_SECONDS=60` for one).
 */

import { monitorEventLoopDelay } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import v8 from "node:v8";
import vm from "node:vm";
import { quantile, round } from "../adapters/bench/stats.js";
import { type RunningServer, startServer } from "../adapters/cli/serve.js";
import { type PresetOverrides, resolveSimParams, stepTimeMs } from "../adapters/engines/sim/presets.js";
import { createTokenizer } from "../adapters/tokenizers/index.js";
import { defaultStatus, isRefusalReason } from "../src/errors.js";
import type { IdleCheck } from "../src/scheduler.js";

/** Options of {@link runSoakBench}; every field has a default. */
export interface SoakOptions {
  /** Length of the load, s. Default 60. */
  seconds?: number;
  /** Offered load as a multiple of the derived sustainable rate. Default 1.5. */
  loadFactor?: number;
  /** Simulated replicas. Default 2 (the `sluice serve` default). */
  replicas?: number;
  /**
   * Preset of the replicas. Default h100-llama3-8b with `max_num_seqs` 8: the fleet, not the
   * machine running the test, must be the bottleneck, so its capacity is kept to tens of calls/s.
   */
  preset?: PresetOverrides;
  /** Generated tokens per call. Default 64. */
  outputTokens?: number;
  /** Words of each call's user message (the prompt is about twice as many tokens). Default 90. */
  promptWords?: number;
  /**
   * Draw prompts from this many fixed ones instead of making each one new. Default: every prompt new
   * (the prompt-token cache then fills toward its cap, which shows as heap growth).
   */
  promptPool?: number;
  /** Share of calls that are steps of a session (x-session-id). Default 0.3. */
  sessionShare?: number;
  /** Share of calls that stream. Default 0.5. */
  streamShare?: number;
  /** SLO of an admitted call: time to first token and time per output token, ms. Default 2000 / 50. */
  slo?: { ttftMs: number; tpotMs: number };
  /** The heap baseline is taken this far into the load, s. Default min(10, seconds / 4). */
  warmupSeconds?: number;
  /** Seed of arrivals and prompts. Default 1. */
  seed?: number;
  /** Progress lines. Default: none. */
  log?: (line: string) => void;
}

/** What a soak measured. Latencies in ms, memory in MiB. */
export interface SoakResult {
  seconds: number;
  replicas: number;
  maxNumSeqs: number;
  sustainableRatePerSecond: number;
  offeredRatePerSecond: number;
  arrivals: number;
  admitted: number;
  completed: number;
  /** Refusals by `"<status> <reason>"`. */
  refused: Record<string, number>;
  /** Refusals whose envelope broke docs/http-api.md (no JSON, no reason, no Retry-After where due). */
  malformedRefusals: number;
  /** 5xx other than the overload status and 503, streams that ended with an error event, transport failures. */
  errors: number;
  errorSamples: string[];
  sloAttainment: number;
  ttftP50: number;
  ttftP99: number;
  tpotP50: number;
  tpotP99: number;
  refusalLatencyP50: number;
  refusalLatencyP99: number;
  eventLoopLagP50: number;
  eventLoopLagP99: number;
  eventLoopLagMax: number;
  heapAfterWarmupMiB: number;
  heapAtEndMiB: number;
  heapGrowthMiB: number;
  /** Whether the heap figures were taken after a forced full GC. */
  gcForced: boolean;
  /** Held once the load stopped and every session was closed: all must be zero. */
  leftover: IdleCheck & { trackedCalls: number };
}

/** Sampling interval of the event-loop delay histogram, ms. */
const LAG_RESOLUTION_MS = 10;

const DEFAULT_PRESET: PresetOverrides = { base: "h100-llama3-8b", maxNumSeqs: 8 };

/** A 32-bit PRNG (mulberry32): arrivals and prompts repeat for a seed. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The fleet's sustainable call rate (calls/s), derived from the step-time model (docs/simulator.md): at
 * saturation each rank runs `max_num_seqs` = B calls; each call is one prefill of I tokens and O
 * decode steps, so a step carries B/O prefills and B decodes and lasts
 * `T = c0 + max(0, cPrefill·(B/O)·I + cDec·B − cPrefill·128) + cKv·B·(I + O/2) + cPfattn·(B/O)·I²/2`;
 * a rank completes B/O calls per step. Real-time stepping only makes steps longer, so this is an
 * upper bound: a load above it is an overload for certain.
 */
export function sustainableRate(options: {
  preset?: PresetOverrides;
  replicas: number;
  inputTokens: number;
  outputTokens: number;
}): number {
  const params = resolveSimParams(options.preset ?? DEFAULT_PRESET);
  const b = params.maxNumSeqs;
  const i = options.inputTokens;
  const o = options.outputTokens;
  const prefillsPerStep = b / o;
  const stepMs = stepTimeMs(params, {
    prefillTokens: prefillsPerStep * i,
    decodeSeqs: b,
    decodeContextTokens: b * (i + o / 2),
    prefillPairs: prefillsPerStep * ((i * i) / 2),
  });
  return (options.replicas * prefillsPerStep * 1000) / stepMs;
}

/** A full GC when the runtime allows one (the flag can be set at run time). */
function forcedGc(): (() => void) | undefined {
  const exposed = (globalThis as { gc?: () => void }).gc;
  if (exposed) return exposed;
  try {
    v8.setFlagsFromString("--expose-gc");
    return vm.runInNewContext("gc") as () => void;
  } catch {
    return undefined;
  }
}

interface CallRecord {
  status: number;
  reason?: string;
  ttftMs?: number;
  tpotMs?: number;
  e2eMs: number;
  stream: boolean;
  outputTokens: number;
  error?: string;
}

/** Runs one soak and returns its figures. Never throws for what it measures; the caller judges. */
export async function runSoakBench(options: SoakOptions = {}): Promise<SoakResult> {
  const seconds = options.seconds ?? 60;
  const loadFactor = options.loadFactor ?? 1.5;
  const replicas = options.replicas ?? 2;
  const preset = options.preset ?? DEFAULT_PRESET;
  const outputTokens = options.outputTokens ?? 64;
  const promptWords = options.promptWords ?? 90;
  const sessionShare = options.sessionShare ?? 0.3;
  const streamShare = options.streamShare ?? 0.5;
  const slo = options.slo ?? { ttftMs: 2000, tpotMs: 50 };
  const warmupSeconds = options.warmupSeconds ?? Math.min(10, seconds / 4);
  const log = options.log ?? (() => {});
  const random = prng(options.seed ?? 1);
  const tokenizer = createTokenizer();

  const fresh = (salt: string) =>
    `${salt} ${Array.from({ length: promptWords }, () => `w${Math.floor(random() * 500)}`).join(" ")}`;
  // With a pool, prompts repeat: the prompt-token cache stays small, so heap growth shows anything else.
  const pool = options.promptPool
    ? Array.from({ length: options.promptPool }, (_, i) => fresh(`pool ${i}`))
    : undefined;
  const prompt = (salt: string) => (pool ? pool[Math.floor(random() * pool.length)]! : fresh(salt));
  const inputTokens = tokenizer.encode(prompt("sample")).length + 8;
  const sustainable = sustainableRate({ preset, replicas, inputTokens, outputTokens });
  const rate = sustainable * loadFactor;
  const maxNumSeqs = resolveSimParams(preset).maxNumSeqs;
  log(
    `soak: ${replicas} replicas, max_num_seqs ${maxNumSeqs}, ~${inputTokens} input + ${outputTokens} output tokens`,
  );
  log(
    `soak: sustainable ≈ ${sustainable.toFixed(1)} calls/s; offering ${rate.toFixed(1)} calls/s for ${seconds} s`,
  );

  const server: RunningServer = await startServer({
    port: 0,
    host: "127.0.0.1",
    simReplicas: replicas,
    simPreset: preset,
    log: () => {},
    drainTimeoutMs: 5000,
  });
  const gc = forcedGc();
  const lag = monitorEventLoopDelay({ resolution: LAG_RESOLUTION_MS });
  const records: CallRecord[] = [];
  const inFlight = new Set<Promise<void>>();
  const sessions: { id: string; steps: number; history: string[] }[] = [];
  const opened = new Set<string>();
  let sessionSeq = 0;
  let heapAfterWarmup = 0;

  const oneCall = async (index: number): Promise<void> => {
    const stream = random() < streamShare;
    const headers: Record<string, string> = { "content-type": "application/json" };
    let messages: { role: string; content: string }[];
    let session: (typeof sessions)[number] | undefined;
    let retire = false;
    if (random() < sessionShare) {
      // A pool of agent sessions, each a few steps long with a growing context.
      if (sessions.length < 16) sessions.push({ id: `soak-${sessionSeq++}`, steps: 0, history: [] });
      session = sessions[Math.floor(random() * sessions.length)]!;
      session.steps++;
      session.history.push(prompt(`step ${session.steps}`));
      // The last step retires the session: a finished agent closes it, freeing its window slot.
      retire = session.steps >= 4;
      if (retire) sessions.splice(sessions.indexOf(session), 1);
      headers["x-session-id"] = session.id;
      opened.add(session.id);
      messages = session.history.flatMap((content) => [
        { role: "user", content },
        { role: "assistant", content: "noted, next" },
      ]);
      messages.pop();
    } else {
      messages = [{ role: "user", content: prompt(`call ${index}`) }];
    }
    const started = performance.now();
    const record: CallRecord = { status: 0, e2eMs: 0, stream, outputTokens: 0 };
    try {
      const response = await fetch(`${server.url}/v1/chat/completions`, {
        method: "POST",
        headers,
        body: JSON.stringify({ messages, max_tokens: outputTokens, stream }),
      });
      record.status = response.status;
      if (response.status !== 200) {
        const text = await response.text();
        record.e2eMs = performance.now() - started;
        try {
          const reason = (JSON.parse(text) as { error?: { code?: string } }).error?.code;
          if (reason) record.reason = reason;
        } catch {
          // Counted as malformed below.
        }
        const retryAfter = response.headers.get("retry-after");
        const retryable = response.status === 429 || response.status === 503 || response.status === 529;
        if (retryable && !/^[1-9][0-9]*$/.test(retryAfter ?? "")) record.reason = undefined;
      } else if (stream) {
        const reader = response.body!.getReader();
        const decoder = new TextDecoder();
        let buffered = "";
        let first = 0;
        let last = 0;
        for (;;) {
          const next = await reader.read();
          if (next.done) break;
          buffered += decoder.decode(next.value, { stream: true });
          let cut = buffered.indexOf("\n\n");
          while (cut >= 0) {
            const event = buffered.slice(0, cut);
            buffered = buffered.slice(cut + 2);
            cut = buffered.indexOf("\n\n");
            if (event.startsWith("event: error")) record.error = `stream error: ${event.slice(0, 200)}`;
            if (event.includes('"content":"') && !event.includes('"content":""')) {
              const now = performance.now();
              if (first === 0) first = now;
              last = now;
              record.outputTokens++;
            }
          }
        }
        record.e2eMs = performance.now() - started;
        if (first > 0) {
          record.ttftMs = first - started;
          if (record.outputTokens > 1) record.tpotMs = (last - first) / (record.outputTokens - 1);
        }
      } else {
        const body = (await response.json()) as { usage?: { completion_tokens?: number } };
        record.e2eMs = performance.now() - started;
        record.outputTokens = body.usage?.completion_tokens ?? 0;
      }
    } catch (error) {
      record.error = `transport: ${(error as Error).message}`;
      record.e2eMs = performance.now() - started;
    }
    records.push(record);
    if (session && retire) {
      await fetch(`${server.url}/v1/sessions/${session.id}`, { method: "DELETE" }).then(
        (r) => r.body?.cancel(),
        () => undefined,
      );
    }
  };

  lag.enable();
  const startedAt = performance.now();
  let arrivals = 0;
  let nextArrival = startedAt;
  let warmedUp = false;
  let lastLogged = 0;
  // Open loop: arrivals are due whatever happened to earlier calls.
  while (performance.now() - startedAt < seconds * 1000) {
    const now = performance.now();
    while (nextArrival <= now) {
      const call = oneCall(arrivals++);
      inFlight.add(call);
      void call.finally(() => inFlight.delete(call));
      nextArrival += (-Math.log(1 - random()) / rate) * 1000;
    }
    if (!warmedUp && now - startedAt >= warmupSeconds * 1000) {
      warmedUp = true;
      gc?.();
      heapAfterWarmup = process.memoryUsage().heapUsed;
    }
    const elapsed = Math.floor((now - startedAt) / 10_000) * 10;
    if (elapsed > lastLogged) {
      lastLogged = elapsed;
      log(`soak: ${elapsed} s, ${arrivals} arrivals, ${inFlight.size} in flight`);
    }
    await new Promise((resolve) =>
      setTimeout(resolve, Math.max(1, Math.min(10, nextArrival - performance.now()))),
    );
  }
  const loadSeconds = (performance.now() - startedAt) / 1000;
  // Let the calls in flight end (the gate bounds how long they can queue).
  log(`soak: load stopped with ${inFlight.size} calls in flight`);
  let giveUp: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.allSettled([...inFlight]),
    new Promise((resolve) => {
      giveUp = setTimeout(resolve, 60_000);
    }),
  ]);
  clearTimeout(giveUp);
  log(`soak: ${inFlight.size} calls still in flight`);
  lag.disable();
  for (const id of opened) server.scheduler.closeSession(id);
  gc?.();
  const heapAtEnd = process.memoryUsage().heapUsed;
  const idle = server.scheduler.idleCheck();
  const leftover = { ...idle, trackedCalls: server.tracker.size };
  await server.close();

  const admittedCalls = records.filter((r) => r.status === 200);
  const refused: Record<string, number> = {};
  let malformed = 0;
  let errors = 0;
  const errorSamples: string[] = [];
  for (const record of records) {
    if (record.error) {
      errors++;
      if (errorSamples.length < 5) errorSamples.push(record.error);
      continue;
    }
    if (record.status === 200) continue;
    const valid =
      record.reason !== undefined &&
      isRefusalReason(record.reason) &&
      (defaultStatus(record.reason) === record.status || record.reason === "worker_overloaded");
    if (!valid) malformed++;
    if (record.status >= 500 && record.status !== 503 && record.status !== 529) {
      errors++;
      if (errorSamples.length < 5) errorSamples.push(`${record.status} ${record.reason ?? "?"}`);
    }
    const key = `${record.status} ${record.reason ?? "malformed"}`;
    refused[key] = (refused[key] ?? 0) + 1;
  }
  const metSlo = admittedCalls.filter((r) => {
    if (r.error) return false;
    if (r.stream)
      return (r.ttftMs ?? Number.POSITIVE_INFINITY) <= slo.ttftMs && (r.tpotMs ?? 0) <= slo.tpotMs;
    return r.e2eMs <= slo.ttftMs + outputTokens * slo.tpotMs;
  }).length;
  const streamed = admittedCalls.filter((r) => r.stream && r.ttftMs !== undefined);
  const refusals = records.filter((r) => r.status !== 200 && r.status !== 0);
  const lagMs = (ns: number) => round(Math.max(0, ns / 1e6 - LAG_RESOLUTION_MS), 2);
  const mib = (bytes: number) => round(bytes / (1024 * 1024), 1);
  return {
    seconds: round(loadSeconds, 1),
    replicas,
    maxNumSeqs,
    sustainableRatePerSecond: round(sustainable, 1),
    offeredRatePerSecond: round(arrivals / loadSeconds, 1),
    arrivals,
    admitted: admittedCalls.length,
    completed: admittedCalls.filter((r) => !r.error).length,
    refused,
    malformedRefusals: malformed,
    errors,
    errorSamples,
    sloAttainment: round(admittedCalls.length > 0 ? metSlo / admittedCalls.length : 0, 4),
    ttftP50: round(
      quantile(
        streamed.map((r) => r.ttftMs!),
        0.5,
      ),
      1,
    ),
    ttftP99: round(
      quantile(
        streamed.map((r) => r.ttftMs!),
        0.99,
      ),
      1,
    ),
    tpotP50: round(
      quantile(
        streamed.filter((r) => r.tpotMs !== undefined).map((r) => r.tpotMs!),
        0.5,
      ),
      2,
    ),
    tpotP99: round(
      quantile(
        streamed.filter((r) => r.tpotMs !== undefined).map((r) => r.tpotMs!),
        0.99,
      ),
      2,
    ),
    refusalLatencyP50: round(
      quantile(
        refusals.map((r) => r.e2eMs),
        0.5,
      ),
      2,
    ),
    refusalLatencyP99: round(
      quantile(
        refusals.map((r) => r.e2eMs),
        0.99,
      ),
      2,
    ),
    // The histogram holds each sampling interval whole; the lag is what exceeds the resolution.
    eventLoopLagP50: lagMs(lag.percentile(50)),
    eventLoopLagP99: lagMs(lag.percentile(99)),
    eventLoopLagMax: lagMs(lag.max),
    heapAfterWarmupMiB: mib(heapAfterWarmup),
    heapAtEndMiB: mib(heapAtEnd),
    heapGrowthMiB: mib(heapAtEnd - heapAfterWarmup),
    gcForced: gc !== undefined,
    leftover,
  };
}

/** The figures as a plain-text table. */
export function formatSoakTable(result: SoakResult): string {
  const refused = Object.values(result.refused).reduce((a, b) => a + b, 0);
  const rows: [string, string][] = [
    [
      "load",
      `${result.offeredRatePerSecond} calls/s offered for ${result.seconds} s (${round(result.offeredRatePerSecond / result.sustainableRatePerSecond, 2)} × sustainable ${result.sustainableRatePerSecond} calls/s; ${result.replicas} replicas, max_num_seqs ${result.maxNumSeqs})`,
    ],
    [
      "calls",
      `${result.arrivals} arrived, ${result.admitted} admitted, ${result.completed} completed, ${refused} refused`,
    ],
    [
      "refusals",
      Object.entries(result.refused)
        .map(([k, v]) => `${k}: ${v}`)
        .join(", ") || "none",
    ],
    ["SLO attainment (admitted)", `${round(result.sloAttainment * 100, 2)} %`],
    ["TTFT p50 / p99", `${result.ttftP50} / ${result.ttftP99} ms`],
    ["TPOT p50 / p99", `${result.tpotP50} / ${result.tpotP99} ms`],
    ["refusal latency p50 / p99", `${result.refusalLatencyP50} / ${result.refusalLatencyP99} ms`],
    [
      "event-loop lag p50 / p99 / max",
      `${result.eventLoopLagP50} / ${result.eventLoopLagP99} / ${result.eventLoopLagMax} ms`,
    ],
    [
      "heap after warm-up → end",
      `${result.heapAfterWarmupMiB} → ${result.heapAtEndMiB} MiB (${result.heapGrowthMiB >= 0 ? "+" : ""}${result.heapGrowthMiB} MiB${result.gcForced ? ", after full GC" : ""})`,
    ],
    ["errors, malformed refusals", `${result.errors}, ${result.malformedRefusals}`],
    [
      "held after the load",
      `permits ${result.leftover.permits}, reservations ${result.leftover.reservations}, window slots ${result.leftover.windowSlots}, queued ${result.leftover.queued}, calls ${result.leftover.trackedCalls}`,
    ],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `${k.padEnd(width)}  ${v}`).join("\n");
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const seconds = Number(process.env.SOAK_SECONDS ?? "600");
  if (!(Number.isFinite(seconds) && seconds > 0)) {
    process.stderr.write(
      `SOAK_SECONDS must be a positive number of seconds, got ${process.env.SOAK_SECONDS}\n`,
    );
    process.exit(2);
  }
  const pool = process.env.SOAK_PROMPT_POOL ? Number(process.env.SOAK_PROMPT_POOL) : undefined;
  const result = await runSoakBench({
    seconds,
    ...(pool ? { promptPool: pool } : {}),
    log: (line) => process.stderr.write(`${line}\n`),
  });
  process.stdout.write(`${formatSoakTable(result)}\n`);
  if (process.env.SOAK_JSON) {
    const { writeFileSync } = await import("node:fs");
    writeFileSync(process.env.SOAK_JSON, `${JSON.stringify(result, null, 2)}\n`);
  }
}
