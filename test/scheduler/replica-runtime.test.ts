import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { VirtualClock } from "../../src/clock.js";
import { policyFeatures } from "../../src/config/policy-features.js";
import { type Policy, resolveSchedulerConfig } from "../../src/config/scheduler-config.js";
import { FleetPrefixIndex } from "../../src/routing/fleet-prefix-index.js";
import { ReplicaRuntime } from "../../src/scheduler/replica-runtime.js";

function replica(policy: Policy, bulkFloorShare?: number): ReplicaRuntime {
  const clock = new VirtualClock();
  const config = resolveSchedulerConfig({
    policy,
    ...(bulkFloorShare !== undefined ? { lanes: { bulkFloorShare, bulkMaxShare: 1 } } : {}),
  });
  const engine = new SimEngine({ id: "r1", clock, preset: "h100-llama3-8b" });
  return new ReplicaRuntime(engine, clock, config, policyFeatures(policy, config.window.unit));
}

describe("queued prefill a new call waits behind", () => {
  it("is the whole queue for bulk, and for interactive the interactive queue plus bulk's floor share", () => {
    const r = replica("sluice");
    r.queuePrefill(9_000, "interactive");
    r.queuePrefill(50_000, "bulk");
    assert.equal(r.queuedPrefillTokens, 59_000);
    assert.equal(r.queuedPrefillAheadOf("bulk"), 59_000);
    // Bulk keeps 10 % of the tokens admitted while both lanes wait: 9,000 interactive tokens let
    // 1,000 bulk tokens in beside them.
    assert.equal(r.queuedPrefillAheadOf("interactive"), 10_000);
    r.dequeuePrefill(50_000, "bulk");
    assert.equal(r.queuedPrefillAheadOf("interactive"), 9_000, "no more bulk than is queued");
    r.dequeuePrefill(9_000, "interactive");
    assert.equal(r.queuedPrefillTokens, 0);
  });

  it("with a bulk floor of 1, is the whole queue for either lane", () => {
    const r = replica("sluice", 1);
    r.queuePrefill(1_000, "interactive");
    r.queuePrefill(5_000, "bulk");
    assert.equal(r.queuedPrefillAheadOf("interactive"), 6_000);
  });

  it("is the whole queue for either lane when one FIFO serves both (a policy without lanes)", () => {
    const r = replica("gate-prefix");
    r.queuePrefill(1_000, "interactive");
    r.queuePrefill(5_000, "bulk");
    assert.equal(r.queuedPrefillAheadOf("interactive"), 6_000);
  });
});

describe("the prefix index's GPU part", () => {
  it("is the KV capacity less what running calls took anew, trimmed when a call starts, whole again when every call ended", () => {
    const clock = new VirtualClock();
    const config = resolveSchedulerConfig({ policy: "gate-prefix" });
    const engine = new SimEngine({
      id: "r1",
      clock,
      preset: { base: "h100-llama3-8b", kvCapacityTokens: 64 * 100 },
    });
    let runtime: ReplicaRuntime | undefined;
    const index = new FleetPrefixIndex({ capacityBlocks: () => runtime!.indexGpuBlocks() });
    runtime = new ReplicaRuntime(engine, clock, config, policyFeatures("gate-prefix", "tokens"), index);
    assert.equal(runtime.indexGpuBlocks(), 100);
    index.record(
      "r1",
      Array.from({ length: 80 }, (_, i) => i.toString(16)),
    );
    assert.equal(index.gpuBlocksHeld("r1"), 80);
    runtime.callStarted(64 * 50 + 1);
    assert.equal(runtime.indexGpuBlocks(), 49, "a block begun counts whole");
    assert.equal(index.gpuBlocksHeld("r1"), 49, "the engine evicts as the call takes its blocks");
    runtime.callStarted(0);
    runtime.callEnded(64 * 50 + 1);
    assert.equal(runtime.indexGpuBlocks(), 100);
    runtime.callEnded(0);
    assert.equal(runtime.running, 0);
    assert.equal(runtime.runningNewKv, 0);
    assert.equal(index.gpuBlocksHeld("r1"), 49, "what the engine evicted is not back");
  });
});
