import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { before, describe, it } from "node:test";
import { hitRateSeries, renderTable } from "../../adapters/bench/report.js";
import type { Sample } from "../../adapters/bench/run.js";
import { run } from "../../adapters/cli/bench.js";
import { benchOutputSchema } from "../../bench/output-schema.js";

const dir = mkdtempSync(join(tmpdir(), "sluice-bench-cli-"));
const workload = join(dir, "tiny.json");
writeFileSync(
  workload,
  JSON.stringify({
    kind: "agents",
    sessions: 4,
    steps: [2, 3],
    system_prompt_tokens: 500,
    tool_output_tokens: [200, 600],
    output_tokens: [20, 40],
    tool_wait_s: [0.5, 1],
    seed: 4,
  }),
);

/** Runs `sluice bench` with stdout and stderr captured. */
async function bench(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const realOut = process.stdout.write.bind(process.stdout);
  const realErr = process.stderr.write.bind(process.stderr);
  process.stdout.write = ((chunk: string | Uint8Array) =>
    out.push(String(chunk)) > 0) as typeof process.stdout.write;
  process.stderr.write = ((chunk: string | Uint8Array) =>
    err.push(String(chunk)) > 0) as typeof process.stderr.write;
  try {
    const code = await run(argv);
    return { code, stdout: out.join(""), stderr: err.join("") };
  } finally {
    process.stdout.write = realOut;
    process.stderr.write = realErr;
  }
}

describe("sluice bench", () => {
  const json = join(dir, "out", "results.json");
  const html = join(dir, "out", "report.html");
  const svg = join(dir, "out", "main.svg");
  let result: { code: number; stdout: string; stderr: string };

  before(async () => {
    result = await bench([
      "--workload",
      workload,
      "--policies",
      "rr,gate-prefix,sluice",
      "--load",
      "1,2",
      "--json",
      json,
      "--report",
      html,
      "--svg",
      svg,
    ]);
  });

  it("prints a table on stdout and progress on stderr, and exits 0", () => {
    assert.equal(result.code, 0, result.stderr);
    assert.match(result.stdout, /policy\s+load\s+makespan s/);
    for (const policy of ["rr", "gate-prefix", "sluice", "bound"])
      assert.match(result.stdout, new RegExp(`^${policy}\\s`, "m"));
    assert.match(result.stderr, /\[tiny\] sluice load 2: makespan/);
  });

  it("writes the documented JSON: one row per policy and load, plus the bound", () => {
    const doc = JSON.parse(readFileSync(json, "utf8"));
    const parsed = benchOutputSchema.safeParse(doc);
    assert.ok(parsed.success, parsed.success ? "" : JSON.stringify(parsed.error.issues));
    assert.equal(doc.workload, "tiny");
    assert.equal(doc.replicas, 1);
    assert.equal(doc.preset, "h100-llama3-8b");
    assert.deepEqual(
      doc.results.map((r: { policy: string; load: number }) => `${r.policy}@${r.load}`),
      ["rr@1", "gate-prefix@1", "sluice@1", "bound@1", "rr@2", "gate-prefix@2", "sluice@2", "bound@2"],
    );
  });

  it("writes a self-contained HTML report and the main chart as SVG", () => {
    const page = readFileSync(html, "utf8");
    assert.match(page, /^<!doctype html>/);
    for (const title of [
      "makespan",
      "goodput against offered load",
      "prefix-cache hit rate over time",
      "session window",
      "TTFT distribution",
    ]) {
      assert.ok(page.includes(title), `report lacks "${title}"`);
    }
    // No script, stylesheet or image from anywhere: the only URL is the SVG namespace.
    const urls = page.match(/https?:\/\/[^\s"'<>]+/g) ?? [];
    assert.deepEqual([...new Set(urls)], ["http://www.w3.org/2000/svg"]);
    assert.doesNotMatch(page, /<script|<link|<img/);
    const chart = readFileSync(svg, "utf8");
    assert.match(chart, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"[^>]*>.*<\/svg>\n$/s);
    assert.match(chart, /makespan/);
  });

  it("refuses bad flags and bad workloads with exit status 2, naming the value", async () => {
    const cases: [string[], RegExp][] = [
      [["--policies", "rr,fifo"], /--policies .*"fifo"/],
      [["--load", "1,0"], /--load .*"0"/],
      [["--replicas", "two"], /--replicas .*"two"/],
      [["--preset", "a100"], /--preset .*"a100"/],
      [["--workload", "nonesuch"], /unknown workload "nonesuch"/],
      [["--frobnicate"], /frobnicate/],
    ];
    for (const [argv, message] of cases) {
      const r = await bench(argv);
      assert.equal(r.code, 2, argv.join(" "));
      assert.match(r.stderr, message);
      assert.equal(r.stdout, "");
    }
    const bad = join(dir, "bad.json");
    writeFileSync(bad, JSON.stringify({ kind: "agents", sessions: 2, think_time_s: 3 }));
    const r = await bench(["--workload", bad]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /unknown field "think_time_s"/);
    assert.ok(!existsSync(join(dir, "bad-out.json")));
  });

  it("--help prints the flags and exits 0", async () => {
    const r = await bench(["--help"]);
    assert.equal(r.code, 0);
    for (const flag of [
      "--workload",
      "--replicas",
      "--preset",
      "--policies",
      "--load",
      "--seed",
      "--json",
      "--report",
    ]) {
      assert.ok(r.stdout.includes(flag), flag);
    }
  });
});

describe("report helpers", () => {
  it("hit rate over time is token-weighted over a sliding window of samples", () => {
    const sample = (t: number, hits: number, queries: number): Sample => ({
      t,
      hits,
      queries,
      window: null,
      activeSessions: 0,
      kvUsage: 0,
      queued: 0,
      running: 0,
      stage: 0,
    });
    const samples = [
      sample(0, 0, 0),
      sample(1, 0, 100),
      sample(2, 90, 200),
      sample(3, 90, 200),
      sample(4, 190, 300),
    ];
    assert.deepEqual(hitRateSeries(samples, 2), [
      [1, 0],
      [2, 0.45],
      [3, 0.9],
      [4, 1],
    ]);
  });

  it("the table aligns every row", () => {
    const row = {
      policy: "sluice",
      load: 1,
      makespan_s: 12.5,
      goodput_rps: 1.25,
      slo_attainment: 0.5,
      throughput_tokens_per_s: 100,
      prefix_hit_rate: 0.8,
      recomputed_tokens: 0,
      preemptions: 0,
      ttft_p50_s: 0.1,
      ttft_p99_s: 0.2,
      tpot_p50_s: 0.01,
      tpot_p99_s: 0.02,
      session_completion_mean_s: 4,
      session_completion_p99_s: 9,
      session_wait_mean_s: 0.5,
      session_wait_p99_s: 2,
      session_wait_max_s: 2.5,
      completed: 10,
      refused_share: 0,
      rejected: { queue_full: 2 },
    };
    const lines = renderTable([row, { ...row, policy: "rr", rejected: {} }]).split("\n");
    assert.equal(lines.length, 3);
    assert.match(lines[1]!, /queue_full:2$/);
    assert.equal(lines[1]!.indexOf("12.5"), lines[2]!.indexOf("12.5"));
  });
});
