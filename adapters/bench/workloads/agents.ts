/** @module The `agents` workload: ReAct-style sessions whose context grows step by step around a shared system prompt. */

import type { Range } from "./prng.js";
import { exponential, stream, tokenIds, uniformInt, uniformReal } from "./prng.js";
import type { AgentsClass, AgentsSpec } from "./schema.js";
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
    const profile = profileOf(spec, s);
    const steps = uniformInt(sessionRandom, profile.steps);
    const sessionId = `${name}-s${s}`;
    let context = 0;
    let previous: PlannedCall | undefined;
    for (let k = 0; k < steps; k++) {
      const random = stream(seed, "step", s, k);
      const toolTokens = uniformInt(random, profile.tool_output_tokens);
      const outputTokens = uniformInt(random, profile.output_tokens);
      const waitMs = uniformReal(random, profile.tool_wait_s) * 1000;
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
        group: profile.group,
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
      `${sessions} sessions × ${baseRange(spec, "steps")} steps, system prompt ${systemTokens}, ` +
      `tool output ${baseRange(spec, "tool_output_tokens")}, output ${baseRange(spec, "output_tokens")}, ` +
      `tool wait ${baseRange(spec, "tool_wait_s")} s, ${arrival} arrival, SLO TTFT ${spec.slo.ttft_s} s / ` +
      `TPOT ${spec.slo.tpot_s} s${describeClasses(spec)}, seed ${seed}`,
  };
}

/** The ranges one session draws from, and the group its calls are reported in. */
interface SessionProfile {
  group: string;
  steps: Range;
  tool_output_tokens: Range;
  output_tokens: Range;
  tool_wait_s: Range;
}

/** The name a class is reported under. */
export function classGroup(cls: AgentsClass, index: number): string {
  return cls.name ?? `class-${index}`;
}

/**
 * The class of session `s`: a golden-ratio sequence with a seeded start, so
 * every prefix of the sessions holds each class within one session of its
 * share, and session s keeps its class whatever the number of sessions.
 * Sessions no class claims keep the spec's own ranges.
 */
export function classIndexOf(spec: AgentsSpec, s: number): number | undefined {
  if (!spec.classes) return undefined;
  const start = stream(spec.seed, "classes")();
  const u = (start + s * 0.6180339887498949) % 1;
  let cumulative = 0;
  for (let i = 0; i < spec.classes.length; i++) {
    cumulative += spec.classes[i]!.share;
    if (u < cumulative) return i;
  }
  // Shares that add up to 1 claim every session, whatever the rounding of their sum.
  return cumulative >= 1 - 1e-9 ? spec.classes.length - 1 : undefined;
}

function profileOf(spec: AgentsSpec, s: number): SessionProfile {
  const index = classIndexOf(spec, s);
  const cls = index === undefined ? undefined : spec.classes![index]!;
  return {
    group: cls ? classGroup(cls, index!) : "agents",
    steps: cls?.steps ?? spec.steps,
    tool_output_tokens: cls?.tool_output_tokens ?? spec.tool_output_tokens,
    output_tokens: cls?.output_tokens ?? spec.output_tokens,
    tool_wait_s: cls?.tool_wait_s ?? spec.tool_wait_s,
  };
}

/** A range of the spec as text, or "by class" when the classes claim every session and each sets it. */
function baseRange(
  spec: AgentsSpec,
  key: "steps" | "tool_output_tokens" | "output_tokens" | "tool_wait_s",
): string {
  const classes = spec.classes ?? [];
  const claimed = classes.reduce((sum, c) => sum + c.share, 0);
  if (classes.length > 0 && claimed >= 1 - 1e-9 && classes.every((c) => c[key] !== undefined))
    return "by class";
  return fmtRange(spec[key]);
}

function describeClasses(spec: AgentsSpec): string {
  if (!spec.classes) return "";
  const parts = spec.classes.map((cls, i) => {
    const ranges = (["steps", "tool_output_tokens", "output_tokens", "tool_wait_s"] as const)
      .filter((key) => cls[key] !== undefined)
      .map((key) => `${key} ${fmtRange(cls[key]!)}`);
    return `${classGroup(cls, i)} ${Math.round(cls.share * 100)} %${ranges.length > 0 ? ` (${ranges.join(", ")})` : ""}`;
  });
  return `, classes: ${parts.join("; ")}`;
}

/** `a–b`, or `a` when both ends are equal. */
export function fmtRange([min, max]: readonly [number, number]): string {
  return min === max ? `${min}` : `${min}–${max}`;
}
