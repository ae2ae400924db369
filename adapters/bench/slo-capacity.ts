/**
 * @module SLO capacity (docs/benchmarks.md): the largest offered-load multiplier at which at least 90 % of
 * calls get their first token within their TTFT SLO (DistServe's goodput), found per policy by a
 * grid of loads and then bisection between the last load that met it and the first that did not.
 */

/** Share of calls that must meet their TTFT SLO at a load for the load to count as served. */
export const SLO_CAPACITY_SHARE = 0.9;

/** Loads tried first, in order, until one misses (the search then bisects below it). */
export const DEFAULT_CAPACITY_GRID: readonly number[] = [0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4];

/** Bisection steps after the grid: each halves the gap between the last load met and the first missed. */
export const DEFAULT_CAPACITY_BISECTIONS = 3;

/** How the search runs: its grid and its bisection steps. */
export interface CapacitySearch {
  grid: readonly number[];
  bisections: number;
}

function round3(value: number): number {
  return Math.round(value * 1000) / 1000;
}

/**
 * The largest load that `meets` (tried in grid order until one fails, then bisected), or 0 when
 * the first load of the grid already fails. Every load is tried at most once, in the order the
 * search asks for it; `meets` may record what it measured.
 */
export async function largestLoadMet(
  meets: (load: number) => Promise<boolean>,
  search: CapacitySearch = { grid: DEFAULT_CAPACITY_GRID, bisections: DEFAULT_CAPACITY_BISECTIONS },
): Promise<number> {
  const grid = [...search.grid].sort((a, b) => a - b);
  if (grid.length === 0 || grid.some((load) => !(load > 0))) {
    throw new RangeError(`the capacity grid needs loads > 0, got ${JSON.stringify(search.grid)}`);
  }
  if (!(Number.isInteger(search.bisections) && search.bisections >= 0)) {
    throw new RangeError(`capacity bisections must be an integer ≥ 0, got ${search.bisections}`);
  }
  let good = 0;
  let bad: number | undefined;
  for (const load of grid) {
    if (await meets(load)) good = load;
    else {
      bad = load;
      break;
    }
  }
  if (bad === undefined) return good;
  for (let i = 0; i < search.bisections; i++) {
    const mid = round3((good + bad) / 2);
    if (mid <= good || mid >= bad) break;
    if (await meets(mid)) good = mid;
    else bad = mid;
  }
  return good;
}
