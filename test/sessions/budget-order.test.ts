import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BudgetQueue } from "../../src/budget/budget-queue.js";
import { TokenBudget } from "../../src/budget/token-budget.js";
import { VirtualClock } from "../../src/clock.js";
import type { TenantSpec } from "../../src/config/scheduler-config.js";
import { SessionAdmission } from "../../src/sessions/session-admission.js";

function setup(tenants: Record<string, TenantSpec>, fairness: "tenants" | "off" = "tenants") {
  const clock = new VirtualClock();
  const admission = new SessionAdmission({
    clock,
    unit: "tokens",
    queueLimit: 64,
    waitLimitMs: 600_000,
    idleTimeoutMs: 1_200_000,
    fairness,
    tenants,
    fairReclaimAfterMs: 5000,
  });
  admission.addReplica("r1", 10_000);
  const start = (id: string, tenant: string, tokens: number) => {
    const session = admission.open(id, { tenant });
    const admitted = admission.acquireStep(session, (c) => c[0], undefined, {
      promptTokens: tokens,
      maxTokens: 0,
    });
    admitted.catch(() => {});
    return admitted;
  };
  const step = async (id: string, tenant: string, tokens: number) => {
    await start(id, tenant, tokens);
  };
  return { clock, admission, start, step };
}

describe("the budget queue's order among tenants", () => {
  it("keys a call by its band, then by its tenant's usage ÷ entitlement, while tenants share the windows", async () => {
    const { admission, start, step } = setup({ ops: { band: "protected" } });
    assert.deepEqual(admission.budgetOrderKey("heavy"), [0, 0], "one tenant open: every call is even");
    await step("h1", "heavy", 6_000);
    await step("l1", "light", 1_000);
    // Light asks for more than the room left: the window is contended, entitlements 5,000 each.
    void start("l2", "light", 4_000);
    const heavy = admission.budgetOrderKey("heavy");
    const light = admission.budgetOrderKey("light");
    assert.equal(heavy[0], 1, "standard band");
    assert.ok(heavy[1] > light[1], `heavy ${heavy[1]} above light ${light[1]}`);
    await step("o1", "ops", 500);
    assert.equal(admission.budgetOrderKey("ops")[0], 0, "protected goes first");
    assert.equal(admission.budgetOrderKey(undefined)[0], 1, "an unkeyed call is the default tenant's");
    const listed = admission.tenants().tenants.map((t) => t.tenant);
    assert.ok(!listed.includes("default"), "a key asked for opens no tenant account");
    for (const id of ["h1", "l1", "l2", "o1"]) admission.close(id);
  });

  it("keeps every call even with fairness off", async () => {
    const { admission, step } = setup({}, "off");
    await step("h1", "heavy", 6_000);
    await step("l1", "light", 1_000);
    assert.deepEqual(admission.budgetOrderKey("heavy"), [0, 0]);
    assert.deepEqual(admission.budgetOrderKey("light"), [0, 0]);
    for (const id of ["h1", "l1"]) admission.close(id);
  });

  it("grants the under-share tenant's call first when both wait in one lane", async () => {
    const { clock, admission, start, step } = setup({});
    await step("h1", "heavy", 6_000);
    await step("l1", "light", 1_000);
    void start("l2", "light", 4_000);
    const budget = new TokenBudget({ ceilingTokens: 10_000, guardBandFraction: 0 });
    const held = budget.tryReserve(10_000);
    assert.ok(held);
    const queue = new BudgetQueue(budget, {
      clock,
      limit: 8,
      headReserveMs: 60_000,
      orderKey: (waiter) => admission.budgetOrderKey(waiter.tenant),
    });
    const granted: string[] = [];
    const wait = (tenant: string) =>
      queue.reserve({ tokens: 2_000, lane: "bulk", tenant, maxWaitMs: 60_000 }).then((reservation) => {
        granted.push(tenant);
        return reservation;
      });
    const first = wait("heavy");
    const second = wait("light");
    held.release();
    const [a, b] = await Promise.all([first, second]);
    assert.deepEqual(granted, ["light", "heavy"]);
    a.release();
    b.release();
    assert.equal(queue.size, 0);
    queue.close();
    for (const id of ["h1", "l1", "l2"]) admission.close(id);
  });
});
