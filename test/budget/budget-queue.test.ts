import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type BudgetWaiterView, orderedLane } from "../../src/budget/budget-order.js";
import { BudgetQueue, type BudgetQueueOptions } from "../../src/budget/budget-queue.js";
import { type Reservation, TokenBudget } from "../../src/budget/token-budget.js";
import { VirtualClock } from "../../src/clock.js";
import { Refusal } from "../../src/errors.js";
import type { Lane } from "../../src/types.js";

/** Ceiling 11,000 with a guard band of 1,000: 10,000 tokens to reserve. */
function setup(options: Partial<BudgetQueueOptions> = {}) {
  const clock = new VirtualClock();
  const budget = new TokenBudget({ ceilingTokens: 11_000, guardBandFraction: 1 / 11 });
  const queue = new BudgetQueue(budget, { clock, ...options });
  return { clock, budget, queue };
}

/** A wait whose outcome can be read synchronously after a microtask flush. */
interface Seen {
  reservation?: Reservation;
  error?: unknown;
}

function watch(promise: Promise<Reservation>): Seen {
  const seen: Seen = {};
  promise.then(
    (r) => {
      seen.reservation = r;
    },
    (e) => {
      seen.error = e;
    },
  );
  return seen;
}

/** The reservation a wait got (read through a call: an earlier `assert.equal(…, undefined)` narrows the field). */
function taken(seen: Seen): Reservation {
  assert.ok(seen.reservation, "the call got its reservation");
  return seen.reservation;
}

const flush = () => new Promise<void>((resolve) => setImmediate(resolve));

function ask(
  queue: BudgetQueue,
  tokens: number,
  lane: Lane = "bulk",
  extra: { maxWaitMs?: number; tenant?: string; signal?: AbortSignal } = {},
) {
  return watch(queue.reserve({ tokens, lane, maxWaitMs: extra.maxWaitMs ?? 300_000, ...extra }));
}

describe("BudgetQueue", () => {
  it("grants at once what fits and holds what does not until a release makes room", async () => {
    const { budget, queue } = setup();
    const a = ask(queue, 8_000);
    await flush();
    assert.ok(a.reservation);
    const b = ask(queue, 4_000);
    await flush();
    assert.equal(b.reservation, undefined);
    assert.equal(queue.size, 1);
    a.reservation.release();
    await flush();
    assert.ok(b.reservation);
    assert.equal(queue.size, 0);
    taken(b).release();
    assert.equal(budget.outstanding, 0);
  });

  it("serves waiting interactive calls ahead of bulk ones that came first", async () => {
    const { clock, queue } = setup();
    const holder = ask(queue, 9_000);
    await flush();
    const bulk = ask(queue, 2_000, "bulk");
    clock.advance(10);
    const interactive = ask(queue, 2_000, "interactive");
    await flush();
    holder.reservation!.release();
    await flush();
    assert.ok(interactive.reservation, "interactive first");
    assert.ok(bulk.reservation, "then bulk, beside it");
    interactive.reservation.release();
    bulk.reservation.release();
  });

  it("lets a head that waited longer than the head reserve hold its place against later calls of its lane", async () => {
    const { clock, queue } = setup({ headReserveMs: 2_000 });
    const holder = ask(queue, 7_000);
    await flush();
    const big = ask(queue, 6_000, "bulk");
    // Before the reserve time a smaller call that fits passes the waiting head.
    const early = ask(queue, 2_000, "bulk");
    await flush();
    assert.ok(early.reservation);
    early.reservation.release();
    clock.advance(2_000);
    const late = ask(queue, 2_000, "bulk");
    await flush();
    assert.equal(late.reservation, undefined, "the held head keeps its budget from a later bulk call");
    assert.deepEqual(queue.snapshot().heldHeads, ["bulk"]);
    // Interactive calls are not held back by a bulk head while bulk has its floor share.
    const chat = ask(queue, 1_000, "interactive");
    await flush();
    assert.ok(chat.reservation);
    taken(chat).release();
    holder.reservation!.release();
    await flush();
    assert.ok(big.reservation, "the head first");
    assert.ok(late.reservation, "then the smaller call, beside it");
    big.reservation.release();
    taken(late).release();
  });

  it("serves a held bulk head ahead of interactive calls while bulk is below its floor share", async () => {
    const { clock, queue } = setup({ headReserveMs: 1_000, bulkFloorShare: 0.1 });
    // Only interactive grants so far: bulk's share is 0.
    const holders = [ask(queue, 4_000, "interactive"), ask(queue, 4_000, "interactive")];
    await flush();
    const big = ask(queue, 6_000, "bulk");
    clock.advance(1_000);
    const chat = ask(queue, 2_000, "interactive");
    await flush();
    assert.equal(chat.reservation, undefined, "the held bulk head is owed its floor");
    holders[0]!.reservation!.release();
    await flush();
    assert.ok(big.reservation);
    assert.equal(chat.reservation, undefined);
    holders[1]!.reservation!.release();
    await flush();
    assert.ok(chat.reservation);
    big.reservation.release();
    taken(chat).release();
  });

  it("refuses with 429 token_budget_exhausted when the wait outlives its limit, at once with a limit of 0 or a full queue", async () => {
    const { clock, queue } = setup({ limit: 1, retryAfterSeconds: (deficit) => deficit / 1000 });
    const holder = ask(queue, 9_000);
    await flush();
    const timed = ask(queue, 3_000, "interactive", { maxWaitMs: 500 });
    const full = ask(queue, 3_000, "bulk");
    const now = ask(queue, 3_000, "interactive", { maxWaitMs: 0 });
    await flush();
    for (const seen of [full, now]) {
      assert.ok(seen.error instanceof Refusal);
      assert.equal(seen.error.reason, "token_budget_exhausted");
      assert.equal(seen.error.status, 429);
    }
    // Retry-After from the drain: the waiter ahead and itself, less the 1,000 available.
    assert.equal((full.error as Refusal).retryAfterSeconds, 5);
    clock.advance(499);
    await flush();
    assert.equal(timed.error, undefined);
    clock.advance(1);
    await flush();
    const expired: unknown = timed.error;
    assert.ok(expired instanceof Refusal);
    assert.equal(expired.reason, "token_budget_exhausted");
    assert.match(expired.message, /waited 500 ms/);
    assert.equal(queue.size, 0);
    assert.equal(clock.pending(), 0, "no timer left behind");
    holder.reservation!.release();
    assert.deepEqual(
      { granted: queue.snapshot().granted, timedOut: queue.snapshot().timedOut, full: queue.snapshot().full },
      { granted: 1, timedOut: 1, full: 2 },
    );
  });

  it("withdraws an aborted waiter and lets the calls it held back through", async () => {
    const { clock, queue } = setup({ headReserveMs: 0 });
    const holder = ask(queue, 5_000);
    await flush();
    const abort = new AbortController();
    const big = ask(queue, 8_000, "bulk", { signal: abort.signal });
    const small = ask(queue, 4_000, "bulk");
    await flush();
    assert.equal(small.reservation, undefined, "held back by the head");
    abort.abort();
    await flush();
    assert.equal((big.error as Error).name, "AbortError");
    assert.ok(small.reservation);
    assert.equal(clock.pending(), 0);
    holder.reservation!.release();
    taken(small).release();
  });

  it("orders each lane by the caller's key, read at every decision, and carries the tenant", async () => {
    const usage = new Map<string, number>([
      ["a", 5],
      ["b", 1],
    ]);
    const seen: BudgetWaiterView[] = [];
    const { queue } = setup({
      orderKey: (w) => {
        seen.push(w);
        return [usage.get(w.tenant ?? "") ?? 0];
      },
    });
    const holder = ask(queue, 9_500);
    await flush();
    const a = ask(queue, 3_000, "bulk", { tenant: "a" });
    const b = ask(queue, 3_000, "bulk", { tenant: "b" });
    await flush();
    usage.set("b", 9);
    holder.reservation!.release();
    await flush();
    assert.ok(seen.some((w) => w.tenant === "a"));
    assert.ok(a.reservation && b.reservation);
    a.reservation.release();
    taken(b).release();
    // With room for one only, the lower key goes first.
    const h2 = ask(queue, 7_000);
    await flush();
    const c = ask(queue, 3_500, "bulk", { tenant: "a" });
    const d = ask(queue, 3_500, "bulk", { tenant: "b" });
    await flush();
    h2.reservation!.release();
    await flush();
    assert.ok(c.reservation, "tenant a's key (5) is below b's (9)");
    assert.ok(d.reservation, "both fit once the holder left");
    c.reservation.release();
    d.reservation.release();
  });

  it("keeps its counters consistent under random arrivals, cancels, timeouts and releases, and ends at zero", async () => {
    for (let seed = 1; seed <= 20; seed++) {
      let state = seed;
      const random = () => {
        state = (state * 1_103_515_245 + 12_345) % 2 ** 31;
        return state / 2 ** 31;
      };
      const { clock, budget, queue } = setup({
        limit: 8,
        headReserveMs: 200,
        orderKey: seed % 2 === 0 ? (w) => [w.tokens % 3] : undefined,
      });
      const live = new Set<Reservation>();
      const pending = new Map<
        number,
        { seen: ReturnType<typeof watch>; abort: AbortController; tokens: number }
      >();
      let id = 0;
      const check = async () => {
        await flush();
        for (const [key, entry] of pending) {
          if (entry.seen.reservation) {
            live.add(entry.seen.reservation);
            pending.delete(key);
          } else if (entry.seen.error) {
            pending.delete(key);
          }
        }
        assert.equal(queue.size, pending.size, "every unsettled call waits in the queue, and only those");
        assert.equal(budget.outstanding, live.size);
        let reserved = 0;
        for (const r of live) reserved += r.tokens;
        assert.equal(budget.reservedActive + budget.reservedQueued, reserved);
        assert.ok(budget.reservedActive + budget.reservedQueued <= budget.maxReservable);
        const snapshot = queue.snapshot();
        assert.equal(snapshot.waiting.interactive + snapshot.waiting.bulk, pending.size);
        // Progress: with nothing reserved at all, nobody can be left waiting.
        if (live.size === 0) assert.equal(pending.size, 0, "an empty budget leaves no waiter behind");
      };
      for (let step = 0; step < 300; step++) {
        const roll = random();
        if (roll < 0.4) {
          const abort = new AbortController();
          const tokens = 1 + Math.floor(random() * 6_000);
          const lane: Lane = random() < 0.5 ? "interactive" : "bulk";
          const maxWaitMs = random() < 0.1 ? 0 : 50 + Math.floor(random() * 2_000);
          pending.set(id++, {
            seen: ask(queue, tokens, lane, { maxWaitMs, signal: abort.signal, tenant: `t${step % 3}` }),
            abort,
            tokens,
          });
        } else if (roll < 0.65 && live.size > 0) {
          const all = [...live];
          const victim = all[Math.floor(random() * all.length)]!;
          victim.release();
          if (random() < 0.3) victim.release(); // idempotent
          live.delete(victim);
        } else if (roll < 0.75 && pending.size > 0) {
          const all = [...pending.values()];
          all[Math.floor(random() * all.length)]!.abort.abort();
        } else {
          clock.advance(Math.floor(random() * 400));
        }
        await check();
      }
      for (const r of live) r.release();
      live.clear();
      await check();
      clock.advance(10_000);
      await check();
      for (const r of live) r.release();
      live.clear();
      await check();
      assert.equal(queue.size, 0);
      assert.equal(budget.outstanding, 0);
      assert.equal(budget.reservedActive + budget.reservedQueued, 0);
      assert.equal(clock.pending(), 0, `seed ${seed}: no timer left`);
    }
  });
});

describe("a lane's order", () => {
  const waiter = (seq: number, tenant: string): BudgetWaiterView => ({
    tokens: 100,
    lane: "interactive",
    tenant,
    seq,
    enqueuedAtMs: 0,
  });
  const lane = [waiter(0, "b"), waiter(1, "a"), waiter(2, "b"), waiter(3, "a")];

  it("goes by key, then arrival", () => {
    const order = orderedLane(lane, (w) => (w.tenant === "a" ? [0, 1] : [0, 2]));
    assert.deepEqual(
      order.map((w) => w.seq),
      [1, 3, 0, 2],
    );
  });

  it("is arrival order, as a copy, when every key is the same or there is no key", () => {
    for (const key of [() => [0, 0] as const, undefined]) {
      const order = orderedLane(lane, key);
      assert.notEqual(order, lane);
      assert.deepEqual(
        order.map((w) => w.seq),
        [0, 1, 2, 3],
      );
    }
  });
});
