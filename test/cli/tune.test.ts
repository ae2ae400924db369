/** @module `sluice tune`: Little's law over two gate scrapes, from fixture files and from a live server. */

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { startServer } from "../../adapters/cli/serve.js";
import { formatReport, littleLaw, type TuneRow } from "../../adapters/cli/tune.js";

const SLUICE = fileURLToPath(new URL("../../adapters/cli/sluice.js", import.meta.url));

const BEFORE = `# HELP sluice_gate_engine_request_waiting_count Calls admitted and before their first token.
# TYPE sluice_gate_engine_request_waiting_count gauge
sluice_gate_engine_request_waiting_count{worker="sim-0",dp_rank="0"} 3
sluice_gate_engine_request_waiting_count{worker="sim-0",dp_rank="1"} 5
sluice_gate_engine_request_waiting_count{worker="sim-1",dp_rank="unspecified"} 0
# TYPE sluice_gate_request_queue_count gauge
sluice_gate_request_queue_count{worker="sim-0",dp_rank="0"} 0
sluice_gate_request_queue_count{worker="sim-0",dp_rank="1"} 2
sluice_gate_request_queue_count{worker="sim-1",dp_rank="unspecified"} 0
# TYPE sluice_gate_request_admit_total counter
sluice_gate_request_admit_total{worker="sim-0",dp_rank="0",source="direct"} 100
sluice_gate_request_admit_total{worker="sim-0",dp_rank="0",source="queue"} 0
sluice_gate_request_admit_total{worker="sim-0",dp_rank="1",source="direct"} 200
sluice_gate_request_admit_total{worker="sim-0",dp_rank="1",source="queue"} 10
sluice_gate_request_admit_total{worker="sim-1",dp_rank="unspecified",source="direct"} 0
# TYPE sluice_gate_rejection_total counter
sluice_gate_rejection_total{worker="sim-0",dp_rank="1",scope="rank"} 0
# TYPE sluice_gate_cancellation_total counter
sluice_gate_cancellation_total{worker="sim-0",dp_rank="1"} 4
# TYPE sluice_gate_limit gauge
sluice_gate_limit{worker="sim-0",kind="engine_request_waiting"} 256
sluice_gate_limit{worker="sim-1",kind="engine_request_waiting"} 256
`;

const AFTER = `sluice_gate_engine_request_waiting_count{worker="sim-0",dp_rank="0"} 5
sluice_gate_engine_request_waiting_count{worker="sim-0",dp_rank="1"} 7
sluice_gate_engine_request_waiting_count{worker="sim-1",dp_rank="unspecified"} 1
sluice_gate_request_queue_count{worker="sim-0",dp_rank="0"} 0
sluice_gate_request_queue_count{worker="sim-0",dp_rank="1"} 1
sluice_gate_request_queue_count{worker="sim-1",dp_rank="unspecified"} 0
sluice_gate_request_admit_total{worker="sim-0",dp_rank="0",source="direct"} 150
sluice_gate_request_admit_total{worker="sim-0",dp_rank="0",source="queue"} 0
sluice_gate_request_admit_total{worker="sim-0",dp_rank="1",source="direct"} 260
sluice_gate_request_admit_total{worker="sim-0",dp_rank="1",source="queue"} 15
sluice_gate_request_admit_total{worker="sim-1",dp_rank="unspecified",source="direct"} 20
sluice_gate_rejection_total{worker="sim-0",dp_rank="1",scope="rank"} 2
sluice_gate_cancellation_total{worker="sim-0",dp_rank="1"} 5
sluice_gate_limit{worker="sim-0",kind="engine_request_waiting"} 256
sluice_gate_limit{worker="sim-1",kind="engine_request_waiting"} 256
`;

function row(rows: TuneRow[], worker: string, dpRank: string): TuneRow {
  const found = rows.find((r) => r.worker === worker && r.dpRank === dpRank);
  assert.ok(found, `no row for ${worker}/${dpRank}`);
  return found;
}

test("L, C, W and the suggested waiting limit per worker and rank", () => {
  const report = littleLaw(BEFORE, AFTER, 10);
  const quiet = row(report.rows, "sim-0", "0");
  assert.equal(quiet.waiting, 4);
  assert.equal(quiet.admitRatePerS, 5);
  assert.equal(quiet.waitSeconds, 0.8);
  assert.equal(quiet.suggestedWaitingLimit, 4);
  assert.equal(quiet.currentWaitingLimit, 256);
  assert.deepEqual(quiet.warnings, []);

  const busy = row(report.rows, "sim-0", "1");
  assert.equal(busy.waiting, 6);
  assert.equal(busy.admitRatePerS, 6.5);
  assert.ok(Math.abs(busy.waitSeconds! - 6 / 6.5) < 1e-12);
  assert.equal(busy.suggestedWaitingLimit, 6);
  assert.equal(busy.queued, 1.5);
  assert.equal(busy.warnings.length, 3, busy.warnings.join(" | "));
  assert.match(busy.warnings.join("\n"), /queued/);
  assert.match(busy.warnings.join("\n"), /2 rejection/);
  assert.match(busy.warnings.join("\n"), /1 cancellation/);

  const unranked = row(report.rows, "sim-1", "unspecified");
  assert.equal(unranked.waiting, 0.5);
  assert.equal(unranked.admitRatePerS, 2);
  assert.equal(unranked.waitSeconds, 0.25);
  assert.equal(unranked.suggestedWaitingLimit, 1);

  const total = row(report.rows, "sim-0", "all");
  assert.equal(total.waiting, 10);
  assert.equal(total.admitRatePerS, 11.5);
  assert.ok(!report.rows.some((r) => r.worker === "sim-1" && r.dpRank === "all"), "one rank needs no total");

  assert.ok(report.notes.some((n) => /mean, not a tail bound/.test(n)));
  assert.ok(report.notes.some((n) => /two scrapes/.test(n)));
  const text = formatReport(report);
  assert.match(text, /sim-0\s+1\s+6\.00/);
  assert.match(text, /warning: sim-0 rank 1:/);
});

test("a counter that went down is reported, never turned into a negative rate", () => {
  const restarted = AFTER.replace('dp_rank="0",source="direct"} 150', 'dp_rank="0",source="direct"} 7');
  const report = littleLaw(BEFORE, restarted, 10);
  const r = row(report.rows, "sim-0", "0");
  assert.ok(r.admitRatePerS >= 0);
  assert.match(r.warnings.join("\n"), /went down/);
  assert.throws(() => littleLaw(BEFORE, AFTER, 0), /positive number of seconds, got 0/);
});

test("the command reads two fixture scrapes and prints the report (text and JSON)", () => {
  const dir = mkdtempSync(join(tmpdir(), "sluice-tune-"));
  writeFileSync(join(dir, "before.prom"), BEFORE);
  writeFileSync(join(dir, "after.prom"), AFTER);
  const args = [
    "tune",
    "--before",
    join(dir, "before.prom"),
    "--after",
    join(dir, "after.prom"),
    "--interval-s",
    "10",
  ];
  const json = spawnSync(process.execPath, [SLUICE, ...args, "--json"], { encoding: "utf8" });
  assert.equal(json.status, 0, json.stderr);
  const report = JSON.parse(json.stdout);
  assert.equal(row(report.rows, "sim-0", "1").suggestedWaitingLimit, 6);
  const text = spawnSync(process.execPath, [SLUICE, ...args], { encoding: "utf8" });
  assert.equal(text.status, 0, text.stderr);
  assert.match(text.stdout, /L waiting/);
  assert.match(text.stdout, /suggested/);
  const missing = spawnSync(process.execPath, [SLUICE, "tune", "--before", join(dir, "before.prom")], {
    encoding: "utf8",
  });
  assert.equal(missing.status, 2);
  const badInterval = spawnSync(process.execPath, [SLUICE, ...args.slice(0, -1), "soon"], {
    encoding: "utf8",
  });
  assert.equal(badInterval.status, 2);
  assert.match(badInterval.stderr, /--interval-s takes a positive number, got "soon"/);
});

test("--url scrapes a live sluice twice and measures the load it saw", async () => {
  const server = await startServer({
    port: 0,
    host: "127.0.0.1",
    simReplicas: 1,
    simPreset: { base: "h100-llama3-8b", c0: 3 },
    log: () => {},
  });
  let running = true;
  const load = Array.from({ length: 4 }, async (_, i) => {
    while (running) {
      const response = await fetch(`${server.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          messages: [{ role: "user", content: `question ${i} ${"context ".repeat(200)}` }],
          max_tokens: 8,
        }),
      });
      await response.text();
    }
  });
  const child = spawn(
    process.execPath,
    [SLUICE, "tune", "--url", server.url, "--interval-s", "1", "--json"],
    {
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk: Buffer) => {
    stdout += chunk.toString();
  });
  child.stderr.on("data", (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  running = false;
  await Promise.all(load);
  await server.close();
  assert.equal(code, 0, stderr);
  assert.match(stderr, /first scrape done/);
  const report = JSON.parse(stdout);
  const r = row(report.rows, "sim-0", "unspecified");
  assert.ok(r.admitRatePerS > 0, "calls were admitted during the interval");
  assert.ok(r.waitSeconds !== null && r.waitSeconds >= 0);
  assert.ok(r.suggestedWaitingLimit >= 1);
  assert.equal(r.currentWaitingLimit, 256, "the simulated replica reports max_num_seqs 256");
});
