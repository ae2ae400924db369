/** @module Prometheus text exposition parsing, and the mapping of vLLM's and SGLang's metrics to `EngineSignals`. */

import type { EngineSignals } from "../../../src/engine.js";

/** One sample line of an exposition. */
export interface MetricSample {
  /** Sample name as written (`vllm:prefix_cache_hits_total`, `x_bucket`, …). */
  name: string;
  labels: Readonly<Record<string, string>>;
  /** The value; `NaN`, `Infinity` and `-Infinity` are kept as such. */
  value: number;
  /** Optional sample timestamp (ms since the epoch), as the exposition gave it. */
  timestampMs?: number;
}

/** A parsed exposition: every well-formed sample, the declared types, and how many lines were unreadable. */
export interface ParsedExposition {
  samples: MetricSample[];
  /** `# TYPE` declarations: metric family name → type (`counter`, `gauge`, …). */
  types: Map<string, string>;
  /** `# HELP` texts, unescaped. */
  help: Map<string, string>;
  /** Lines that were neither comments, blank, nor well-formed samples (skipped, never fatal). */
  invalidLines: number;
}

/**
 * Parses the Prometheus text exposition format (0.0.4), and the parts of
 * OpenMetrics a scrape may meet (`# EOF`, exemplars, quoted metric names).
 * Never throws: a malformed line is counted in `invalidLines` and skipped,
 * so one bad line cannot hide a whole page of good samples.
 */
export function parsePrometheusText(text: string): ParsedExposition {
  const out: ParsedExposition = { samples: [], types: new Map(), help: new Map(), invalidLines: 0 };
  let start = 0;
  const length = text.length;
  while (start <= length) {
    let end = text.indexOf("\n", start);
    if (end === -1) end = length;
    let line = text.slice(start, end);
    start = end + 1;
    if (line.endsWith("\r")) line = line.slice(0, -1);
    parseLine(line, out);
    if (end === length) break;
  }
  return out;
}

function parseLine(raw: string, out: ParsedExposition): void {
  const line = raw.trim();
  if (line === "") return;
  if (line.startsWith("#")) {
    parseComment(line, out);
    return;
  }
  const sample = parseSample(line);
  if (sample) out.samples.push(sample);
  else out.invalidLines++;
}

function parseComment(line: string, out: ParsedExposition): void {
  // `# HELP name text` and `# TYPE name type`; every other comment is free text.
  const match = /^#\s+(HELP|TYPE)\s+(\S+)(?:\s+(.*))?$/.exec(line);
  if (!match) return;
  const [, keyword, name, rest = ""] = match;
  if (keyword === "TYPE") out.types.set(name!, rest.trim().toLowerCase());
  else out.help.set(name!, unescapeHelp(rest));
}

function unescapeHelp(text: string): string {
  return text.replace(/\\(\\|n)/g, (_, c: string) => (c === "n" ? "\n" : "\\"));
}

const NAME_START = /[a-zA-Z_:]/;
const NAME_CHAR = /[a-zA-Z0-9_:]/;
const LABEL_START = /[a-zA-Z_]/;
const LABEL_CHAR = /[a-zA-Z0-9_]/;

/** A cursor over one line; every reader returns undefined on malformed input. */
class Cursor {
  pos = 0;
  constructor(readonly s: string) {}

  done(): boolean {
    return this.pos >= this.s.length;
  }

  peek(): string {
    return this.s[this.pos] ?? "";
  }

  skipSpace(): number {
    const from = this.pos;
    while (this.peek() === " " || this.peek() === "\t") this.pos++;
    return this.pos - from;
  }

  ident(start: RegExp, rest: RegExp): string | undefined {
    if (!start.test(this.peek())) return undefined;
    const from = this.pos++;
    while (!this.done() && rest.test(this.peek())) this.pos++;
    return this.s.slice(from, this.pos);
  }

  /** A double-quoted string with `\\`, `\"` and `\n` escapes; the cursor sits on the opening quote. */
  quoted(): string | undefined {
    if (this.peek() !== '"') return undefined;
    this.pos++;
    let value = "";
    while (!this.done()) {
      const c = this.s[this.pos++]!;
      if (c === '"') return value;
      if (c === "\\") {
        const next = this.s[this.pos++];
        if (next === "n") value += "\n";
        else if (next === "\\" || next === '"') value += next;
        // Unknown escapes are kept verbatim, as Prometheus itself does.
        else if (next !== undefined) value += `\\${next}`;
        else return undefined;
      } else value += c;
    }
    return undefined;
  }

  token(): string {
    const from = this.pos;
    while (!this.done() && this.peek() !== " " && this.peek() !== "\t") this.pos++;
    return this.s.slice(from, this.pos);
  }
}

function parseSample(line: string): MetricSample | undefined {
  const cur = new Cursor(line);
  let name = cur.ident(NAME_START, NAME_CHAR);
  const labels: Record<string, string> = {};
  let gap = cur.skipSpace();
  if (cur.peek() === "{") {
    cur.pos++;
    const setName = name === undefined ? (n: string) => (name = n) : undefined;
    if (!parseLabels(cur, labels, setName)) return undefined;
    gap = cur.skipSpace();
  }
  if (name === undefined || gap === 0) return undefined;
  const value = parseValue(cur.token());
  if (value === undefined) return undefined;
  const sample: MetricSample = { name, labels, value };
  cur.skipSpace();
  if (cur.done() || cur.peek() === "#") return sample; // `# {…} v` is an OpenMetrics exemplar: ignored
  const ts = Number(cur.token());
  if (!Number.isFinite(ts)) return undefined;
  // Prometheus text timestamps are integer ms; a fractional one is OpenMetrics seconds.
  sample.timestampMs = Number.isInteger(ts) ? ts : ts * 1000;
  cur.skipSpace();
  if (!cur.done() && cur.peek() !== "#") return undefined;
  return sample;
}

/**
 * Reads `name="value",…}`; the cursor sits after `{`. A bare quoted string is
 * the metric name in UTF-8 exposition (`{"my.metric", a="b"}`), handed to `setName`.
 */
function parseLabels(cur: Cursor, labels: Record<string, string>, setName?: (n: string) => void): boolean {
  for (;;) {
    cur.skipSpace();
    if (cur.peek() === "}") {
      cur.pos++;
      return true;
    }
    let label: string | undefined;
    if (cur.peek() === '"') {
      const quoted = cur.quoted();
      if (quoted === undefined) return false;
      cur.skipSpace();
      if (cur.peek() !== "=") {
        if (!setName) return false;
        setName(quoted);
        setName = undefined;
        if (!afterLabel(cur)) return false;
        continue;
      }
      label = quoted;
    } else {
      label = cur.ident(LABEL_START, LABEL_CHAR);
      if (label === undefined) return false;
      cur.skipSpace();
    }
    if (cur.peek() !== "=") return false;
    cur.pos++;
    cur.skipSpace();
    const value = cur.quoted();
    if (value === undefined) return false;
    labels[label] = value;
    if (!afterLabel(cur)) return false;
  }
}

function afterLabel(cur: Cursor): boolean {
  cur.skipSpace();
  if (cur.peek() === ",") {
    cur.pos++;
    return true;
  }
  return cur.peek() === "}";
}

function parseValue(token: string): number | undefined {
  if (token === "") return undefined;
  const lower = token.toLowerCase();
  if (lower === "nan") return Number.NaN;
  if (lower === "+inf" || lower === "inf" || lower === "+infinity" || lower === "infinity") {
    return Number.POSITIVE_INFINITY;
  }
  if (lower === "-inf" || lower === "-infinity") return Number.NEGATIVE_INFINITY;
  const value = Number(token);
  return Number.isNaN(value) ? undefined : value;
}

/** Which engine a page came from. */
export type EngineFlavor = "vllm" | "sglang";

/** Signals read from one scrape: everything but the scrape time and health, which the scraper owns. */
export type ScrapedSignals = Omit<EngineSignals, "readAtMs" | "healthy"> & { flavor: EngineFlavor };

/** Samples grouped by name, for lookups by metric. */
type ByName = Map<string, MetricSample[]>;

function groupByName(samples: readonly MetricSample[]): ByName {
  const byName: ByName = new Map();
  for (const sample of samples) {
    const list = byName.get(sample.name);
    if (list) list.push(sample);
    else byName.set(sample.name, [sample]);
  }
  return byName;
}

/**
 * Labels along which an engine repeats one logical value: SGLang exports its
 * scheduler gauges once per tensor-parallel (and expert-parallel) worker, so
 * summing over them would count each request TP times.
 */
const REPLICATED_LABELS = ["tp_rank", "moe_ep_rank", "pid"];

/** One sample per logical series: label sets equal but for `REPLICATED_LABELS` collapse to their largest value. */
function collapseReplicas(samples: readonly MetricSample[]): MetricSample[] {
  if (!samples.some((s) => REPLICATED_LABELS.some((l) => l in s.labels))) return [...samples];
  const groups = new Map<string, MetricSample>();
  for (const s of samples) {
    const key = Object.keys(s.labels)
      .filter((l) => !REPLICATED_LABELS.includes(l))
      .sort()
      .map((l) => `${l}=${JSON.stringify(s.labels[l])}`)
      .join(",");
    const seen = groups.get(key);
    if (!seen || (Number.isFinite(s.value) && !(seen.value >= s.value))) groups.set(key, s);
  }
  return [...groups.values()];
}

/** The first of several names (newest first) that the page carries, one sample per logical series. */
function pick(byName: ByName, ...names: string[]): MetricSample[] | undefined {
  for (const name of names) {
    const found = byName.get(name);
    if (found && found.length > 0) return collapseReplicas(found);
  }
  return undefined;
}

/** All samples of one name, one per logical series; empty when absent. */
function series(byName: ByName, name: string): MetricSample[] {
  return pick(byName, name) ?? [];
}

/** Sum over label sets (models, ranks); NaN samples count as absent. */
function sum(samples: readonly MetricSample[] | undefined): number {
  let total = 0;
  for (const s of samples ?? []) if (Number.isFinite(s.value)) total += s.value;
  return total;
}

/** Mean over label sets: a ratio per rank pools to the mean when ranks are the same size. */
function mean(samples: readonly MetricSample[] | undefined): number {
  let total = 0;
  let count = 0;
  for (const s of samples ?? []) {
    if (!Number.isFinite(s.value)) continue;
    total += s.value;
    count++;
  }
  return count === 0 ? 0 : total / count;
}

function clamp01(x: number): number {
  return Math.min(1, Math.max(0, x));
}

/** A label read as a positive integer, or undefined. */
function intLabel(sample: MetricSample, label: string): number | undefined {
  const raw = sample.labels[label];
  if (raw === undefined) return undefined;
  const value = Number(raw.trim());
  return Number.isFinite(value) && value > 0 ? Math.floor(value) : undefined;
}

/**
 * Data-parallel size: the number of distinct `dp_rank` (SGLang) or `engine`
 * (vLLM V1, one engine core per DP rank) label values on the given samples;
 * 1 when neither label appears. A rank that exports no sample is not seen.
 */
function dataParallelSize(samples: readonly MetricSample[]): number {
  const dpRanks = new Set<string>();
  const engines = new Set<string>();
  for (const s of samples) {
    const dp = s.labels.dp_rank;
    if (dp !== undefined) dpRanks.add(dp);
    const engine = s.labels.engine;
    if (engine !== undefined) engines.add(engine);
  }
  return Math.max(1, dpRanks.size, engines.size);
}

const VLLM_KV_USAGE = ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"];
const VLLM_QUERIES = ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"];
const VLLM_HITS = ["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"];

/**
 * Maps a parsed page to engine signals, or undefined when it carries neither
 * vLLM's nor SGLang's core gauges (a garbage page, or another server's metrics).
 *
 * - Counters and request gauges are summed over label sets (several models,
 *   ranks); KV usage, a ratio per rank, is averaged.
 * - vLLM: KV capacity = Σ over `vllm:cache_config_info` label sets of
 *   `num_gpu_blocks × block_size`; `max_num_seqs` comes from the same labels
 *   when present (it is a per-rank limit, so the largest value is kept).
 * - SGLang: capacity = Σ `sglang:max_total_num_tokens`; hits/queries are
 *   `sglang:cached_tokens_total` / `sglang:prompt_tokens_total`; block size is
 *   `sglang:page_size` when exported (else 0: unknown); preemptions are
 *   `sglang:num_retracted_requests_total`. Series repeated per `tp_rank` count once.
 * - Data-parallel size = distinct `dp_rank` or `engine` label values (1 when absent).
 */
export function signalsFromExposition(page: ParsedExposition): ScrapedSignals | undefined {
  const byName = groupByName(page.samples);
  const vllmKv = pick(byName, ...VLLM_KV_USAGE);
  const vllmRunning = pick(byName, "vllm:num_requests_running");
  if (vllmKv || vllmRunning) return vllmSignals(byName, vllmKv, vllmRunning ?? []);
  const sglangKv = pick(byName, "sglang:token_usage");
  const sglangRunning = pick(byName, "sglang:num_running_reqs");
  if (sglangKv || sglangRunning) return sglangSignals(byName, sglangKv ?? [], sglangRunning ?? []);
  return undefined;
}

function vllmSignals(
  byName: ByName,
  kv: MetricSample[] | undefined,
  running: MetricSample[],
): ScrapedSignals {
  const config = series(byName, "vllm:cache_config_info");
  let kvCapacityTokens = 0;
  let blockSize = 0;
  let maxNumSeqs = 0;
  for (const info of config) {
    const blocks = intLabel(info, "num_gpu_blocks");
    const size = intLabel(info, "block_size");
    if (blocks !== undefined && size !== undefined) kvCapacityTokens += blocks * size;
    if (size !== undefined) blockSize = Math.max(blockSize, size);
    maxNumSeqs = Math.max(maxNumSeqs, intLabel(info, "max_num_seqs") ?? 0);
  }
  const waiting = series(byName, "vllm:num_requests_waiting");
  return {
    flavor: "vllm",
    kvUsage: clamp01(mean(kv)),
    prefixQueryTokens: sum(pick(byName, ...VLLM_QUERIES)),
    prefixHitTokens: sum(pick(byName, ...VLLM_HITS)),
    running: sum(running),
    waiting: sum(waiting),
    preemptions: sum(pick(byName, "vllm:num_preemptions_total")),
    kvCapacityTokens,
    blockSize,
    maxNumSeqs,
    dataParallelSize: dataParallelSize([...(kv ?? []), ...running, ...waiting, ...config]),
  };
}

function sglangSignals(byName: ByName, kv: MetricSample[], running: MetricSample[]): ScrapedSignals {
  const waiting = series(byName, "sglang:num_queue_reqs");
  const capacity = series(byName, "sglang:max_total_num_tokens");
  let maxNumSeqs = 0;
  for (const s of series(byName, "sglang:max_running_requests")) {
    if (Number.isFinite(s.value)) maxNumSeqs = Math.max(maxNumSeqs, Math.floor(s.value));
  }
  let blockSize = 0;
  for (const s of series(byName, "sglang:page_size")) {
    if (Number.isFinite(s.value) && s.value > 0) blockSize = Math.max(blockSize, Math.floor(s.value));
  }
  return {
    flavor: "sglang",
    kvUsage: clamp01(mean(kv)),
    prefixQueryTokens: sum(pick(byName, "sglang:prompt_tokens_total")),
    prefixHitTokens: sum(pick(byName, "sglang:cached_tokens_total")),
    running: sum(running),
    waiting: sum(waiting),
    // SGLang calls preemption "retraction"; the counter is cumulative like vLLM's.
    preemptions: sum(pick(byName, "sglang:num_retracted_requests_total")),
    kvCapacityTokens: Math.floor(sum(capacity)),
    blockSize,
    maxNumSeqs,
    dataParallelSize: dataParallelSize([...kv, ...running, ...waiting, ...capacity]),
  };
}

/** Parses a page and maps it in one go; undefined when the page is not an engine's. */
export function parseEngineMetrics(text: string): ScrapedSignals | undefined {
  return signalsFromExposition(parsePrometheusText(text));
}
