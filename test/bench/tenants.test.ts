import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { simFleet } from "../../adapters/bench/fleet.js";
import type { BenchOutput, TenantStats } from "../../adapters/bench/run.js";
import { runBench, runPolicy } from "../../adapters/bench/run.js";
import { tenantCells } from "../../adapters/bench/tenant-report.js";
import { jainIndex, tenantTracker } from "../../adapters/bench/tenant-stats.js";
import { compileWorkload, NAMED_WORKLOADS, withSeed } from "../../adapters/bench/workloads/index.js";
import type { TenantsSpec } from "../../adapters/bench/workloads/schema.js";
import { parseWorkloadSpec, WorkloadError } from "../../adapters/bench/workloads/schema.js";
import { onlyTenants } from "../../adapters/bench/workloads/tenants.js";
import type { PlannedCall, Workload } from "../../adapters/bench/workloads/types.js";
import { benchOutputSchema } from "../../bench/output-schema.js";
import {
  SLUICE_FAIRNESS_OFF,
  targetsOf,
  tenantsBandsChecks,
  tenantsNoisyChecks,
  tenantsSizesChecks,
  tenantsWeightedChecks,
} from "../../bench/regret.js";
import { renderResultsDoc } from "../../bench/results-doc.js";
import { VirtualClock } from "../../src/clock.js";
import type { SessionView } from "../../src/types.js";

/** The example of docs/benchmarks.md's `kind: "tenants"`. */
const EXAMPLE = {
  kind: "tenants",
  tenants: { A: { weight: 1 }, B: { weight: 1, band: "standard" } },
  parts: [
    { tenant: "A", start_s: 0, workload: { kind: "agents", sessions: 64 } },
    { tenant: "B", start_s: 60, workload: { kind: "agents", sessions: 4, seed: 2 } },
  ],
};

function throwsNaming(value: unknown, ...fragments: string[]): void {
  assert.throws(
    () => parseWorkloadSpec(value, "t.json"),
    (error: unknown) =>
      error instanceof WorkloadError &&
      fragments.every((f) => error.message.includes(f)) &&
      error.message.includes("t.json"),
  );
}

describe("tenants workload files", () => {
  it("parse the documented example, with the defaults of each tenant and part", () => {
    const spec = parseWorkloadSpec(structuredClone(EXAMPLE)) as TenantsSpec;
    assert.equal(spec.kind, "tenants");
    assert.deepEqual(spec.tenants.A, { weight: 1, band: "standard" });
    assert.equal(spec.parts[1]!.start_s, 60);
    assert.equal(spec.parts[1]!.workload.kind, "agents");
    if (spec.parts[0]!.workload.kind === "agents") assert.equal(spec.parts[0]!.workload.steps[0], 20);
    const withBands = parseWorkloadSpec({
      ...EXAMPLE,
      tenants: { A: { band: "sheddable", max_share: 0.5 }, B: { band: "protected", weight: 3 } },
    }) as TenantsSpec;
    assert.deepEqual(withBands.tenants.A, { weight: 1, band: "sheddable", max_share: 0.5 });
  });

  it("name the field of every mistake, nested ones included", () => {
    throwsNaming({ ...EXAMPLE, extra: 1 }, 'unknown field "extra"');
    throwsNaming(
      { ...EXAMPLE, parts: [{ tenant: "A", workload: { kind: "agents", sesions: 3 } }] },
      'unknown field "parts[0].workload.sesions"',
    );
    throwsNaming(
      { ...EXAMPLE, parts: [{ tenant: "C", workload: { kind: "agents" } }] },
      '"parts[0].tenant"',
      "A, B",
    );
    throwsNaming({ ...EXAMPLE, tenants: { A: { weight: 0 } } }, '"tenants.A.weight"');
    throwsNaming({ ...EXAMPLE, tenants: { A: { band: "gold" } } }, '"tenants.A.band"');
    throwsNaming({ ...EXAMPLE, tenants: { A: { max_share: 1.5 } } }, '"tenants.A.max_share"');
    throwsNaming({ ...EXAMPLE, tenants: {} }, '"tenants"');
    throwsNaming({ ...EXAMPLE, parts: [] }, '"parts"');
    throwsNaming(
      { ...EXAMPLE, parts: [{ tenant: "A", start_s: -1, workload: { kind: "agents" } }] },
      '"parts[0].start_s"',
    );
    // A part is any other kind: tenants do not nest.
    throwsNaming(
      { ...EXAMPLE, parts: [{ tenant: "A", workload: structuredClone(EXAMPLE) }] },
      '"parts[0].workload.kind"',
    );
    throwsNaming({ kind: "tenant" }, '"kind"', "tenants");
  });

  it("compile each part shifted by its start, tagged with its tenant, ids and dependencies intact", () => {
    const spec = parseWorkloadSpec({
      kind: "tenants",
      tenants: { A: {}, B: { weight: 2 } },
      parts: [
        { tenant: "A", workload: { kind: "agents", sessions: 2, steps: [3, 3], seed: 1 } },
        { tenant: "B", start_s: 10, workload: { kind: "agents", sessions: 1, steps: [2, 2], seed: 2 } },
        { tenant: "B", start_s: 20, workload: { kind: "agents", sessions: 1, steps: [2, 2], seed: 3 } },
      ],
    });
    const workload = compileWorkload(spec, { name: "t", load: 1 });
    assert.equal(workload.kind, "tenants");
    assert.deepEqual(workload.tenants, {
      A: { weight: 1, band: "standard" },
      B: { weight: 2, band: "standard" },
    });
    assert.equal(workload.calls.length, 2 * 3 + 2 + 2);
    workload.calls.forEach((call, i) => {
      assert.equal(call.index, i);
      if (call.after !== undefined) {
        assert.ok(call.after < i);
        assert.equal(
          workload.calls[call.after]!.sessionId,
          call.sessionId,
          "a dependency stays in its session",
        );
      }
    });
    const b = workload.calls.filter((c) => c.tenant === "B");
    assert.equal(b.length, 4);
    assert.deepEqual(
      [...new Set(b.map((c) => c.arrivalMs))].sort((x, y) => x - y),
      [10_000, 20_000],
    );
    assert.ok(workload.calls.filter((c) => c.tenant === "A").every((c) => c.arrivalMs === 0));
    const sessions = new Set(workload.calls.map((c) => c.sessionId));
    assert.equal(sessions.size, 4, "the two B parts do not share session keys");
    assert.equal(new Set(workload.calls.map((c) => c.id)).size, workload.calls.length);
    assert.ok(workload.calls.every((c) => c.group.startsWith(`${c.tenant}/`)));
    // The same calls, tenant by tenant, as each part alone.
    const alone = compileWorkload(onlyTenants(spec as TenantsSpec, ["B"]), { name: "t", load: 1 });
    assert.deepEqual(
      alone.calls.map((c) => [c.id, c.arrivalMs, c.promptTokens]),
      b.map((c) => [c.id, c.arrivalMs, c.promptTokens]),
    );
    assert.deepEqual(alone.calls[0]!.newTokens(), b[0]!.newTokens());
    // A seed shifts every part alike; seed 1 is the file's own.
    const reseeded = withSeed(spec, 5) as TenantsSpec;
    assert.deepEqual(
      reseeded.parts.map((p) => (p.workload.kind === "agents" ? p.workload.seed : -1)),
      [5, 6, 7],
    );
    assert.deepEqual(withSeed(spec, 1), spec);
  });

  it("built-ins are tenants workloads of the issue's shapes", () => {
    const fleet = {
      replicas: 1,
      model: { c0: 7, cPrefill: 0.022, cDec: 0.015, cKv: 4.9e-5, cPfattn: 1.3e-6 },
    };
    for (const name of ["tenants-noisy", "tenants-weighted", "tenants-bands", "tenants-sizes"]) {
      const named = NAMED_WORKLOADS[name]!;
      const spec = named.spec(fleet as never);
      assert.equal(spec.kind, "tenants", name);
      for (const tenant of named.alone ?? []) assert.ok(Object.hasOwn((spec as TenantsSpec).tenants, tenant));
    }
    const weighted = NAMED_WORKLOADS["tenants-weighted"]!.spec(fleet as never) as TenantsSpec;
    assert.deepEqual(
      Object.values(weighted.tenants).map((t) => t.weight),
      [1, 2, 3, 4],
    );
    const bands = NAMED_WORKLOADS["tenants-bands"]!.spec(fleet as never) as TenantsSpec;
    assert.deepEqual(
      Object.values(bands.tenants).map((t) => t.band),
      ["sheddable", "protected"],
    );
  });
});

describe("Jain's index", () => {
  it("is 1 for equal values, 1/n when one value holds everything, and (Σx)²/(nΣx²) between", () => {
    assert.equal(jainIndex([0.25, 0.25, 0.25, 0.25]), 1);
    assert.equal(jainIndex([1, 0, 0, 0]), 0.25);
    assert.ok(Math.abs(jainIndex([1, 2, 3]) - 36 / 42) < 1e-12);
    assert.equal(jainIndex([]), 1);
    assert.equal(jainIndex([0, 0]), 1);
  });
});

/** A planned call of a tenant, for the tracker (only the fields it reads matter). */
function call(index: number, tenant: string, sessionId: string): PlannedCall {
  return {
    index,
    id: `${sessionId}-k${index}`,
    sessionId,
    arrivalMs: 0,
    gapMs: 0,
    extendsAfter: false,
    newTokens: () => [],
    promptTokens: 100,
    cachedAtBest: 0,
    maxTokens: 50,
    slo: { ttftS: 5, tpotS: 0.1 },
    retry: true,
    group: `${tenant}/agents`,
    tenant,
  };
}

function view(id: string, state: SessionView["state"], footprint: number): SessionView {
  return {
    id,
    state,
    replica: "r0",
    steps: 1,
    tokens: footprint,
    phase: state === "active" ? "active" : state === "paused" ? "paused" : "waiting",
    footprint_tokens: footprint,
    retention_ms: 0,
  };
}

describe("the tenant tracker", () => {
  it("shares service only while two or more tenants wait, and times first admissions and pauses", () => {
    const clock = new VirtualClock();
    const calls = [call(0, "A", "a1"), call(1, "A", "a2"), call(2, "B", "b1")];
    const workload: Workload = {
      kind: "tenants",
      name: "t",
      load: 1,
      calls,
      sharedPrefills: [],
      describe: "",
      tenants: { A: { weight: 1, band: "standard" }, B: { weight: 3, band: "protected" } },
    };
    const views = new Map<string, SessionView>();
    let onSession:
      | ((e: { id: string; event: string; replica: string | null; reason?: string }) => void)
      | undefined;
    const tracker = tenantTracker(
      workload,
      {
        getSession: (id) => views.get(id),
        addEvents: (events) => {
          onSession = events.session;
        },
      },
      clock,
    );
    // t = 0: a1 admitted (holds 3,000), a2 and b1 wait: contended.
    tracker.waiting(calls[0]!, 100);
    tracker.waiting(calls[1]!, 100);
    tracker.waiting(calls[2]!, 100);
    tracker.admitted(calls[0]!);
    views.set("a1", view("a1", "active", 3000));
    views.set("a2", view("a2", "waiting", 0));
    views.set("b1", view("b1", "waiting", 0));
    tracker.sample(1000);
    clock.advance(1000);
    // t = 1 s: b1 admitted to a window (the event comes before its call is released), holds 1,000.
    onSession?.({ id: "b1", event: "admitted", replica: "r0" });
    clock.advance(500);
    tracker.admitted(calls[2]!);
    views.set("b1", view("b1", "active", 1000));
    tracker.sample(1000);
    clock.advance(1000);
    // t = 2.5 s: a1 paused (for b1's band) and waits again with a2: A alone waits, not contended.
    onSession?.({ id: "a1", event: "paused", replica: "r0", reason: "priority" });
    views.set("a1", view("a1", "paused", 3000));
    tracker.sample(1000);
    clock.advance(1000);
    tracker.refused(calls[1]!, "token_budget_exhausted");
    tracker.settled(calls[0]!, 400);
    tracker.settled(calls[2]!, 200);
    tracker.closed("a1");
    tracker.closed("b1");
    const records = calls.map((c) => ({
      readyAt: 0,
      firstTokenAt: c.index === 1 ? undefined : 2000,
      endAt: 3000 + c.index * 1000,
      tokens: 50,
      waitMs: 0,
      outcome: c.index === 1 ? ("refused" as const) : ("ok" as const),
    }));
    const { tenants, fairness } = tracker.results(records, "tenants");
    const a = tenants.A!;
    const b = tenants.B!;
    // Contended: only the first second, A holding 3,000 tokens and B none.
    assert.equal(fairness.contended_s, 1);
    assert.equal(a.service_token_s, 3000);
    assert.equal(a.service_share, 1);
    assert.equal(b.service_share, 0);
    assert.deepEqual(fairness.tenants, ["A", "B"]);
    assert.equal(fairness.jain, 0.5);
    assert.equal(fairness.share_over_weight_max_over_min, null, "B got nothing while it waited");
    assert.equal(fairness.mode, "tenants");
    // The whole run: A 3,000 × 2 s (nothing while paused), B 1,000 × 2 s.
    assert.equal(a.service_share_run, 0.75);
    assert.equal(a.token_share, round4(400 / 600));
    // First admission: a1 at 0 (a2 never), b1 at the window event, 1 s.
    assert.equal(a.never_admitted, 1);
    assert.equal(a.first_admission_wait_max_s, 0);
    assert.equal(b.first_admission_wait_p99_s, 1);
    assert.equal(a.pauses, 1);
    assert.deepEqual(a.pauses_by_reason, { priority: 1 });
    assert.equal(b.pauses, 0);
    assert.deepEqual(a.rejected, { token_budget_exhausted: 1 });
    assert.equal(a.sessions, 2);
    assert.equal(a.completed, 1);
    assert.equal(b.completed, 1);
    assert.equal(b.session_completion_mean_s, 5);
    assert.equal(b.weight, 3);
    assert.equal(b.band, "protected");
  });
});

function round4(x: number): number {
  return Math.round(x * 10_000) / 10_000;
}

/** Two tenants on one small replica: a crowd at 0 s and one late session. */
const TINY = parseWorkloadSpec({
  kind: "tenants",
  tenants: { crowd: { weight: 1 }, late: { weight: 1 } },
  parts: [
    {
      tenant: "crowd",
      workload: {
        kind: "agents",
        sessions: 12,
        steps: [3, 3],
        system_prompt_tokens: 500,
        tool_output_tokens: [2000, 4000],
        output_tokens: [50, 100],
        tool_wait_s: [0.5, 1],
        seed: 1,
      },
    },
    {
      tenant: "late",
      start_s: 2,
      workload: {
        kind: "agents",
        sessions: 2,
        steps: [3, 3],
        system_prompt_tokens: 500,
        tool_output_tokens: [2000, 4000],
        output_tokens: [50, 100],
        tool_wait_s: [0.5, 1],
        seed: 2,
      },
    },
  ],
}) as TenantsSpec;

// A replica with little KV, so the crowd fills sluice's window and the late tenant waits.
const FLEET = simFleet({ base: "h100-llama3-8b", kvCapacityTokens: 40_000 }, "small");

describe("per-tenant results of a run", () => {
  it("carry every tenant's numbers, leak nothing, and match the document's schema", async () => {
    const workload = compileWorkload(TINY, { name: "tiny", load: 1 });
    for (const policy of ["rr", "sluice"] as const) {
      const run = await runPolicy({ workload, policy, replicas: 1, fleet: FLEET });
      assert.deepEqual(run.errors, [], policy);
      assert.equal(run.unfinished, 0, policy);
      assert.deepEqual(run.idle, { permits: 0, reservations: 0, windowSlots: 0, queued: 0 }, policy);
      const tenants = run.row.tenants!;
      assert.deepEqual(Object.keys(tenants), ["crowd", "late"]);
      assert.equal(tenants.crowd!.sessions, 12);
      assert.equal(tenants.late!.sessions, 2);
      assert.equal(tenants.crowd!.completed + tenants.late!.completed, run.sessionCompletionS.length);
      assert.ok(Math.abs(tenants.crowd!.token_share + tenants.late!.token_share - 1) < 1e-3);
      for (const t of Object.values(tenants)) {
        assert.ok(t.first_admission_wait_p99_s >= t.first_admission_wait_p50_s);
        assert.ok(t.ttft_p99_s >= t.ttft_p50_s && t.ttft_p50_s > 0);
        assert.ok(t.session_completion_mean_s > 0);
      }
      const fairness = run.row.fairness!;
      if (fairness.contended_s > 0)
        assert.ok(Math.abs(tenants.crowd!.service_share + tenants.late!.service_share - 1) < 1e-3);
      assert.ok(fairness.jain > 0 && fairness.jain <= 1);
      if (policy === "sluice") {
        // The crowd fills the window: the late tenant waits, and so do crowd sessions, so the shares count.
        assert.ok(fairness.contended_s > 0, "two tenants waited at once under sluice");
        assert.ok(tenants.late!.first_admission_wait_p99_s > 0);
      }
    }
  });

  it("run side by side with fairness off and alone, as one document the verdicts read", async () => {
    const report = await runBench({
      name: "tenants-noisy",
      compile: (load) => compileWorkload(TINY, { name: "tiny", load }),
      loads: [1],
      policies: ["rr", "sluice"],
      replicas: 1,
      fleet: FLEET,
      fairness: ["tenants", "off"],
      alone: [
        {
          tenant: "late",
          compile: (load) => compileWorkload(onlyTenants(TINY, ["late"]), { name: "tiny", load }),
        },
      ],
    });
    assert.deepEqual(report.problems, []);
    assert.deepEqual(
      report.output.results.map((r) => r.policy),
      ["rr", "sluice", SLUICE_FAIRNESS_OFF, "bound"],
    );
    assert.equal(report.output.results.find((r) => r.policy === SLUICE_FAIRNESS_OFF)!.fairness?.mode, "off");
    assert.deepEqual(
      report.output.alone!.map((a) => [a.policy, a.tenant, a.stats.sessions]),
      [
        ["rr", "late", 2],
        ["sluice", "late", 2],
      ],
    );
    const parsed = benchOutputSchema.safeParse(JSON.parse(JSON.stringify(report.output)));
    assert.ok(parsed.success, JSON.stringify(parsed.error?.issues.slice(0, 3)));
    const checks = tenantsNoisyChecks(report.output);
    assert.deepEqual(
      checks.map((c) => c.target),
      [
        "late's first admission p99 after it arrives, s",
        "late's mean session completion ÷ late alone",
        "sluice makespan ÷ fairness off",
        "sluice hit rate − fairness off's, absolute",
      ],
    );
    const cells = tenantCells(report.output);
    assert.equal(cells.length, 1 + 3 * 2 + 2, "a header, two tenants per run, each alone run");
    assert.ok(cells.some((row) => row[0] === "sluice (late alone)"));
    const doc = renderResultsDoc({ docs: [report.output] });
    assert.match(doc, /## tenants-noisy/);
    assert.match(doc, /\| sluice \(fairness off\) \| 1 \| crowd \|/);
  });
});

/** A document with one sluice row whose tenants are given. */
function docWith(
  workload: string,
  tenants: Record<string, Partial<TenantStats>>,
  extra: Partial<BenchOutput> = {},
) {
  const full = (t: Partial<TenantStats>): TenantStats => ({
    weight: 1,
    band: "standard",
    sessions: 4,
    completed: 4,
    session_completion_mean_s: 100,
    session_completion_p99_s: 120,
    ttft_p50_s: 0.1,
    ttft_p99_s: 0.3,
    first_admission_wait_p50_s: 0,
    first_admission_wait_p99_s: 0,
    first_admission_wait_max_s: 0,
    never_admitted: 0,
    service_share: 0.5,
    service_token_s: 1000,
    service_share_run: 0.5,
    token_share: 0.5,
    pauses: 0,
    pauses_by_reason: {},
    rejected: {},
    ...t,
  });
  const stats = Object.fromEntries(Object.entries(tenants).map(([k, v]) => [k, full(v)]));
  const row = {
    policy: "sluice",
    load: 1,
    makespan_s: 100,
    goodput_rps: 1,
    slo_attainment: 1,
    prefix_hit_rate: 0.9,
    ttft_p99_s: 1,
    completed: 10,
    tenants: stats,
    fairness: {
      jain: 0.97,
      share_over_weight_max_over_min: 1.15,
      contended_s: 50,
      tenants: Object.keys(stats),
    },
  };
  return { workload, replicas: 1, preset: "p", results: [row], ...extra } as never;
}

describe("the tenants targets", () => {
  it("weighted: max ÷ min of share ÷ weight and Jain's index, met and missed at their bounds", () => {
    const met = tenantsWeightedChecks(docWith("tenants-weighted", { a: {}, b: {} }));
    assert.deepEqual(
      met.map((c) => [c.measured, c.met]),
      [
        [1.15, true],
        [0.97, true],
      ],
    );
    const doc = docWith("tenants-weighted", { a: {} }) as { results: { fairness: object }[] };
    doc.results[0]!.fairness = {
      jain: 0.9,
      share_over_weight_max_over_min: null,
      contended_s: 1,
      tenants: [],
    };
    assert.deepEqual(
      tenantsWeightedChecks(doc as never).map((c) => c.met),
      [false, false],
    );
  });

  it("bands: the protected tenant's admission, completion against alone, and pauses", () => {
    const alone = [
      { policy: "sluice", load: 1, tenant: "ops", stats: { session_completion_mean_s: 80 } as TenantStats },
    ];
    const checks = tenantsBandsChecks(
      docWith(
        "tenants-bands",
        {
          batch: { band: "sheddable" },
          ops: { band: "protected", first_admission_wait_max_s: 6, pauses: 2 },
        },
        { alone },
      ),
    );
    assert.deepEqual(
      checks.map((c) => [c.target, c.measured, c.met]),
      [
        ["protected ops: longest first admission wait, s", 6, false],
        ["protected ops: mean session completion ÷ alone", 1.25, true],
        ["protected ops: pauses", 2, false],
      ],
    );
  });

  it("sizes: large calls completed, none refused for the budget, share within 20 % of fair", () => {
    const checks = tenantsSizesChecks(
      docWith("tenants-sizes", {
        large: { sessions: 16, completed: 15, service_share: 0.39, rejected: { token_budget_exhausted: 3 } },
        small: { service_share: 0.61 },
      }),
    );
    assert.deepEqual(
      checks.map((c) => [c.measured, c.met]),
      [
        [0.938, false],
        [3, false],
        [0.78, false],
      ],
    );
    const ok = tenantsSizesChecks(docWith("tenants-sizes", { large: { service_share: 0.41 }, small: {} }));
    assert.ok(ok.every((c) => c.met));
    // The checks are reached through the workload's name.
    assert.ok(
      targetsOf(docWith("tenants-sizes", { large: {}, small: {} })).some((c) =>
        c.target.startsWith("large calls"),
      ),
    );
  });
});
