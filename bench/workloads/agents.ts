/** @module The `agents` workload: ReAct-style sessions whose context grows step by step around a shared system prompt. */

import { exponential, stream, tokenIds, uniformInt, uniformReal } from "./prng.js";
import type { AgentsSpec } from "./schema.js";
import type { PlannedCall, Workload } from "./types.js";

/**
 * Compiles an agents spec at an offered-load multiplier. With `arrival:
 * "batch"` the load scales the number of sessions (all start at 0, as in RL
 * rollouts); with Poisson arrivals it scales the arrival rate. Every draw of
 * session i comes from its own seeded stream, so session i is the same
 * session at every load.
 *
 * Step 0's prompt is the shared system prompt plus the session's first tool
 * output (its task); step k > 0 starts `tool_wait_s` after step k-1 ended and
 * sends the whole context so far (the previous prompt and the tokens the
 * engine generated for it) plus that step's tool output.
 */
export function buildAgentsWorkload(
  spec: AgentsSpec,
  options: { name?: string; load?: number } = {},
): Workload {
  const load = options.load ?? 1;
  if (!(load > 0)) throw new RangeError(`load must be > 0, got ${load}`);
  const name = options.name ?? "agents";
  const seed = spec.seed;
  const batch = spec.arrival === "batch";
  const sessions = batch ? Math.max(1, Math.round(spec.sessions * load)) : spec.sessions;
  const systemTokens = spec.system_prompt_tokens;
  let systemPrompt: number[] | undefined;
  const system = (): number[] => {
    systemPrompt ??= tokenIds(systemTokens, seed, "system");
    return systemPrompt;
  };

  const calls: PlannedCall[] = [];
  const arrivals = stream(seed, "arrivals");
  let arrivalMs = 0;
  for (let s = 0; s < sessions; s++) {
    if (spec.arrival !== "batch") arrivalMs += exponential(arrivals, spec.arrival.rate_per_s * load) * 1000;
    const sessionRandom = stream(seed, "session", s);
    const steps = uniformInt(sessionRandom, spec.steps);
    const sessionId = `${name}-s${s}`;
    let context = 0;
    let previous: PlannedCall | undefined;
    for (let k = 0; k < steps; k++) {
      const random = stream(seed, "step", s, k);
      const toolTokens = uniformInt(random, spec.tool_output_tokens);
      const outputTokens = uniformInt(random, spec.output_tokens);
      const waitMs = uniformReal(random, spec.tool_wait_s) * 1000;
      const first = k === 0;
      const promptTokens = (first ? systemTokens : context) + toolTokens;
      const call: PlannedCall = {
        index: calls.length,
        id: `${sessionId}-k${k}`,
        sessionId,
        arrivalMs,
        gapMs: first ? 0 : waitMs,
        extendsAfter: !first,
        newTokens: first
          ? () => system().concat(tokenIds(toolTokens, seed, "tool", s, k))
          : () => tokenIds(toolTokens, seed, "tool", s, k),
        promptTokens,
        // The lower bound may assume the shared system prompt and the previous context already cached.
        cachedAtBest: first ? systemTokens : context,
        maxTokens: outputTokens,
        slo: { ttftS: spec.slo.ttft_s, tpotS: spec.slo.tpot_s },
        retry: true,
        group: "agents",
      };
      if (previous) call.after = previous.index;
      calls.push(call);
      context = promptTokens + outputTokens;
      previous = call;
    }
  }
  const arrival = batch
    ? "batch"
    : `Poisson ${spec.arrival === "batch" ? 0 : spec.arrival.rate_per_s * load}/s`;
  return {
    kind: "agents",
    name,
    load,
    calls,
    sharedPrefills: systemTokens > 0 ? [{ tokens: systemTokens }] : [],
    describe:
      `${sessions} sessions × ${fmtRange(spec.steps)} steps, system prompt ${systemTokens}, ` +
      `tool output ${fmtRange(spec.tool_output_tokens)}, output ${fmtRange(spec.output_tokens)}, ` +
      `tool wait ${fmtRange(spec.tool_wait_s)} s, ${arrival} arrival, SLO TTFT ${spec.slo.ttft_s} s / ` +
      `TPOT ${spec.slo.tpot_s} s, seed ${seed}`,
  };
}

/** `a–b`, or `a` when both ends are equal. */
export function fmtRange([min, max]: readonly [number, number]): string {
  return min === max ? `${min}` : `${min}–${max}`;
}
