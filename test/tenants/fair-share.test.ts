import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { entitlements, jainIndex } from "../../src/tenants/fair-share.js";

const round = (shares: Map<string, number>) =>
  Object.fromEntries([...shares].map(([tenant, tokens]) => [tenant, Math.round(tokens)]));

describe("entitlements (weighted max-min)", () => {
  it("splits a window among backlogged tenants by weight", () => {
    const shares = entitlements(100_000, [
      { tenant: "a", weight: 1, demandTokens: 1e9 },
      { tenant: "b", weight: 2, demandTokens: 1e9 },
      { tenant: "c", weight: 3, demandTokens: 1e9 },
      { tenant: "d", weight: 4, demandTokens: 1e9 },
    ]);
    assert.deepEqual(round(shares), { a: 10_000, b: 20_000, c: 30_000, d: 40_000 });
  });

  it("gives a tenant that needs less than its share its demand, and the rest to the others by weight", () => {
    const shares = entitlements(90_000, [
      { tenant: "small", weight: 1, demandTokens: 6_000 },
      { tenant: "a", weight: 1, demandTokens: 1e9 },
      { tenant: "b", weight: 2, demandTokens: 1e9 },
    ]);
    // 90,000 − 6,000 = 84,000 left, split 1:2.
    assert.deepEqual(round(shares), { small: 6_000, a: 28_000, b: 56_000 });
  });

  it("lets a tenant alone use everything it asks, and caps one with max_share", () => {
    assert.deepEqual(round(entitlements(50_000, [{ tenant: "a", weight: 1, demandTokens: 80_000 }])), {
      a: 50_000,
    });
    const capped = entitlements(100_000, [
      { tenant: "ops", weight: 4, demandTokens: 1e9, maxShare: 0.25 },
      { tenant: "a", weight: 1, demandTokens: 1e9 },
    ]);
    assert.deepEqual(round(capped), { ops: 25_000, a: 75_000 });
    // Every tenant capped: the rest of the window stays unassigned.
    const all = entitlements(100_000, [{ tenant: "ops", weight: 1, demandTokens: 1e9, maxShare: 0.5 }]);
    assert.deepEqual(round(all), { ops: 50_000 });
  });

  it("omits tenants without demand and rejects bad numbers naming the value", () => {
    assert.deepEqual(
      round(
        entitlements(10_000, [
          { tenant: "idle", weight: 5, demandTokens: 0 },
          { tenant: "a", weight: 1, demandTokens: 20_000 },
        ]),
      ),
      { a: 10_000 },
    );
    assert.throws(() => entitlements(-1, []), /got -1/);
    assert.throws(
      () => entitlements(10, [{ tenant: "x", weight: 0, demandTokens: 1 }]),
      /weight of x .* got 0/,
    );
  });
});

describe("jainIndex", () => {
  it("is 1 for equal values and 1/n when one takes all", () => {
    assert.equal(jainIndex([1, 1, 1, 1]), 1);
    assert.equal(jainIndex([1, 0, 0, 0]), 0.25);
    assert.equal(jainIndex([]), 1);
    assert.ok(Math.abs(jainIndex([1, 2]) - 0.9) < 1e-12);
  });
});
