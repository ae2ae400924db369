/**
 * @module Weighted max-min shares of the fleet's windows among tenants with
 * demand (docs/tenants.md): a decision of plain numbers, apart from the
 * session table that applies it.
 */

/** What one tenant asks of the fleet's windows now. */
export interface TenantDemand {
  readonly tenant: string;
  /** Its weight, > 0. */
  readonly weight: number;
  /** Footprints of its active sessions plus those waiting to be (paused, returning, queued), tokens. */
  readonly demandTokens: number;
  /** Largest share of the total it may be entitled to, in (0, 1]; undefined: no cap. */
  readonly maxShare?: number | undefined;
}

/**
 * Each tenant's entitlement, tokens: the weighted max-min share of `totalTokens`
 * among `demands` (water-filling). A tenant never gets more than it asks nor
 * more than its cap; what it leaves goes to the others by weight, so a tenant
 * alone may use everything. Tenants with no demand get 0 and are omitted.
 * Room that no tenant can take (every one at its demand or cap) stays unassigned.
 */
export function entitlements(totalTokens: number, demands: readonly TenantDemand[]): Map<string, number> {
  if (!(totalTokens >= 0)) throw new RangeError(`totalTokens should be ≥ 0, got ${totalTokens}`);
  const result = new Map<string, number>();
  let open: { tenant: string; weight: number; cap: number }[] = [];
  for (const demand of demands) {
    if (!(demand.weight > 0))
      throw new RangeError(`weight of ${demand.tenant} should be > 0, got ${demand.weight}`);
    if (!(demand.demandTokens > 0)) continue;
    const capByShare =
      demand.maxShare === undefined ? Number.POSITIVE_INFINITY : demand.maxShare * totalTokens;
    open.push({
      tenant: demand.tenant,
      weight: demand.weight,
      cap: Math.min(demand.demandTokens, capByShare),
    });
  }
  let remaining = totalTokens;
  // Each round fixes every tenant whose cap lies below its weighted share of what is left; at most one round per tenant.
  while (open.length > 0) {
    let weights = 0;
    for (const entry of open) weights += entry.weight;
    const perWeight = remaining / weights;
    const capped = open.filter((entry) => entry.cap <= entry.weight * perWeight);
    if (capped.length === 0) {
      for (const entry of open) result.set(entry.tenant, entry.weight * perWeight);
      break;
    }
    for (const entry of capped) {
      result.set(entry.tenant, entry.cap);
      remaining -= entry.cap;
    }
    open = open.filter((entry) => entry.cap > entry.weight * perWeight);
  }
  return result;
}

/**
 * Jain's fairness index of `values` (1: all equal; 1/n: one takes all), for
 * usage ÷ entitlement per tenant. An empty or all-zero list is fair (1).
 */
export function jainIndex(values: readonly number[]): number {
  let sum = 0;
  let squares = 0;
  for (const value of values) {
    sum += value;
    squares += value * value;
  }
  if (values.length === 0 || squares === 0) return 1;
  return (sum * sum) / (values.length * squares);
}
