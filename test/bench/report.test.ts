/** @module The HTML report's content: refused share, per-session distributions, lines that coincide stay visible, no flat charts. */

import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { renderHtml } from "../../adapters/bench/report.js";
import { runWorkloadBench } from "../../adapters/bench/suite.js";
import { hasSignal, lineChart, styleOf } from "../../adapters/bench/svg.js";

const dir = mkdtempSync(join(tmpdir(), "sluice-report-"));

function workloadFile(name: string, spec: Record<string, unknown>): string {
  const path = join(dir, `${name}.json`);
  writeFileSync(path, JSON.stringify(spec));
  return path;
}

/** Every `<svg>` of a page, with the titles it carries. */
function charts(html: string): string[] {
  return html.match(/<svg[\s\S]*?<\/svg>/g) ?? [];
}

describe("lines that coincide", () => {
  it("each policy has its own stroke pattern and marker, and earlier lines are drawn wider", () => {
    const policies = ["rr", "gate", "gate-prefix", "concur", "sluice"];
    const patterns = new Set(policies.map((p) => `${styleOf(p).dash}|${styleOf(p).marker}`));
    assert.equal(patterns.size, policies.length);
    const svg = lineChart({
      title: "t",
      xLabel: "x",
      yLabel: "y",
      series: policies.map((name) => ({
        name,
        points: [
          [0, 1],
          [1, 2],
          [2, 3],
        ],
      })),
    });
    const paths = [...svg.matchAll(/<path d="M[^"]*" fill="none" stroke="([^"]+)" stroke-width="([\d.]+)"/g)];
    assert.equal(paths.length, policies.length);
    const widths = paths.map((m) => Number(m[2]));
    for (let i = 1; i < widths.length; i++) assert.ok(widths[i]! < widths[i - 1]!, `widths ${widths}`);
    assert.equal(new Set(paths.map((m) => m[1])).size, policies.length, "distinct colours");
  });

  it("a chart needs a value off zero to be drawn", () => {
    assert.equal(hasSignal([0, 0, null, undefined]), false);
    assert.equal(hasSignal([0, 0.01]), true);
    assert.equal(hasSignal([Number.NaN]), false);
  });
});

describe("the HTML report", () => {
  it("shows refused share beside goodput, session completion and wait distributions, and no flat chart", async () => {
    // A small thrashing case: concur and sluice make sessions wait for their window.
    const workload = workloadFile("waits", {
      kind: "agents",
      sessions: 24,
      steps: [4, 4],
      system_prompt_tokens: 1000,
      tool_output_tokens: [2000, 4000],
      output_tokens: [20, 60],
      tool_wait_s: [0.5, 1],
      seed: 3,
    });
    const result = await runWorkloadBench({
      workload,
      replicas: 1,
      preset: { base: "h100-llama3-8b", kvCapacityTokens: 60_000 },
      policies: ["rr", "gate-prefix", "concur", "sluice"],
    });
    assert.deepEqual(result.report.problems, []);
    const html = renderHtml(result.report, { describe: result.describe });
    assert.match(html, /<th>goodput\/s<\/th><th>refused<\/th>/);
    assert.match(html, /session completion time \(CDF\)/);
    const rows = result.report.output.results.filter((r) => r.policy !== "bound");
    const anyWait = rows.some((r) => r.session_wait_max_s > 0);
    if (anyWait) assert.match(html, /admission wait per session \(CDF\)/);
    else assert.match(html, /no session waited for admission/);
    const anyRefused = rows.some((r) => r.refused_share > 0);
    assert.equal(/share of calls refused/.test(html), anyRefused);
    for (const svg of charts(html)) {
      const numbers = [...svg.matchAll(/<title>[^<]*: ([\d.k]+)(?:, ([\d.]+))?<\/title>/g)];
      if (numbers.length === 0) continue;
      assert.ok(
        numbers.some((m) => Number(m[2] ?? m[1]) > 0 || m[1]!.endsWith("k")),
        `a chart draws only zeros: ${svg.slice(0, 200)}`,
      );
    }
  });
});
