/** @module Token budget: docs/how-it-works.md#token-budget-and-feasibility worked example, reservations released exactly once, counters back to zero. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { type Reservation, reservationTokens, TokenBudget } from "../../src/budget/index.js";
import { Refusal } from "../../src/errors.js";

describe("reservationTokens", () => {
  it("is the prompt less its prefix in GPU memory, plus the output the call may generate", () => {
    assert.equal(reservationTokens(14_000, 0, 4_000), 18_000);
    assert.equal(reservationTokens(14_000, 10_000, 4_000), 8_000);
    assert.equal(reservationTokens(14_000, 14_000, 1), 1, "a prefill replica's one token");
  });
});

describe("TokenBudget", () => {
  it("reproduces the docs/how-it-works.md#token-budget-and-feasibility worked example", () => {
    const budget = new TokenBudget({ ceilingTokens: 96_000 });
    assert.equal(budget.guardTokens, 9600);
    const active = budget.tryReserve(58_000);
    const queued = budget.tryReserve(8000, { queued: true });
    assert.ok(active && queued);
    assert.equal(budget.reservedActive, 58_000);
    assert.equal(budget.reservedQueued, 8000);
    assert.equal(budget.available(), 20_400);

    assert.equal(budget.tryReserve(19_000 + 4000), null, "a 19,000 + 4,000 call does not fit");
    assert.equal(budget.available(), 20_400, "a refused reservation holds nothing");
    assert.equal(budget.outstanding, 2);

    const fits = budget.tryReserve(14_000 + 4000);
    assert.ok(fits, "a 14,000 + 4,000 call fits");
    assert.equal(budget.available(), 2400);

    for (const r of [active, queued, fits]) r.release();
    assert.equal(budget.reservedActive, 0);
    assert.equal(budget.reservedQueued, 0);
    assert.equal(budget.outstanding, 0);
    assert.equal(budget.available(), 96_000 - 9600);
  });

  it("grants a reservation of exactly the available tokens and not one more", () => {
    const budget = new TokenBudget({ ceilingTokens: 1000, guardBandFraction: 0.1 });
    assert.equal(budget.available(), 900);
    assert.equal(budget.tryReserve(901), null);
    const r = budget.tryReserve(900);
    assert.ok(r);
    assert.equal(budget.available(), 0);
    assert.equal(budget.tryReserve(1), null);
    r.release();
    assert.equal(budget.available(), 900);
  });

  it("releases each reservation exactly once, whatever is called twice", () => {
    const budget = new TokenBudget({ ceilingTokens: 10_000, guardBandFraction: 0 });
    const a = budget.tryReserve(3000)!;
    const b = budget.tryReserve(2000, { queued: true })!;
    assert.equal(a.queued, false);
    assert.equal(b.queued, true);
    a.release();
    a.release();
    assert.equal(a.released, true);
    assert.equal(budget.reservedActive, 0);
    assert.equal(budget.reservedQueued, 2000, "a second release of a must not eat b's tokens");
    assert.equal(budget.outstanding, 1);
    a.activate();
    assert.equal(budget.reservedActive, 0, "activating a released reservation does nothing");

    b.activate();
    b.activate();
    assert.equal(b.queued, false);
    assert.equal(budget.reservedQueued, 0);
    assert.equal(budget.reservedActive, 2000);
    b.release();
    b.release();
    assert.equal(budget.reservedActive, 0);
    assert.equal(budget.outstanding, 0);
    assert.equal(budget.available(), 10_000);
  });

  it("releases a queued reservation from the queued total", () => {
    const budget = new TokenBudget({ ceilingTokens: 10_000 });
    const r = budget.tryReserve(500, { queued: true })!;
    r.release();
    assert.equal(budget.reservedQueued, 0);
    assert.equal(budget.reservedActive, 0);
  });

  it("names calls that could never fit (413) apart from calls that do not fit now (429)", () => {
    const budget = new TokenBudget({ ceilingTokens: 96_000 });
    assert.equal(budget.maxReservable, 86_400);
    assert.throws(
      () => budget.reserveOrRefuse(86_401, { lane: "bulk" }),
      (e: unknown) =>
        e instanceof Refusal &&
        e.reason === "context_limit" &&
        e.status === 413 &&
        e.retryAfterSeconds === undefined &&
        e.limits?.max_total_tokens === 86_400 &&
        e.lane === "bulk",
    );
    const big = budget.reserveOrRefuse(86_400);
    assert.equal(budget.available(), 0);
    assert.throws(
      () => budget.reserveOrRefuse(1, { lane: "interactive", retryAfterSeconds: 2.1 }),
      (e: unknown) =>
        e instanceof Refusal &&
        e.reason === "token_budget_exhausted" &&
        e.status === 429 &&
        e.retryAfterSeconds === 3,
    );
    assert.throws(
      () => budget.reserveOrRefuse(1, { retryAfterSeconds: 0 }),
      (e: unknown) => e instanceof Refusal && e.retryAfterSeconds === 1,
      "Retry-After is never 0",
    );
    big.release();
    assert.equal(budget.outstanding, 0);
  });

  it("keeps reservations when the ceiling drops, and reads 0 available until they drain", () => {
    const budget = new TokenBudget({ ceilingTokens: 100_000 });
    const r = budget.tryReserve(60_000)!;
    budget.setCeiling(50_000);
    assert.equal(budget.ceiling, 50_000);
    assert.equal(budget.guardTokens, 5000);
    assert.equal(budget.reservedActive, 60_000);
    assert.equal(budget.available(), 0);
    assert.equal(budget.tryReserve(1), null);
    r.release();
    assert.equal(budget.available(), 45_000);
    assert.deepEqual(budget.snapshot(), {
      ceilingTokens: 50_000,
      guardTokens: 5000,
      reservedActive: 0,
      reservedQueued: 0,
      availableTokens: 45_000,
      outstanding: 0,
    });
  });

  it("validates options and token counts, naming the value", () => {
    assert.throws(() => new TokenBudget({ ceilingTokens: -1 }), /ceilingTokens.*-1/);
    assert.throws(() => new TokenBudget({ ceilingTokens: Number.NaN }), /ceilingTokens.*NaN/);
    assert.throws(() => new TokenBudget({ ceilingTokens: 10, guardBandFraction: 1 }), /guardBandFraction.*1/);
    assert.throws(() => new TokenBudget({ ceilingTokens: 10, guardBandFraction: -0.1 }), /-0.1/);
    const budget = new TokenBudget({ ceilingTokens: 10 });
    assert.throws(() => budget.tryReserve(-3), /-3/);
    assert.throws(() => budget.tryReserve(1.5), /1.5/);
    assert.throws(() => budget.setCeiling(Number.POSITIVE_INFINITY), /Infinity/);
  });

  it("never over-commits and always returns to zero (random reserve/activate/release sequences)", () => {
    const op = fc.oneof(
      fc.record({
        kind: fc.constant("reserve" as const),
        tokens: fc.integer({ min: 0, max: 5000 }),
        queued: fc.boolean(),
      }),
      fc.record({ kind: fc.constant("activate" as const), index: fc.nat() }),
      fc.record({ kind: fc.constant("release" as const), index: fc.nat() }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 20_000 }), fc.array(op, { maxLength: 60 }), (ceiling, ops) => {
        const budget = new TokenBudget({ ceilingTokens: ceiling });
        const held: Reservation[] = [];
        for (const o of ops) {
          if (o.kind === "reserve") {
            const before = budget.available();
            const r = budget.tryReserve(o.tokens, { queued: o.queued });
            assert.equal(r !== null, o.tokens <= before);
            if (r) held.push(r);
          } else if (held.length > 0) {
            const r = held[o.index % held.length]!;
            if (o.kind === "activate") r.activate();
            else r.release();
          }
          const live = held.filter((r) => !r.released);
          const sum = (queued: boolean) =>
            live.filter((r) => r.queued === queued).reduce((acc, r) => acc + r.tokens, 0);
          assert.equal(budget.reservedActive, sum(false));
          assert.equal(budget.reservedQueued, sum(true));
          assert.equal(budget.outstanding, live.length);
          assert.ok(budget.reservedActive + budget.reservedQueued + budget.guardTokens <= ceiling);
        }
        for (const r of held) r.release();
        assert.equal(budget.reservedActive, 0);
        assert.equal(budget.reservedQueued, 0);
        assert.equal(budget.outstanding, 0);
      }),
    );
  });
});
