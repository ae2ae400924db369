/** @module Lookups over a parsed metrics page that every engine profile shares: series by name, replicas collapsed, sums and means that treat NaN as absent. */

import type { MetricSample } from "./exposition.js";

/** Samples grouped by name, for lookups by metric. */
export type ByName = Map<string, MetricSample[]>;

export function groupByName(samples: readonly MetricSample[]): ByName {
  const byName: ByName = new Map();
  for (const sample of samples) {
    const list = byName.get(sample.name);
    if (list) list.push(sample);
    else byName.set(sample.name, [sample]);
  }
  return byName;
}

/**
 * Labels along which an engine repeats one logical value: SGLang exports its
 * scheduler gauges once per tensor-parallel (and expert-parallel) worker, so
 * summing over them would count each request TP times. LMCache keeps its
 * counters once per vLLM worker (`worker_id`), and its lookup client asks
 * every tensor-parallel worker about each prompt, so each worker's lookup
 * counters count every lookup (LMCache PR #1300's page: two lookups, 2.0 on
 * each of four workers).
 */
export const REPLICATED_LABELS = ["tp_rank", "moe_ep_rank", "pid", "worker_id"];

/** One sample per logical series: label sets equal but for `REPLICATED_LABELS` collapse to their largest value. */
export function collapseReplicas(samples: readonly MetricSample[]): MetricSample[] {
  if (!samples.some((s) => REPLICATED_LABELS.some((l) => l in s.labels))) return [...samples];
  const groups = new Map<string, MetricSample>();
  for (const s of samples) {
    const key = Object.keys(s.labels)
      .filter((l) => !REPLICATED_LABELS.includes(l))
      .sort()
      .map((l) => `${l}=${JSON.stringify(s.labels[l])}`)
      .join(",");
    const seen = groups.get(key);
    if (!seen || (Number.isFinite(s.value) && !(seen.value >= s.value))) groups.set(key, s);
  }
  return [...groups.values()];
}

/**
 * The totals of a family split by `priority`: SGLang with priority scheduling
 * prints each scheduler gauge once per priority and once more with an empty
 * `priority`, which is their total; adding them all would count every request
 * twice. A family without that empty-priority total is kept whole.
 */
export function priorityTotals(samples: readonly MetricSample[]): readonly MetricSample[] {
  const totals = samples.filter((s) => s.labels.priority === "");
  return totals.length > 0 && totals.length < samples.length ? totals : samples;
}

/** The first of several names (newest first) that the page carries with a finite value, one sample per logical series. */
export function pick(byName: ByName, ...names: string[]): MetricSample[] | undefined {
  for (const name of names) {
    const found = byName.get(name);
    // A series whose every sample is NaN says nothing: the next name, or unknown.
    if (found?.some((s) => Number.isFinite(s.value))) return collapseReplicas(priorityTotals(found));
  }
  return undefined;
}

/** All samples of one name, one per logical series; empty when absent. */
export function series(byName: ByName, name: string): MetricSample[] {
  const found = byName.get(name);
  return found ? collapseReplicas(priorityTotals(found)) : [];
}

/** Sum over label sets (models, ranks); NaN samples count as absent. */
export function sum(samples: readonly MetricSample[] | undefined): number {
  let total = 0;
  for (const s of samples ?? []) if (Number.isFinite(s.value)) total += s.value;
  return total;
}

/** Mean over label sets: a ratio per rank pools to the mean when ranks are the same size. */
export function mean(samples: readonly MetricSample[] | undefined): number {
  let total = 0;
  let count = 0;
  for (const s of samples ?? []) {
    if (!Number.isFinite(s.value)) continue;
    total += s.value;
    count++;
  }
  return count === 0 ? 0 : total / count;
}

export function clamp01(x: number): number {
  return Math.min(1, Math.max(0, x));
}

/** A label read as a positive integer, or undefined (absent, `None`, zero, garbage). */
export function intLabel(sample: MetricSample, label: string): number | undefined {
  const raw = sample.labels[label];
  if (raw === undefined) return undefined;
  const value = Number(raw.trim());
  return Number.isFinite(value) && value > 0 ? Math.floor(value) : undefined;
}

/** The largest positive finite value of a gauge, floored; undefined when there is none. */
export function largestPositive(samples: readonly MetricSample[]): number | undefined {
  let best: number | undefined;
  for (const s of samples) {
    if (Number.isFinite(s.value) && s.value > 0) best = Math.max(best ?? 0, Math.floor(s.value));
  }
  return best;
}

/**
 * Data-parallel size: the number of distinct `dp_rank` (SGLang) or `engine`
 * (vLLM V1, one engine core per DP rank) label values over every sample of
 * the engine's own series; 1 when neither label appears. Every series counts,
 * not only the gauges read: a rank whose request gauge a page leaves out
 * (SGLang sets some gauges from one rank only) is still a rank.
 */
export function dataParallelSize(samples: Iterable<MetricSample>): number {
  const dpRanks = new Set<string>();
  const engines = new Set<string>();
  for (const s of samples) {
    const dp = s.labels.dp_rank;
    if (dp !== undefined) dpRanks.add(dp);
    const engine = s.labels.engine;
    if (engine !== undefined) engines.add(engine);
  }
  return Math.max(1, dpRanks.size, engines.size);
}

/** Every sample of the series whose names start with `prefix`. */
export function* samplesOf(byName: ByName, prefix: string): Generator<MetricSample> {
  for (const [name, list] of byName) if (name.startsWith(prefix)) yield* list;
}

/** A cumulative counter pair, or undefined when either half is missing (a missing counter is not a zero). */
export function counterPair(
  byName: ByName,
  pairs: readonly (readonly [queries: string, hits: string])[],
): { queries: number; hits: number } | undefined {
  for (const [queriesName, hitsName] of pairs) {
    const queries = pick(byName, queriesName);
    const hits = pick(byName, hitsName);
    if (queries && hits) return { queries: sum(queries), hits: sum(hits) };
  }
  return undefined;
}
