/** @module The regret table, the issue's targets and docs/results.md, computed from benchmark documents alone. */

import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { type PdRow, pdTargets } from "../../bench/pd.js";
import type { BenchDoc, RowLike } from "../../bench/regret.js";
import {
  agentsMixedChecks,
  regimeChecks,
  regretRows,
  renderRegretTable,
  runChecks,
  targetsOf,
} from "../../bench/regret.js";
import { readResults, renderResultsDoc, writeResultsDoc } from "../../bench/results-doc.js";
import { mergeSummary } from "../../bench/run-all.js";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

function row(policy: string, values: Partial<RowLike> = {}): RowLike {
  return {
    policy,
    load: 1,
    makespan_s: 100,
    goodput_rps: 2,
    slo_attainment: 0.9,
    prefix_hit_rate: 0.5,
    ttft_p99_s: 1,
    session_completion_mean_s: 50,
    session_completion_p99_s: 90,
    session_wait_max_s: 0,
    refused_share: 0,
    completed: 200,
    ...values,
  };
}

function doc(workload: string, results: RowLike[], details?: BenchDoc["details"]): BenchDoc {
  return { workload, replicas: 1, preset: "h100-llama3-8b", results, ...(details ? { details } : {}) };
}

describe("regret rows", () => {
  it("compare sluice with the best baseline on each metric, naming it", () => {
    const d = doc("steady", [
      row("rr", { makespan_s: 120, goodput_rps: 3, ttft_p99_s: 0.5 }),
      row("gate", { makespan_s: 90 }),
      row("gate-prefix", { slo_attainment: 0.95, session_completion_mean_s: 40 }),
      row("concur", { session_completion_p99_s: 70 }),
      row("sluice", { makespan_s: 95 }),
      row("bound", { makespan_s: 10, goodput_rps: 99, ttft_p99_s: 0 }),
    ]);
    const [r] = regretRows(d);
    assert.deepEqual(r!.cells.makespan_s, { sluice: 95, best: 90, bestPolicy: "gate" });
    assert.deepEqual(r!.cells.goodput_rps, { sluice: 2, best: 3, bestPolicy: "rr" });
    assert.deepEqual(r!.cells.slo_attainment, { sluice: 0.9, best: 0.95, bestPolicy: "gate-prefix" });
    assert.deepEqual(r!.cells.ttft_p99_s, { sluice: 1, best: 0.5, bestPolicy: "rr" });
    assert.deepEqual(r!.cells.session_completion_mean_s, { sluice: 50, best: 40, bestPolicy: "gate-prefix" });
    assert.deepEqual(r!.cells.session_completion_p99_s, { sluice: 90, best: 70, bestPolicy: "concur" });
    assert.match(renderRegretTable([r!]), /95\.00 vs 90\.00 gate \(×1\.06\)/);
  });

  it("leave out metrics an older document lacks, and documents without sluice", () => {
    const old = row("sluice");
    delete old.session_completion_mean_s;
    const [r] = regretRows(doc("light", [row("rr"), old]));
    assert.equal(r!.cells.session_completion_mean_s, undefined);
    assert.ok(r!.cells.makespan_s);
    assert.deepEqual(regretRows(doc("light", [row("rr")])), []);
  });
});

describe("targets", () => {
  it("regimes: makespan ≤ 1.05 ×, goodput ≥ 0.95 ×, SLO ≥ best − 0.01, TTFT p99 ≤ 1.1 × best + 0.25 s", () => {
    const met = regimeChecks(
      doc("burst", [
        row("rr"),
        row("sluice", { makespan_s: 105, goodput_rps: 1.9, slo_attainment: 0.89, ttft_p99_s: 1.35 }),
      ]),
    );
    assert.equal(met.length, 4);
    assert.ok(
      met.every((c) => c.met),
      JSON.stringify(met),
    );
    const missed = regimeChecks(
      doc("burst", [
        row("rr"),
        row("sluice", { makespan_s: 105.5, goodput_rps: 1.89, slo_attainment: 0.885, ttft_p99_s: 1.36 }),
      ]),
    );
    assert.deepEqual(
      missed.map((c) => c.met),
      [false, false, false, false],
    );
    assert.equal(missed[0]!.measured, 1.055);
  });

  it("every load of a regime is checked", () => {
    const d = doc("mixed", [row("rr"), row("sluice"), row("rr", { load: 2 }), row("sluice", { load: 2 })]);
    const checks = regimeChecks(d);
    assert.equal(checks.length, 8);
    assert.ok(checks.some((c) => c.target.includes("at load 2")));
  });

  it("agents-mixed: mean session completion ≤ 0.85 × concur's and makespan ≤ concur's", () => {
    const checks = agentsMixedChecks(
      doc("agents-mixed", [
        row("concur", { session_completion_mean_s: 100, makespan_s: 500 }),
        row("sluice", { session_completion_mean_s: 86, makespan_s: 499 }),
      ]),
    );
    assert.deepEqual(
      checks.map((c) => [c.measured, c.met]),
      [
        [0.86, false],
        [0.998, true],
      ],
    );
  });

  it("agents: sluice ≤ concur and ≤ 0.5 × rr, hit rate ≥ 0.8; agents-256: rr ≥ 2 × sluice", () => {
    const agents = targetsOf(
      doc("agents", [
        row("rr", { makespan_s: 1000 }),
        row("concur", { makespan_s: 480 }),
        row("sluice", { makespan_s: 490, prefix_hit_rate: 0.85 }),
      ]),
    );
    const byTarget = Object.fromEntries(agents.map((c) => [c.target, c.met]));
    assert.equal(byTarget["sluice makespan ÷ rr"], true);
    assert.equal(byTarget["sluice makespan ÷ concur"], false);
    assert.equal(byTarget["sluice prefix hit rate"], true);
    const big = targetsOf(
      doc("agents-256", [row("rr", { makespan_s: 1999 }), row("sluice", { makespan_s: 1000 })]),
    );
    assert.deepEqual(
      big.map((c) => c.met),
      [false],
    );
  });

  it("every run: a minute of wall time at most, and no call left unfinished", () => {
    const checks = runChecks(
      doc(
        "light",
        [row("rr"), row("sluice")],
        [
          { policy: "rr", load: 1, wall_s: 3, unfinished: 0 },
          { policy: "sluice", load: 1, wall_s: 4, unfinished: 2 },
          { policy: "bound", load: 1 },
        ],
      ),
    );
    assert.deepEqual(
      checks.map((c) => [c.measured, c.met]),
      [
        [4, true],
        [2, false],
      ],
    );
  });
});

describe("docs/results.md", () => {
  const docs = [
    doc("chat", [row("rr"), row("concur", { makespan_s: 130 }), row("sluice", { makespan_s: 130 })]),
    doc("agents-mixed", [
      row("rr", { makespan_s: 1100 }),
      row("concur", { makespan_s: 560, session_completion_mean_s: 360 }),
      row("sluice", { makespan_s: 500, session_completion_mean_s: 250 }),
    ]),
  ];

  it("is generated from the documents: regret table, targets marked met or missed, each workload's rows", () => {
    const text = renderResultsDoc({
      docs,
      summary: { wall_s: 600, finished_at: "2026-12-01T12:00:00Z" },
      http: {
        sessions: 200,
        replicas: 2,
        runs: [
          { policy: "sluice", total_s: 1.3, ok: 200, failed: 0 },
          { policy: "gate-prefix", total_s: 1.2, ok: 200, failed: 0 },
        ],
        sluice_over_gate_prefix: 1.083,
        goal: "≤ 1.2",
        met: true,
      },
    });
    assert.match(text, /do not edit by hand/);
    assert.match(text, /took 10\.0 min of wall time/);
    // agents-mixed is listed before chat, whatever the input order.
    assert.ok(text.indexOf("## agents-mixed") < text.indexOf("## chat"));
    assert.match(text, /\| chat \| 1 \| 130\.0 vs 100\.0 rr \(×1\.30\)/);
    assert.match(
      text,
      /\| \*\*missed\*\* \| chat \| sluice makespan ÷ best baseline \(rr\) \| 1\.3 \| ≤ 1\.05 \|/,
    );
    assert.match(
      text,
      /\| met \| agents-mixed \| sluice mean session completion ÷ concur \| 0\.694 \| ≤ 0\.85 \|/,
    );
    assert.match(text, /sluice ÷ gate-prefix = 1\.083 \(goal ≤ 1\.2\): met/);
    assert.match(text, /## Targets \(\d+ of \d+ met\)/);
    assert.equal(renderResultsDoc({ docs }), renderResultsDoc({ docs: [...docs].reverse() }), "stable");
  });

  it("is written from a results folder, ignoring JSON that is not a benchmark document", () => {
    const dir = mkdtempSync(join(tmpdir(), "sluice-results-"));
    for (const d of docs) writeFileSync(join(dir, `${d.workload}.json`), JSON.stringify(d));
    writeFileSync(join(dir, "gate.json"), JSON.stringify({ direct_ratio: 1.2 }));
    writeFileSync(join(dir, "summary.json"), JSON.stringify({ wall_s: 61 }));
    const out = join(dir, "docs", "results.md");
    writeResultsDoc(dir, out);
    const text = readFileSync(out, "utf8");
    assert.equal(readResults(dir).docs.length, 2);
    assert.equal(text, renderResultsDoc(readResults(dir)));
    assert.doesNotMatch(text, /direct_ratio/);
  });

  it("the recorded docs/results.md is what bench/results generates (never edited by hand)", () => {
    const recorded = join(REPO, "docs/results.md");
    assert.ok(
      existsSync(recorded),
      "docs/results.md is recorded in the repository (npx tsx bench/results-doc.ts)",
    );
    assert.equal(readFileSync(recorded, "utf8"), renderResultsDoc(readResults(join(REPO, "bench/results"))));
  });
});

describe("the pd targets", () => {
  const pdRow = (policy: string, values: Partial<PdRow>): PdRow =>
    ({
      ...row(policy),
      wasted_prefill_tokens: 0,
      refused_after_prefill: 0,
      decode_kv_mean: 0.8,
      decode_kv_cv: 0.2,
      groups: {},
      ...values,
    }) as PdRow;

  it("are sluice's wasted prefill, and its goodput and decode KV CV over current-load admission's, each met or missed", () => {
    const rows = [
      pdRow("sluice", { goodput_rps: 2.6, decode_kv_cv: 0.09 }),
      pdRow("current-load", { goodput_rps: 2, decode_kv_cv: 0.2, wasted_prefill_tokens: 5000 }),
    ];
    assert.deepEqual(
      pdTargets({ rows }).map((t) => [t.measured, t.met]),
      [
        [0, true],
        [1.3, true],
        [0.45, true],
      ],
    );
    const missed = [
      pdRow("sluice", { goodput_rps: 2.5, wasted_prefill_tokens: 10, decode_kv_cv: 0.15 }),
      rows[1]!,
    ];
    assert.deepEqual(
      pdTargets({ rows: missed }).map((t) => t.met),
      [false, false, false],
    );
    assert.deepEqual(pdTargets({ rows: [rows[0]!] }), [], "nothing to compare with");
  });

  it("are checked in docs/results.md beside the pd table", () => {
    const rows = [pdRow("sluice", { goodput_rps: 2.6 }), pdRow("current-load", { goodput_rps: 2.7 })];
    const text = renderResultsDoc({
      docs: [],
      pd: { fleet: "2 prefill + 2 decode", workload: "agents and chat", steady_s: [60, 240], rows },
    });
    assert.match(text, /## pd: disaggregated prefill and decode/);
    assert.match(
      text,
      /\| \*\*missed\*\* \| pd \| sluice goodput ÷ current-load admission's \| 0\.963 \| ≥ 1\.3 \|/,
    );
    assert.match(text, /\| current-load \| 2\.7 \|/);
  });
});

describe("a partial run's summary", () => {
  it("replaces the entries of the parts that ran and keeps the rest of the last full run", () => {
    const previous = {
      wall_s: 650,
      finished_at: "then",
      mooncake_knee: { load: 1 },
      seed_spread: [{ workload: "agents" }],
      regret: [{ workload: "agents" }, { workload: "burst" }],
      targets: [
        { run: "agents", target: "a", measured: 1, goal: "", met: true },
        { run: "burst", target: "b", measured: 1, goal: "", met: false },
      ],
      problems: ["sim.ts: Error: trace not found", "burst: 1 calls unfinished"],
    };
    const current = {
      wall_s: 40,
      finished_at: "now",
      regret: [{ workload: "burst", new: true }],
      targets: [{ run: "burst", target: "b", measured: 2, goal: "", met: true }],
      problems: [],
    };
    const merged = mergeSummary(previous, current, new Set(["burst", "others"]));
    assert.equal(merged.wall_s, 650);
    assert.deepEqual(merged.mooncake_knee, { load: 1 });
    assert.deepEqual(merged.regret, [{ workload: "agents" }, { workload: "burst", new: true }]);
    assert.deepEqual(
      (merged.targets as { run: string; measured: number }[]).map((t) => [t.run, t.measured]),
      [
        ["agents", 1],
        ["burst", 2],
      ],
    );
    assert.deepEqual(merged.problems, []);
    assert.deepEqual(merged.partial, { only: ["burst", "others"], wall_s: 40, finished_at: "now" });
  });
});
