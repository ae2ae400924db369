/** @module The `mooncake` workload: replay of a Mooncake trace, conversations inferred from prefix chains. */

import { existsSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { expandMooncakeTokens, loadMooncakeTrace, REPO_ROOT } from "./mooncake.js";
import type { MooncakeSpec } from "./schema.js";
import { WorkloadError } from "./schema.js";
import type { PlannedCall, Workload } from "./types.js";

export { REPO_ROOT };

/** Mooncake hash blocks cover 512 tokens each. */
const MOONCAKE_BLOCK_TOKENS = 512;

/**
 * Finds a trace file: an absolute path as is; a relative one against the
 * workload file's folder, then the working directory, then the repository root
 * (where `../shared/traces/…` points at the shared traces).
 */
export function resolveTracePath(trace: string, baseDir?: string): string {
  if (isAbsolute(trace)) return trace;
  const candidates = [baseDir, process.cwd(), REPO_ROOT]
    .filter((d): d is string => !!d)
    .map((d) => resolve(d, trace));
  const found = candidates.find((path) => existsSync(path));
  if (!found) throw new WorkloadError(`trace ${trace} not found (looked in ${candidates.join(", ")})`);
  return found;
}

interface TrieNode {
  children: Map<number, TrieNode>;
}

/**
 * Compiles a mooncake spec at an offered-load multiplier: arrival times,
 * counted from the trace's first timestamp, are divided by `load` (after the
 * spec's `time_scale`). A request that extends an
 * earlier one (its conversation's previous turn) also waits until that turn
 * has completed — a user does not answer a reply they have not seen — so in
 * overload the replay slows down like real conversations do. Prompts are the
 * trace's 512-token hash blocks expanded into deterministic tokens, built when
 * the request starts.
 */
export function buildMooncakeWorkload(
  spec: MooncakeSpec,
  options: { name?: string; load?: number; baseDir?: string } = {},
): Workload {
  const load = options.load ?? 1;
  if (!(load > 0)) throw new RangeError(`load must be > 0, got ${load}`);
  const name = options.name ?? "mooncake";
  const path = resolveTracePath(spec.trace, options.baseDir);
  const requests = loadMooncakeTrace(path, {
    timeScale: spec.time_scale,
    ...(spec.limit !== undefined ? { limit: spec.limit } : {}),
  });
  // A conversation is a chain of at least two turns; a lone request is a one-off call with no session.
  const chained = new Set<number>();
  for (const request of requests) {
    if (request.parent !== undefined) {
      chained.add(request.sessionKey);
    }
  }
  // A slice of a trace starts at its own first timestamp: the replay begins there, not after an idle wait as long as it.
  let startMs = Number.POSITIVE_INFINITY;
  for (const request of requests) if (request.arrivalMs < startMs) startMs = request.arrivalMs;
  if (!Number.isFinite(startMs)) startMs = 0;
  const positionOf = new Map<number, number>();
  const root: TrieNode = { children: new Map() };
  const calls: PlannedCall[] = [];
  for (const request of requests) {
    // The ideal cache holds every chain an earlier arrival brought in.
    let node = root;
    let matched = 0;
    let walking = true;
    for (const id of request.hashIds) {
      let child = node.children.get(id);
      if (child && walking) matched++;
      else walking = false;
      if (!child) {
        child = { children: new Map() };
        node.children.set(id, child);
      }
      node = child;
    }
    const hashIds = request.hashIds;
    const inputLength = request.inputLength;
    const call: PlannedCall = {
      index: calls.length,
      id: `${name}-${request.index}`,
      ...(chained.has(request.sessionKey) ? { sessionId: `${name}-c${request.sessionKey}` } : {}),
      arrivalMs: (request.arrivalMs - startMs) / load,
      gapMs: 0,
      extendsAfter: false,
      newTokens: () => expandMooncakeTokens(hashIds, inputLength),
      promptTokens: inputLength,
      cachedAtBest: Math.min(matched * MOONCAKE_BLOCK_TOKENS, inputLength),
      maxTokens: Math.max(1, request.outputLength),
      slo: { ttftS: spec.slo.ttft_s, tpotS: spec.slo.tpot_s },
      retry: true,
      group: "mooncake",
    };
    const parent = request.parent === undefined ? undefined : positionOf.get(request.parent);
    if (parent !== undefined) call.after = parent;
    positionOf.set(request.index, call.index);
    calls.push(call);
  }
  const spanS = calls.length > 0 ? (calls[calls.length - 1]!.arrivalMs - calls[0]!.arrivalMs) / 1000 : 0;
  return {
    kind: "mooncake",
    name,
    load,
    calls,
    sharedPrefills: [],
    describe:
      `${calls.length} requests of ${spec.trace} over ${spanS.toFixed(0)} s (time scale ${spec.time_scale}, ` +
      `load ×${load}), SLO TTFT ${spec.slo.ttft_s} s / TPOT ${spec.slo.tpot_s} s`,
  };
}
