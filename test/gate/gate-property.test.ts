/** @module Property test of the gate: random operation sequences, every limit and order rule checked after each. */

import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { VirtualClock } from "../../src/clock.js";
import { BackendGate, type Permit } from "../../src/gate/backend-gate.js";
import type { Lane } from "../../src/types.js";
import { idleInvariant, settle } from "./gate-helpers.js";

type Op =
  | {
      k: "acquire";
      rank: number | undefined;
      lane: Lane;
      tokens: number;
      signal: "none" | "live" | "aborted";
    }
  | { k: "firstToken"; i: number }
  | { k: "release"; i: number }
  | { k: "cancel"; i: number }
  | { k: "setRanks"; n: number }
  | { k: "advance"; ms: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      k: fc.constant("acquire" as const),
      rank: fc.option(fc.integer({ min: 0, max: 4 }), { nil: undefined }),
      lane: fc.constantFrom<Lane>("interactive", "bulk"),
      tokens: fc.integer({ min: 1, max: 5_000 }),
      signal: fc.constantFrom("none" as const, "live" as const, "aborted" as const),
    }),
  },
  { weight: 2, arbitrary: fc.record({ k: fc.constant("firstToken" as const), i: fc.nat() }) },
  { weight: 3, arbitrary: fc.record({ k: fc.constant("release" as const), i: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ k: fc.constant("cancel" as const), i: fc.nat() }) },
  {
    weight: 1,
    arbitrary: fc.record({ k: fc.constant("setRanks" as const), n: fc.integer({ min: 1, max: 4 }) }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ k: fc.constant("advance" as const), ms: fc.integer({ min: 0, max: 20_000 }) }),
  },
);

interface Config {
  e: number;
  w: number;
  q: number;
  ranks: number | undefined;
  lanes: boolean;
}

const configArb: fc.Arbitrary<Config> = fc.record({
  e: fc.integer({ min: 1, max: 3 }),
  w: fc.integer({ min: 1, max: 3 }),
  q: fc.integer({ min: 0, max: 3 }),
  ranks: fc.option(fc.integer({ min: 1, max: 3 }), { nil: undefined }),
  lanes: fc.boolean(),
});

interface Call {
  seq: number;
  /** The queue it waits in: `r<k>` or `u` (shared). */
  key: string;
  lane: Lane;
  state: "pending" | "admitted" | "failed";
  permit: Permit | undefined;
  held: 0 | 1 | 2;
  controller: AbortController | undefined;
}

async function runScenario(config: Config, ops: Op[]): Promise<void> {
  const clock = new VirtualClock();
  const gate = new BackendGate({
    engineRequestLimit: config.e,
    engineRequestWaitingLimit: config.w,
    requestQueueLimit: config.q,
    clock,
    ...(config.ranks === undefined ? {} : { ranks: config.ranks }),
    ...(config.lanes
      ? {
          lanes: {
            interactive: { maxResidenceMs: 15_000 },
            bulk: { maxResidenceMs: 40_000 },
            bulkMaxShare: 0.5,
            shareWindowMs: 30_000,
          },
        }
      : {}),
  });
  let known = config.ranks !== undefined;
  let rankCount = config.ranks ?? 1;
  const calls: Call[] = [];
  const violations: string[] = [];
  let admissions = 0;

  const onAdmitted = (call: Call, permit: Permit) => {
    call.state = "admitted";
    call.permit = permit;
    call.held = 2;
    admissions++;
    // Nobody older in the same queue (and, with lanes, the same lane) may still be waiting.
    for (const other of calls) {
      if (other.seq >= call.seq || other.state !== "pending" || other.key !== call.key) continue;
      if (config.lanes && other.lane !== call.lane) continue;
      violations.push(`call ${call.seq} (${call.key}) admitted before older call ${other.seq}`);
    }
    const expectedRank = call.key === "u" ? undefined : Number(call.key.slice(1));
    if (permit.rank !== expectedRank)
      violations.push(`call ${call.seq} got rank ${permit.rank}, not ${expectedRank}`);
  };

  const check = (label: string, admittedBefore: number, queuedBefore: number) => {
    const s = gate.snapshot();
    const parts = [...s.ranks, s.unranked];
    const sum = (f: (x: { requests: number; waiting: number; queued: number }) => number) =>
      parts.reduce((n, x) => n + f(x), 0);
    if (
      sum((x) => x.requests) !== s.requests ||
      sum((x) => x.waiting) !== s.waiting ||
      sum((x) => x.queued) !== s.queued
    ) {
      violations.push(`${label}: per-rank parts do not add up`);
    }
    if (gate.queuedCount("interactive") + gate.queuedCount("bulk") !== s.queued) {
      violations.push(`${label}: lanes do not add up`);
    }
    if (config.lanes !== (s.lanes !== undefined))
      violations.push(`${label}: lanes in the snapshot iff lanes are on`);
    if (
      s.lanes &&
      (s.lanes.interactive.queued !== gate.queuedCount("interactive") ||
        s.lanes.bulk.queued !== gate.queuedCount("bulk"))
    ) {
      violations.push(`${label}: snapshot lanes disagree with queuedCount`);
    }
    for (const r of s.ranks) {
      if (r.rank >= rankCount) continue;
      if (r.requests > config.e || r.waiting > config.w || r.queued > config.q) {
        violations.push(`${label}: rank ${r.rank} over its limits ${JSON.stringify(r)}`);
      }
    }
    // Shrinking the ranks may leave more admitted or queued than the new combined limits;
    // then nothing may be added until the counts are back under them.
    if (
      admissions > admittedBefore &&
      (s.requests > rankCount * config.e || s.waiting > rankCount * config.w)
    ) {
      violations.push(`${label}: admitted over the combined limits ${JSON.stringify(s)}`);
    }
    if (s.queued > queuedBefore && s.queued > rankCount * config.q) {
      violations.push(`${label}: queued over the combined queue limit`);
    }
    // Work conservation: without lanes, no queued call may fit while it waits.
    if (!config.lanes) {
      const room = s.requests < rankCount * config.e && s.waiting < rankCount * config.w;
      if (room && s.unranked.queued > 0) violations.push(`${label}: a shared-queue call fits but waits`);
      for (const r of s.ranks) {
        if (r.rank < rankCount && room && r.queued > 0 && r.requests < config.e && r.waiting < config.w) {
          violations.push(`${label}: a rank ${r.rank} call fits but waits`);
        }
      }
    }
    // Held counts must match what the admitted calls still hold.
    const held = calls.filter((c) => c.state === "admitted");
    if (
      held.filter((c) => c.held > 0).length !== s.requests ||
      held.filter((c) => c.held === 2).length !== s.waiting
    ) {
      violations.push(`${label}: snapshot does not match permits held`);
    }
    if (calls.filter((c) => c.state === "pending").length !== s.queued) {
      violations.push(`${label}: snapshot queued ${s.queued} does not match pending calls`);
    }
  };

  const pick = <T>(items: T[], i: number): T | undefined =>
    items.length === 0 ? undefined : items[i % items.length];

  for (const [index, op] of ops.entries()) {
    const admittedBefore = admissions;
    const queuedBefore = gate.snapshot().queued;
    switch (op.k) {
      case "acquire": {
        const key = known && op.rank !== undefined && op.rank < rankCount ? `r${op.rank}` : "u";
        const controller = op.signal === "none" ? undefined : new AbortController();
        if (op.signal === "aborted") controller!.abort();
        const call: Call = {
          seq: calls.length,
          key,
          lane: op.lane,
          state: "pending",
          permit: undefined,
          held: 0,
          controller,
        };
        calls.push(call);
        gate
          .acquire({
            ...(op.rank === undefined ? {} : { rank: op.rank }),
            lane: op.lane,
            prefillTokens: op.tokens,
            ...(controller ? { signal: controller.signal } : {}),
          })
          .then(
            (permit) => onAdmitted(call, permit),
            () => {
              call.state = "failed";
            },
          );
        break;
      }
      case "firstToken": {
        const call = pick(
          calls.filter((c) => c.state === "admitted" && c.held > 0),
          op.i,
        );
        if (call) {
          call.permit!.firstToken();
          if (call.held === 2) call.held = 1;
        }
        break;
      }
      case "release": {
        const call = pick(
          calls.filter((c) => c.state === "admitted" && c.held > 0),
          op.i,
        );
        if (call) {
          call.permit!.release();
          call.held = 0;
        }
        break;
      }
      case "cancel": {
        const call = pick(
          calls.filter((c) => c.controller !== undefined),
          op.i,
        );
        call?.controller?.abort();
        break;
      }
      case "setRanks": {
        if (known && op.n < rankCount) {
          for (const c of calls)
            if (c.state === "pending" && c.key !== "u" && Number(c.key.slice(1)) >= op.n) c.key = "u";
        }
        gate.setRanks(op.n);
        known = true;
        rankCount = op.n;
        break;
      }
      case "advance":
        clock.advance(op.ms);
        break;
    }
    await settle();
    check(`op ${index} ${op.k}`, admittedBefore, queuedBefore);
    if (violations.length > 0) break;
  }
  assert.deepEqual(violations, []);

  // Drain: release everything admitted until nothing is held or waiting.
  for (let round = 0; round < 10_000; round++) {
    const held = calls.filter((c) => c.state === "admitted" && c.held > 0);
    if (held.length === 0 && !calls.some((c) => c.state === "pending")) break;
    for (const c of held) {
      c.permit!.release();
      c.held = 0;
    }
    await settle();
    if (held.length === 0) clock.advance(1_000);
  }
  assert.equal(idleInvariant(gate), undefined);
  const counters = gate.counters();
  assert.equal(counters.received, calls.length);
  assert.equal(
    counters.admittedDirect + counters.admittedQueue,
    calls.filter((c) => c.state === "admitted").length,
  );
  assert.equal(clock.pending(), 0, "no residence or share timer left behind");
  assert.deepEqual(violations, []);
}

test("random acquire/firstToken/release/cancel/setRanks sequences keep every limit and order rule", async () => {
  await fc.assert(
    fc.asyncProperty(configArb, fc.array(opArb, { minLength: 1, maxLength: 150 }), runScenario),
    { numRuns: 150 },
  );
});

test("the property holds for a busy, long sequence with lanes and ranks", async () => {
  await fc.assert(
    fc.asyncProperty(
      configArb.map((c) => ({ ...c, lanes: true, ranks: 2 })),
      fc.array(opArb, { minLength: 400, maxLength: 600 }),
      runScenario,
    ),
    { numRuns: 10 },
  );
});
