/** @module `sluice tune`: Little's law from two scrapes of a gate's `/metrics` — L, C, W and a suggested waiting limit. */

import { readFile } from "node:fs/promises";
import { z } from "zod";
import { ConfigError } from "../../src/config/config-error.js";
import { defineSetting, type Setting } from "../../src/config/settings.js";
import { type MetricSample, parsePrometheusText } from "../engines/openai/metrics-parser.js";
import { type CommandIo, type CommandSpec, httpUrl, runCommand } from "./command-line.js";
import { describeError } from "./error-cause.js";

/** One (worker, dp_rank) row of the report. */
export interface TuneRow {
  worker: string;
  /** Rank id, `unspecified` for unranked calls, or `all` for a worker's total over its ranks. */
  dpRank: string;
  /** L: time-average number of admitted calls before their first token (mean of the two samples). */
  waiting: number;
  /** Mean gate queue length over the interval (mean of the two samples). */
  queued: number;
  /** C: admissions per second (direct + from the queue) over the interval. */
  admitRatePerS: number;
  /** W = L / C: mean time an admitted call waits for its first token, seconds; null when nothing was admitted. */
  waitSeconds: number | null;
  /** The waiting limit the gate ran with (per rank), when the scrape shows it. */
  currentWaitingLimit: number | null;
  /** ⌈L⌉, at least 1: the per-rank `--engine-request-waiting-limit` that would have let this load through. */
  suggestedWaitingLimit: number;
  /** Reasons the numbers understate demand (queueing, rejections, cancellations, counter resets). */
  warnings: string[];
}

/** The whole report. */
export interface TuneReport {
  intervalSeconds: number;
  rows: TuneRow[];
  notes: string[];
}

const WAITING = "sluice_gate_engine_request_waiting_count";
const QUEUED = "sluice_gate_request_queue_count";
const ADMITS = "sluice_gate_request_admit_total";
const REJECTIONS = "sluice_gate_rejection_total";
const CANCELLATIONS = "sluice_gate_cancellation_total";
const LIMIT = "sluice_gate_limit";

type Key = string;
const keyOf = (worker: string, rank: string): Key => `${worker}\u0000${rank}`;

interface Totals {
  waiting: number;
  queued: number;
  admitDirect: number;
  admitQueue: number;
  rejections: number;
  cancellations: number;
}

function emptyTotals(): Totals {
  return { waiting: 0, queued: 0, admitDirect: 0, admitQueue: 0, rejections: 0, cancellations: 0 };
}

/** Sums one scrape's gate samples per (worker, dp_rank); also returns the waiting limit per worker. */
function gather(samples: readonly MetricSample[]): { rows: Map<Key, Totals>; limits: Map<string, number> } {
  const rows = new Map<Key, Totals>();
  const limits = new Map<string, number>();
  const row = (s: MetricSample) => {
    const key = keyOf(s.labels.worker ?? "", s.labels.dp_rank ?? "unspecified");
    const existing = rows.get(key);
    if (existing) return existing;
    const totals = emptyTotals();
    rows.set(key, totals);
    return totals;
  };
  for (const s of samples) {
    if (!Number.isFinite(s.value)) continue;
    switch (s.name) {
      case WAITING:
        row(s).waiting += s.value;
        break;
      case QUEUED:
        row(s).queued += s.value;
        break;
      case ADMITS:
        if (s.labels.source === "queue") row(s).admitQueue += s.value;
        else row(s).admitDirect += s.value;
        break;
      case REJECTIONS:
        row(s).rejections += s.value;
        break;
      case CANCELLATIONS:
        row(s).cancellations += s.value;
        break;
      case LIMIT:
        if (s.labels.kind === "engine_request_waiting" && s.labels.worker !== undefined) {
          limits.set(s.labels.worker, s.value);
        }
        break;
    }
  }
  return { rows, limits };
}

function rowFrom(
  worker: string,
  dpRank: string,
  a: Totals,
  b: Totals,
  intervalSeconds: number,
  limit: number | null,
): TuneRow {
  const warnings: string[] = [];
  const delta = (x: number, y: number, what: string) => {
    if (y < x) {
      warnings.push(`${what} went down (restart between scrapes?); its rate is unusable`);
      return 0;
    }
    return y - x;
  };
  const direct = delta(a.admitDirect, b.admitDirect, "admissions");
  const queued = delta(a.admitQueue, b.admitQueue, "queue admissions");
  const rejected = delta(a.rejections, b.rejections, "rejections");
  const cancelled = delta(a.cancellations, b.cancellations, "cancellations");
  const waiting = (a.waiting + b.waiting) / 2;
  const queueMean = (a.queued + b.queued) / 2;
  const admitRatePerS = (direct + queued) / intervalSeconds;
  if (queued > 0 || a.queued > 0 || b.queued > 0) {
    warnings.push(
      `calls queued in the gate during the interval (${queued} admitted from the queue): ` +
        "the waiting limit was binding, so L understates demand; raise the limit and measure again",
    );
  }
  if (rejected > 0) warnings.push(`${rejected} rejection(s) in the interval: demand above what was admitted`);
  if (cancelled > 0) warnings.push(`${cancelled} cancellation(s) in the interval: clients gave up waiting`);
  if (direct + queued === 0) warnings.push("no admissions in the interval: nothing to measure");
  return {
    worker,
    dpRank,
    waiting,
    queued: queueMean,
    admitRatePerS,
    waitSeconds: admitRatePerS > 0 ? waiting / admitRatePerS : null,
    currentWaitingLimit: limit,
    suggestedWaitingLimit: Math.max(1, Math.ceil(waiting - 1e-9)),
    warnings,
  };
}

/**
 * Applies Little's law (L = C·W) to two scrapes taken `intervalSeconds` apart.
 * L is the mean of the waiting count at the two scrapes — a two-point
 * estimate of the time average, good when the load is steady over the
 * interval; C is the admission rate (Δ direct + Δ queue ÷ interval); W = L/C.
 * The suggestion ⌈L⌉ is a mean, not a tail bound.
 */
export function littleLaw(beforeText: string, afterText: string, intervalSeconds: number): TuneReport {
  if (!(Number.isFinite(intervalSeconds) && intervalSeconds > 0)) {
    throw new RangeError(`the interval must be a positive number of seconds, got ${intervalSeconds}`);
  }
  const before = gather(parsePrometheusText(beforeText).samples);
  const after = gather(parsePrometheusText(afterText).samples);
  const keys = [...new Set([...before.rows.keys(), ...after.rows.keys()])].sort();
  const rows: TuneRow[] = [];
  const perWorker = new Map<string, { a: Totals; b: Totals; ranks: number }>();
  for (const key of keys) {
    const [worker = "", dpRank = "unspecified"] = key.split("\u0000");
    const a = before.rows.get(key) ?? emptyTotals();
    const b = after.rows.get(key) ?? emptyTotals();
    const limit = after.limits.get(worker) ?? before.limits.get(worker) ?? null;
    rows.push(rowFrom(worker, dpRank, a, b, intervalSeconds, limit));
    const sum = perWorker.get(worker) ?? { a: emptyTotals(), b: emptyTotals(), ranks: 0 };
    perWorker.set(worker, sum);
    sum.ranks++;
    for (const field of Object.keys(a) as (keyof Totals)[]) {
      sum.a[field] += a[field];
      sum.b[field] += b[field];
    }
  }
  for (const [worker, sum] of perWorker) {
    if (sum.ranks < 2) continue;
    const total = rowFrom(worker, "all", sum.a, sum.b, intervalSeconds, null);
    total.warnings = [];
    rows.push(total);
  }
  const notes = [
    "L is the mean of the waiting count at the two scrapes: a two-point estimate of the time average, " +
      "sound when the load was steady over the interval (use a longer interval for bursty load).",
    "The suggestion is a mean, not a tail bound: bursts exceed L; leave headroom, and re-measure after a change.",
    "The limit is per rank; apply it with --engine-request-waiting-limit (or SLUICE_ENGINE_REQUEST_WAITING_LIMIT).",
  ];
  if (rows.length === 0)
    notes.unshift(`no ${WAITING} samples in the scrapes: is this a sluice /metrics page?`);
  return { intervalSeconds, rows, notes };
}

function fixed(value: number | null, digits: number): string {
  return value === null ? "—" : value.toFixed(digits);
}

/** The report as a text table with notes. */
export function formatReport(report: TuneReport): string {
  const header = ["worker", "dp_rank", "L waiting", "queued", "C admits/s", "W s", "limit now", "suggested"];
  const body = report.rows.map((r) => [
    r.worker,
    r.dpRank,
    fixed(r.waiting, 2),
    fixed(r.queued, 2),
    fixed(r.admitRatePerS, 2),
    fixed(r.waitSeconds, 3),
    r.currentWaitingLimit === null ? "—" : String(r.currentWaitingLimit),
    r.dpRank === "all" ? "—" : String(r.suggestedWaitingLimit),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((row) => row[i]!.length)));
  const line = (cells: string[]) =>
    cells.map((cell, i) => (i < 2 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join("  ");
  const out = [`interval ${report.intervalSeconds} s`, line(header), ...body.map(line)];
  for (const r of report.rows) {
    for (const warning of r.warnings) out.push(`warning: ${r.worker} rank ${r.dpRank}: ${warning}`);
  }
  for (const note of report.notes) out.push(`note: ${note}`);
  return out.join("\n");
}

const TUNE = "Scrapes";

/** Every flag of `sluice tune` (flags only, no variables). */
export const TUNE_SETTINGS: readonly Setting[] = [
  defineSetting({
    flag: "url",
    path: "url",
    topic: TUNE,
    schema: httpUrl,
    env: null,
    placeholder: "<url>",
    expects: "an http(s) URL",
    help: "sluice base URL or its /metrics URL; scraped twice, --interval-s apart",
  }),
  defineSetting({
    flag: "before",
    path: "before",
    topic: TUNE,
    schema: z.string(),
    env: null,
    placeholder: "<file>",
    help: "a saved /metrics page (first scrape)",
  }),
  defineSetting({
    flag: "after",
    path: "after",
    topic: TUNE,
    schema: z.string(),
    env: null,
    placeholder: "<file>",
    help: "a saved /metrics page (second scrape)",
  }),
  defineSetting({
    flag: "interval-s",
    path: "intervalS",
    topic: TUNE,
    schema: z.number().positive(),
    env: null,
    defaultText: "10 with --url; required with files",
    help: "seconds between the two scrapes",
  }),
  defineSetting({
    flag: "json",
    path: "json",
    topic: "Output",
    schema: z.boolean().default(false),
    env: null,
    help: "print the report as JSON",
  }),
];

/** `sluice tune` for help and the parser. */
export const TUNE_COMMAND: CommandSpec = {
  name: "tune",
  usage:
    "sluice tune --url <url> [--interval-s <number>] | --before <file> --after <file> --interval-s <number>",
  summary:
    "Little's law on a gate's /metrics: L (time-average calls waiting for their first token),\n" +
    "C (admissions per second), W = L / C, and the per-rank waiting limit ⌈L⌉.",
  settings: TUNE_SETTINGS,
  footer: "exit status: 0 ok, 1 a scrape failed, 2 bad flags or unreadable files",
};

async function scrape(url: string): Promise<string> {
  let response: Response;
  try {
    response = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  } catch (err) {
    throw new Error(`GET ${url}: ${describeError(err)}`);
  }
  if (!response.ok) throw new Error(`GET ${url} answered ${response.status}`);
  return response.text();
}

interface TuneFlags {
  url?: string;
  before?: string;
  after?: string;
  intervalS?: number;
  json?: boolean;
}

/** `sluice tune`. Returns 0, or 2 for bad flags, 1 when a scrape failed. */
export function run(argv: string[], io: CommandIo = {}): Promise<number> {
  const stdout = io.stdout ?? ((text: string) => process.stdout.write(text));
  const stderr = io.stderr ?? ((text: string) => process.stderr.write(text));
  return runCommand(
    TUNE_COMMAND,
    argv,
    async (line) => {
      const flags = line.values as TuneFlags;
      const interval = flags.intervalS ?? 10;
      let beforeText: string;
      let afterText: string;
      if (flags.url !== undefined && (flags.before !== undefined || flags.after !== undefined)) {
        throw new ConfigError("give either --url or --before/--after, not both");
      }
      if (flags.url !== undefined) {
        const target = new URL(flags.url);
        if (!target.pathname.endsWith("/metrics"))
          target.pathname = `${target.pathname.replace(/\/+$/, "")}/metrics`;
        try {
          beforeText = await scrape(target.href);
          stderr(`sluice tune: first scrape done; second in ${interval} s\n`);
          await new Promise((resolve) => setTimeout(resolve, interval * 1000));
          afterText = await scrape(target.href);
        } catch (err) {
          stderr(`sluice tune: ${(err as Error).message}\n`);
          return 1;
        }
      } else {
        if (flags.before === undefined || flags.after === undefined) {
          throw new ConfigError("give --url, or both --before and --after (see sluice tune --help)");
        }
        if (flags.intervalS === undefined)
          throw new ConfigError("--interval-s is required with --before/--after");
        try {
          beforeText = await readFile(flags.before, "utf8");
          afterText = await readFile(flags.after, "utf8");
        } catch (err) {
          throw new ConfigError(describeError(err));
        }
      }
      const report = littleLaw(beforeText, afterText, interval);
      stdout(`${flags.json ? JSON.stringify(report, null, 2) : formatReport(report)}\n`);
      return 0;
    },
    { stdout, stderr, ...(io.env ? { env: io.env } : {}) },
  );
}
