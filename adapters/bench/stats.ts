/** @module Small statistics for benchmark results. */

/**
 * The p-quantile (0–1) of the values with linear interpolation between
 * closest ranks (numpy's default); 0 for no values.
 */
export function quantile(values: readonly number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return quantileSorted(sorted, p);
}

/** `quantile` on values already sorted ascending. */
export function quantileSorted(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return 0;
  const position = Math.min(1, Math.max(0, p)) * (sorted.length - 1);
  const lower = Math.floor(position);
  const upper = Math.ceil(position);
  const a = sorted[lower]!;
  const b = sorted[upper]!;
  return a + (b - a) * (position - lower);
}

/** Rounds to `digits` decimals, keeping the JSON short and stable (-0 becomes 0). */
export function round(value: number, digits = 6): number {
  if (!Number.isFinite(value)) return 0;
  const factor = 10 ** digits;
  const rounded = Math.round(value * factor) / factor;
  return rounded === 0 ? 0 : rounded;
}
