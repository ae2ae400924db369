/** @module The `mixed` workload: open-loop interactive chat beside bulk document jobs, each with its own SLO. */

import type { Lane } from "../../../src/types.js";
import { fmtRange } from "./agents.js";
import { poissonArrivals, stream, tokenIds, uniformInt } from "./prng.js";
import type { MixedSpec } from "./schema.js";
import type { PlannedCall, Workload } from "./types.js";

/**
 * Compiles a mixed spec at an offered-load multiplier (both lanes' arrival
 * rates are multiplied by `load`). Each lane is a Poisson stream of one-off
 * calls (no session) declaring its lane; refused calls are not retried —
 * a chat user does not wait for a 429 to clear. Calls are listed in arrival
 * order, interactive first on ties.
 */
export function buildMixedWorkload(
  spec: MixedSpec,
  options: { name?: string; load?: number } = {},
): Workload {
  const load = options.load ?? 1;
  if (!(load > 0)) throw new RangeError(`load must be > 0, got ${load}`);
  const name = options.name ?? "mixed";
  const seed = spec.seed;
  const durationMs = spec.duration_s * 1000;
  const pending: Omit<PlannedCall, "index">[] = [];
  for (const lane of ["interactive", "bulk"] as const satisfies readonly Lane[]) {
    const params = spec[lane];
    const arrivals = poissonArrivals(stream(seed, lane, "arrivals"), params.rate_per_s * load, durationMs);
    arrivals.forEach((arrivalMs, i) => {
      const random = stream(seed, lane, "call", i);
      const inputTokens = uniformInt(random, params.input_tokens);
      const outputTokens = uniformInt(random, params.output_tokens);
      pending.push({
        id: `${name}-${lane[0]}${i}`,
        declaredLane: lane,
        arrivalMs,
        gapMs: 0,
        extendsAfter: false,
        newTokens: () => tokenIds(inputTokens, seed, lane, i),
        promptTokens: inputTokens,
        cachedAtBest: 0,
        maxTokens: outputTokens,
        slo: { ttftS: params.slo.ttft_s, tpotS: params.slo.tpot_s },
        retry: false,
        group: lane,
      });
    });
  }
  pending.sort(
    (a, b) => a.arrivalMs - b.arrivalMs || (a.group === b.group ? 0 : a.group === "interactive" ? -1 : 1),
  );
  const calls = pending.map((call, index): PlannedCall => ({ ...call, index }));
  const lane = (l: "interactive" | "bulk") =>
    `${l} ${round(spec[l].rate_per_s * load)}/s, input ${fmtRange(spec[l].input_tokens)}, output ` +
    `${fmtRange(spec[l].output_tokens)}, SLO TTFT ${spec[l].slo.ttft_s} s / TPOT ${spec[l].slo.tpot_s} s`;
  return {
    kind: "mixed",
    name,
    load,
    calls,
    sharedPrefills: [],
    describe: `${spec.duration_s} s of arrivals; ${lane("interactive")}; ${lane("bulk")}; seed ${seed}`,
  };
}

function round(value: number): number {
  return Math.round(value * 1000) / 1000;
}
