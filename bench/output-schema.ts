/** @module SPEC 13's `--json` document as a zod schema, so a results file can be checked by anyone who reads it. */

import { z } from "zod";

const nonNegative = z.number().finite().nonnegative();

/** One `results` entry: SPEC 13's fields, plus per-session admission waits and the refused share. */
export const resultRowSchema = z.strictObject({
  policy: z.enum(["rr", "gate", "gate-prefix", "concur", "sluice", "bound"]),
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
  rejected: z.record(z.string(), z.number().int().positive()),
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
});

/** The whole document; `details` is ours (per-run wall time, leaks, per-lane numbers). */
export const benchOutputSchema = z.object({
  workload: z.string().min(1),
  replicas: z.number().int().positive(),
  preset: z.string().min(1),
  results: z.array(resultRowSchema).min(1),
  details: z.array(z.record(z.string(), z.unknown())).optional(),
});

export type BenchOutputJson = z.output<typeof benchOutputSchema>;
