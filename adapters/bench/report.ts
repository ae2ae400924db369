/** @module Benchmark outputs: the text table, the self-contained HTML report, and the README chart. */

import type { BenchReport, ResultRow, Sample } from "./run.js";
import { quantileSorted } from "./stats.js";
import { barChart, colourOf, downsample, escapeXml, fmtNumber, hasSignal, lineChart } from "./svg.js";

const TABLE_COLUMNS: { title: string; value: (row: ResultRow) => string }[] = [
  { title: "policy", value: (r) => r.policy },
  { title: "load", value: (r) => String(r.load) },
  { title: "makespan s", value: (r) => r.makespan_s.toFixed(1) },
  { title: "goodput/s", value: (r) => r.goodput_rps.toFixed(3) },
  { title: "refused", value: (r) => r.refused_share.toFixed(3) },
  { title: "SLO", value: (r) => r.slo_attainment.toFixed(3) },
  { title: "tok/s", value: (r) => r.throughput_tokens_per_s.toFixed(0) },
  { title: "hit rate", value: (r) => r.prefix_hit_rate.toFixed(3) },
  { title: "recomp tok", value: (r) => String(r.recomputed_tokens) },
  { title: "preempt", value: (r) => String(r.preemptions) },
  { title: "TTFT p50", value: (r) => r.ttft_p50_s.toFixed(3) },
  { title: "TTFT p99", value: (r) => r.ttft_p99_s.toFixed(3) },
  { title: "TPOT p50", value: (r) => r.tpot_p50_s.toFixed(4) },
  { title: "TPOT p99", value: (r) => r.tpot_p99_s.toFixed(4) },
  { title: "sess mean", value: (r) => r.session_completion_mean_s.toFixed(1) },
  { title: "sess p99", value: (r) => r.session_completion_p99_s.toFixed(1) },
  { title: "wait p99", value: (r) => r.session_wait_p99_s.toFixed(1) },
  { title: "wait max", value: (r) => r.session_wait_max_s.toFixed(1) },
  { title: "done", value: (r) => String(r.completed) },
  {
    title: "rejected",
    value: (r) =>
      Object.entries(r.rejected)
        .map(([reason, n]) => `${reason}:${n}`)
        .join(" ") || "-",
  },
];

/** The results as an aligned plain-text table (stdout). */
export function renderTable(rows: readonly ResultRow[]): string {
  const cells = [
    TABLE_COLUMNS.map((c) => c.title),
    ...rows.map((row) => TABLE_COLUMNS.map((c) => c.value(row))),
  ];
  const widths = TABLE_COLUMNS.map((_, i) => Math.max(...cells.map((line) => line[i]!.length)));
  return cells
    .map((line) =>
      line
        .map((cell, i) =>
          i === 0 || i === line.length - 1 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!),
        )
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

function policiesOf(report: BenchReport): string[] {
  return [...new Set(report.output.results.map((r) => r.policy))];
}

function loadsOf(report: BenchReport): number[] {
  return [...new Set(report.output.results.map((r) => r.load))];
}

function cellOf(report: BenchReport, policy: string, load: number, key: keyof ResultRow): number | null {
  const row = report.output.results.find((r) => r.policy === policy && r.load === load);
  const value = row?.[key];
  return typeof value === "number" ? value : null;
}

/**
 * The main chart: makespan per policy (bars, one per load) with the lower
 * bound as a dashed line when there is one load. Standalone SVG, for the README.
 */
export function mainChartSvg(report: BenchReport): string {
  const loads = loadsOf(report);
  const policies = policiesOf(report).filter((p) => loads.length > 1 || p !== "bound");
  const bound = loads.length === 1 ? cellOf(report, "bound", loads[0]!, "makespan_s") : null;
  return barChart({
    title: `${report.output.workload}: makespan on ${report.output.replicas} × ${report.output.preset} (lower is better)`,
    yLabel: "makespan, s",
    categories: policies,
    colourByCategory: true,
    series: loads.map((load) => ({
      name: `load ${load}`,
      values: policies.map((p) => cellOf(report, p, load, "makespan_s")),
    })),
    ...(bound !== null ? { reference: { value: bound, label: `lower bound ${fmtNumber(bound)} s` } } : {}),
  });
}

/** A bar chart of one column per policy and load, or nothing when every value is zero. */
function policyBars(report: BenchReport, key: keyof ResultRow, title: string, yLabel: string): string {
  const loads = loadsOf(report);
  const policies = policiesOf(report).filter((p) => p !== "bound");
  const series = loads.map((load) => ({
    name: `load ${load}`,
    values: policies.map((p) => cellOf(report, p, load, key)),
  }));
  if (!hasSignal(series.flatMap((s) => s.values))) return "";
  return barChart({ title, yLabel, categories: policies, colourByCategory: true, series });
}

function refusedChart(report: BenchReport): string {
  return policyBars(
    report,
    "refused_share",
    "share of calls refused for good (lower is better)",
    "refused ÷ offered",
  );
}

function goodputChart(report: BenchReport): string {
  const loads = loadsOf(report);
  const policies = policiesOf(report).filter((p) => p !== "bound");
  if (!hasSignal(loads.flatMap((load) => policies.map((p) => cellOf(report, p, load, "goodput_rps")))))
    return "";
  return barChart({
    title: "goodput (calls meeting their SLO per second; higher is better)",
    yLabel: "goodput, calls/s",
    categories: policies,
    colourByCategory: true,
    series: loads.map((load) => ({
      name: `load ${load}`,
      values: policies.map((p) => cellOf(report, p, load, "goodput_rps")),
    })),
  });
}

function goodputVsLoad(report: BenchReport): string {
  const loads = loadsOf(report);
  if (loads.length < 2) return "";
  const values = report.output.results.filter((r) => r.policy !== "bound").map((r) => r.goodput_rps);
  if (!hasSignal(values)) return "";
  return lineChart({
    title: "goodput against offered load",
    xLabel: "offered load (× the workload's base rate)",
    yLabel: "goodput, calls/s",
    markers: true,
    series: policiesOf(report)
      .filter((p) => p !== "bound")
      .map((policy) => ({
        name: policy,
        points: loads
          .map((load): [number, number | null] => [load, cellOf(report, policy, load, "goodput_rps")])
          .filter((p): p is [number, number] => p[1] !== null),
      })),
  });
}

/** Each policy's SLO capacity as text lines (trace replays), or "" when none was searched. */
export function renderSloCapacity(report: BenchReport): string {
  const capacity = report.output.slo_capacity;
  if (!capacity) return "";
  const lines = capacity.policies.map(
    (p) =>
      `${p.policy}: SLO capacity ${fmtNumber(p.capacity)}` +
      (p.ratio_to_rr !== undefined ? ` (${fmtNumber(p.ratio_to_rr)} × rr)` : "") +
      ` — ${p.tried.map((t) => `${fmtNumber(t.load)}: ${(t.ttft_slo_met * 100).toFixed(1)} %`).join(", ")}`,
  );
  return [
    `SLO capacity: the largest load at which ≥ ${capacity.share * 100} % of calls meet their TTFT SLO`,
    ...lines,
  ].join("\n");
}

/** SLO attainment (share of calls within their TTFT SLO) against load per policy, each capacity marked. */
function sloCapacityChart(report: BenchReport): string {
  const capacity = report.output.slo_capacity;
  if (!capacity) return "";
  const loads = capacity.policies.flatMap((p) => p.tried.map((t) => t.load));
  const lowest = Math.min(...loads);
  const highest = Math.max(...loads);
  const series: Parameters<typeof lineChart>[0]["series"] = [];
  capacity.policies.forEach((p, i) => {
    series.push({ name: p.policy, points: p.tried.map((t) => [t.load, t.ttft_slo_met]) });
    // The capacity: a dashed drop from the policy's line at that load, in its colour.
    const met = p.tried.find((t) => t.load === p.capacity)?.ttft_slo_met;
    if (met !== undefined) {
      series.push({
        name: `${p.policy} capacity ${fmtNumber(p.capacity)}`,
        points: [
          [p.capacity, 0],
          [p.capacity, met],
        ],
        dashed: true,
        colour: colourOf(p.policy, i),
      });
    }
  });
  series.push({
    name: `${capacity.share * 100} % of calls`,
    points: [
      [lowest, capacity.share],
      [highest, capacity.share],
    ],
    dashed: true,
    colour: "#888",
  });
  return lineChart({
    title: "SLO attainment against offered load, each policy's SLO capacity marked",
    xLabel: "offered load (× the trace's rate)",
    yLabel: "share of calls within their TTFT SLO",
    yMax: 1,
    markers: true,
    series,
  });
}

/** Token-weighted hit rate over a sliding window of `span` samples. */
export function hitRateSeries(samples: readonly Sample[], span = 10): [number, number][] {
  const out: [number, number][] = [];
  for (let i = 1; i < samples.length; i++) {
    const from = samples[Math.max(0, i - span)]!;
    const to = samples[i]!;
    const queries = to.queries - from.queries;
    if (queries > 0) out.push([to.t, (to.hits - from.hits) / queries]);
  }
  return out;
}

/** A line chart, or nothing when no series has a point off zero. */
function unlessFlat(chart: Parameters<typeof lineChart>[0]): string {
  return hasSignal(chart.series.flatMap((s) => s.points.map(([, y]) => y))) ? lineChart(chart) : "";
}

function timeCharts(report: BenchReport, load: number): string {
  const runs = report.runs.filter((r) => r.load === load);
  const hit = unlessFlat({
    title: `prefix-cache hit rate over time (10 s window), load ${load}`,
    xLabel: "virtual time, s",
    yLabel: "hit rate",
    yMax: 1,
    series: runs.map(({ policy, run }) => ({
      name: policy,
      points: downsample(hitRateSeries(run.samples), 400),
    })),
  });
  const windowed = runs.filter(({ run }) => run.samples.some((s) => s.window !== null));
  const windowSeries = windowed.flatMap(({ policy, run }) => [
    {
      name: `${policy} window`,
      colour: colourOf(policy),
      points: downsample(
        run.samples.filter((s) => s.window !== null).map((s): [number, number] => [s.t, s.window!]),
        400,
      ),
    },
    {
      name: `${policy} active sessions`,
      colour: colourOf(policy),
      dashed: true,
      points: downsample(
        run.samples.map((s): [number, number] => [s.t, s.activeSessions]),
        400,
      ),
    },
  ]);
  const windowChart =
    windowSeries.length > 0
      ? unlessFlat({
          title: `session window (sum over replicas) and active sessions, load ${load}`,
          xLabel: "virtual time, s",
          yLabel: "sessions",
          series: windowSeries,
        })
      : "";
  const kv = unlessFlat({
    title: `mean KV usage over time, load ${load}`,
    xLabel: "virtual time, s",
    yLabel: "KV usage",
    yMax: 1,
    series: runs.map(({ policy, run }) => ({
      name: policy,
      points: downsample(
        run.samples.map((s): [number, number] => [s.t, s.kvUsage]),
        400,
      ),
    })),
  });
  return hit + windowChart + kv;
}

/** Up to 200 points of the empirical CDF of `values` (x floored at `floor` for a log axis). */
export function cdfPoints(values: readonly number[], floor = 1e-3): [number, number][] {
  const sorted = [...values].sort((a, b) => a - b);
  const points: [number, number][] = [];
  const n = Math.min(200, sorted.length);
  for (let i = 1; i <= n; i++) {
    const p = i / n;
    points.push([Math.max(floor, quantileSorted(sorted, p)), p]);
  }
  return points;
}

/** A CDF over policies, or nothing when every value is zero (e.g. no session ever waited). */
function cdfChart(
  report: BenchReport,
  load: number,
  pick: (run: BenchReport["runs"][number]["run"]) => readonly number[],
  title: string,
  xLabel: string,
  yLabel: string,
): string {
  const runs = report.runs.filter((r) => r.load === load);
  if (!hasSignal(runs.flatMap(({ run }) => pick(run)))) return "";
  return lineChart({
    title,
    xLabel,
    yLabel,
    yMax: 1,
    logX: true,
    series: runs.map(({ policy, run }) => ({ name: policy, points: cdfPoints(pick(run)) })),
  });
}

function ttftChart(report: BenchReport, load: number): string {
  return cdfChart(
    report,
    load,
    (run) => run.ttftS,
    `TTFT distribution (CDF), load ${load}`,
    "time to first token, s (log scale)",
    "fraction of calls",
  );
}

/** Per-session distributions: completion time, and the total time each session waited for admission. */
function sessionCharts(report: BenchReport, load: number): string {
  const completion = cdfChart(
    report,
    load,
    (run) => run.sessionCompletionS,
    `session completion time (CDF), load ${load}`,
    "first arrival to last call's end, s (log scale)",
    "fraction of sessions",
  );
  const wait = cdfChart(
    report,
    load,
    (run) => run.sessionWaitS,
    `admission wait per session (CDF), load ${load}`,
    "total time a session's calls waited for admission, s (log scale; none at 1 ms)",
    "fraction of sessions",
  );
  const note = wait === "" ? `<p>Load ${load}: no session waited for admission under any policy.</p>` : "";
  return completion + wait + note;
}

function htmlTable(report: BenchReport): string {
  const head = TABLE_COLUMNS.map((c) => `<th>${escapeXml(c.title)}</th>`).join("");
  const rows = report.output.results
    .map((row) => `<tr>${TABLE_COLUMNS.map((c) => `<td>${escapeXml(c.value(row))}</td>`).join("")}</tr>`)
    .join("\n");
  return `<table><thead><tr>${head}</tr></thead><tbody>${rows}</tbody></table>`;
}

function groupTable(report: BenchReport): string {
  const lines: string[] = [];
  for (const { policy, load, run } of report.runs) {
    for (const [group, g] of Object.entries(run.groups)) {
      lines.push(
        `<tr><td>${escapeXml(policy)}</td><td>${load}</td><td>${escapeXml(group)}</td><td>${g.offered}</td>` +
          `<td>${g.completed}</td><td>${g.met_slo}</td><td>${g.slo_attainment}</td><td>${g.goodput_rps}</td>` +
          `<td>${g.ttft_p50_s}</td><td>${g.ttft_p99_s}</td><td>${g.tpot_p99_s}</td><td>${g.rejected}</td></tr>`,
      );
    }
  }
  return (
    "<table><thead><tr><th>policy</th><th>load</th><th>group</th><th>offered</th><th>completed</th>" +
    "<th>met SLO</th><th>SLO</th><th>goodput/s</th><th>TTFT p50</th><th>TTFT p99</th><th>TPOT p99</th>" +
    `<th>refused</th></tr></thead><tbody>${lines.join("\n")}</tbody></table>`
  );
}

/** The self-contained HTML report: every chart inline SVG, no external resource. */
export function renderHtml(report: BenchReport, meta: { describe: string[]; command?: string }): string {
  const loads = loadsOf(report);
  const perLoad = loads.map(
    (load) =>
      `<h2>Load ${load}</h2>${timeCharts(report, load)}${ttftChart(report, load)}${sessionCharts(report, load)}`,
  );
  const problems =
    report.problems.length > 0
      ? `<div class="problems"><h2>Problems</h2><ul>${report.problems.map((p) => `<li>${escapeXml(p)}</li>`).join("")}</ul></div>`
      : "";
  const bounds = report.bounds
    .map(
      ({ load, bound }) =>
        `<li>load ${load}: ${fmtNumber(bound.makespanS)} s = max(critical path ${fmtNumber(bound.criticalPathS)} s, ` +
        `unique work ÷ replicas ${fmtNumber(bound.workS)} s)</li>`,
    )
    .join("");
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>sluice bench: ${escapeXml(report.output.workload)}</title>
<style>
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1340px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:12px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
svg{margin:8px 8px 8px 0;border:1px solid #eee}
.problems{background:#fff0f0;border:1px solid #e0a0a0;padding:4px 16px}
code{background:#f4f4f4;padding:1px 4px}
</style></head><body>
<h1>sluice bench: ${escapeXml(report.output.workload)}</h1>
<p>${report.output.replicas} × <code>${escapeXml(report.output.preset)}</code> simulated replicas, virtual time.
${meta.command ? `Command: <code>${escapeXml(meta.command)}</code>.` : ""}</p>
<ul>${meta.describe.map((d) => `<li>${escapeXml(d)}</li>`).join("")}</ul>
${problems}
${htmlTable(report)}
<p>Goodput: calls that met their SLO (TTFT and TPOT) per second of makespan; refused: calls refused for
good ÷ calls offered. Hit rate: the engines' token-weighted prefix-cache hits ÷ queries over the run.
Session times (sess, wait) run per session: from its first arrival to its last call's end, and the total
time its calls waited for admission (refusals and retry delays included). A chart whose values are all
zero is left out. <code>bound</code>: a lower bound on makespan:</p>
<ul>${bounds}</ul>
${report.output.slo_capacity ? `<h2>SLO capacity</h2><pre>${escapeXml(renderSloCapacity(report))}</pre>${sloCapacityChart(report)}` : ""}
${mainChartSvg(report)}${goodputChart(report)}${refusedChart(report)}${goodputVsLoad(report)}
<h2>Per group</h2>
${groupTable(report)}
${perLoad.join("\n")}
</body></html>
`;
}
