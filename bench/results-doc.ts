/**
 * @module docs/results.md, generated from the recorded run in bench/results/*.json (never edited by hand):
 * the regret table, every target of the issue marked met or missed, each workload's numbers, the HTTP
 * sessions case, the disaggregated `pd` comparison and the run's wall time. `run-all.ts` calls it last; `npx tsx bench/results-doc.ts` redoes it.
 */

import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { tenantCells } from "../adapters/bench/tenant-report.js";
import { type PdResult, pdTable, pdTargets } from "./pd.js";
import type { BenchDoc, RowLike, TargetCheck } from "./regret.js";
import { regretCells, regretRows, targetsOf } from "./regret.js";

const HERE = dirname(fileURLToPath(import.meta.url));

/** The order workloads are listed in; others follow alphabetically. */
export const WORKLOAD_ORDER = [
  "agents",
  "agents-256",
  "agents-mixed",
  "burst",
  "light",
  "steady",
  "long",
  "chat",
  "mixed",
  "mooncake",
  "tenants-noisy",
  "tenants-weighted",
  "tenants-bands",
  "tenants-sizes",
] as const;

/** The HTTP sessions case (bench/http-sessions.ts), as its JSON records it. */
export interface HttpSessionsDoc {
  sessions: number;
  replicas: number;
  runs: { policy: string; total_s: number; ok: number; failed: number }[];
  sluice_over_gate_prefix: number;
  goal: string;
  met: boolean;
}

/** What the document is made from. */
export interface ResultsInput {
  docs: BenchDoc[];
  /** `bench/tiers.ts`'s replays, one document per workload and KV tiers: regret rows only. */
  tierDocs?: BenchDoc[];
  /** bench/results/summary.json: the mooncake knee, the seed spread, the run's wall time. */
  summary?: {
    wall_s?: number;
    finished_at?: string;
    mooncake_knee?: { load: number; misses: { load: number; ttftMiss: number }[] };
    seed_spread?: {
      workload: string;
      min: number;
      mean: number;
      max: number;
      seeds: { seed: number; sluice_over_rr: number }[];
    }[];
  };
  http?: HttpSessionsDoc;
  /** bench/results/pd.json: the disaggregated prefill/decode comparison. */
  pd?: Pick<PdResult, "fleet" | "workload" | "steady_s" | "rows">;
}

function orderOf(name: string): number {
  const i = (WORKLOAD_ORDER as readonly string[]).indexOf(name);
  return i >= 0 ? i : WORKLOAD_ORDER.length;
}

function sortDocs(docs: readonly BenchDoc[]): BenchDoc[] {
  return [...docs].sort(
    (a, b) => orderOf(a.workload) - orderOf(b.workload) || a.workload.localeCompare(b.workload),
  );
}

function escapeCell(text: string): string {
  return text.replace(/\|/g, "\\|");
}

function markdownTable(
  cells: readonly (readonly string[])[],
  alignRight: (column: number) => boolean,
): string {
  const [head, ...body] = cells;
  if (!head) return "";
  const line = (row: readonly string[]) => `| ${row.map(escapeCell).join(" | ")} |`;
  const rule = `|${head.map((_, i) => (alignRight(i) ? "---:" : "---")).join("|")}|`;
  return [line(head), rule, ...body.map(line)].join("\n");
}

function num(value: number | undefined, digits: number): string {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "–";
}

const ROW_COLUMNS: { title: string; value: (row: RowLike) => string }[] = [
  { title: "policy", value: (r) => r.policy },
  { title: "load", value: (r) => String(r.load) },
  { title: "makespan s", value: (r) => num(r.makespan_s, 1) },
  { title: "goodput/s", value: (r) => num(r.goodput_rps, 3) },
  { title: "refused", value: (r) => num(r.refused_share, 3) },
  { title: "SLO", value: (r) => num(r.slo_attainment, 3) },
  { title: "hit rate", value: (r) => num(r.prefix_hit_rate, 3) },
  { title: "TTFT p99 s", value: (r) => num(r.ttft_p99_s, 3) },
  { title: "session mean s", value: (r) => num(r.session_completion_mean_s, 1) },
  { title: "session p99 s", value: (r) => num(r.session_completion_p99_s, 1) },
  { title: "wait p99 s", value: (r) => num((r as { session_wait_p99_s?: number }).session_wait_p99_s, 1) },
  { title: "wait max s", value: (r) => num(r.session_wait_max_s, 1) },
];

function checksTable(checks: readonly TargetCheck[]): string {
  return markdownTable(
    [
      ["", "workload", "target", "measured", "goal"],
      ...checks.map((c) => [c.met ? "met" : "**missed**", c.run, c.target, String(c.measured), c.goal]),
    ],
    (i) => i === 3,
  );
}

/** The whole of docs/results.md. */
export function renderResultsDoc(input: ResultsInput): string {
  const docs = sortDocs(input.docs);
  const regret = [...docs, ...(input.tierDocs ?? [])].flatMap((doc) => regretRows(doc));
  const checks = docs.flatMap((doc) => targetsOf(doc));
  if (input.http) {
    checks.push({
      run: "http-sessions",
      target: "sluice total time ÷ gate-prefix",
      measured: input.http.sluice_over_gate_prefix,
      goal: input.http.goal,
      met: input.http.met,
    });
  }
  if (input.pd) checks.push(...pdTargets(input.pd));
  const met = checks.filter((c) => c.met).length;
  const out: string[] = [];
  out.push("# Benchmark results");
  out.push("");
  out.push(
    "Generated by `bench/results-doc.ts` from the recorded run in `bench/results/*.json` " +
      "(`npm run bench` rewrites both); do not edit by hand.",
  );
  const s = input.summary;
  if (s?.wall_s !== undefined || s?.finished_at !== undefined) {
    out.push("");
    out.push(
      `The recorded run${s.finished_at ? ` finished ${s.finished_at}` : ""}` +
        `${s.wall_s !== undefined ? ` and took ${(s.wall_s / 60).toFixed(1)} min of wall time` : ""}.`,
    );
  }
  out.push("");
  out.push("## Regret: sluice against the best baseline");
  out.push("");
  out.push(
    "Per workload and load, sluice's value against the best of rr, gate, gate-prefix and concur on each " +
      "metric (the baseline named), and their ratio (the difference for SLO attainment). Session times " +
      "run from a session's first arrival to its last call's end.",
  );
  out.push("");
  out.push(
    regret.length > 0 ? markdownTable(regretCells(regret), (i) => i === 1) : "No run with sluice recorded.",
  );
  out.push("");
  out.push(`## Targets (${met} of ${checks.length} met)`);
  out.push("");
  out.push(checksTable(checks));
  for (const doc of docs) {
    out.push("");
    out.push(`## ${doc.workload}`);
    out.push("");
    out.push(`${doc.replicas} × \`${doc.preset}\`, virtual time.`);
    out.push("");
    out.push(
      markdownTable(
        [ROW_COLUMNS.map((c) => c.title), ...doc.results.map((row) => ROW_COLUMNS.map((c) => c.value(row)))],
        (i) => i > 0,
      ),
    );
    const tenants = tenantCells(doc);
    if (tenants.length > 0) {
      out.push("");
      out.push(
        "Per tenant: first admission wait from a session's first call becoming ready; service share: " +
          "footprint-token-seconds held while two or more tenants had sessions waiting; share ÷ weight: " +
          "that share over the tenant's share of the weights; Jain's index over service share ÷ weight " +
          "([benchmarks.md](benchmarks.md)).",
      );
      out.push("");
      out.push(markdownTable(tenants, (i) => i === 1 || i === 3 || (i >= 5 && i <= 16)));
    }
    const capacity = doc.slo_capacity;
    if (capacity) {
      out.push("");
      out.push(
        `SLO capacity (the largest load at which ≥ ${capacity.share * 100} % of calls meet their TTFT SLO; the loads tried):`,
      );
      out.push("");
      for (const p of capacity.policies) {
        out.push(
          `- ${p.policy}: **${p.capacity}**${p.ratio_to_rr !== undefined ? ` (${p.ratio_to_rr} × rr)` : ""} — ` +
            p.tried.map((t) => `${t.load}: ${(t.ttft_slo_met * 100).toFixed(1)} %`).join(", "),
        );
      }
    }
  }
  if (s?.mooncake_knee) {
    out.push("");
    out.push("## mooncake: where rr first misses its TTFT SLO for more than 10 % of calls");
    out.push("");
    out.push(
      s.mooncake_knee.misses.map((m) => `load ${m.load}: ${(m.ttftMiss * 100).toFixed(1)} %`).join(", ") +
        ` → load ${s.mooncake_knee.load}.`,
    );
  }
  if (s?.seed_spread && s.seed_spread.length > 0) {
    out.push("");
    out.push("## sluice makespan ÷ rr over seeds");
    out.push("");
    for (const spread of s.seed_spread) {
      out.push(
        `- ${spread.workload}: ${spread.seeds.map((x) => x.sluice_over_rr).join(", ")} ` +
          `(min ${spread.min}, mean ${spread.mean}, max ${spread.max})`,
      );
    }
  }
  if (input.http) {
    const h = input.http;
    out.push("");
    out.push(`## HTTP: ${h.sessions} one-call conversations at once through \`sluice serve\``);
    out.push("");
    out.push(
      `Each with its own \`x-session-id\`, on ${h.replicas} simulated replicas in real time ` +
        "(`bench/http-sessions.ts`).",
    );
    out.push("");
    out.push(
      markdownTable(
        [
          ["policy", "total s", "ok", "failed"],
          ...h.runs.map((r) => [r.policy, r.total_s.toFixed(2), String(r.ok), String(r.failed)]),
        ],
        (i) => i > 0,
      ),
    );
    out.push("");
    out.push(
      `sluice ÷ gate-prefix = ${h.sluice_over_gate_prefix} (goal ${h.goal}): ${h.met ? "met" : "**missed**"}.`,
    );
  }
  if (input.pd) {
    const pd = input.pd;
    out.push("");
    out.push("## pd: disaggregated prefill and decode");
    out.push("");
    out.push(
      `${pd.fleet}, virtual time (\`bench/pd.ts\`, [disaggregated.md](disaggregated.md)). ${pd.workload}. ` +
        `The same scheduler three times, only its decode check differing; decode KV CV over ` +
        `${pd.steady_s[0]}–${pd.steady_s[1]} s.`,
    );
    out.push("");
    out.push(pdTable(pd));
  }
  out.push("");
  return out.join("\n");
}

function readJson<T>(path: string): T | undefined {
  if (!existsSync(path)) return undefined;
  return JSON.parse(readFileSync(path, "utf8")) as T;
}

/** Reads the benchmark documents of a results folder (files with a `results` array). */
export function readResults(dir: string): ResultsInput {
  const docs: BenchDoc[] = [];
  for (const file of readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .sort()) {
    const value = readJson<Partial<BenchDoc>>(join(dir, file));
    if (value && Array.isArray(value.results) && typeof value.workload === "string")
      docs.push(value as BenchDoc);
  }
  const summary = readJson<ResultsInput["summary"]>(join(dir, "summary.json"));
  const http = readJson<HttpSessionsDoc>(join(dir, "http-sessions.json"));
  const pd = readJson<ResultsInput["pd"]>(join(dir, "pd.json"));
  const tiers = readJson<{ replicas?: number; preset?: string; results?: TierRowLike[] }>(
    join(dir, "tiers.json"),
  );
  const tierDocs = tiers?.results
    ? tierRegretDocs(tiers.results, tiers.replicas ?? 0, tiers.preset ?? "")
    : [];
  return {
    docs,
    ...(tierDocs.length > 0 ? { tierDocs } : {}),
    ...(summary ? { summary } : {}),
    ...(http ? { http } : {}),
    ...(pd ? { pd } : {}),
  };
}

/** The fields of a `bench/tiers.ts` replay row that the regret table compares. */
interface TierRowLike {
  workload: string;
  tiers: 1 | 2;
  policy: string;
  load: number;
  makespan_s: number;
  slo_attainment: number;
  ttft_p99_s: number;
  hit_rate: number;
  completed: number;
}

/**
 * `bench/tiers.ts`'s replays as one document per workload and KV tiers ("agents-256, host tier"),
 * so the regret table has entries with and without the host tier. Its rows carry no goodput or
 * session times: those cells stay empty.
 */
function tierRegretDocs(rows: readonly TierRowLike[], replicas: number, preset: string): BenchDoc[] {
  const byName = new Map<string, BenchDoc>();
  for (const row of rows) {
    const workload = `${row.workload}, ${row.tiers === 2 ? "host tier" : "one tier"}`;
    let doc = byName.get(workload);
    if (!doc) {
      doc = { workload, replicas, preset, results: [] };
      byName.set(workload, doc);
    }
    doc.results.push({
      policy: row.policy,
      load: row.load,
      makespan_s: row.makespan_s,
      goodput_rps: Number.NaN,
      slo_attainment: row.slo_attainment,
      prefix_hit_rate: row.hit_rate,
      ttft_p99_s: row.ttft_p99_s,
      completed: row.completed,
    });
  }
  return [...byName.values()];
}

/** Regenerates the document from a results folder; returns its path. */
export function writeResultsDoc(
  resultsDir = join(HERE, "results"),
  outPath = resolve(HERE, "../docs/results.md"),
): string {
  mkdirSync(dirname(outPath), { recursive: true });
  writeFileSync(outPath, renderResultsDoc(readResults(resultsDir)));
  return outPath;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  process.stdout.write(`${writeResultsDoc(process.argv[2], process.argv[3])}\n`);
}
