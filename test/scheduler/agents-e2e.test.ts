import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { VirtualClock } from "../../src/clock.js";
import type { Policy } from "../../src/config/scheduler-config.js";
import { Refusal } from "../../src/errors.js";
import { Scheduler } from "../../src/scheduler.js";

interface AgentsRun {
  makespanS: number;
  hitRate: number;
  completedSteps: number;
  refusals: number;
  idle: ReturnType<Scheduler["idleCheck"]>;
  maxActive: number;
  rejections: Record<string, number>;
}

/** A seeded generator, so every policy sees the same workload. */
function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function sleep(clock: VirtualClock, ms: number): Promise<void> {
  return new Promise((resolve) => clock.setTimeout(resolve, ms));
}

/**
 * ReAct-style agents on one simulated replica in virtual time: each step's
 * prompt is the whole context so far plus a tool output; the model's output
 * joins the context; a tool wait follows.
 */
async function runAgents(policy: Policy, sessions: number, steps: number): Promise<AgentsRun> {
  const clock = new VirtualClock();
  const engine = new SimEngine({ id: "r1", clock, preset: "h100-llama3-8b" });
  const scheduler = new Scheduler({ engines: [engine], clock, policy });
  scheduler.start();
  const random = prng(7);
  const system = Array.from({ length: 2000 }, (_, i) => 1000 + (i % 5000));
  const plans = Array.from({ length: sessions }, (_, s) =>
    Array.from({ length: steps }, (_, k) => ({
      tool: Array.from(
        { length: 500 + Math.floor(random() * 2500) },
        (_, i) => 100_000 + s * 7919 + k * 131 + i,
      ),
      output: 100 + Math.floor(random() * 300),
      waitMs: 1000 + random() * 4000,
    })),
  );
  let finished = 0;
  let completedSteps = 0;
  let refusals = 0;
  let maxActive = 0;
  const agent = async (s: number) => {
    const id = `agent-${s}`;
    const context = [...system];
    for (const step of plans[s]!) {
      for (const token of step.tool) context.push(token);
      for (;;) {
        try {
          const call = await scheduler.submit({
            requestId: `${id}-${completedSteps}`,
            endpoint: "chat",
            input: { kind: "tokens", tokens: [...context] },
            maxTokens: step.output,
            stream: true,
            sessionId: id,
          });
          for await (const chunk of call) for (const token of chunk.tokens) context.push(token);
          break;
        } catch (error) {
          if (!(error instanceof Refusal) || error.retryAfterSeconds === undefined) throw error;
          refusals++;
          await sleep(clock, error.retryAfterSeconds * 1000);
        }
      }
      completedSteps++;
      const active = scheduler.state().sessions.active;
      maxActive = Math.max(maxActive, active);
      await sleep(clock, step.waitMs);
    }
    scheduler.closeSession(id);
    finished++;
  };
  const runs = plans.map((_, s) => agent(s));
  await clock.runAsyncUntil(() => finished === sessions);
  await Promise.all(runs);
  await scheduler.stop();
  const signals = engine.signals();
  return {
    makespanS: clock.now() / 1000,
    hitRate: signals.prefixHitTokens / Math.max(1, signals.prefixQueryTokens),
    completedSteps,
    refusals,
    idle: scheduler.idleCheck(),
    rejections: scheduler.state().rejections,
    maxActive,
  };
}

describe("scheduler end to end on a simulated replica", () => {
  it("48 agents on one h100-llama3-8b replica: sluice beats rr on hit rate and makespan, and nothing leaks", async () => {
    const rr = await runAgents("rr", 48, 8);
    const sluice = await runAgents("sluice", 48, 8);
    for (const run of [rr, sluice]) {
      assert.equal(run.completedSteps, 48 * 8);
      assert.deepEqual(run.idle, { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    }
    assert.ok(
      sluice.hitRate > rr.hitRate,
      `sluice hit rate ${sluice.hitRate.toFixed(3)} should beat rr's ${rr.hitRate.toFixed(3)}`,
    );
    assert.ok(
      sluice.makespanS < rr.makespanS,
      `sluice makespan ${sluice.makespanS.toFixed(1)} s should beat rr's ${rr.makespanS.toFixed(1)} s`,
    );
  });
});

export { runAgents };
