/**
 * @module The `adversarial` workload: agent sessions built to trip session inference
 * (docs/routing.md). Every session opens with the same system prompt and the same first task, and
 * its first answer has the same length, so the simulator answers them identically; a quarter fork a
 * child session off an earlier step, a quarter send their outputs back without their first tokens
 * (dropped reasoning), a quarter restart from a compacted history halfway. Run with
 * `--session-keys off`: the target is zero merges of distinct sessions.
 */

import type { Range } from "./prng.js";
import { stream, tokenIds, uniformInt, uniformReal } from "./prng.js";
import type { AgentsSpec } from "./schema.js";
import type { PlannedCall, Workload } from "./types.js";

/** Tokens of the task every session opens with, after the shared system prompt. */
const OPENER_TASK_TOKENS = 200;
/** Output of every session's first step: one length, so identical openers get identical answers. */
const OPENER_OUTPUT_TOKENS = 64;
/** Generated tokens a dropped-reasoning session leaves out of what it sends back. */
const DROPPED_REASONING_TOKENS = 24;
/** Tokens of the summary a compacted history restarts from (after the system prompt). */
const SUMMARY_TOKENS = 400;

type Behaviour = "plain" | "fork" | "dropped-reasoning" | "compacted";
const BEHAVIOURS: readonly Behaviour[] = ["plain", "fork", "dropped-reasoning", "compacted"];

/**
 * Compiles the adversarial workload from an agents spec (sessions, steps, sizes, waits, SLO, seed;
 * classes are not used). A fork's child is a true session of its own (`<session>-fork`): it
 * continues its parent's step 1 beside the parent's own step 2, for `steps − 2` steps.
 */
export function buildAdversarialWorkload(
  spec: AgentsSpec,
  options: { name?: string; load?: number } = {},
): Workload {
  const load = options.load ?? 1;
  if (!(load > 0)) throw new RangeError(`load must be > 0, got ${load}`);
  const name = options.name ?? "adversarial";
  const seed = spec.seed;
  const sessions = Math.max(1, Math.round(spec.sessions * load));
  const systemTokens = spec.system_prompt_tokens;
  let opener: number[] | undefined;
  const openerTokens = (): number[] => {
    opener ??= tokenIds(systemTokens, seed, "system").concat(tokenIds(OPENER_TASK_TOKENS, seed, "task"));
    return opener;
  };
  const calls: PlannedCall[] = [];
  const slo = { ttftS: spec.slo.ttft_s, tpotS: spec.slo.tpot_s };

  const addCall = (call: Omit<PlannedCall, "index" | "retry" | "arrivalMs">): PlannedCall => {
    const planned: PlannedCall = { ...call, index: calls.length, arrivalMs: 0, retry: true };
    calls.push(planned);
    return planned;
  };
  /** One step after `previous` (its context, then a tool output), in true session `sessionId`. */
  const step = (
    sessionId: string,
    k: number,
    previous: PlannedCall,
    context: number,
    behaviour: Behaviour,
    label: string,
  ): { call: PlannedCall; context: number } => {
    const random = stream(seed, label, k);
    const toolTokens = uniformInt(random, spec.tool_output_tokens);
    const outputTokens = uniformInt(random, spec.output_tokens);
    const drop = behaviour === "dropped-reasoning" ? DROPPED_REASONING_TOKENS : 0;
    const call = addCall({
      id: `${sessionId}-k${k}`,
      sessionId,
      after: previous.index,
      gapMs: uniformReal(random, spec.tool_wait_s as Range) * 1000,
      extendsAfter: true,
      newTokens: () => tokenIds(toolTokens, seed, label, "tool", k),
      promptTokens: context + toolTokens,
      cachedAtBest: context,
      maxTokens: outputTokens,
      slo,
      group: behaviour,
      ...(drop > 0 ? { dropsOutputTokens: drop } : {}),
    });
    return { call, context: context + toolTokens + outputTokens - drop };
  };

  for (let s = 0; s < sessions; s++) {
    const behaviour = BEHAVIOURS[s % BEHAVIOURS.length]!;
    const sessionId = `${name}-s${s}`;
    const steps = Math.max(3, uniformInt(stream(seed, "session", s), spec.steps));
    const first = addCall({
      id: `${sessionId}-k0`,
      sessionId,
      gapMs: 0,
      extendsAfter: false,
      newTokens: () => openerTokens().slice(),
      promptTokens: systemTokens + OPENER_TASK_TOKENS,
      cachedAtBest: systemTokens + OPENER_TASK_TOKENS,
      maxTokens: OPENER_OUTPUT_TOKENS,
      slo,
      group: behaviour,
      ...(behaviour === "dropped-reasoning" ? { dropsOutputTokens: DROPPED_REASONING_TOKENS } : {}),
    });
    let previous = first;
    let context =
      systemTokens +
      OPENER_TASK_TOKENS +
      OPENER_OUTPUT_TOKENS -
      (behaviour === "dropped-reasoning" ? DROPPED_REASONING_TOKENS : 0);
    let forkPoint: { call: PlannedCall; context: number } | undefined;
    for (let k = 1; k < steps; k++) {
      if (behaviour === "compacted" && k === Math.floor(steps / 2)) {
        // The history is replaced by a summary: the prompt no longer continues any earlier one.
        const random = stream(seed, "compact", s);
        const outputTokens = uniformInt(random, spec.output_tokens);
        previous = addCall({
          id: `${sessionId}-k${k}`,
          sessionId,
          after: previous.index,
          gapMs: uniformReal(random, spec.tool_wait_s as Range) * 1000,
          extendsAfter: false,
          newTokens: () =>
            tokenIds(systemTokens, seed, "system").concat(tokenIds(SUMMARY_TOKENS, seed, "summary", s)),
          promptTokens: systemTokens + SUMMARY_TOKENS,
          cachedAtBest: systemTokens,
          maxTokens: outputTokens,
          slo,
          group: behaviour,
        });
        context = systemTokens + SUMMARY_TOKENS + outputTokens;
        continue;
      }
      const next = step(sessionId, k, previous, context, behaviour, `session-${s}`);
      if (k === 1) forkPoint = next;
      previous = next.call;
      context = next.context;
    }
    if (behaviour === "fork" && forkPoint) {
      // The child continues step 1, as the parent's step 2 does.
      const childId = `${sessionId}-fork`;
      let childPrevious = forkPoint.call;
      let childContext = forkPoint.context;
      for (let k = 2; k < steps; k++) {
        const next = step(childId, k, childPrevious, childContext, "fork", `fork-${s}`);
        childPrevious = next.call;
        childContext = next.context;
      }
    }
  }
  return {
    kind: "agents",
    name,
    load,
    calls,
    sharedPrefills: [{ tokens: systemTokens + OPENER_TASK_TOKENS }],
    describe:
      `${sessions} sessions (plus a child per fork) with identical openers (system prompt ${systemTokens} + task ${OPENER_TASK_TOKENS}, ` +
      `first output ${OPENER_OUTPUT_TOKENS}); a quarter each plain, forking at step 2, dropping ${DROPPED_REASONING_TOKENS} reasoning tokens ` +
      `of every output, compacting their history halfway; seed ${seed}`,
  };
}
