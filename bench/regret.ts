/**
 * @module The benchmark's verdicts, computed from its JSON documents alone: the regret table (per workload,
 * sluice against the best baseline on each metric) and every target of the issue, marked met or missed.
 * `run-all.ts` prints them; `results-doc.ts` writes them into docs/results.md from the recorded files.
 */

import type { AloneRow, FairnessStats, SloCapacityOutput, TenantStats } from "../adapters/bench/run.js";

/** The policies sluice is compared with; `bound` is not one (no policy can reach it). */
export const BASELINES = ["rr", "gate", "gate-prefix", "concur"] as const;

/** The workloads where admission must never cost users: sluice must match the best baseline there. */
export const REGIMES = ["burst", "light", "steady", "long", "chat", "mixed"] as const;

/** The fields of a result row the verdicts read; older documents may lack the session fields. */
export interface RowLike {
  policy: string;
  load: number;
  makespan_s: number;
  goodput_rps: number;
  slo_attainment: number;
  prefix_hit_rate: number;
  ttft_p99_s: number;
  session_completion_mean_s?: number;
  session_completion_p99_s?: number;
  session_wait_max_s?: number;
  refused_share?: number;
  completed: number;
  /** `tenants` workloads. */
  tenants?: Record<string, TenantStats>;
  fairness?: FairnessStats;
}

/** A benchmark's `--json` document, as far as the verdicts need it. */
export interface BenchDoc {
  workload: string;
  replicas: number;
  preset: string;
  results: RowLike[];
  /** Trace replays: each policy's SLO capacity. */
  slo_capacity?: SloCapacityOutput;
  /** `tenants` workloads: tenants run alone. */
  alone?: AloneRow[];
  details?: {
    policy: string;
    load: number;
    wall_s?: number;
    unfinished?: number;
    groups?: Record<string, { ttft_p99_s: number; ttft_slo_s: number; completed: number }>;
  }[];
}

/** One target of the issue, as measured. */
export interface TargetCheck {
  run: string;
  target: string;
  measured: number;
  goal: string;
  met: boolean;
}

/** A metric of the regret table and which way is better. */
export interface RegretMetric {
  key:
    | "makespan_s"
    | "goodput_rps"
    | "slo_attainment"
    | "ttft_p99_s"
    | "session_completion_mean_s"
    | "session_completion_p99_s";
  title: string;
  better: "lower" | "higher";
}

export const REGRET_METRICS: readonly RegretMetric[] = [
  { key: "makespan_s", title: "makespan s", better: "lower" },
  { key: "goodput_rps", title: "goodput/s", better: "higher" },
  { key: "slo_attainment", title: "SLO", better: "higher" },
  { key: "ttft_p99_s", title: "TTFT p99 s", better: "lower" },
  { key: "session_completion_mean_s", title: "session mean s", better: "lower" },
  { key: "session_completion_p99_s", title: "session p99 s", better: "lower" },
];

/** sluice and the best baseline on one metric. */
export interface RegretCell {
  sluice: number;
  best: number;
  /** The baseline that did best (the first of BASELINES among equals). */
  bestPolicy: string;
}

/** One line of the regret table: one workload at one load. */
export interface RegretRow {
  workload: string;
  load: number;
  cells: Partial<Record<RegretMetric["key"], RegretCell>>;
}

function metricOf(row: RowLike, key: RegretMetric["key"]): number | undefined {
  const value = row[key];
  return typeof value === "number" && Number.isFinite(value) ? value : undefined;
}

function loadsOf(doc: BenchDoc): number[] {
  return [...new Set(doc.results.map((r) => r.load))];
}

function rowOf(doc: BenchDoc, policy: string, load?: number): RowLike | undefined {
  return doc.results.find((r) => r.policy === policy && (load === undefined || r.load === load));
}

/** Per load of the document, sluice against the best baseline on each metric (none without a sluice row). */
export function regretRows(doc: BenchDoc): RegretRow[] {
  const out: RegretRow[] = [];
  for (const load of loadsOf(doc)) {
    const sluice = rowOf(doc, "sluice", load);
    if (!sluice) continue;
    const baselines = BASELINES.map((p) => rowOf(doc, p, load)).filter((r): r is RowLike => r !== undefined);
    if (baselines.length === 0) continue;
    const cells: RegretRow["cells"] = {};
    for (const metric of REGRET_METRICS) {
      const mine = metricOf(sluice, metric.key);
      let best: RowLike | undefined;
      for (const row of baselines) {
        const v = metricOf(row, metric.key);
        if (v === undefined) continue;
        const b = best === undefined ? undefined : metricOf(best, metric.key)!;
        if (b === undefined || (metric.better === "lower" ? v < b : v > b)) best = row;
      }
      if (mine === undefined || best === undefined) continue;
      cells[metric.key] = { sluice: mine, best: metricOf(best, metric.key)!, bestPolicy: best.policy };
    }
    out.push({ workload: doc.workload, load, cells });
  }
  return out;
}

function ratio(a: number, b: number): number {
  return b > 0 ? Math.round((a / b) * 1000) / 1000 : a > 0 ? Number.POSITIVE_INFINITY : 1;
}

function check(run: string, target: string, measured: number, goal: string, met: boolean): TargetCheck {
  return { run, target, measured, goal, met };
}

function r3(value: number): number {
  return Math.round(value * 1000) / 1000;
}

/**
 * The issue's targets for a regime: at every load, sluice's makespan ≤ 1.05 ×
 * and goodput ≥ 0.95 × the best baseline's, SLO attainment ≥ the best − 0.01,
 * TTFT p99 ≤ 1.1 × the best + 0.25 s.
 */
export function regimeChecks(doc: BenchDoc): TargetCheck[] {
  const checks: TargetCheck[] = [];
  const run = doc.workload;
  for (const row of regretRows(doc)) {
    const at = loadsOf(doc).length > 1 ? ` at load ${row.load}` : "";
    const { makespan_s: m, goodput_rps: g, slo_attainment: s, ttft_p99_s: t } = row.cells;
    if (m)
      checks.push(
        check(
          run,
          `sluice makespan ÷ best baseline (${m.bestPolicy})${at}`,
          ratio(m.sluice, m.best),
          "≤ 1.05",
          m.sluice <= 1.05 * m.best,
        ),
      );
    if (g)
      checks.push(
        check(
          run,
          `sluice goodput ÷ best baseline (${g.bestPolicy})${at}`,
          ratio(g.sluice, g.best),
          "≥ 0.95",
          g.sluice >= 0.95 * g.best,
        ),
      );
    if (s)
      checks.push(
        check(
          run,
          `sluice SLO attainment − best baseline (${s.bestPolicy})${at}`,
          r3(s.sluice - s.best),
          "≥ −0.01",
          s.sluice >= s.best - 0.01 - 1e-12,
        ),
      );
    if (t) {
      const limit = 1.1 * t.best + 0.25;
      checks.push(
        check(
          run,
          `sluice TTFT p99 s (best baseline ${t.bestPolicy} ${t.best})${at}`,
          t.sluice,
          `≤ ${r3(limit)}`,
          t.sluice <= limit,
        ),
      );
    }
  }
  return checks;
}

function need(doc: BenchDoc, policy: string, load?: number): RowLike {
  const row = rowOf(doc, policy, load);
  if (!row)
    throw new Error(`no ${policy} row${load === undefined ? "" : ` at load ${load}`} in ${doc.workload}`);
  return row;
}

/**
 * A target on the ratio of two runs' values, `a ÷ b` against `goal` (the comparison as written),
 * checked on the values themselves (no rounding at the bound); none when either run is absent.
 */
function ratioTarget(
  run: string,
  target: string,
  a: number | undefined,
  b: number | undefined,
  comparison: "≤" | "≥",
  goal: number,
): TargetCheck[] {
  if (a === undefined || b === undefined) return [];
  const met = comparison === "≤" ? a <= goal * b : a >= goal * b;
  return [check(run, target, ratio(a, b), `${comparison} ${goal}`, met)];
}

/** agents: sluice makespan ≤ concur's and ≤ 0.5 × rr's (also ≤ 0.6 × gate-prefix's, ≤ 1.5 × bound), hit rate ≥ 0.8. */
export function agentsChecks(doc: BenchDoc): TargetCheck[] {
  const sluice = need(doc, "sluice").makespan_s;
  const makespan = (policy: string) => rowOf(doc, policy)?.makespan_s;
  const hitRate = need(doc, "sluice").prefix_hit_rate;
  return [
    ...ratioTarget("agents", "sluice makespan ÷ rr", sluice, need(doc, "rr").makespan_s, "≤", 0.5),
    ...ratioTarget("agents", "sluice makespan ÷ concur", sluice, makespan("concur"), "≤", 1),
    ...ratioTarget("agents", "sluice makespan ÷ gate-prefix", sluice, makespan("gate-prefix"), "≤", 0.6),
    check("agents", "sluice prefix hit rate", hitRate, "≥ 0.8", hitRate >= 0.8),
    ...ratioTarget("agents", "sluice makespan ÷ bound", sluice, makespan("bound"), "≤", 1.5),
  ];
}

/** agents-256: rr's makespan ≥ 2 × sluice's (and gate-prefix's ≥ 1.5 ×). */
export function agents256Checks(doc: BenchDoc): TargetCheck[] {
  const sluice = need(doc, "sluice").makespan_s;
  return [
    ...ratioTarget("agents-256", "rr makespan ÷ sluice", need(doc, "rr").makespan_s, sluice, "≥", 2),
    ...ratioTarget(
      "agents-256",
      "gate-prefix makespan ÷ sluice",
      rowOf(doc, "gate-prefix")?.makespan_s,
      sluice,
      "≥",
      1.5,
    ),
  ];
}

/** agents-mixed: sluice's mean session completion ≤ 0.85 × concur's and its makespan ≤ concur's. */
export function agentsMixedChecks(doc: BenchDoc): TargetCheck[] {
  const sluice = need(doc, "sluice");
  const concur = need(doc, "concur");
  return [
    ...ratioTarget(
      "agents-mixed",
      "sluice mean session completion ÷ concur",
      sluice.session_completion_mean_s ?? Number.NaN,
      concur.session_completion_mean_s ?? Number.NaN,
      "≤",
      0.85,
    ),
    ...ratioTarget("agents-mixed", "sluice makespan ÷ concur", sluice.makespan_s, concur.makespan_s, "≤", 1),
  ];
}

/** mixed at one load: sluice's interactive TTFT p99 within its SLO, bulk still served, goodput ≥ 1.5 × the best request-level baseline. */
export function mixedChecks(doc: BenchDoc, load: number): TargetCheck[] {
  const groups = doc.details?.find((d) => d.policy === "sluice" && d.load === load)?.groups;
  const interactive = groups?.interactive;
  const bulk = groups?.bulk;
  const ttftSloS = interactive?.ttft_slo_s ?? Number.NaN;
  const sluice = need(doc, "sluice", load);
  const best = Math.max(...["rr", "gate", "gate-prefix"].map((p) => rowOf(doc, p, load)?.goodput_rps ?? 0));
  return [
    check(
      "mixed",
      `sluice interactive TTFT p99 at load ${load}, s`,
      interactive?.ttft_p99_s ?? Number.NaN,
      `≤ ${ttftSloS} (SLO)`,
      interactive !== undefined && interactive.ttft_p99_s <= ttftSloS,
    ),
    check(
      "mixed",
      `sluice bulk calls completed at load ${load}`,
      bulk?.completed ?? 0,
      "> 0",
      (bulk?.completed ?? 0) > 0,
    ),
    check(
      "mixed",
      `sluice goodput ÷ best request-level baseline at load ${load}`,
      ratio(sluice.goodput_rps, best),
      "≥ 1.5",
      sluice.goodput_rps >= 1.5 * best,
    ),
  ];
}

/** mooncake: sluice's goodput ≥ 1.5 × rr's at the load of the document. */
export function mooncakeChecks(doc: BenchDoc): TargetCheck[] {
  const sluice = need(doc, "sluice");
  const rr = need(doc, "rr", sluice.load);
  return [
    check(
      "mooncake",
      `sluice goodput ÷ rr at load ${sluice.load}`,
      ratio(sluice.goodput_rps, rr.goodput_rps),
      "≥ 1.5",
      sluice.goodput_rps >= 1.5 * rr.goodput_rps,
    ),
    ...capacityChecks(doc),
  ];
}

/**
 * The tiered-cache issue's SLO capacity targets without a host tier (the named `mooncake` run has
 * none; `bench/tiers.ts` measures both): sluice ≥ 1.2 × rr's and ≥ gate-prefix's.
 */
function capacityChecks(doc: BenchDoc): TargetCheck[] {
  const of = (policy: string) => doc.slo_capacity?.policies.find((p) => p.policy === policy)?.capacity;
  const sluice = of("sluice");
  const checks: TargetCheck[] = [];
  for (const [baseline, goal] of [
    ["rr", 1.2],
    ["gate-prefix", 1],
  ] as const) {
    const base = of(baseline);
    if (sluice === undefined || base === undefined || base <= 0) continue;
    const measured = ratio(sluice, base);
    checks.push(
      check(
        doc.workload,
        `SLO capacity (≥ 90 % of calls within the TTFT SLO), one tier: sluice ÷ ${baseline}`,
        measured,
        `≥ ${goal}`,
        sluice >= goal * base,
      ),
    );
  }
  return checks;
}

/** The label of sluice's run with fairness off beside the default one. */
export const SLUICE_FAIRNESS_OFF = "sluice (fairness off)";

function tenantOf(row: RowLike, tenant: string): TenantStats | undefined {
  return row.tenants?.[tenant];
}

function aloneOf(doc: BenchDoc, tenant: string, load: number): TenantStats | undefined {
  return doc.alone?.find((a) => a.policy === "sluice" && a.tenant === tenant && a.load === load)?.stats;
}

/**
 * A tenant arriving behind another (`tenants-noisy`, each tenant run alone as
 * the reference): its first admission p99 ≤ 10 s after it arrives, its mean
 * session completion ≤ 1.3 × alone; sluice's makespan ≤ 1.05 × and its hit
 * rate within 0.05 of the same run with fairness off.
 */
export function tenantsNoisyChecks(doc: BenchDoc): TargetCheck[] {
  const run = doc.workload;
  const sluice = need(doc, "sluice");
  const checks: TargetCheck[] = [];
  for (const tenant of [...new Set((doc.alone ?? []).map((a) => a.tenant))]) {
    const mine = tenantOf(sluice, tenant);
    if (!mine) continue;
    const wait = mine.first_admission_wait_p99_s;
    checks.push(check(run, `${tenant}'s first admission p99 after it arrives, s`, wait, "≤ 10", wait <= 10));
    checks.push(
      ...ratioTarget(
        run,
        `${tenant}'s mean session completion ÷ ${tenant} alone`,
        mine.session_completion_mean_s,
        aloneOf(doc, tenant, sluice.load)?.session_completion_mean_s,
        "≤",
        1.3,
      ),
    );
  }
  const off = rowOf(doc, SLUICE_FAIRNESS_OFF, sluice.load);
  if (off) {
    checks.push(
      ...ratioTarget(run, "sluice makespan ÷ fairness off", sluice.makespan_s, off.makespan_s, "≤", 1.05),
    );
    const gap = r3(Math.abs(sluice.prefix_hit_rate - off.prefix_hit_rate));
    checks.push(check(run, "sluice hit rate − fairness off's, absolute", gap, "≤ 0.05", gap <= 0.05 + 1e-12));
  }
  return checks;
}

/** All tenants backlogged (`tenants-weighted`): max ÷ min of service share ÷ weight ≤ 1.2, Jain's index ≥ 0.95. */
export function tenantsWeightedChecks(doc: BenchDoc): TargetCheck[] {
  const fairness = need(doc, "sluice").fairness;
  if (!fairness) return [];
  const spread = fairness.share_over_weight_max_over_min;
  return [
    check(
      doc.workload,
      "max ÷ min of service share ÷ weight",
      spread ?? Number.POSITIVE_INFINITY,
      "≤ 1.2",
      spread !== null && spread <= 1.2,
    ),
    check(
      doc.workload,
      "Jain's index over service share ÷ weight",
      fairness.jain,
      "≥ 0.95",
      fairness.jain >= 0.95,
    ),
  ];
}

/** A protected tenant among sheddable sessions (`tenants-bands`): admitted within 5 s, completing within 1.3 × alone, never paused. */
export function tenantsBandsChecks(doc: BenchDoc): TargetCheck[] {
  const sluice = need(doc, "sluice");
  const checks: TargetCheck[] = [];
  for (const [tenant, t] of Object.entries(sluice.tenants ?? {})) {
    if (t.band !== "protected") continue;
    const wait = t.first_admission_wait_max_s;
    checks.push(
      check(doc.workload, `protected ${tenant}: longest first admission wait, s`, wait, "≤ 5", wait <= 5),
    );
    checks.push(
      ...ratioTarget(
        doc.workload,
        `protected ${tenant}: mean session completion ÷ alone`,
        t.session_completion_mean_s,
        aloneOf(doc, tenant, sluice.load)?.session_completion_mean_s,
        "≤",
        1.3,
      ),
    );
    checks.push(check(doc.workload, `protected ${tenant}: pauses`, t.pauses, "= 0", t.pauses === 0));
  }
  return checks;
}

/**
 * Calls of very unequal size (`tenants-sizes`, the tenant named `large`): every
 * large call completes, none refused for the token budget, and the large
 * tenant's service share within 20 % of its fair share (its weight's share).
 */
export function tenantsSizesChecks(doc: BenchDoc): TargetCheck[] {
  const sluice = need(doc, "sluice");
  const large = sluice.tenants?.large;
  if (!large) return [];
  const weights = Object.values(sluice.tenants ?? {}).reduce((sum, t) => sum + t.weight, 0);
  const fair = weights > 0 ? large.weight / weights : 0;
  const refused = large.rejected.token_budget_exhausted ?? 0;
  const off = fair > 0 ? r3(large.service_share / fair) : Number.POSITIVE_INFINITY;
  return [
    check(
      doc.workload,
      "large calls completed ÷ offered",
      ratio(large.completed, large.sessions),
      "= 1",
      large.completed === large.sessions,
    ),
    check(doc.workload, "large calls refused for the token budget", refused, "= 0", refused === 0),
    check(
      doc.workload,
      `large tenant's service share ÷ its fair share (${r3(fair)})`,
      off,
      "within 0.8–1.2",
      off >= 0.8 - 1e-12 && off <= 1.2 + 1e-12,
    ),
  ];
}

/** Every policy run finished in a minute of wall time, and no session was left waiting (all calls settled). */
export function runChecks(doc: BenchDoc): TargetCheck[] {
  const details = (doc.details ?? []).filter((d) => d.policy !== "bound");
  if (details.length === 0) return [];
  const slowest = Math.max(0, ...details.map((d) => d.wall_s ?? 0));
  const unfinished = details.reduce((sum, d) => sum + (d.unfinished ?? 0), 0);
  return [
    check(doc.workload, "slowest policy run, wall s", slowest, "≤ 60", slowest <= 60),
    check(
      doc.workload,
      "calls left unfinished (a session waiting forever)",
      unfinished,
      "= 0",
      unfinished === 0,
    ),
  ];
}

/** Every target that applies to a document, by its workload name. */
export function targetsOf(doc: BenchDoc, options: { mixedLoad?: number } = {}): TargetCheck[] {
  const checks = runChecks(doc);
  const has = (policy: string) => doc.results.some((r) => r.policy === policy);
  if (!has("sluice")) return checks;
  if ((REGIMES as readonly string[]).includes(doc.workload)) checks.push(...regimeChecks(doc));
  switch (doc.workload) {
    case "agents":
      if (has("rr")) checks.push(...agentsChecks(doc));
      break;
    case "agents-256":
      if (has("rr")) checks.push(...agents256Checks(doc));
      break;
    case "agents-mixed":
      if (has("concur")) checks.push(...agentsMixedChecks(doc));
      break;
    case "mixed": {
      const load = options.mixedLoad ?? 1.5;
      if (doc.results.some((r) => r.policy === "sluice" && r.load === load))
        checks.push(...mixedChecks(doc, load));
      break;
    }
    case "mooncake":
      if (has("rr")) checks.push(...mooncakeChecks(doc));
      break;
    case "tenants-noisy":
      checks.push(...tenantsNoisyChecks(doc));
      break;
    case "tenants-weighted":
      checks.push(...tenantsWeightedChecks(doc));
      break;
    case "tenants-bands":
      checks.push(...tenantsBandsChecks(doc));
      break;
    case "tenants-sizes":
      checks.push(...tenantsSizesChecks(doc));
      break;
  }
  return checks;
}

function fmt(value: number): string {
  if (!Number.isFinite(value)) return "–";
  const abs = Math.abs(value);
  if (abs >= 100) return value.toFixed(1);
  if (abs >= 1) return value.toFixed(2);
  return value.toFixed(3);
}

/** One cell: sluice's value, the best baseline's, and their ratio. */
function cellText(cell: RegretCell | undefined, metric: RegretMetric): string {
  if (!cell) return "–";
  const rel =
    metric.key === "slo_attainment"
      ? `${cell.sluice - cell.best >= 0 ? "+" : ""}${(cell.sluice - cell.best).toFixed(3)}`
      : `×${fmt(ratio(cell.sluice, cell.best))}`;
  return `${fmt(cell.sluice)} vs ${fmt(cell.best)} ${cell.bestPolicy} (${rel})`;
}

/** The regret table as rows of text cells, a header first. */
export function regretCells(rows: readonly RegretRow[]): string[][] {
  return [
    ["workload", "load", ...REGRET_METRICS.map((m) => m.title)],
    ...rows.map((row) => [
      row.workload,
      String(row.load),
      ...REGRET_METRICS.map((metric) => cellText(row.cells[metric.key], metric)),
    ]),
  ];
}

/** The regret table as aligned text (stdout). */
export function renderRegretTable(rows: readonly RegretRow[]): string {
  const cells = regretCells(rows);
  const widths = cells[0]!.map((_, i) => Math.max(...cells.map((line) => line[i]!.length)));
  return cells
    .map((line) =>
      line
        .map((cell, i) => cell.padEnd(widths[i]!))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

/** The targets as text lines, `met` or `MISSED` first. */
export function renderChecks(checks: readonly TargetCheck[]): string {
  return checks
    .map((c) => `${c.met ? "met   " : "MISSED"}  ${c.run}: ${c.target} = ${c.measured} (goal ${c.goal})`)
    .join("\n");
}
