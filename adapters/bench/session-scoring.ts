/**
 * @module How well inferred sessions matched a workload's true sessions (docs/routing.md's
 * `session_inference`): precision and recall over the calls assigned to a session, and the share
 * of true sessions merged with another.
 */

/** `session_inference` of a result row. */
export interface SessionInferenceScore {
  /** Assigned calls whose inferred session's other calls are of their own true session, 0–1. */
  precision: number;
  /** Calls that could be assigned (each true session's calls after its first) that were, to a session holding no other true session's calls, 0–1. */
  recall: number;
  /** Share of true sessions with a call in an inferred session that also holds another true session's calls, 0–1. */
  false_merges: number;
  /** Inferred sessions that held calls. */
  inferred_sessions: number;
  /** True sessions of the workload (calls with a session id). */
  true_sessions: number;
}

/**
 * Scores an assignment. `calls[i]` is the i-th call's true session (undefined: a one-off call) and
 * the session the scheduler counted it in (undefined: none; a session exists from its second call,
 * so a session's first call is never expected to be assigned).
 *
 * A call is precise when every call of its inferred session belongs to its true session or, in a
 * session of several true ones, to the true session holding most of that session's calls (a fork's
 * child that is its own true session counts as such a session). Recall asks, per true session, for
 * its calls after the first to be assigned precisely and to one inferred session.
 */
export function scoreSessionInference(
  calls: readonly { trueSession: string | undefined; assigned: string | undefined }[],
): SessionInferenceScore {
  const members = new Map<string, Map<string, number>>();
  const trueCalls = new Map<string, number>();
  for (const { trueSession, assigned } of calls) {
    if (trueSession !== undefined) trueCalls.set(trueSession, (trueCalls.get(trueSession) ?? 0) + 1);
    if (assigned === undefined) continue;
    let counts = members.get(assigned);
    if (!counts) {
      counts = new Map();
      members.set(assigned, counts);
    }
    const key = trueSession ?? "\u0000one-off";
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  const majority = new Map<string, string>();
  const merged = new Set<string>();
  for (const [inferred, counts] of members) {
    let best = "";
    let bestCount = -1;
    for (const [truth, n] of counts) {
      if (n > bestCount || (n === bestCount && truth < best)) {
        best = truth;
        bestCount = n;
      }
    }
    majority.set(inferred, best);
    if (counts.size > 1) for (const truth of counts.keys()) merged.add(truth);
  }
  let assignedCalls = 0;
  let precise = 0;
  // Per true session: its precisely assigned calls in each inferred session.
  const recovered = new Map<string, Map<string, number>>();
  for (const { trueSession, assigned } of calls) {
    if (assigned === undefined) continue;
    assignedCalls++;
    const truth = trueSession ?? "\u0000one-off";
    if (majority.get(assigned) !== truth) continue;
    precise++;
    if (trueSession === undefined || (members.get(assigned)?.size ?? 0) > 1) continue;
    let per = recovered.get(trueSession);
    if (!per) {
      per = new Map();
      recovered.set(trueSession, per);
    }
    per.set(assigned, (per.get(assigned) ?? 0) + 1);
  }
  let expected = 0;
  let found = 0;
  for (const [truth, n] of trueCalls) {
    expected += Math.max(0, n - 1);
    const per = recovered.get(truth);
    if (per) found += Math.min(Math.max(0, n - 1), Math.max(...per.values()));
  }
  merged.delete("\u0000one-off");
  const round4 = (v: number) => Math.round(v * 10_000) / 10_000;
  return {
    precision: round4(assignedCalls > 0 ? precise / assignedCalls : 1),
    recall: round4(expected > 0 ? found / expected : 1),
    false_merges: round4(trueCalls.size > 0 ? merged.size / trueCalls.size : 0),
    inferred_sessions: members.size,
    true_sessions: trueCalls.size,
  };
}
