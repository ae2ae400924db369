/** @module the documented `--json` document as a zod schema, so a results file can be checked by anyone who reads it. */

import { z } from "zod";

const nonNegative = z.number().finite().nonnegative();

const POLICY_NAMES = ["rr", "gate", "gate-prefix", "concur", "sluice", "bound"] as const;

/** A policy, or a policy run again with another fairness mode: `sluice (fairness off)`. */
const policyLabel = z.union([
  z.enum(POLICY_NAMES),
  z.string().regex(/^(rr|gate|gate-prefix|concur|sluice) \(fairness (tenants|off)\)$/),
]);

const share = z.number().min(0).max(1);
const counts = z.record(z.string(), z.number().int().positive());

/** One tenant's numbers in a `tenants` workload's row. */
export const tenantStatsSchema = z.strictObject({
  weight: z.number().positive(),
  band: z.enum(["protected", "standard", "sheddable"]),
  sessions: z.number().int().nonnegative(),
  completed: z.number().int().nonnegative(),
  session_completion_mean_s: nonNegative,
  session_completion_p99_s: nonNegative,
  ttft_p50_s: nonNegative,
  ttft_p99_s: nonNegative,
  first_admission_wait_p50_s: nonNegative,
  first_admission_wait_p99_s: nonNegative,
  first_admission_wait_max_s: nonNegative,
  never_admitted: z.number().int().nonnegative(),
  service_share: share,
  service_token_s: nonNegative,
  service_share_run: share,
  token_share: share,
  pauses: z.number().int().nonnegative(),
  pauses_by_reason: counts,
  rejected: counts,
});

const fairnessSchema = z.strictObject({
  jain: z.number().min(0).max(1),
  share_over_weight_max_over_min: z.number().min(1).nullable(),
  contended_s: nonNegative,
  tenants: z.array(z.string()),
  mode: z.enum(["tenants", "off"]).optional(),
});

/** One `results` entry: the documented fields, plus per-session admission waits and the refused share. */
export const resultRowSchema = z.strictObject({
  policy: policyLabel,
  load: z.number().positive(),
  makespan_s: nonNegative,
  goodput_rps: nonNegative,
  slo_attainment: z.number().min(0).max(1),
  throughput_tokens_per_s: nonNegative,
  prefix_hit_rate: z.number().min(0).max(1),
  recomputed_tokens: z.number().int().nonnegative(),
  preemptions: z.number().int().nonnegative(),
  ttft_p50_s: nonNegative,
  ttft_p99_s: nonNegative,
  tpot_p50_s: nonNegative,
  tpot_p99_s: nonNegative,
  session_completion_mean_s: nonNegative,
  session_completion_p99_s: nonNegative,
  session_wait_mean_s: nonNegative,
  session_wait_p99_s: nonNegative,
  session_wait_max_s: nonNegative,
  completed: z.number().int().nonnegative(),
  refused_share: z.number().min(0).max(1),
  rejected: counts,
  /** With `--session-keys off` (docs/routing.md, "Results in the benchmark"). */
  session_inference: z
    .strictObject({
      precision: z.number().min(0).max(1),
      recall: z.number().min(0).max(1),
      false_merges: z.number().min(0).max(1),
      inferred_sessions: z.number().int().nonnegative(),
      true_sessions: z.number().int().nonnegative(),
    })
    .optional(),
  tenants: z.record(z.string(), tenantStatsSchema).optional(),
  fairness: fairnessSchema.optional(),
});

/** The whole document; `details` is ours (per-run wall time, leaks, per-lane numbers). */
export const benchOutputSchema = z.object({
  workload: z.string().min(1),
  replicas: z.number().int().positive(),
  preset: z.string().min(1),
  results: z.array(resultRowSchema).min(1),
  details: z.array(z.record(z.string(), z.unknown())).optional(),
  /** `tenants` workloads: tenants run alone, per policy and load. */
  alone: z
    .array(
      z.strictObject({
        policy: z.enum(POLICY_NAMES),
        load: z.number().positive(),
        tenant: z.string().min(1),
        stats: tenantStatsSchema,
      }),
    )
    .optional(),
});

export type BenchOutputJson = z.output<typeof benchOutputSchema>;
