/**
 * @module The whole scheduler at fleet scale, in virtual time: 256 simulated replicas and 20,000
 * agent sessions arriving as a Poisson stream, under the `sluice` policy. Reports the process CPU
 * the run took against the virtual time it simulated — an upper bound on the scheduler's share,
 * since the simulated replicas and the workload driver run in the same process — with the heap
 * after the run and the calls per CPU second.
 *
 * Run: `npx tsx bench/fleet-scale.ts [--replicas N] [--sessions N]`; writes
 * bench/results/fleet-scale.json.
 */

import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { simFleet } from "../adapters/bench/fleet.js";
import { runPolicy } from "../adapters/bench/run.js";
import { compileWorkload } from "../adapters/bench/workloads/index.js";
import { parseWorkloadSpec } from "../adapters/bench/workloads/schema.js";

const { values } = parseArgs({
  options: { replicas: { type: "string" }, sessions: { type: "string" }, quiet: { type: "boolean" } },
});
const replicas = Number(values.replicas ?? 256);
const sessions = Number(values.sessions ?? 20_000);

/**
 * Agents of ten steps with small contexts (a 500-token system prompt, tool outputs of 100–300):
 * the point is the number of sessions and replicas the scheduler juggles, not KV pressure.
 * Arrivals are spread so that about 2,000 sessions are live at once.
 */
const spec = parseWorkloadSpec(
  {
    kind: "agents",
    sessions,
    steps: [10, 10],
    system_prompt_tokens: 500,
    tool_output_tokens: [100, 300],
    output_tokens: [50, 100],
    tool_wait_s: [1, 5],
    arrival: { rate_per_s: sessions / 400 },
    slo: { ttft_s: 5, tpot_s: 0.1 },
    seed: 1,
  },
  "fleet-scale",
);
const workload = compileWorkload(spec, { name: "fleet-scale", load: 1 });

const cpuBefore = process.cpuUsage();
const wallBefore = performance.now();
const run = await runPolicy({
  workload,
  policy: "sluice",
  replicas,
  fleet: simFleet("h100-llama3-8b"),
  sampleEveryMs: 10_000,
  ...(values.quiet ? {} : { onProgress: (line: string) => process.stderr.write(`${line}\n`) }),
});
const cpu = process.cpuUsage(cpuBefore);
const cpuS = (cpu.user + cpu.system) / 1e6;
const wallS = (performance.now() - wallBefore) / 1000;
const virtualS = run.row.makespan_s;
const calls = run.row.completed;
const result = {
  replicas,
  sessions,
  calls,
  virtual_s: virtualS,
  wall_s: Number(wallS.toFixed(2)),
  process_cpu_s: Number(cpuS.toFixed(2)),
  cpu_share_of_simulated_time: Number((cpuS / virtualS).toFixed(4)),
  cpu_us_per_call: Number(((cpuS * 1e6) / Math.max(1, calls)).toFixed(1)),
  heap_mb_after: Number((process.memoryUsage().heapUsed / 2 ** 20).toFixed(1)),
  goal: "process CPU ≤ 5 % of the simulated time (the scheduler's share is below the process's)",
  met: cpuS / virtualS <= 0.05,
};
const out = join(dirname(fileURLToPath(import.meta.url)), "results", "fleet-scale.json");
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, `${JSON.stringify(result, null, 2)}\n`);
process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
