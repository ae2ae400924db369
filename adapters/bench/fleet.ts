/** @module The benchmark's fleet: simulated replicas and the real scheduler, fresh for every policy run. */

import type { SchedulerConfigInput } from "../../src/config/scheduler-config.js";
import { schedulerConfigSchema } from "../../src/config/scheduler-config.js";
import { Scheduler } from "../../src/scheduler.js";
import type { PresetName, PresetOverrides } from "../engines/sim/presets.js";
import { SimEngine } from "../engines/sim/sim-engine.js";
import { stepModelOfPreset } from "./cost-model.js";
import type { FairnessMode, FleetFactory } from "./run.js";
import type { WorkloadTenant } from "./workloads/types.js";

/** Whether the scheduler's configuration knows a top-level key (tenant sharing is newer than some builds). */
function knows(key: string): boolean {
  return Object.hasOwn(schedulerConfigSchema.shape, key);
}

/**
 * The configuration of one run: the fleet's own, plus a `tenants` workload's
 * tenants and the fairness mode asked for. Each is passed only when set and
 * when the scheduler's configuration has the key, so single-tenant runs are
 * configured exactly as before.
 */
export function runConfig(
  config: SchedulerConfigInput,
  tenants: Record<string, WorkloadTenant> | undefined,
  fairness: FairnessMode | undefined,
): SchedulerConfigInput {
  const extra: Record<string, unknown> = {};
  if (tenants !== undefined && knows("tenants")) extra.tenants = structuredClone(tenants);
  if (fairness !== undefined && knows("fairness")) extra.fairness = fairness;
  return Object.keys(extra).length > 0 ? ({ ...config, ...extra } as SchedulerConfigInput) : config;
}

/**
 * Replicas `r0…r{n-1}` of one preset behind a scheduler running the policy
 * under test. `config` is passed to every policy alike (the policy decides
 * which layers are on).
 */
export function simFleet(
  preset: PresetName | PresetOverrides,
  label = typeof preset === "string" ? preset : "custom",
  config: SchedulerConfigInput = {},
): FleetFactory {
  return {
    preset: label,
    stepModel: stepModelOfPreset(preset),
    createEngines: (clock, replicas) =>
      Array.from({ length: replicas }, (_, i) => new SimEngine({ id: `r${i}`, clock, preset })),
    createScheduler: ({ engines, clock, policy, tenants, fairness }) =>
      new Scheduler({ engines, clock, policy, config: runConfig(config, tenants, fairness) }),
  };
}
