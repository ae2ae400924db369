/** @module The replicas of a disaggregated simulated fleet: names and roles, one place for `serve`, `bench` and tests. */

import type { ReplicaRole } from "../../../src/engine.js";

/** What each replica of the fleet is: its id and role. */
export interface PdReplicaSpec {
  id: string;
  role: Exclude<ReplicaRole, "both">;
}

/**
 * `prefill` replicas `prefill-0…` then `decode` replicas `decode-0…`, each
 * built by `make`. A disaggregated fleet needs at least one of each: with
 * none of one role every call would be refused.
 */
export function simPdFleet<E>(prefill: number, decode: number, make: (spec: PdReplicaSpec) => E): E[] {
  for (const [name, count] of [
    ["prefill", prefill],
    ["decode", decode],
  ] as const) {
    if (!(Number.isInteger(count) && count >= 1)) {
      throw new RangeError(`a disaggregated fleet needs ≥ 1 ${name} replica, got ${count}`);
    }
  }
  const specs: PdReplicaSpec[] = [
    ...Array.from({ length: prefill }, (_, i) => ({ id: `prefill-${i}`, role: "prefill" as const })),
    ...Array.from({ length: decode }, (_, i) => ({ id: `decode-${i}`, role: "decode" as const })),
  ];
  return specs.map(make);
}
