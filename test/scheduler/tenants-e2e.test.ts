/** @module Tenants sharing one simulated replica in virtual time: a late tenant is not starved behind a batch. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { VirtualClock } from "../../src/clock.js";
import { Refusal } from "../../src/errors.js";
import { Scheduler } from "../../src/scheduler.js";
import type { AdmittedCall } from "../../src/types.js";

/** Tenant A opens 16 agent sessions at t = 0, tenant B 2 at t = 5 s; returns B's first-step waits (ms). */
async function run(fairness: "tenants" | "off") {
  const clock = new VirtualClock();
  const engine = new SimEngine({
    id: "r1",
    clock,
    preset: { base: "h100-llama3-8b", kvCapacityTokens: 60_000 },
  });
  const scheduler = new Scheduler({ engines: [engine], clock, config: { fairness } });
  scheduler.start();
  const sleep = (ms: number) => new Promise<void>((resolve) => clock.setTimeout(resolve, ms));
  const firstWaits = new Map<string, number>();
  let pending = 0;
  const agent = async (tenant: string, id: string, startMs: number) => {
    pending++;
    const seed = [...id].reduce((sum, ch) => sum * 31 + ch.charCodeAt(0), 7) % 100_003;
    await sleep(startMs);
    const prompt: number[] = Array.from({ length: 2_000 }, (_, i) => (i * 7) % 5000);
    for (let step = 0; step < 8; step++) {
      for (let i = 0; i < 2_500; i++) prompt.push((seed * 7919 + step * 104_729 + i * 31) % 50_000);
      const arrived = clock.now();
      let call: AdmittedCall | undefined;
      while (!call) {
        try {
          call = await scheduler.submit({
            requestId: `${id}-${step}`,
            endpoint: "chat",
            input: { kind: "tokens", tokens: prompt },
            maxTokens: 200,
            stream: false,
            sessionId: id,
            tenant,
          });
        } catch (err) {
          // A call over the token budget is refused at once: the client retries after Retry-After.
          if (!(err instanceof Refusal) || err.reason !== "token_budget_exhausted") throw err;
          await sleep(1_000);
        }
      }
      if (step === 0) firstWaits.set(id, clock.now() - arrived);
      for await (const _chunk of call) {
        // drained
      }
      await sleep(2_000);
    }
    scheduler.closeSession(id, tenant);
    pending--;
  };
  const agents = [
    ...Array.from({ length: 16 }, (_, i) => agent("a", `a-${i}`, 0)),
    agent("b", "b-0", 5_000),
    agent("b", "b-1", 5_000),
  ];
  const all = Promise.all(agents);
  await clock.runAsyncUntil(() => pending === 0 && firstWaits.size === 18);
  await all;
  const idle = scheduler.idleCheck();
  const pauses = scheduler.tenants().tenants.find((t) => t.tenant === "a")?.pauses;
  await scheduler.stop();
  return { b: Math.max(firstWaits.get("b-0")!, firstWaits.get("b-1")!), idle, pauses };
}

describe("tenants on a simulated replica", () => {
  it("admits a late tenant's sessions within seconds by reclaim, where arrival order makes them wait", async () => {
    const off = await run("off");
    const on = await run("tenants");
    assert.deepEqual(on.idle, { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    assert.deepEqual(off.idle, { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    assert.ok(on.b <= 12_000, `B's first step waited ${on.b} ms with fairness (off: ${off.b} ms)`);
    assert.ok(off.b > on.b, `off ${off.b} ms should exceed on ${on.b} ms`);
    assert.ok((on.pauses?.fairness ?? 0) >= 1, JSON.stringify(on.pauses));
  });
});
