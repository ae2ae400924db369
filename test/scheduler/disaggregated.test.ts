/** @module A fleet of prefill and decode replicas: decode room checked before prefill, two gates, two budgets, nothing leaked. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { VirtualClock } from "../../src/clock.js";
import { policyFeatures } from "../../src/config/policy-features.js";
import { resolveSchedulerConfig, type SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import type { Engine, EngineCall, EngineSignals, EngineStream } from "../../src/engine.js";
import { EngineError, Refusal } from "../../src/errors.js";
import { DisaggregatedPath, type RoutedCall } from "../../src/scheduler/disaggregated-path.js";
import { ReplicaRuntime } from "../../src/scheduler/replica-runtime.js";
import { Scheduler } from "../../src/scheduler.js";
import type { AdmittedCall, CallRequest, SchedulerEvents } from "../../src/types.js";

/** A real simulated replica whose decode calls can be made to fail. */
class Replica implements Engine {
  readonly id: string;
  readonly role;
  failDecode = false;
  failPrefill = false;
  constructor(readonly sim: SimEngine) {
    this.id = sim.id;
    this.role = sim.role;
  }
  models(): readonly string[] {
    return this.sim.models();
  }
  generate(call: EngineCall): Promise<EngineStream> {
    if (this.failDecode && call.kvTransferParams?.do_remote_prefill === true) {
      return Promise.reject(new EngineError("connection refused"));
    }
    if (this.failPrefill && call.kvTransferParams?.do_remote_decode === true) {
      return Promise.reject(new EngineError("connection refused"));
    }
    return this.sim.generate(call);
  }
  signals(): EngineSignals {
    return this.sim.signals();
  }
  contextWindow(): number {
    return 131_072;
  }
}

function pdFleet(config: SchedulerConfigInput = {}, decodeKvTokens = 439_000, events?: SchedulerEvents) {
  const clock = new VirtualClock();
  const prefill = new Replica(new SimEngine({ id: "prefill-0", role: "prefill", clock }));
  const decode = new Replica(
    new SimEngine({ id: "decode-0", role: "decode", clock, kvCapacityTokens: decodeKvTokens }),
  );
  const scheduler = new Scheduler({
    engines: [prefill, decode],
    clock,
    config,
    ...(events ? { events } : {}),
  });
  scheduler.start();
  return { clock, prefill, decode, scheduler };
}

function tokens(n: number, offset = 0): number[] {
  return Array.from({ length: n }, (_, i) => offset + i);
}

let next = 0;
function request(prompt: number[], maxTokens: number, extra: Partial<CallRequest> = {}): CallRequest {
  return {
    requestId: `req-${next++}`,
    endpoint: "completions",
    input: { kind: "tokens", tokens: prompt },
    maxTokens,
    stream: true,
    ...extra,
  };
}

async function drain(call: AdmittedCall): Promise<number> {
  let count = 0;
  for await (const chunk of call) count += chunk.tokenCount;
  return count;
}

async function run<T>(clock: VirtualClock, promise: Promise<T>): Promise<T> {
  let settled = false;
  const tracked = promise.finally(() => {
    settled = true;
  });
  tracked.catch(() => undefined);
  await clock.runAsyncUntil(() => settled, 10_000_000);
  return tracked;
}

async function settle(clock: VirtualClock, scheduler: Scheduler): Promise<void> {
  await scheduler.stop();
  await clock.runAsyncUntil(() => false, 10_000_000);
  assert.deepEqual(scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
}

describe("disaggregated prefill and decode", () => {
  it("runs a call as vLLM's two calls: the prefill computes the prompt, the decode receives its KV and generates", async () => {
    const { clock, prefill, decode, scheduler } = pdFleet();
    const call = await run(clock, scheduler.submit(request(tokens(3000), 40)));
    assert.equal(call.replica, "decode-0", "the answer comes from the decode replica");
    assert.equal(await run(clock, drain(call)), 40);
    assert.equal(prefill.sim.stats().prefillTokens, 3000);
    assert.equal(prefill.sim.stats().generationTokens, 1, "the prefill generated its one token only");
    assert.equal(decode.sim.stats().prefillTokens, 1, "the decode side computed only the last prompt token");
    assert.equal(decode.sim.transfers.transfers, 1);
    const state = scheduler.state();
    assert.deepEqual(
      state.replicas.map((r) => [r.id, r.role]),
      [
        ["prefill-0", "prefill"],
        ["decode-0", "decode"],
      ],
    );
    assert.deepEqual(state.disaggregation, {
      decodeCheck: "predicted",
      refusedAfterPrefill: 0,
      wastedPrefillTokens: 0,
    });
    await settle(clock, scheduler);
  });

  it("feeds the overload stages the time calls queued at its gates", async () => {
    const { clock, scheduler } = pdFleet({
      gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 8 },
      overload: { objectiveMs: 1, windowMs: 1000, bulkPauseAfter: 1 },
    });
    const calls = [0, 1, 2].map((i) => scheduler.submit(request(tokens(200, i * 10_000), 20)));
    for (const call of calls) call.catch(() => undefined);
    const admitted = await run(clock, Promise.all(calls));
    await run(clock, Promise.all(admitted.map(drain)));
    assert.ok(
      admitted.some((call) => call.queueMs > 1),
      "a call queued behind another at a gate",
    );
    await clock.advanceAsync(1000);
    assert.equal(
      scheduler.state().stage,
      "bulk_paused",
      "a window of interactive calls queued past the objective",
    );
    await settle(clock, scheduler);
  });

  it("holds a call before its prefill until a decode replica will have room for it, then runs it", async () => {
    const { clock, prefill, decode, scheduler } = pdFleet({}, 8192);
    const first = await run(clock, scheduler.submit(request(tokens(3000), 3000)));
    const firstDone = drain(first);
    const second = scheduler.submit(request(tokens(3000, 50_000), 3000));
    second.catch(() => undefined);
    await clock.advanceAsync(5000);
    assert.equal(prefill.sim.stats().prefillTokens, 3000, "the waiting call has cost no prefill");
    assert.equal(scheduler.idleCheck().reservations, 3, "the first call's two holds, and the waiting call");
    assert.equal(await run(clock, firstDone), 3000);
    const admitted = await run(clock, second);
    assert.equal(await run(clock, drain(admitted)), 3000);
    assert.equal(prefill.sim.stats().prefillTokens, 6000);
    assert.equal(decode.sim.stats().preemptions, 0, "the decode replica never ran out of KV");
    await settle(clock, scheduler);
  });

  it("follows a decode leg's output: a call fits beside one about to finish, not beside the same call just started", async () => {
    // About 8,100 usable tokens: the first call's 6,000 at its end and the second's 4,000 fit only one after the other.
    const { clock, prefill, scheduler } = pdFleet({}, 9000);
    const first = await run(clock, scheduler.submit(request(tokens(3000), 3000)));
    let streamed = 0;
    const firstDone = (async () => {
      for await (const chunk of first) streamed += chunk.tokenCount;
    })();
    const early = scheduler.submit(request(tokens(1000, 50_000), 3000));
    early.catch(() => undefined);
    await clock.advanceAsync(200);
    assert.equal(prefill.sim.stats().prefillTokens, 3000, "the second call waits before its prefill");
    while (prefill.sim.stats().prefillTokens === 3000 && streamed < 3000) await clock.advanceAsync(100);
    // Once the first call has under ~1,100 tokens to go it ends before the second has grown by as much.
    assert.ok(streamed < 3000, "the second call's prefill started while the first call was still decoding");
    assert.ok(streamed >= 1900, `not before the first call's end was near (${streamed} of 3000 streamed)`);
    const second = await run(clock, early);
    assert.equal(await run(clock, drain(second)), 3000);
    await run(clock, firstDone);
    assert.equal(streamed, 3000);
    await settle(clock, scheduler);
  });

  it("refuses before prefill when no decode replica will have room within the lane's wait: 429 decode_budget_exhausted, no prefill spent", async () => {
    const { clock, prefill, scheduler } = pdFleet({ lanes: { bulk: { maxResidenceMs: 2000 } } }, 8192);
    const first = await run(clock, scheduler.submit(request(tokens(3000), 3000)));
    const firstDone = drain(first);
    await clock.advanceAsync(1000);
    const before = prefill.sim.stats().prefillTokens;
    await assert.rejects(
      run(clock, scheduler.submit(request(tokens(3000, 50_000), 3000))),
      (error: Refusal) => {
        assert.ok(error instanceof Refusal);
        assert.equal(error.reason, "decode_budget_exhausted");
        assert.equal(error.status, 429);
        assert.ok(error.retryAfterSeconds! >= 1);
        return true;
      },
    );
    assert.equal(prefill.sim.stats().prefillTokens, before, "the refused call cost no prefill");
    assert.equal(scheduler.state().disaggregation?.wastedPrefillTokens, 0);
    assert.equal(await run(clock, firstDone), 3000);
    await settle(clock, scheduler);
  });

  it("without a decode check the same call is refused after its prefill ran, and its prefill is counted as wasted", async () => {
    const wasted: number[] = [];
    const { clock, prefill, scheduler } = pdFleet({ disaggregation: { decodeCheck: "none" } }, 8192, {
      wastedPrefill: (e) => wasted.push(e.tokens),
    });
    const first = await run(clock, scheduler.submit(request(tokens(3000), 3000)));
    const firstDone = drain(first);
    // Past a control interval: the decode replica's measured KV usage shows the first call.
    await clock.advanceAsync(2500);
    const before = prefill.sim.stats().prefillTokens;
    await assert.rejects(
      run(clock, scheduler.submit(request(tokens(3000, 50_000), 3000))),
      (error: Refusal) => {
        assert.equal(error.reason, "decode_budget_exhausted");
        return true;
      },
    );
    assert.equal(prefill.sim.stats().prefillTokens - before, 3000, "the prefill ran before the refusal");
    assert.deepEqual(wasted, [3000]);
    assert.deepEqual(scheduler.state().disaggregation, {
      decodeCheck: "none",
      refusedAfterPrefill: 1,
      wastedPrefillTokens: 3000,
    });
    assert.equal(await run(clock, firstDone), 3000);
    await settle(clock, scheduler);
  });

  it("takes its place at the decode replica's gate before the prefill and holds it through the hand-over", async () => {
    const { clock, prefill, scheduler } = pdFleet();
    const gateOf = (id: string) => scheduler.state().replicas.find((r) => r.id === id)!.gate;
    const pending = scheduler.submit(request(tokens(30_000), 20));
    pending.catch(() => undefined);
    await clock.advanceAsync(50);
    assert.ok(prefill.sim.stats().prefillTokens < 30_000, "the prefill is still running");
    assert.equal(gateOf("prefill-0").requests, 1);
    assert.equal(gateOf("decode-0").requests, 1, "the decode place is held while the prefill runs");
    const call = await run(clock, pending);
    assert.equal(gateOf("prefill-0").requests, 0);
    assert.equal(gateOf("decode-0").requests, 1, "the same place, now the decode leg's");
    assert.equal(await run(clock, drain(call)), 20);
    assert.equal(gateOf("decode-0").requests, 0);
    await settle(clock, scheduler);
  });

  it("a full decode gate refuses the call before its prefill: nothing computed, nothing wasted, nothing held", async () => {
    const { clock, prefill, scheduler } = pdFleet({ gate: { engineRequestLimit: 1, requestQueueLimit: 0 } });
    const first = await run(clock, scheduler.submit(request(tokens(1000), 2000)));
    const firstDone = drain(first);
    const before = prefill.sim.stats().prefillTokens;
    await assert.rejects(
      run(clock, scheduler.submit(request(tokens(1000, 50_000), 20))),
      (error: Refusal) => {
        assert.ok(error instanceof Refusal);
        assert.equal(error.reason, "worker_overloaded");
        return true;
      },
    );
    assert.equal(prefill.sim.stats().prefillTokens, before, "the refused call cost no prefill");
    assert.deepEqual(scheduler.state().disaggregation, {
      decodeCheck: "predicted",
      refusedAfterPrefill: 0,
      wastedPrefillTokens: 0,
    });
    assert.equal(await run(clock, firstDone), 2000);
    await settle(clock, scheduler);
  });

  it("a client that cancels while queued at the decode gate leaves nothing held and cost no prefill", async () => {
    const { clock, prefill, decode, scheduler } = pdFleet({ gate: { engineRequestLimit: 1 } });
    const first = await run(clock, scheduler.submit(request(tokens(1000), 2000)));
    const firstDone = drain(first);
    const before = prefill.sim.stats().prefillTokens;
    const abort = new AbortController();
    const second = scheduler.submit(request(tokens(1000, 50_000), 20, { signal: abort.signal }));
    second.catch(() => undefined);
    await clock.advanceAsync(1000);
    assert.equal(scheduler.state().replicas.find((r) => r.id === "decode-0")!.gate.queued, 1);
    assert.equal(prefill.sim.stats().prefillTokens, before, "it queues for decode before its prefill");
    abort.abort();
    await assert.rejects(run(clock, second), (error: Error) => error.name === "AbortError");
    assert.equal(decode.sim.transfers.transfers, 1, "only the first call's KV was pulled");
    assert.equal(scheduler.state().disaggregation?.wastedPrefillTokens, 0);
    assert.equal(await run(clock, firstDone), 2000);
    await settle(clock, scheduler);
  });

  it("a client that cancels during the prefill gives the decode place and room back", async () => {
    const { clock, decode, scheduler } = pdFleet();
    const abort = new AbortController();
    const pending = scheduler.submit(request(tokens(30_000), 20, { signal: abort.signal }));
    pending.catch(() => undefined);
    await clock.advanceAsync(50);
    assert.equal(scheduler.state().replicas.find((r) => r.id === "decode-0")!.gate.requests, 1);
    abort.abort();
    await assert.rejects(run(clock, pending), (error: Error) => error.name === "AbortError");
    assert.equal(decode.sim.transfers.transfers, 0, "no KV was pulled");
    assert.equal(scheduler.state().disaggregation?.wastedPrefillTokens, 0, "a cancel is not a refusal");
    await settle(clock, scheduler);
  });

  it("a prefill replica that fails: 503 unavailable, the decode place and room given back, nothing counted as wasted", async () => {
    const { clock, prefill, decode, scheduler } = pdFleet();
    prefill.failPrefill = true;
    await assert.rejects(run(clock, scheduler.submit(request(tokens(2000), 10))), (error: Refusal) => {
      assert.equal(error.reason, "unavailable");
      return true;
    });
    assert.equal(decode.sim.transfers.transfers, 0);
    assert.equal(scheduler.state().disaggregation?.wastedPrefillTokens, 0);
    await settle(clock, scheduler);
  });

  it("with --decode-check current a call may still be refused at the decode gate after its prefill, and that is counted", async () => {
    const { clock, prefill, scheduler } = pdFleet({
      disaggregation: { decodeCheck: "current" },
      gate: { engineRequestLimit: 1, requestQueueLimit: 0 },
    });
    const first = await run(clock, scheduler.submit(request(tokens(1000), 2000)));
    const firstDone = drain(first);
    const before = prefill.sim.stats().prefillTokens;
    await assert.rejects(
      run(clock, scheduler.submit(request(tokens(1000, 50_000), 20))),
      (error: Refusal) => {
        assert.equal(error.reason, "worker_overloaded");
        return true;
      },
    );
    assert.equal(prefill.sim.stats().prefillTokens - before, 1000, "its prefill ran first");
    assert.deepEqual(scheduler.state().disaggregation, {
      decodeCheck: "current",
      refusedAfterPrefill: 1,
      wastedPrefillTokens: 1000,
    });
    assert.equal(await run(clock, firstDone), 2000);
    await settle(clock, scheduler);
  });

  it("a decode replica that fails after the prefill: 503 unavailable, the prefill counted as wasted, nothing leaked", async () => {
    const { clock, decode, scheduler } = pdFleet();
    decode.failDecode = true;
    await assert.rejects(run(clock, scheduler.submit(request(tokens(2000), 10))), (error: Refusal) => {
      assert.equal(error.reason, "unavailable");
      assert.equal(error.status, 503);
      return true;
    });
    assert.equal(scheduler.state().disaggregation?.wastedPrefillTokens, 2000);
    await settle(clock, scheduler);
  });

  it("a fleet with prefill replicas but no decode replica (or a replica of role both among them) is refused at start", () => {
    const clock = new VirtualClock();
    const p = new SimEngine({ id: "p", role: "prefill", clock });
    const b = new SimEngine({ id: "b", clock });
    const d = new SimEngine({ id: "d", role: "decode", clock });
    assert.throws(() => new Scheduler({ engines: [p], clock }), /needs a decode replica/);
    assert.throws(() => new Scheduler({ engines: [p, d, b], clock }), /no replica of role both/);
  });

  it("counts what the prefill replica's cache delivered against the prefix predicted there, call by call, as the token window's evidence", async () => {
    // The path alone, on real replicas: the scheduler's gate and holdings play no part in the evidence.
    const clock = new VirtualClock();
    const config = resolveSchedulerConfig({});
    const features = policyFeatures(config.policy, config.window.unit);
    const prefillSim = new SimEngine({ id: "prefill-0", role: "prefill", clock });
    const prefill = new ReplicaRuntime(prefillSim, clock, config, features);
    const decode = new ReplicaRuntime(
      new SimEngine({ id: "decode-0", role: "decode", clock }),
      clock,
      config,
      features,
    );
    const path = new DisaggregatedPath({
      clock,
      config,
      decodeReplicas: [decode],
      passGate: async () => null,
      waitForBudget: async () => null,
      holdings: () => ({ firstToken: () => undefined, finish: () => undefined }),
      recordPrefix: () => undefined,
      recordGateWait: () => undefined,
      emit: () => undefined,
    });
    const prompt = tokens(4096);
    const send = async (predictedHitTokens: number) => {
      const call: RoutedCall = {
        req: request(prompt, 8),
        model: prefillSim.model,
        tokens: prompt,
        maxTokens: 8,
        lane: "interactive",
        session: undefined,
        prefill,
        uncached: prompt.length - predictedHitTokens,
        gpuCached: predictedHitTokens,
        hashes: ["a chained block hash"],
        startedAt: clock.now(),
      };
      const admitted = await run(clock, path.admit(call, { reservation: null, permit: null, inflight: 0 }));
      await run(clock, drain(admitted));
    };
    await send(0);
    // The prompt's blocks are cached on the prefill replica: predicted, and delivered.
    await send(4032);
    const computedBefore = prefillSim.stats().prefillTokens;
    assert.ok(computedBefore < 2 * 4096, "the second prefill found the prompt cached");
    // The cache loses them behind the router's back (every free block taken and given back).
    const pool = prefillSim.poolOf(0);
    const taken: number[] = [];
    while (pool.freeBlocks() > 0) taken.push(pool.allocate());
    pool.release(taken);
    await send(4032);
    prefill.thrashEvidence.close(undefined, 0.95);
    const reading = prefill.thrashEvidence.read(0);
    assert.equal(
      prefillSim.stats().prefillTokens - computedBefore,
      4096,
      "the third prefill computed the whole prompt again",
    );
    assert.equal(reading.predicted, (4032 * 2) / (4096 * 3));
    assert.ok(reading.delivered !== undefined, "the prefill replica's evidence reads the calls it ran");
    assert.ok(
      Math.abs(reading.delivered - 0.5) < 0.02,
      `half the predicted hits delivered, got ${reading.delivered}`,
    );
    assert.equal(path.outstanding(), 0);
    assert.equal(prefill.running, 0);
    assert.equal(prefill.runningNewKv, 0, "the prefill legs gave back the KV they took");
  });
});
