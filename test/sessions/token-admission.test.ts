import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { VirtualClock } from "../../src/clock.js";
import { DEFAULT_SESSIONS } from "../../src/config/defaults.js";
import { resolveSchedulerConfig } from "../../src/config/scheduler-config.js";
import { Refusal } from "../../src/errors.js";
import {
  SessionAdmission,
  type SessionAdmissionOptions,
  type SessionRecord,
  tokenFootprint,
} from "../../src/sessions/session-admission.js";

function setup(
  overrides: Partial<SessionAdmissionOptions> = {},
  windows: Record<string, number> = { r1: 10_000 },
) {
  const clock = new VirtualClock();
  const events: string[] = [];
  const retention: string[] = [];
  const admission = new SessionAdmission({
    clock,
    unit: "tokens",
    queueLimit: 64,
    waitLimitMs: 60_000,
    idleTimeoutMs: 120_000,
    onEvent: (id, event) => events.push(`${id}:${event}`),
    onRetention: (_replica, ms, source) => retention.push(`${source}:${ms}`),
    ...overrides,
  });
  for (const [id, size] of Object.entries(windows)) admission.addReplica(id, size);
  const first = (candidates: readonly string[]) => candidates[0];
  return { clock, admission, events, retention, first };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));
const demand = (promptTokens: number, maxTokens = 0, expectedIdleMs?: number) => ({
  promptTokens,
  maxTokens,
  ...(expectedIdleMs !== undefined ? { expectedIdleMs } : {}),
});

describe("token window admission", () => {
  it("admits sessions while their footprints fit W, and a lone session larger than W", async () => {
    const { admission, first } = setup();
    const a = admission.open("a");
    const b = admission.open("b");
    assert.equal(await admission.acquireStep(a, first, undefined, demand(5_000, 1_000)), "r1");
    assert.equal(admission.replicaCounts("r1").footprintTokens, 6_000);
    let admitted = false;
    const stepB = admission.acquireStep(b, first, undefined, demand(4_500, 500)).then(() => {
      admitted = true;
    });
    await settle();
    assert.equal(admitted, false, "6,000 + 5,000 > 10,000: b waits");
    admission.endStep(a, { completed: true, contextTokens: 5_200 });
    await settle();
    assert.equal(admitted, false, "idle, a keeps its place: context plus expected growth (5,200 + 5,200)");
    admission.close("a");
    await stepB;
    const big = admission.open("big");
    admission.close("b");
    assert.equal(
      await admission.acquireStep(big, first, undefined, demand(50_000, 1_000)),
      "r1",
      "alone, it runs",
    );
    assert.equal(admission.replicaCounts("r1").size, 1);
  });

  it("counts a prompt prefix its sessions share on a replica once (a system prompt), and forgets it with them", async () => {
    const { admission, first } = setup({ blockTokens: 100 });
    const system = Array.from({ length: 20 }, (_, i) => `system-${i}`);
    const blocks = (owner: string, total: number) => [
      ...system,
      ...Array.from({ length: total - system.length }, (_, i) => `${owner}-${i}`),
    ];
    const a = admission.open("a");
    const b = admission.open("b");
    await admission.acquireStep(a, first, undefined, { ...demand(5_000), promptBlocks: blocks("a", 50) });
    const held = () => {
      const counts = admission.replicaCounts("r1");
      return counts.footprintTokens! - counts.sharedPrefixTokens!;
    };
    assert.equal(held(), 5_000);
    // 5,000 + 6,000 > 10,000, but their first 2,000 tokens are the same blocks: 9,000 fits.
    assert.equal(
      await admission.acquireStep(b, first, undefined, { ...demand(6_000), promptBlocks: blocks("b", 60) }),
      "r1",
    );
    assert.deepEqual(
      [admission.replicaCounts("r1").footprintTokens, admission.replicaCounts("r1").sharedPrefixTokens],
      [11_000, 2_000],
      "each footprint whole, the shared blocks counted once besides",
    );
    assert.equal(held(), 9_000);
    // The next step extends b's prompt: only its new blocks are counted, the shared ones stay shared.
    admission.endStep(b, { completed: true, contextTokens: 6_000 });
    await admission.acquireStep(b, first, undefined, { ...demand(7_000), promptBlocks: blocks("b", 70) });
    assert.equal(held(), 5_000 + 7_000 - 2_000);
    admission.endStep(b, { completed: true, contextTokens: 7_000 });
    admission.close("a");
    assert.equal(held(), tokenFootprint(b), "alone, b shares nothing");
    assert.equal(admission.replicaCounts("r1").sharedPrefixTokens, 0);
    admission.close("b");
    assert.equal(admission.replicaCounts("r1").footprintTokens, 0);
    assert.equal(admission.counts().promptBlocks, 0);
    // Without block sizes the prefix counts in every session.
    const plain = setup();
    const c = plain.admission.open("c");
    await plain.admission.acquireStep(c, plain.first, undefined, {
      ...demand(5_000),
      promptBlocks: blocks("c", 50),
    });
    const d = plain.admission.open("d");
    let admitted = false;
    plain.admission
      .acquireStep(d, plain.first, undefined, { ...demand(6_000), promptBlocks: blocks("d", 60) })
      .then(() => {
        admitted = true;
      });
    await settle();
    assert.equal(admitted, false);
    plain.admission.close("c");
    await settle();
    assert.equal(admitted, true);
    plain.admission.close("d");
  });

  it("counts a footprint by its learned growth once a step has grown the context", async () => {
    const { admission, first } = setup({}, { r1: 100_000 });
    const a = admission.open("a");
    await admission.acquireStep(a, first, undefined, demand(2_000, 500));
    admission.endStep(a, { completed: true, contextTokens: 2_400 });
    assert.equal(tokenFootprint(a), 4_800, "first step: its own size stands in for growth");
    await admission.acquireStep(a, first, undefined, demand(3_400, 500));
    assert.equal(tokenFootprint(a), 3_900, "a running step holds at most its prompt plus max_tokens");
    admission.endStep(a, { completed: true, contextTokens: 3_700 });
    assert.equal(tokenFootprint(a), 3_700 + 1_300);
  });

  it("gives retention from the hint, then its own gaps, then the fleet's, bounded by the idle timeout", async () => {
    const { clock, admission, retention, first } = setup({ idleTimeoutMs: 60_000 }, { r1: 100_000 });
    const a = admission.open("a");
    await admission.acquireStep(a, first, undefined, demand(100, 10));
    admission.endStep(a, { completed: true, contextTokens: 110 });
    assert.equal(a.retentionMs, 15_000, "nothing known: a quarter of the idle timeout");
    clock.advance(4_000);
    await admission.acquireStep(a, first, undefined, demand(200, 10, 90_000));
    admission.endStep(a, { completed: true, contextTokens: 210 });
    assert.equal(a.retentionMs, 60_000, "the hint, bounded by the idle timeout");
    clock.advance(2_000);
    await admission.acquireStep(a, first, undefined, demand(300, 10));
    admission.endStep(a, { completed: true, contextTokens: 310 });
    assert.equal(a.retentionMs, 6_000, "its own gaps (4 s and 2 s): a high quantile, with slack");
    const b = admission.open("b");
    await admission.acquireStep(b, first, undefined, demand(100, 10));
    admission.endStep(b, { completed: true, contextTokens: 110 });
    assert.equal(b.retentionMs, 6_000, "a first gap takes the fleet's");
    assert.deepEqual(retention, ["default:15000", "hint:60000", "own:6000", "fleet:6000"]);
  });

  it("takes its retention quantile's default from the configuration's, built without it", async () => {
    const { clock, admission, first } = setup({ idleTimeoutMs: 600_000 }, { r1: 100_000 });
    assert.equal(resolveSchedulerConfig({}).sessions.retentionQuantile, DEFAULT_SESSIONS.retentionQuantile);
    const a = admission.open("a");
    const gaps = [...Array.from({ length: 19 }, () => 1_000), 20_000];
    await admission.acquireStep(a, first, undefined, demand(100, 10));
    admission.endStep(a, { completed: true, contextTokens: 110 });
    for (const gap of gaps) {
      clock.advance(gap);
      await admission.acquireStep(a, first, undefined, demand(100, 10));
      admission.endStep(a, { completed: true, contextTokens: 110 });
    }
    assert.ok(
      a.retentionMs >= 20_000,
      `one long gap in twenty is inside the 0.99 quantile: ${a.retentionMs} ms`,
    );
  });

  it("lets an idle session past its retention go dormant only while others wait, keeping its pin", async () => {
    const { clock, admission, events, first } = setup({}, { r1: 10_000 });
    const a = admission.open("a");
    await admission.acquireStep(a, first, undefined, demand(4_000, 0, 5_000));
    admission.endStep(a, { completed: true, contextTokens: 4_000 });
    clock.advance(30_000);
    admission.sweep();
    assert.equal(a.state, "active", "nobody waits: it keeps its place");
    const b = admission.open("b");
    const stepB = admission.acquireStep(b, first, undefined, demand(6_000, 1_000));
    assert.equal(await stepB, "r1");
    assert.equal(a.state, "dormant");
    assert.equal(a.replica, "r1");
    assert.equal(admission.view(a).state, "paused", "docs/http-api.md shows a dormant session as paused");
    assert.equal(admission.view(a).phase, "dormant");
    assert.ok(events.includes("a:dormant"));
    // Dormant a comes back ahead of a session never admitted.
    const c = admission.open("c");
    const order: string[] = [];
    const stepA = admission.acquireStep(a, first, undefined, demand(4_500, 0)).then(() => order.push("a"));
    const stepC = admission.acquireStep(c, first, undefined, demand(2_000, 0)).then(() => order.push("c"));
    await settle();
    admission.endStep(b, { completed: true, contextTokens: 6_500 });
    admission.close("b");
    await Promise.all([stepA, stepC]);
    assert.deepEqual(order, ["a", "c"]);
  });

  it("counts a session out of the window as retained in host memory while its context fits the room there", async () => {
    const { clock, admission, events, first } = setup({}, { r1: 10_000 });
    // Blocks outlive their last use by 20 s in GPU memory; the host tier has room for 5,000 tokens.
    admission.setCacheRetention("r1", { hostRoomTokens: 5_000, turnoverMs: 20_000 });
    const a = admission.open("a");
    const b = admission.open("b");
    await admission.acquireStep(a, first, undefined, demand(3_000, 0, 60_000));
    admission.endStep(a, { completed: true, contextTokens: 3_000 });
    await admission.acquireStep(b, first, undefined, demand(2_000, 0, 60_000));
    admission.endStep(b, { completed: true, contextTokens: 2_500 });
    clock.advance(1_000);
    admission.sweep();
    assert.equal(a.state, "active", "nobody waits: both keep their places");
    assert.equal(admission.replicaCounts("r1").hostRetainedTokens, 0);
    // c does not fit beside a and b; both are expected back (60 s) after their GPU cache turns over.
    const c = admission.open("c");
    assert.equal(await admission.acquireStep(c, first, undefined, demand(4_000, 0)), "r1");
    assert.equal(a.state, "dormant");
    assert.equal(b.state, "dormant");
    assert.equal(a.retainedInHost, true);
    assert.equal(
      b.retainedInHost,
      false,
      "2,500 more would overflow the 5,000 of host room: b's cache is lost",
    );
    assert.equal(admission.replicaCounts("r1").hostRetainedTokens, 3_000);
    assert.ok(events.includes("a:dormant"));
    // Back, it holds GPU room again and no longer counts in host memory.
    admission.endStep(c, { completed: true, contextTokens: 4_100 });
    admission.close("c");
    await admission.acquireStep(a, first, undefined, demand(3_200, 0, 60_000));
    assert.equal(a.state, "active");
    assert.equal(admission.replicaCounts("r1").hostRetainedTokens, 0);
    // Dormant and retained again, then closed: nothing stays counted.
    admission.endStep(a, { completed: true, contextTokens: 3_300 });
    const d = admission.open("d");
    await admission.acquireStep(d, first, undefined, demand(8_000, 0));
    assert.equal(a.state, "dormant");
    assert.equal(admission.replicaCounts("r1").hostRetainedTokens, 3_300);
    for (const id of ["a", "b", "d"]) admission.close(id);
    assert.equal(admission.replicaCounts("r1").hostRetainedTokens, 0);
    assert.equal(admission.replicaCounts("r1").footprintTokens, 0);
    assert.throws(
      () => admission.setCacheRetention("r1", { hostRoomTokens: -1, turnoverMs: 1 }),
      /host room should be a number of tokens ≥ 0, got -1/,
    );
    assert.throws(
      () => admission.setCacheRetention("r1", { hostRoomTokens: 0, turnoverMs: 0 }),
      /turnoverMs should be a number of ms > 0, got 0/,
    );
  });

  it("lets an idle session go while others wait when it is expected back after its cache has turned over", async () => {
    const { clock, admission, first } = setup({}, { r1: 10_000 });
    // Blocks outlive their last use by 20 s here: a session expected back in 60 s will not find its cache.
    admission.setCacheRetention("r1", { hostRoomTokens: 0, turnoverMs: 20_000 });
    const late = admission.open("late");
    const soon = admission.open("soon");
    await admission.acquireStep(late, first, undefined, demand(4_000, 0, 60_000));
    admission.endStep(late, { completed: true, contextTokens: 4_000 });
    await admission.acquireStep(soon, first, undefined, demand(1_000, 0, 10_000));
    admission.endStep(soon, { completed: true, contextTokens: 1_000 });
    clock.advance(1_000);
    const c = admission.open("c");
    assert.equal(await admission.acquireStep(c, first, undefined, demand(3_000, 0)), "r1");
    assert.equal(late.state, "dormant");
    assert.equal(late.retainedInHost, false);
    assert.equal(soon.state, "active", "back within the turnover: its place keeps its cache");
    for (const id of ["late", "soon", "c"]) admission.close(id);
    assert.equal(admission.replicaCounts("r1").footprintTokens, 0);
  });

  it("keeps retention as it was where the replica has no host tier", async () => {
    const { clock, admission, first } = setup({}, { r1: 10_000 });
    const a = admission.open("a");
    await admission.acquireStep(a, first, undefined, demand(6_000, 0, 60_000));
    admission.endStep(a, { completed: true, contextTokens: 6_000 });
    clock.advance(1_000);
    const b = admission.open("b");
    let admitted = false;
    const stepB = admission.acquireStep(b, first, undefined, demand(5_000, 0)).then(() => {
      admitted = true;
    });
    await settle();
    assert.equal(admitted, false, "within its retention, a keeps its place");
    assert.equal(a.state, "active");
    clock.advance(59_000);
    admission.sweep();
    await stepB;
    assert.equal(a.state, "dormant");
    assert.equal(a.retainedInHost, false);
    for (const id of ["a", "b"]) admission.close(id);
  });

  it("pauses idle sessions past their retention first when W shrinks, never a running step", async () => {
    const { clock, admission, first } = setup({}, { r1: 100_000 });
    const sessions: SessionRecord[] = [];
    for (const [id, idleHint] of [
      ["old", 1_000],
      ["late", 50_000],
      ["soon", 5_000],
      ["busy", 0],
    ] as const) {
      const session = admission.open(id);
      sessions.push(session);
      await admission.acquireStep(session, first, undefined, demand(10_000, 0, idleHint));
      if (id !== "busy") admission.endStep(session, { completed: true, contextTokens: 10_000 });
    }
    clock.advance(2_000);
    // Idle footprints are 20,000 (context plus a first step's size as growth), the running one 10,000.
    admission.setWindow("r1", 50_000, true);
    const state = Object.fromEntries(sessions.map((s) => [s.id, s.state]));
    assert.deepEqual(state, { old: "paused", late: "active", soon: "active", busy: "active" });
    admission.setWindow("r1", 30_000, true);
    assert.equal(admission.get("late")!.state, "paused", "then the one expected back latest");
    admission.setWindow("r1", 5_000, true);
    assert.equal(admission.get("soon")!.state, "paused");
    assert.equal(admission.get("busy")!.state, "active", "a running step is never interrupted");
    assert.equal(admission.get("busy")!.pauseRequested, false, "and a lone session stays");
  });

  it("property: active footprints fit W but for a lone session; every wait ends; counters return to zero", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.record({
            session: fc.integer({ min: 0, max: 7 }),
            op: fc.constantFrom("step", "end", "close", "tick", "shrink", "grow", "abort"),
            size: fc.integer({ min: 100, max: 30_000 }),
            advance: fc.integer({ min: 0, max: 20_000 }),
            // Which history the prompt carries after its shared opening: a step may rewrite it.
            history: fc.integer({ min: 0, max: 1 }),
          }),
          { minLength: 1, maxLength: 60 },
        ),
        async (ops) => {
          const { clock, admission } = setup(
            { waitLimitMs: 30_000, queueLimit: 4, blockTokens: 100 },
            { r1: 40_000, r2: 20_000 },
          );
          // Every prompt opens with the same ten blocks; the rest are its session's own.
          const promptBlocks = (id: string, tokens: number, history: number) =>
            Array.from({ length: Math.floor(tokens / 100) }, (_, i) =>
              i < 10 ? `system-${i}` : `${id}-${history}-${i}`,
            );
          const sizes: Record<string, number> = { r1: 40_000, r2: 20_000 };
          const resize = (id: string, size: number) => {
            sizes[id] = size;
            admission.setWindow(id, size, true);
          };
          const settled: Promise<unknown>[] = [];
          const controllers: AbortController[] = [];
          const placed = (candidates: readonly string[]) => candidates[candidates.length - 1];
          const check = (ids: readonly string[]) => {
            for (const id of ids) {
              const counts = admission.replicaCounts(id);
              if (counts.size !== null && counts.size > 1) {
                assert.ok(
                  counts.footprintTokens! - counts.sharedPrefixTokens! <= counts.sizeTokens!,
                  `${id}: ${counts.footprintTokens} less ${counts.sharedPrefixTokens} shared > W`,
                );
              }
            }
          };
          for (const { session: n, op, size, advance, history } of ops) {
            const id = `s${n}`;
            const session = admission.get(id) ?? admission.open(id);
            if (op === "step" && session.state !== "closed") {
              const controller = new AbortController();
              controllers.push(controller);
              settled.push(
                admission
                  .acquireStep(session, placed, controller.signal, {
                    ...demand(size, 100),
                    promptBlocks: promptBlocks(id, size, history),
                  })
                  .then(
                    () => admission.endStep(session, { completed: true, contextTokens: size + 50 }),
                    (error: unknown) =>
                      assert.ok(error instanceof Refusal || (error as Error).name === "AbortError"),
                  ),
              );
            } else if (op === "close") admission.close(id);
            else if (op === "shrink") resize("r1", Math.max(1_000, size));
            else if (op === "grow") resize("r1", 40_000 + size);
            else if (op === "tick") {
              // The control tick: a session's own growth since the last one is enforced here.
              for (const [replica, w] of Object.entries(sizes)) resize(replica, w);
              admission.sweep();
            } else if (op === "abort") controllers.shift()?.abort(new DOMException("gone", "AbortError"));
            // A session's own growth is enforced on the control tick: every window is in bounds after one,
            // and the window just resized is after a resize.
            if (op === "tick") check(["r1", "r2"]);
            else if (op === "shrink" || op === "grow") check(["r1"]);
            clock.advance(advance);
            await settle();
          }
          // Every wait ends within the wait limit: admitted or refused.
          clock.advance(30_000);
          await Promise.all(settled);
          for (let i = 0; i < 8; i++) admission.close(`s${i}`);
          const counts = admission.counts();
          assert.deepEqual(
            [
              counts.active,
              counts.paused,
              counts.dormant,
              counts.queuedSteps,
              counts.runningSteps,
              counts.promptBlocks,
            ],
            [0, 0, 0, 0, 0, 0],
          );
          for (const id of ["r1", "r2"]) {
            assert.equal(admission.replicaCounts(id).footprintTokens, 0);
            assert.equal(admission.replicaCounts(id).sharedPrefixTokens, 0);
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe("idle gaps", () => {
  it("keeps the most recent gaps and answers a nearest-rank quantile of them", async () => {
    const { IdleGaps } = await import("../../src/sessions/idle-gaps.js");
    const gaps = new IdleGaps(4);
    assert.equal(gaps.quantile(0.9), undefined);
    for (const gap of [5, 1, 9, 3]) gaps.record(gap);
    assert.equal(gaps.quantile(0.5), 3);
    assert.equal(gaps.quantile(1), 9);
    gaps.record(2); // drops the oldest (5)
    gaps.record(2); // drops 1
    assert.equal(gaps.size, 4);
    assert.equal(gaps.quantile(0.25), 2);
    assert.equal(gaps.quantile(0.99), 9);
    gaps.record(Number.NaN);
    assert.equal(gaps.size, 4, "a gap that is not a number is not recorded");
  });
});
