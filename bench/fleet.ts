/** @module The benchmark's fleet: simulated replicas and the real scheduler, fresh for every policy run. */

import type { PresetName, PresetOverrides } from "../adapters/engines/sim/presets.js";
import { SimEngine } from "../adapters/engines/sim/sim-engine.js";
import type { SchedulerConfigInput } from "../src/config/scheduler-config.js";
import { Scheduler } from "../src/scheduler.js";
import { stepModelOfPreset } from "./cost-model.js";
import type { FleetFactory } from "./run.js";

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
    createScheduler: ({ engines, clock, policy }) => new Scheduler({ engines, clock, policy, config }),
  };
}
