/** @module `kind: "tenants"` workloads: each tenant's part compiled on its own, shifted by its start, merged into one plan. */

import type { PartSpec, TenantsSpec } from "./schema.js";
import type { PlannedCall, Workload, WorkloadTenant } from "./types.js";

/** Compiles one part (any kind but `tenants`); passed in so this module does not import the index. */
export type CompilePart = (
  spec: PartSpec,
  options: { name: string; load: number; baseDir?: string },
) => Workload;

/**
 * Merges the tenants' parts into one plan: every part is compiled at the same
 * load under a name of its own (`<name>.<tenant>`, `.<n>` for a tenant's later
 * parts, so ids and session keys never collide), its arrivals shifted by
 * `start_s`, its calls tagged with the tenant and grouped as `<tenant>/<group>`.
 */
export function buildTenantsWorkload(
  spec: TenantsSpec,
  options: { name?: string; load?: number; baseDir?: string },
  compilePart: CompilePart,
): Workload {
  const name = options.name ?? "tenants";
  const load = options.load ?? 1;
  const calls: PlannedCall[] = [];
  const sharedPrefills: Workload["sharedPrefills"] = [];
  const describe: string[] = [];
  const partsOf = new Map<string, number>();
  for (const part of spec.parts) {
    const n = partsOf.get(part.tenant) ?? 0;
    partsOf.set(part.tenant, n + 1);
    const partName = `${name}.${part.tenant}${n > 0 ? `.${n}` : ""}`;
    const compiled = compilePart(part.workload, {
      name: partName,
      load,
      ...(options.baseDir !== undefined ? { baseDir: options.baseDir } : {}),
    });
    const offset = calls.length;
    const shiftMs = part.start_s * 1000;
    for (const call of compiled.calls) {
      const shifted: PlannedCall = {
        ...call,
        index: call.index + offset,
        arrivalMs: call.arrivalMs + shiftMs,
        group: `${part.tenant}/${call.group}`,
        tenant: part.tenant,
      };
      if (call.after !== undefined) shifted.after = call.after + offset;
      calls.push(shifted);
    }
    sharedPrefills.push(...compiled.sharedPrefills);
    describe.push(`${part.tenant} from ${part.start_s} s: ${compiled.describe}`);
  }
  const tenants: Record<string, WorkloadTenant> = {};
  for (const [tenant, def] of Object.entries(spec.tenants)) {
    tenants[tenant] = {
      weight: def.weight,
      band: def.band,
      ...(def.max_share !== undefined ? { max_share: def.max_share } : {}),
    };
  }
  const who = Object.entries(tenants)
    .map(([tenant, t]) => `${tenant} (weight ${t.weight}, ${t.band})`)
    .join(", ");
  return {
    kind: "tenants",
    name,
    load,
    calls,
    sharedPrefills,
    tenants,
    describe: `tenants ${who}; ${describe.join("; ")}`,
  };
}

/**
 * The same workload with only the parts of some tenants: the "alone" reference
 * runs (a tenant's sessions with nobody else on the fleet).
 */
export function onlyTenants(spec: TenantsSpec, keep: readonly string[]): TenantsSpec {
  const tenants: TenantsSpec["tenants"] = {};
  for (const tenant of keep) if (Object.hasOwn(spec.tenants, tenant)) tenants[tenant] = spec.tenants[tenant]!;
  return { ...spec, tenants, parts: spec.parts.filter((part) => keep.includes(part.tenant)) };
}
