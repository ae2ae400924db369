/** @module Mooncake trace loading: requests with arrival times, 512-token hash blocks expanded into tokens, sessions inferred from prefix chains. */

import { existsSync, readFileSync } from "node:fs";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** Tokens covered by one Mooncake hash id. */
export const MOONCAKE_BLOCK_TOKENS = 512;

/**
 * The repository root: the nearest folder above this file that holds package.json. Found rather than
 * counted, because the compiled copy of this file sits one level deeper (dist/adapters/bench/workloads/).
 */
export const REPO_ROOT = findPackageRoot(dirname(fileURLToPath(import.meta.url)));

function findPackageRoot(from: string): string {
  for (let dir = from; ; dir = dirname(dir)) {
    if (existsSync(join(dir, "package.json"))) return dir;
    if (dirname(dir) === dir) return resolve(from, "../../..");
  }
}

/** The shared traces folder, `../shared/traces/` from the repository root. */
export const MOONCAKE_TRACES_DIR = resolve(REPO_ROOT, "../shared/traces");

/** Path of a shared Mooncake trace: `conversation` (default) or `synthetic`. */
export function mooncakeTracePath(name: "conversation" | "synthetic" = "conversation"): string {
  return resolve(MOONCAKE_TRACES_DIR, `mooncake-${name}.jsonl`);
}

/** One request of a Mooncake trace. */
export interface MooncakeRequest {
  /** Line number in the trace (0-based), before `limit`. */
  index: number;
  /** Arrival, ms from the trace start (times `timeScale`). */
  arrivalMs: number;
  /** Prompt tokens. */
  inputLength: number;
  /** Generated tokens. */
  outputLength: number;
  /** One opaque id per 512-token block of the prompt (the last block may be partial). */
  hashIds: number[];
  /** Index of the earlier request this one extends (its conversation's previous turn), if any. */
  parent: number | undefined;
  /** Index of the first request of its conversation (itself when it extends none). */
  sessionKey: number;
}

/** Options of {@link loadMooncakeTrace}. */
export interface MooncakeLoadOptions {
  /** Keep only the first `limit` requests. */
  limit?: number;
  /** Multiplies arrival times (2 = half the rate); default 1. */
  timeScale?: number;
}

/**
 * Reads a Mooncake JSONL trace (`timestamp`, `input_length`, `output_length`,
 * `hash_ids`). A relative path is resolved from the repository root (or its nearest ancestor that has it). Sessions
 * are inferred as the traces README says: a request whose leading ids (at
 * least two) equal the ids of an earlier request's full blocks extends it
 * (the earlier request's partial last block is excluded: the next turn fills
 * it further, so its id changes). When several earlier requests qualify the
 * longest wins, the latest among equals. In the conversation trace 3,975 of
 * 12,031 requests extend an earlier one. Errors name the line and the field.
 */
export function loadMooncakeTrace(path: string, opts: MooncakeLoadOptions = {}): MooncakeRequest[] {
  const timeScale = opts.timeScale ?? 1;
  if (!(Number.isFinite(timeScale) && timeScale > 0)) {
    throw new RangeError(`timeScale should be a finite number > 0, got ${timeScale}`);
  }
  const limit = opts.limit ?? Number.POSITIVE_INFINITY;
  if (!(limit === Number.POSITIVE_INFINITY || (Number.isInteger(limit) && limit >= 0))) {
    throw new RangeError(`limit should be a non-negative integer, got ${limit}`);
  }
  const file = isAbsolute(path) ? path : resolve(REPO_ROOT, path);
  const lines = readFileSync(file, "utf8").split("\n");
  const out: MooncakeRequest[] = [];
  // Full id lists of earlier requests → the latest request that had exactly those ids.
  const byIds = new Map<string, number>();
  for (let n = 0; n < lines.length && out.length < limit; n++) {
    const line = lines[n]!.trim();
    if (line === "") continue;
    let record: { timestamp?: unknown; input_length?: unknown; output_length?: unknown; hash_ids?: unknown };
    try {
      record = JSON.parse(line);
    } catch (error) {
      throw new Error(`${file}:${n + 1}: not JSON (${(error as Error).message})`);
    }
    const field = (name: string, value: unknown): number => {
      if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
        throw new Error(`${file}:${n + 1}: ${name} should be a number ≥ 0, got ${JSON.stringify(value)}`);
      }
      return value;
    };
    const timestamp = field("timestamp", record.timestamp);
    const inputLength = field("input_length", record.input_length);
    const outputLength = field("output_length", record.output_length);
    if (!Array.isArray(record.hash_ids) || !record.hash_ids.every((id) => Number.isInteger(id))) {
      throw new Error(
        `${file}:${n + 1}: hash_ids should be an array of integers, got ${JSON.stringify(record.hash_ids)}`,
      );
    }
    const hashIds = record.hash_ids as number[];
    const index = out.length;
    const keys: string[] = [];
    let key = "";
    for (let i = 0; i < hashIds.length; i++) {
      key = i === 0 ? String(hashIds[0]) : `${key},${hashIds[i]}`;
      keys.push(key);
    }
    let parent: number | undefined;
    for (let len = hashIds.length; len >= 2 && parent === undefined; len--)
      parent = byIds.get(keys[len - 1]!);
    // Only full blocks carry over: the next turn fills the partial last block further, so its id differs.
    const fullBlocks = inputLength % MOONCAKE_BLOCK_TOKENS === 0 ? hashIds.length : hashIds.length - 1;
    if (fullBlocks > 0) byIds.set(keys[fullBlocks - 1]!, index);
    out.push({
      index,
      arrivalMs: timestamp * timeScale,
      inputLength,
      outputLength,
      hashIds,
      parent,
      sessionKey: parent === undefined ? index : out[parent]!.sessionKey,
    });
  }
  return out;
}

/**
 * Expands hash ids into prompt tokens: each id becomes 512 pseudo-token ids
 * drawn from a generator seeded by the id (so equal ids give equal blocks and
 * shared prefixes stay shared), the last block cut to fit `inputLength`.
 * When `inputLength` exceeds the ids' capacity the missing tail is drawn from
 * the last id's generator. Token ids are in [0, 100000).
 */
export function expandMooncakeTokens(hashIds: readonly number[], inputLength: number): number[] {
  if (!(Number.isInteger(inputLength) && inputLength >= 0)) {
    throw new RangeError(`inputLength should be a non-negative integer, got ${inputLength}`);
  }
  const out = new Array<number>(inputLength);
  let pos = 0;
  for (let b = 0; b < hashIds.length && pos < inputLength; b++) {
    const isLast = b === hashIds.length - 1;
    const end = isLast ? inputLength : Math.min(inputLength, pos + MOONCAKE_BLOCK_TOKENS);
    let state = seedOf(hashIds[b]!);
    for (; pos < end; pos++) {
      state = (state + 0x6d2b79f5) | 0;
      let t = Math.imul(state ^ (state >>> 15), state | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      out[pos] = ((t ^ (t >>> 14)) >>> 0) % 100_000;
    }
  }
  for (; pos < inputLength; pos++) out[pos] = 0;
  return out;
}

function seedOf(id: number): number {
  let h = Math.imul(id ^ 0x5bd1e995, 0x9e3779b1) ^ Math.floor(id / 4294967296);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h | 0;
}
