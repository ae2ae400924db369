/**
 * @module Overload soak, part of `npm run test:reliability` (not `npm test`): the embedded fleet at
 * 1.5 × its sustainable load for 60 s of real time (`SOAK_TEST_SECONDS` to change). Asserts
 * correctness — every refusal a docs/http-api.md envelope, no errors, nothing held afterwards, bounded heap —
 * and nothing that depends on how fast the machine is: SLO attainment and event-loop lag measure the
 * machine as much as sluice, so they are reported (test diagnostics and
 * `test/artifacts/reliability.json`), never asserted. docs/reliability.md has the figures of record.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { formatSoakTable, runSoakBench } from "../../../bench/soak.js";
import { recordFigures } from "../helpers.js";

const SECONDS = Number(process.env.SOAK_TEST_SECONDS ?? "60");

test(`${SECONDS} s at 1.5 × the sustainable load: no errors, refusals well-formed, nothing leaks`, async (t) => {
  const result = await runSoakBench({ seconds: SECONDS, loadFactor: 1.5 });
  await recordFigures("soak", result);
  const table = formatSoakTable(result);
  if (process.env.SOAK_PRINT) process.stderr.write(`${table}\n`);
  t.diagnostic(
    `SLO attainment ${result.sloAttainment}, event-loop lag p99 ${result.eventLoopLagP99} ms, heap growth ${result.heapGrowthMiB} MiB`,
  );

  assert.equal(result.errors, 0, `errors under overload: ${result.errorSamples.join("; ")}\n${table}`);
  assert.equal(result.malformedRefusals, 0, `refusals without a docs/http-api.md envelope\n${table}`);
  assert.ok(result.admitted > 0, table);
  // Above capacity for certain (the rate is an upper bound of what the fleet can serve): something is refused.
  const refused = Object.values(result.refused).reduce((a, b) => a + b, 0);
  assert.ok(refused > 0, `1.5 × load refused nothing: the sustainable rate is wrong\n${table}`);
  for (const key of Object.keys(result.refused)) {
    assert.match(
      key,
      /^(429 (queue_full|queue_timeout|token_budget_exhausted|deadline_infeasible|session_queue_full)|529 worker_overloaded|503 unavailable)$/,
      table,
    );
  }
  assert.deepEqual(
    result.leftover,
    { permits: 0, reservations: 0, windowSlots: 0, queued: 0, trackedCalls: 0 },
    table,
  );
  // Memory does not depend on the machine's speed; a generous bound catches a leak.
  assert.ok(result.heapGrowthMiB < 256, `heap grew ${result.heapGrowthMiB} MiB\n${table}`);
});
