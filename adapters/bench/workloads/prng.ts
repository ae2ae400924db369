/** @module Seeded pseudo-randomness for workloads: every draw is a pure function of the seed and a stream name. */

/** A generator of uniform floats in [0, 1). */
export type Random = () => number;

/**
 * mulberry32: a tiny, fast 32-bit generator with good enough statistics for
 * workload synthesis. Not for anything that needs unpredictability.
 */
export function mulberry32(seed: number): Random {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Mixes a seed and any number of stream labels into one 32-bit seed (FNV-1a
 * over the labels, then a murmur finaliser). Streams keyed by labels keep a
 * session's draws the same whatever else the workload contains — session 7 is
 * the same session at load 1 and at load 2.
 */
export function streamSeed(seed: number, ...labels: (string | number)[]): number {
  let h = (0x811c9dc5 ^ (seed >>> 0)) >>> 0;
  h = Math.imul(h ^ Math.floor(seed / 4294967296), 0x01000193) >>> 0;
  for (const label of labels) {
    const text = `${typeof label}:${label};`;
    for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b) >>> 0;
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35) >>> 0;
  h ^= h >>> 16;
  return h >>> 0;
}

/** A generator for one named stream of a seed. */
export function stream(seed: number, ...labels: (string | number)[]): Random {
  return mulberry32(streamSeed(seed, ...labels));
}

/** A closed range `[min, max]`. */
export type Range = readonly [number, number];

/** An integer drawn uniformly from the closed range. */
export function uniformInt(random: Random, [min, max]: Range): number {
  const lo = Math.ceil(min);
  const hi = Math.floor(max);
  if (hi <= lo) return lo;
  return lo + Math.floor(random() * (hi - lo + 1));
}

/** A real number drawn uniformly from `[min, max]`. */
export function uniformReal(random: Random, [min, max]: Range): number {
  return min + random() * (max - min);
}

/** An exponential variate with the given rate (events per unit time): the gap between Poisson arrivals. */
export function exponential(random: Random, rate: number): number {
  // 1 - u lies in (0, 1], so the log is finite.
  return -Math.log(1 - random()) / rate;
}

/** Size of the pseudo-vocabulary token ids are drawn from (Llama 3's is 128,256). */
export const VOCAB_SIZE = 128_000;

/** `count` deterministic pseudo-token ids for one stream; the same labels always give the same tokens. */
export function tokenIds(count: number, seed: number, ...labels: (string | number)[]): number[] {
  const random = stream(seed, "tokens", ...labels);
  const out = new Array<number>(count);
  for (let i = 0; i < count; i++) out[i] = Math.floor(random() * VOCAB_SIZE);
  return out;
}

/** Arrival times (ms from 0) of a Poisson process of `ratePerS` over `[0, durationMs)`. */
export function poissonArrivals(random: Random, ratePerS: number, durationMs: number): number[] {
  const out: number[] = [];
  if (!(ratePerS > 0)) return out;
  let t = 0;
  for (;;) {
    t += exponential(random, ratePerS) * 1000;
    if (t >= durationMs) return out;
    out.push(t);
  }
}
