import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BudgetQueue } from "../../src/budget/budget-queue.js";
import { TokenBudget } from "../../src/budget/token-budget.js";
import { VirtualClock } from "../../src/clock.js";
import { Refusal } from "../../src/errors.js";

const RANK: Record<string, number> = { ops: 0, team: 1, batch: 2 };

function full(shed: boolean) {
  const clock = new VirtualClock();
  const budget = new TokenBudget({ ceilingTokens: 10_000, guardBandFraction: 0 });
  const held = budget.tryReserve(10_000);
  assert.ok(held);
  const queue = new BudgetQueue(budget, {
    clock,
    limit: 2,
    ...(shed ? { shedRank: (w: { tenant: string | undefined }) => RANK[w.tenant ?? "team"] ?? 1 } : {}),
  });
  const outcomes: string[] = [];
  const wait = (tenant: string, tokens = 1_000) => {
    const p = queue.reserve({ tokens, lane: "bulk", tenant, maxWaitMs: 60_000 });
    p.then(
      (r) => {
        outcomes.push(`${tenant}:granted`);
        r.release();
      },
      (e) => outcomes.push(`${tenant}:${e instanceof Refusal ? e.reason : String(e)}`),
    );
    return p.catch(() => undefined);
  };
  return { queue, held, wait, outcomes, budget };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

describe("a full budget queue", () => {
  it("refuses the latest waiter of the lowest band to take a higher band's call, never one of its own band or above", async () => {
    const { queue, held, wait, outcomes, budget } = full(true);
    const waits = [wait("batch"), wait("batch")];
    waits.push(wait("ops"));
    await settle();
    assert.deepEqual(outcomes, ["batch:token_budget_exhausted"], "the later sheddable waiter gave way");
    waits.push(wait("batch"));
    await settle();
    assert.deepEqual(
      outcomes.slice(1),
      ["batch:token_budget_exhausted"],
      "an equal band takes no one's place",
    );
    held.release();
    await Promise.all(waits);
    await settle();
    assert.deepEqual(outcomes.slice(2).sort(), ["batch:granted", "ops:granted"]);
    assert.equal(queue.size, 0);
    assert.equal(budget.outstanding, 0);
    queue.close();
  });

  it("refuses the arrival without a rank to shed by", async () => {
    const { queue, held, wait, outcomes, budget } = full(false);
    const waits = [wait("batch"), wait("batch"), wait("ops")];
    await settle();
    assert.deepEqual(outcomes, ["ops:token_budget_exhausted"]);
    held.release();
    await Promise.all(waits);
    await settle();
    assert.equal(queue.size, 0);
    assert.equal(budget.outstanding, 0);
    queue.close();
  });
});
