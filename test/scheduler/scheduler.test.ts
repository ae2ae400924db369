import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { VirtualClock } from "../../src/clock.js";
import type { SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import type { Engine, EngineCall, EngineSignals, EngineStream } from "../../src/engine.js";
import { Refusal } from "../../src/errors.js";
import { GateRejection } from "../../src/gate/gate-errors.js";
import { Scheduler } from "../../src/scheduler.js";
import type { AdmittedCall, CallRequest, SchedulerEvents } from "../../src/types.js";

/** A real simulated replica whose reported signals and per-call cached tokens a test can bend (stale, saturated, evicted). */
class BentSignals implements Engine {
  readonly id: string;
  bend: (signals: EngineSignals) => EngineSignals = (signals) => signals;
  /** What a call's result reports as its cached prompt tokens, from what the simulator found. */
  bendCached: (cachedTokens: number) => number = (cachedTokens) => cachedTokens;
  constructor(readonly inner: SimEngine) {
    this.id = inner.id;
  }
  models(): readonly string[] {
    return this.inner.models();
  }
  async generate(call: EngineCall): Promise<EngineStream> {
    const stream = await this.inner.generate(call);
    const result = stream.result.then((r) => ({ ...r, cachedTokens: this.bendCached(r.cachedTokens) }));
    result.catch(() => undefined);
    return {
      firstToken: stream.firstToken,
      result,
      [Symbol.asyncIterator]: () => stream[Symbol.asyncIterator](),
    };
  }
  signals(): EngineSignals {
    return this.bend(this.inner.signals());
  }
  contextWindow(): number | undefined {
    return 131_072;
  }
}

function fleet(replicas: number, config: SchedulerConfigInput = {}, events?: SchedulerEvents) {
  const clock = new VirtualClock();
  const engines = Array.from(
    { length: replicas },
    (_, i) => new BentSignals(new SimEngine({ id: `r${i + 1}`, clock, preset: "h100-llama3-8b" })),
  );
  const scheduler = new Scheduler({ engines, clock, config, ...(events ? { events } : {}) });
  scheduler.start();
  return { clock, engines, scheduler };
}

/** A token window started above the replica's KV capacity, where lost hits can be the window's doing. */
const ABOVE_CAPACITY: SchedulerConfigInput = { window: { initialTokens: 800_000 } };

/**
 * One replica whose KV usage reads 0.8 (above U_high), after its first control interval: the
 * token window's W now (`start`) and a reader of it, for tests of thrash cuts.
 */
async function loadedWindow(config: SchedulerConfigInput) {
  const { clock, scheduler, engines } = fleet(1, config);
  const windowTokens = () => scheduler.state().replicas[0]!.window.sizeTokens!;
  engines[0]!.bend = (signals) => ({ ...signals, kvUsage: 0.8 });
  await clock.advanceAsync(2_000);
  return { clock, scheduler, engines, windowTokens, start: windowTokens() };
}

function tokens(n: number, offset = 0): number[] {
  return Array.from({ length: n }, (_, i) => offset + i);
}

function request(overrides: Partial<CallRequest> = {}): CallRequest {
  return {
    requestId: `req-${Math.random().toString(36).slice(2)}`,
    endpoint: "chat",
    input: { kind: "tokens", tokens: tokens(500) },
    maxTokens: 50,
    stream: true,
    ...overrides,
  };
}

async function drain(call: AdmittedCall): Promise<number> {
  let count = 0;
  for await (const chunk of call) count += chunk.tokenCount;
  return count;
}

/** Runs the virtual clock until `promise` settles. */
async function run<T>(clock: VirtualClock, promise: Promise<T>): Promise<T> {
  let settled = false;
  const tracked = promise.finally(() => {
    settled = true;
  });
  tracked.catch(() => undefined);
  await clock.runAsyncUntil(() => settled, 10_000_000);
  return tracked;
}

function assertIdle(scheduler: Scheduler): void {
  assert.deepEqual(scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
}

function refusalWith(reason: string, status: number) {
  return (error: unknown) => {
    assert.ok(error instanceof Refusal, `expected a Refusal, got ${String(error)}`);
    assert.equal(error.reason, reason);
    assert.equal(error.status, status);
    if ([429, 503, 529].includes(status)) assert.ok((error.retryAfterSeconds ?? 0) >= 1);
    return true;
  };
}

describe("scheduler request path", () => {
  it("runs a call end to end and releases everything", async () => {
    const { clock, scheduler } = fleet(1);
    const call = await run(clock, scheduler.submit(request()));
    assert.equal(call.replica, "r1");
    assert.equal(call.lane, "interactive");
    assert.equal(await run(clock, drain(call)), 50);
    const result = await call.result;
    assert.equal(result.completionTokens, 50);
    assertIdle(scheduler);
    await scheduler.stop();
  });

  it("refuses a call over the context window with 413 context_limit and its limits", async () => {
    const { clock, scheduler } = fleet(1);
    await assert.rejects(
      run(
        clock,
        scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(131_000) }, maxTokens: 2000 })),
      ),
      (error: unknown) => {
        assert.ok(refusalWith("context_limit", 413)(error));
        assert.equal((error as Refusal).limits?.max_total_tokens, 131_072);
        assert.equal((error as Refusal).retryAfterSeconds, undefined);
        return true;
      },
    );
    assertIdle(scheduler);
  });

  it("refuses beyond the bulk limit with 413 overflow, and an unknown model with 404", async () => {
    const { clock, scheduler } = fleet(1, { lanes: { bulkMaxTotalTokens: 10_000 } });
    await assert.rejects(
      run(
        clock,
        scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(9_990) }, maxTokens: 100 })),
      ),
      refusalWith("overflow", 413),
    );
    await assert.rejects(
      run(clock, scheduler.submit(request({ model: "nope" }))),
      refusalWith("model_not_found", 404),
    );
    assert.deepEqual(scheduler.state().rejections, { overflow: 1, model_not_found: 1 });
    assertIdle(scheduler);
  });

  it("classifies lanes by size, whatever the client declares", async () => {
    const { clock, scheduler } = fleet(1);
    const big = await run(
      clock,
      scheduler.submit(
        request({ input: { kind: "tokens", tokens: tokens(5000) }, declaredLane: "interactive" }),
      ),
    );
    assert.equal(big.lane, "bulk");
    await run(clock, drain(big));
    const declared = await run(clock, scheduler.submit(request({ declaredLane: "bulk" })));
    assert.equal(declared.lane, "bulk");
    await run(clock, drain(declared));
    assertIdle(scheduler);
  });

  it("holds a call the token budget cannot hold now on its replica until room frees; 413 for one it never could", async () => {
    const { clock, scheduler } = fleet(1, {
      budget: { ceilingTokens: 10_000 },
      lanes: { interactive: { maxResidenceMs: 60_000 } },
    });
    const first = await run(
      clock,
      scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(6000) }, maxTokens: 2000 })),
    );
    let admitted: AdmittedCall | undefined;
    const waiting = scheduler
      .submit(request({ input: { kind: "tokens", tokens: tokens(4000, 7) } }))
      .then((call) => {
        admitted = call;
        return call;
      });
    await clock.advanceAsync(1_000);
    assert.equal(admitted, undefined, "it waits while the first call holds the budget");
    assert.equal(scheduler.idleCheck().queued, 1);
    assert.deepEqual(scheduler.state().replicas[0]!.budget.queue, {
      interactive: 1,
      bulk: 0,
      tokens: 4050,
      oldestWaitMs: 1000,
      limit: 256,
    });
    await assert.rejects(
      run(clock, scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(9500, 3) } }))),
      refusalWith("context_limit", 413),
    );
    await run(clock, drain(first));
    const second = await run(clock, waiting);
    assert.ok(second.queueMs >= 1_000, `it waited for the budget (${second.queueMs} ms)`);
    await run(clock, drain(second));
    assert.deepEqual(scheduler.state().rejections, { context_limit: 1 });
    assertIdle(scheduler);
  });

  it("refuses a budget wait with 429 token_budget_exhausted once it outlives its lane's residence time or its shorter queue TTL", async () => {
    const { clock, scheduler } = fleet(1, {
      budget: { ceilingTokens: 10_000 },
      lanes: { interactive: { maxResidenceMs: 3_000 } },
    });
    const first = await run(
      clock,
      scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(6000) }, maxTokens: 2000 })),
    );
    const big = () => request({ input: { kind: "tokens", tokens: tokens(4000, 7) } });
    let from = clock.now();
    await assert.rejects(run(clock, scheduler.submit(big())), refusalWith("token_budget_exhausted", 429));
    assert.equal(clock.now() - from, 3_000, "the lane's residence time");
    from = clock.now();
    await assert.rejects(
      run(clock, scheduler.submit({ ...big(), queueTtlMs: 500 })),
      refusalWith("token_budget_exhausted", 429),
    );
    assert.equal(clock.now() - from, 500, "a shorter queue TTL");
    from = clock.now();
    await assert.rejects(
      run(clock, scheduler.submit({ ...big(), queueTtlMs: 60_000 })),
      refusalWith("token_budget_exhausted", 429),
    );
    assert.equal(clock.now() - from, 3_000, "a longer queue TTL does not lengthen the wait");
    from = clock.now();
    await assert.rejects(
      run(clock, scheduler.submit({ ...big(), queueTtlMs: 0 })),
      refusalWith("token_budget_exhausted", 429),
    );
    assert.equal(clock.now() - from, 0, "a TTL of 0 refuses at once");
    assert.equal(scheduler.idleCheck().queued, 0);
    await run(clock, drain(first));
    assertIdle(scheduler);
  });

  it("refuses at once with 429 token_budget_exhausted when the budget queue is full (0: no queue at all)", async () => {
    for (const queueLimit of [0, 1]) {
      const { clock, scheduler } = fleet(1, {
        budget: { ceilingTokens: 10_000, queueLimit },
        lanes: { interactive: { maxResidenceMs: 60_000 } },
      });
      const first = await run(
        clock,
        scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(6000) }, maxTokens: 2000 })),
      );
      const big = () => request({ input: { kind: "tokens", tokens: tokens(4000, 7) } });
      const queued = queueLimit > 0 ? scheduler.submit(big()) : undefined;
      queued?.catch(() => undefined);
      const from = clock.now();
      await assert.rejects(run(clock, scheduler.submit(big())), refusalWith("token_budget_exhausted", 429));
      assert.equal(clock.now() - from, 0, `queue limit ${queueLimit}: refused at once`);
      await run(clock, drain(first));
      if (queued) await run(clock, drain(await run(clock, queued)));
      assertIdle(scheduler);
    }
  });

  it("withdraws a call whose signal aborts while it waits for budget, holding nothing", async () => {
    const { clock, scheduler } = fleet(1, { budget: { ceilingTokens: 10_000 } });
    const first = await run(
      clock,
      scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(6000) }, maxTokens: 2000 })),
    );
    const abort = new AbortController();
    const waiting = scheduler.submit(
      request({ input: { kind: "tokens", tokens: tokens(4000, 7) }, signal: abort.signal }),
    );
    waiting.catch(() => undefined);
    await clock.advanceAsync(500);
    assert.equal(scheduler.idleCheck().queued, 1);
    abort.abort();
    await assert.rejects(waiting, (error: unknown) => (error as Error).name === "AbortError");
    assert.equal(scheduler.idleCheck().queued, 0);
    await run(clock, drain(first));
    assertIdle(scheduler);
  });

  it("places a call its prefix's replica cannot hold in another replica's budget instead of refusing it", async () => {
    const { clock, scheduler } = fleet(2, { budget: { ceilingTokens: 10_000 } });
    const head = await run(
      clock,
      scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(2000) } })),
    );
    await run(clock, drain(head));
    const running = await run(
      clock,
      scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(6000) }, maxTokens: 2000 })),
    );
    assert.equal(running.replica, head.replica);
    await clock.advanceAsync(3000); // its prefill done, it decodes for a while yet
    // That replica holds the next call's first 1,984 tokens (31 blocks) but has 10,000 − 6,016 −
    // 1,000 = 2,984 tokens left of the 5,066 the call would add there; the other can hold its 7,050.
    const prompt = [...tokens(2000), ...tokens(5000, 50_000)];
    const moved = await run(clock, scheduler.submit(request({ input: { kind: "tokens", tokens: prompt } })));
    assert.notEqual(moved.replica, head.replica);
    await run(clock, Promise.all([drain(running), drain(moved)]));
    assertIdle(scheduler);
  });

  it("refuses a call whose predicted first token misses its deadline with 429 deadline_infeasible", async () => {
    const { clock, scheduler } = fleet(1);
    await assert.rejects(
      run(
        clock,
        scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(60_000) }, deadlineMs: 50 })),
      ),
      refusalWith("deadline_infeasible", 429),
    );
    const fits = await run(clock, scheduler.submit(request({ deadlineMs: 5_000 })));
    await run(clock, drain(fits));
    assertIdle(scheduler);
  });

  it("predicts an interactive call's first token behind queued interactive work, not the bulk it overtakes", async () => {
    const { clock, scheduler } = fleet(1, {
      gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 8 },
    });
    const running = await run(clock, scheduler.submit(request({ maxTokens: 1000 })));
    await clock.advanceAsync(500); // its prefill is done: nothing in flight ahead of the next calls
    const bulk = scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(60_000, 100_000) } }));
    await clock.advanceAsync(1);
    assert.equal(scheduler.state().replicas[0]!.gate.queued, 1);
    // 60,000 queued bulk tokens take ~1.3 s to prefill at the simulated 45,000 tokens/s: another
    // bulk call waits behind them and cannot meet 1 s …
    await assert.rejects(
      run(
        clock,
        scheduler.submit(
          request({ input: { kind: "tokens", tokens: tokens(5_000, 200_000) }, deadlineMs: 1_000 }),
        ),
      ),
      refusalWith("deadline_infeasible", 429),
    );
    // … while an interactive call goes ahead of them (docs/how-it-works.md#token-budget-and-feasibility) and can.
    let bulkAdmitted = false;
    bulk.then(
      () => {
        bulkAdmitted = true;
      },
      () => undefined,
    );
    const interactive = await run(
      clock,
      scheduler.submit(
        request({ input: { kind: "tokens", tokens: tokens(500, 300_000) }, deadlineMs: 1_000 }),
      ),
    );
    assert.equal(interactive.lane, "interactive");
    assert.equal(bulkAdmitted, false, "the interactive call overtook the queued bulk call");
    await run(clock, Promise.all([drain(running), drain(interactive), bulk.then(drain)]));
    assertIdle(scheduler);
  });

  it("answers a full gate with 529 worker_overloaded and marks the replica busy", async () => {
    const { clock, scheduler } = fleet(2, {
      policy: "gate",
      gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 0 },
    });
    const a = await run(clock, scheduler.submit(request()));
    const b = await run(clock, scheduler.submit(request()));
    assert.notEqual(a.replica, b.replica);
    await assert.rejects(run(clock, scheduler.submit(request())), (error: unknown) => {
      assert.ok(error instanceof GateRejection);
      assert.equal(error.status, 529);
      assert.equal(error.scope, "worker");
      return true;
    });
    assert.equal(scheduler.state().replicas.filter((replica) => replica.busy).length, 1);
    await run(clock, Promise.all([drain(a), drain(b)]));
    assertIdle(scheduler);
  });

  it("releases everything when a call is cancelled while queued, before its first token and mid-stream", async () => {
    const { clock, scheduler } = fleet(1, {
      gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 4 },
    });
    const running = await run(clock, scheduler.submit(request({ maxTokens: 400 })));
    const controller = new AbortController();
    const queued = scheduler.submit(request({ signal: controller.signal }));
    await clock.advanceAsync(1);
    assert.equal(scheduler.state().replicas[0]!.gate.queued, 1);
    controller.abort(new DOMException("client left", "AbortError"));
    await assert.rejects(queued, { name: "AbortError" });
    // Mid-stream: read one chunk, then stop reading.
    const iterator = running[Symbol.asyncIterator]();
    await run(clock, iterator.next());
    await iterator.return?.();
    await clock.advanceAsync(10);
    assertIdle(scheduler);
    // Cancel before the first token.
    const early = await run(
      clock,
      scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(20_000) } })),
    );
    early.cancel();
    await clock.advanceAsync(10);
    assertIdle(scheduler);
    const counters = scheduler.state().replicas[0]!.gate.counters;
    assert.equal(
      counters.received,
      counters.admittedDirect + counters.admittedQueue + counters.rejected + counters.cancelled,
    );
    await scheduler.stop();
  });

  it("pins a session's steps to one replica and reports it", async () => {
    const routes: string[] = [];
    const { clock, scheduler } = fleet(3, {}, { route: (e) => routes.push(`${e.replica}:${e.reason}`) });
    let context = tokens(3000);
    const replicas = new Set<string>();
    for (let step = 0; step < 4; step++) {
      const call = await run(
        clock,
        scheduler.submit(request({ sessionId: "s1", input: { kind: "tokens", tokens: context } })),
      );
      replicas.add(call.replica);
      await run(clock, drain(call));
      context = [...context, ...tokens(700, 50_000 + step * 1000)];
    }
    assert.equal(replicas.size, 1);
    assert.deepEqual(
      routes.slice(1).map((route) => route.split(":")[1]),
      ["pinned", "pinned", "pinned"],
    );
    const view = scheduler.getSession("s1");
    assert.equal(view?.state, "active");
    assert.equal(view?.steps, 4);
    assert.ok(scheduler.closeSession("s1"));
    assert.equal(scheduler.getSession("s1")?.state, "closed");
    assertIdle(scheduler);
  });

  it("lets a session go when its pinned replica's KV usage reaches the affinity break", async () => {
    const routes: string[] = [];
    const { clock, scheduler, engines } = fleet(
      2,
      {},
      { route: (e) => routes.push(`${e.replica}:${e.reason}`) },
    );
    const first = await run(clock, scheduler.submit(request({ sessionId: "s1" })));
    await run(clock, drain(first));
    const pinned = engines.find((engine) => engine.id === first.replica)!;
    pinned.bend = (signals) => ({ ...signals, kvUsage: 0.9 });
    await clock.advanceAsync(2_000); // one control tick reads the bent signals
    const second = await run(clock, scheduler.submit(request({ sessionId: "s1" })));
    console.log("DBG", first.replica, second.replica);
    assert.notEqual(second.replica, first.replica);
    assert.equal(routes.at(-1), `${second.replica}:affinity_break`);
    await run(clock, drain(second));
    assert.equal(scheduler.getSession("s1")?.replica, second.replica);
    scheduler.closeSession("s1");
    assertIdle(scheduler);
  });

  it("moves a paused session to a replica with room when its own window has none, as an affinity break", async () => {
    const routes: string[] = [];
    const { clock, scheduler, engines } = fleet(
      2,
      { window: { unit: "sessions", initial: 2, max: 2 } },
      { route: (e) => routes.push(`${e.replica}:${e.reason}`) },
    );
    const prompt = tokens(600);
    const a = await run(
      clock,
      scheduler.submit(request({ sessionId: "a", input: { kind: "tokens", tokens: prompt } })),
    );
    await run(clock, drain(a));
    const b = await run(
      clock,
      scheduler.submit(request({ sessionId: "b", input: { kind: "tokens", tokens: prompt } })),
    );
    await run(clock, drain(b));
    assert.equal(b.replica, a.replica, "the shared prefix pins both to one replica");
    const home = engines.find((engine) => engine.id === a.replica)!;
    let lookups = { hits: 0, queries: 0 };
    home.bend = (signals) => ({
      ...signals,
      kvUsage: 0.8,
      prefixHitTokens: lookups.hits,
      prefixQueryTokens: lookups.queries,
    });
    await clock.advanceAsync(2_000);
    lookups = { hits: 10, queries: 1000 }; // thrash: the home window halves to 1 and b, the younger, pauses
    await clock.advanceAsync(2_000);
    assert.equal(scheduler.getSession("b")?.state, "paused");
    const moved = await run(
      clock,
      scheduler.submit(request({ sessionId: "b", input: { kind: "tokens", tokens: prompt } })),
    );
    assert.notEqual(moved.replica, a.replica);
    assert.equal(routes.at(-1), `${moved.replica}:affinity_break`);
    await run(clock, drain(moved));
    scheduler.closeSession("a");
    scheduler.closeSession("b");
    assertIdle(scheduler);
  });

  it("halves the token window when calls lose the prefix hits predicted for them, once per episode", async () => {
    const { clock, scheduler, engines, windowTokens, start } = await loadedWindow(ABOVE_CAPACITY);
    const call = async (cached: number) => {
      engines[0]!.bendCached = (found) => Math.min(found, cached);
      const admitted = await run(
        clock,
        scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(1000) } })),
      );
      await run(clock, drain(admitted));
    };
    await call(Number.POSITIVE_INFINITY);
    await call(Number.POSITIVE_INFINITY);
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), start, "the second call found its prefix: nothing lost");
    await clock.advanceAsync(10_000);
    // The prefix was predicted cached; the engine reports a call that found 16 of its ~990 tokens.
    await call(16);
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), Math.floor(start / 2), "the predicted hit was lost: thrash");
    await clock.advanceAsync(10_000);
    assert.equal(windowTokens(), Math.floor(start / 2), "the episode it acted on does not cut again");
    assertIdle(scheduler);
  });

  it("does not cut again for a call sent before the cut that finds its prefix lost after it", async () => {
    const { clock, scheduler, engines, windowTokens, start } = await loadedWindow(ABOVE_CAPACITY);
    const send = (maxTokens: number) =>
      run(clock, scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(1000) }, maxTokens })));
    await run(clock, drain(await send(50)));
    await clock.advanceAsync(12_000); // its delivered hit has left the horizon
    engines[0]!.bendCached = (found) => Math.min(found, 16);
    const long = await send(3000);
    await run(clock, drain(await send(50)));
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), Math.floor(start / 2), "the predicted hit was lost: thrash");
    await run(clock, drain(long));
    await clock.advanceAsync(4_000);
    assert.equal(
      windowTokens(),
      Math.floor(start / 2),
      "a call sent before the cut says nothing of the window after it",
    );
    assertIdle(scheduler);
  });

  it("reads as thrash only hits lost by sessions the window held, not by one that waited for its place", async () => {
    const { clock, scheduler, engines, windowTokens, start } = await loadedWindow(ABOVE_CAPACITY);
    const prompt = tokens(1000);
    const step = async (sessionId: string, input: number[], cached: number) => {
      engines[0]!.bendCached = (found) => Math.min(found, cached);
      const admitted = await run(
        clock,
        scheduler.submit(request({ sessionId, input: { kind: "tokens", tokens: input } })),
      );
      await run(clock, drain(admitted));
    };
    await step("a", prompt, Number.POSITIVE_INFINITY);
    // b's first step shares a's prompt, so its prefix is predicted cached; the engine found none of it.
    await step("b", prompt, 16);
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), start, "a session's first step: the window held nothing of it");
    // a comes back while holding its place, and its predicted prefix is gone: thrash.
    await step("a", [...prompt, ...tokens(200, 50_000)], 16);
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), Math.floor(start / 2));
    scheduler.closeSession("a");
    scheduler.closeSession("b");
    assertIdle(scheduler);
  });

  for (const holdWithinCapacity of [false, true]) {
    it(`${holdWithinCapacity ? "with --window-hold-within-capacity, does not cut" : "cuts (docs/how-it-works.md#session-window-tokens-of-cache-footprint)"} a window within the KV capacity less the guard band on thrash`, async () => {
      const { clock, scheduler, engines, windowTokens, start } = await loadedWindow({
        window: { holdWithinCapacity },
      });
      assert.ok(start <= 439_000 * 0.9, `the first W is the capacity less the guard band, got ${start}`);
      for (const cached of [Number.POSITIVE_INFINITY, 16]) {
        engines[0]!.bendCached = (found) => Math.min(found, cached);
        const admitted = await run(
          clock,
          scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(1000) } })),
        );
        await run(clock, drain(admitted));
      }
      await clock.advanceAsync(2_000);
      if (holdWithinCapacity) {
        assert.equal(
          windowTokens(),
          start,
          "its contexts all fit: what they lost, calls outside it pushed out",
        );
      } else {
        assert.equal(windowTokens(), Math.floor(start / 2), "U > U_high and H < H_low cut W by β");
      }
      assertIdle(scheduler);
    });
  }

  it("does not read a lookup counted in another interval than its prediction as thrash", async () => {
    const { clock, scheduler, engines } = fleet(1, ABOVE_CAPACITY);
    const windowTokens = () => scheduler.state().replicas[0]!.window.sizeTokens!;
    let lookups = { hits: 0, queries: 0 };
    engines[0]!.bend = (signals) => ({
      ...signals,
      kvUsage: 0.8,
      prefixHitTokens: lookups.hits,
      prefixQueryTokens: lookups.queries,
    });
    await clock.advanceAsync(2_000);
    const start = windowTokens();
    for (let i = 0; i < 2; i++) {
      const call = await run(
        clock,
        scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(1000) } })),
      );
      await run(clock, drain(call));
    }
    // The counters show the interval's lookups as misses (another call's, counted late), but the
    // engine reported the predicted call's prefix cached: the hits were delivered.
    lookups = { hits: 50, queries: 1000 };
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), start);
    assertIdle(scheduler);
  });

  it("grows the token window only while KV usage stayed below U_low over the last few intervals", async () => {
    const { clock, scheduler, engines } = fleet(1, { window: { kvLow: 0.2, initialTokens: 20_000 } });
    const windowTokens = () => scheduler.state().replicas[0]!.window.sizeTokens!;
    let kvUsage = 0.8;
    engines[0]!.bend = (signals) => ({ ...signals, kvUsage });
    // Sessions wait: two sessions whose first steps together outgrow the window.
    const big = 12_000;
    const first = await run(
      clock,
      scheduler.submit(
        request({ sessionId: "a", maxTokens: 20, input: { kind: "tokens", tokens: tokens(big - 20) } }),
      ),
    );
    const second = scheduler.submit(
      request({
        sessionId: "b",
        maxTokens: 20,
        input: { kind: "tokens", tokens: tokens(big - 20, 1_000_000) },
      }),
    );
    second.catch(() => undefined);
    await clock.advanceAsync(2_000);
    const start = windowTokens();
    assert.equal(scheduler.getSession("b")?.state, "waiting");
    kvUsage = 0.1;
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), start, "one quiet interval after a busy one: W holds");
    await clock.advanceAsync(10_000);
    assert.ok(windowTokens() > start, "quiet over the whole horizon: W grows");
    await run(clock, drain(first));
    await run(clock, drain(await run(clock, second)));
    scheduler.closeSession("a");
    scheduler.closeSession("b");
    assertIdle(scheduler);
  });

  it("reads thrash from the engine's counters where it reports no cached tokens per call", async () => {
    const { clock, scheduler, engines } = fleet(1, ABOVE_CAPACITY);
    const windowTokens = () => scheduler.state().replicas[0]!.window.sizeTokens!;
    engines[0]!.bendCached = () => 0;
    let lookups = { hits: 0, queries: 0 };
    engines[0]!.bend = (signals) => ({
      ...signals,
      kvUsage: 0.8,
      prefixHitTokens: lookups.hits,
      prefixQueryTokens: lookups.queries,
    });
    await clock.advanceAsync(2_000);
    const start = windowTokens();
    // The same prompt twice: placement predicts the second one's prefix cached (0.48 of the interval's tokens).
    for (let i = 0; i < 2; i++) {
      const call = await run(
        clock,
        scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(1000) } })),
      );
      await run(clock, drain(call));
    }
    lookups = { hits: 50, queries: 1000 };
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), Math.floor(start / 2), "0.05 measured of 0.48 predicted: thrash");
    await clock.advanceAsync(4_000);
    assert.equal(windowTokens(), Math.floor(start / 2), "no lookups, no measurement: no second cut");
    engines[0]!.bend = (signals) => ({ ...signals, kvUsage: 0 });
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), Math.floor(start / 2), "nobody waits: W holds");
    assertIdle(scheduler);
  });

  it("does not take a low hit rate the router predicted for thrash", async () => {
    const { clock, scheduler, engines } = fleet(1, ABOVE_CAPACITY);
    const windowTokens = () => scheduler.state().replicas[0]!.window.sizeTokens!;
    let lookups = { hits: 0, queries: 0 };
    engines[0]!.bend = (signals) => ({
      ...signals,
      kvUsage: 0.8,
      prefixHitTokens: lookups.hits,
      prefixQueryTokens: lookups.queries,
    });
    await clock.advanceAsync(2_000);
    const start = windowTokens();
    // Prompts with nothing in common: placement predicts no hits, as on a trace with little reuse.
    for (let i = 0; i < 2; i++) {
      const call = await run(
        clock,
        scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(1000, 10_000 * (i + 1)) } })),
      );
      await run(clock, drain(call));
    }
    lookups = { hits: 50, queries: 1000 };
    await clock.advanceAsync(2_000);
    assert.equal(windowTokens(), start, "5 % hits where none were predicted: nothing lost, W holds");
    assertIdle(scheduler);
  });

  it("halves the session-count window once per measured thrash interval, not again on a rate an idle interval did not measure", async () => {
    const { clock, scheduler, engines } = fleet(1, { window: { unit: "sessions" } });
    const windowSize = () => scheduler.state().replicas[0]!.window.size;
    let lookups = { hits: 0, queries: 0 };
    engines[0]!.bend = (signals) => ({
      ...signals,
      kvUsage: 0.8,
      prefixHitTokens: lookups.hits,
      prefixQueryTokens: lookups.queries,
    });
    await clock.advanceAsync(2_000); // baseline reading
    const start = windowSize()!;
    lookups = { hits: 50, queries: 1000 }; // one interval: 5 % hits at 80 % KV → thrash
    await clock.advanceAsync(2_000);
    assert.equal(windowSize(), Math.floor(start / 2));
    await clock.advanceAsync(2_000); // no lookups: nothing new measured
    await clock.advanceAsync(2_000);
    assert.equal(windowSize(), Math.floor(start / 2), "the carried-over rate does not shrink it again");
    lookups = { hits: 60, queries: 2000 }; // a second measured thrash interval
    await clock.advanceAsync(2_000);
    assert.equal(windowSize(), Math.floor(start / 4));
    engines[0]!.bend = (signals) => ({ ...signals, kvUsage: 0 }); // low KV grows it without lookups
    await clock.advanceAsync(2_000);
    assert.equal(windowSize(), Math.floor(start / 4) + 2);
    assertIdle(scheduler);
  });

  it("fails closed on stale signals for new sessions while active ones continue", async () => {
    const { clock, scheduler, engines } = fleet(1);
    const active = await run(clock, scheduler.submit(request({ sessionId: "old" })));
    await run(clock, drain(active));
    const engine = engines[0]!;
    engine.bend = (signals) => ({ ...signals, readAtMs: clock.now() - 60_000 });
    await clock.advanceAsync(2_000);
    await assert.rejects(
      run(clock, scheduler.submit(request({ sessionId: "new" }))),
      refusalWith("unavailable", 503),
    );
    const again = await run(clock, scheduler.submit(request({ sessionId: "old" })));
    await run(clock, drain(again));
    // One-off calls skip session admission; the gate still bounds them.
    const oneOff = await run(clock, scheduler.submit(request()));
    await run(clock, drain(oneOff));
    scheduler.closeSession("old");
    scheduler.closeSession("new");
    assertIdle(scheduler);
  });

  it("reports replica health changes and overload stage changes as events, with their causes", async () => {
    const health: { replica: string; healthy: boolean; cause: string }[] = [];
    const stages: { from: string; to: string; cause: string }[] = [];
    const clock = new VirtualClock();
    const engines = [1, 2].map((i) => new BentSignals(new SimEngine({ id: `r${i}`, clock })));
    engines[1]!.bend = (signals) => ({ ...signals, healthy: false });
    const scheduler = new Scheduler({
      engines,
      clock,
      config: {
        gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 8 },
        overload: { objectiveMs: 1, windowMs: 1000, bulkPauseAfter: 1 },
      },
      events: { health: (e) => health.push(e), stage: (e) => stages.push(e) },
    });
    scheduler.start();
    assert.equal(health.length, 1, "a replica unhealthy from the start is news; a healthy one is not");
    assert.equal(health[0]!.replica, "r2");
    assert.equal(health[0]!.healthy, false);
    assert.match(health[0]!.cause, /since start-up/);
    engines[1]!.bend = (signals) => signals;
    await clock.advanceAsync(2_000);
    assert.deepEqual(
      health.map((e) => [e.replica, e.healthy]),
      [
        ["r2", false],
        ["r2", true],
      ],
    );
    const calls = [0, 1, 2].map((i) =>
      scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(200, i * 10_000) } })),
    );
    const admitted = await run(clock, Promise.all(calls));
    await run(clock, Promise.all(admitted.map(drain)));
    await clock.advanceAsync(1000);
    assert.equal(stages.length, 1);
    assert.equal(stages[0]!.from, "normal");
    assert.equal(stages[0]!.to, "bulk_paused");
    assert.match(stages[0]!.cause, /p95 interactive gate queue age \d+ ms/);
    assertIdle(scheduler);
  });

  it("with --stale-signals open admits new sessions on stale signals", async () => {
    const { clock, scheduler, engines } = fleet(1, { sessions: { staleSignals: "open" } });
    engines[0]!.bend = (signals) => ({ ...signals, readAtMs: clock.now() - 60_000 });
    await clock.advanceAsync(2_000);
    const call = await run(clock, scheduler.submit(request({ sessionId: "new" })));
    await run(clock, drain(call));
    scheduler.closeSession("new");
    assertIdle(scheduler);
  });

  it("refuses sessions beyond a full window and session queue with 429 session_queue_full", async () => {
    const { clock, scheduler } = fleet(1, {
      window: { unit: "sessions", initial: 1, max: 1 },
      sessions: { queueLimit: 0 },
    });
    const a = await run(clock, scheduler.submit(request({ sessionId: "a" })));
    await run(clock, drain(a));
    await assert.rejects(
      run(clock, scheduler.submit(request({ sessionId: "b" }))),
      refusalWith("session_queue_full", 429),
    );
    scheduler.closeSession("a");
    const b = await run(clock, scheduler.submit(request({ sessionId: "b" })));
    await run(clock, drain(b));
    scheduler.closeSession("b");
    assertIdle(scheduler);
  });

  it("admits a session whose prompt shares the window's system prompt by its own part only", async () => {
    // W of 20,000 tokens; each session's first step is its 12,000-token prompt plus 50 output tokens.
    const { clock, scheduler } = fleet(1, { window: { initialTokens: 20_000 } });
    const system = tokens(8_000, 1_000_000);
    const prompt = (owner: number) => [...system, ...tokens(4_000, owner * 10_000)];
    const a = await run(
      clock,
      scheduler.submit(request({ sessionId: "a", input: { kind: "tokens", tokens: prompt(1) } })),
    );
    const b = await run(
      clock,
      scheduler.submit(request({ sessionId: "b", input: { kind: "tokens", tokens: prompt(2) } })),
    );
    const window = scheduler.state().replicas[0]!.window;
    assert.equal(window.active, 2, "12,050 + 12,050 > 20,000, but 8,000 of each are the same 125 blocks");
    assert.equal(window.footprintTokens, 2 * 12_050, "docs/metrics.md: the sum of the footprints");
    assert.equal(window.sharedPrefixTokens, 8_000, "of which the shared prefix the window holds once");
    await run(clock, drain(a));
    await run(clock, drain(b));
    scheduler.closeSession("a");
    scheduler.closeSession("b");
    assert.equal(scheduler.state().replicas[0]!.window.footprintTokens, 0);
    assertIdle(scheduler);
  });

  it("makes a waiting session's step wait for a slot and time out with 429 queue_timeout", async () => {
    const { clock, scheduler } = fleet(1, {
      window: { unit: "sessions", initial: 1, max: 1 },
      sessions: { waitLimitMs: 30_000 },
    });
    const a = await run(clock, scheduler.submit(request({ sessionId: "a" })));
    await run(clock, drain(a));
    const waiting = scheduler.submit(request({ sessionId: "b" }));
    waiting.catch(() => undefined);
    await clock.advanceAsync(10_000);
    assert.equal(scheduler.getSession("b")?.state, "waiting");
    await clock.advanceAsync(20_001);
    await assert.rejects(waiting, refusalWith("queue_timeout", 429));
    scheduler.closeSession("a");
    scheduler.closeSession("b");
    assertIdle(scheduler);
  });

  it("refuses every new call with 503 once draining", async () => {
    const { clock, scheduler } = fleet(1);
    scheduler.drain();
    await assert.rejects(run(clock, scheduler.submit(request())), refusalWith("unavailable", 503));
    assertIdle(scheduler);
  });
});

describe("the prefix index while a call runs", () => {
  /**
   * One replica of 40,000 KV tokens (625 router blocks of 64). A's 8,000-token prompt is cached;
   * then B takes 34,000 tokens anew, and the engine keeps of A only what fits beside B. While B
   * runs, A's opening comes back: the router records B's blocks when B ends, so it must count
   * them out of the GPU memory it predicts from while B runs, or it predicts all of A.
   */
  async function whileALargeCallRuns(policy: "gate-prefix" | "sluice") {
    const clock = new VirtualClock();
    const engine = new SimEngine({
      id: "r1",
      clock,
      preset: { base: "h100-llama3-8b", kvCapacityTokens: 40_000 },
    });
    const predicted: number[] = [];
    let firstTokens = 0;
    const scheduler = new Scheduler({
      engines: [engine],
      clock,
      config: { policy },
      events: {
        route: (e) => predicted.push(e.predictedHitTokens),
        firstToken: () => firstTokens++,
      },
    });
    scheduler.start();
    const submit = (prompt: number[], maxTokens: number) =>
      run(clock, scheduler.submit(request({ input: { kind: "tokens", tokens: prompt }, maxTokens })));
    const a = tokens(8_000);
    await run(clock, drain(await submit(a, 20)));
    const b = await submit(tokens(34_000, 1_000_000), 200);
    const bDrained = drain(b);
    await clock.runAsyncUntil(() => firstTokens === 2, 10_000_000);
    const again = await submit([...a.slice(0, 7_000), ...tokens(64, 2_000_000)], 20);
    await run(clock, Promise.all([drain(again), bDrained]));
    const cached = (await again.result).cachedTokens;
    await scheduler.stop();
    return { predicted: predicted.at(-1)!, cached, scheduler };
  }

  for (const policy of ["gate-prefix", "sluice"] as const) {
    it(`counts what running calls took out of the KV capacity (${policy}): it predicts what the engine kept`, async () => {
      const { predicted, cached, scheduler } = await whileALargeCallRuns(policy);
      // Beside B's 34,000 tokens the engine kept about 6,000 of A's 8,000 (less what B's output took).
      assert.ok(cached > 5_000 && cached < 6_500, `engine kept ${cached} tokens of A`);
      assert.ok(
        Math.abs(predicted - cached) <= 4 * 64,
        `router predicted ${predicted} cached tokens, the engine had ${cached}`,
      );
      assertIdle(scheduler);
    });
  }
});

/** A simulated replica that can stall: each call waits `stallMs` before the engine starts it. */
class Stalling extends BentSignals {
  stallMs = 0;
  constructor(
    inner: SimEngine,
    private readonly clock: VirtualClock,
  ) {
    super(inner);
  }
  override async generate(call: EngineCall): Promise<EngineStream> {
    if (this.stallMs > 0) await new Promise<void>((resolve) => this.clock.setTimeout(resolve, this.stallMs));
    return super.generate(call);
  }
}

describe("feasibility on an idle replica", () => {
  it("admits a call on a replica with nothing running although a stall drove the learned prefill rate to its floor", async () => {
    const clock = new VirtualClock();
    const engine = new Stalling(new SimEngine({ id: "r1", clock, preset: "h100-llama3-8b" }), clock);
    const scheduler = new Scheduler({ engines: [engine], clock });
    scheduler.start();
    const rate = () => scheduler.state().replicas[0]!.signals.prefillTokensPerSecond;
    // A burst through a stalled engine: every first token comes 40 s after admission, so each
    // sample reads 2,000 tokens in 40 s and the estimate falls to its floor of 100 tokens/s.
    engine.stallMs = 40_000;
    const burst = await run(
      clock,
      Promise.all(
        Array.from({ length: 40 }, (_, i) =>
          scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(2000, i * 10_000) } })),
        ),
      ),
    );
    await run(clock, Promise.all(burst.map(drain)));
    assert.equal(rate(), 100);
    assertIdle(scheduler);
    // Nothing runs now: at 100 tokens/s a 2,000-token call would be predicted 20 s, over the
    // interactive lane's 10 s, and refused every time it came back, since only a call that runs
    // brings a new sample. The idle replica prices it at its starting rate instead.
    engine.stallMs = 0;
    const call = await run(
      clock,
      scheduler.submit(request({ input: { kind: "tokens", tokens: tokens(2000, 900_000) } })),
    );
    await run(clock, drain(call));
    assert.ok(rate() > 100, `the call's own sample moves the estimate up again, got ${rate()}`);
    assertIdle(scheduler);
    await scheduler.stop();
  });
});
