/**
 * @module The records a benchmark run keeps of calls and tenants, apart from the driver so the
 * tenant tracker reads them without importing the driver.
 */

/** How admission shares the window among tenants (docs/configuration.md): by weight and band, or arrival order. */
export const FAIRNESS_MODES = ["tenants", "off"] as const;
export type FairnessMode = (typeof FAIRNESS_MODES)[number];

/** What happened to one call. */
export interface CallRecord {
  readyAt: number;
  firstTokenAt: number | undefined;
  endAt: number;
  tokens: number;
  /** Time spent waiting for admission (ready → admitted, refusals, retry delays and failed attempts included), ms. */
  waitMs: number;
  /** When its first attempt was admitted, ms; undefined if none was. */
  admittedAt?: number;
  outcome: "pending" | "ok" | "refused" | "failed" | "abandoned";
}

/** One tenant's numbers in a run of a `tenants` workload. */
export interface TenantStats {
  weight: number;
  band: string;
  sessions: number;
  /** Sessions whose every call completed. */
  completed: number;
  session_completion_mean_s: number;
  session_completion_p99_s: number;
  ttft_p50_s: number;
  ttft_p99_s: number;
  /** Per session: its first call becoming ready → the session's first admission, s. */
  first_admission_wait_p50_s: number;
  first_admission_wait_p99_s: number;
  first_admission_wait_max_s: number;
  /** Sessions never admitted. */
  never_admitted: number;
  /** Footprint-token-seconds held while two or more tenants had sessions waiting, as a share of all tenants'. */
  service_share: number;
  /** Those footprint-token-seconds. */
  service_token_s: number;
  /** Footprint-token-seconds held over the whole run, as a share of all tenants'. */
  service_share_run: number;
  /** Prompt and output tokens of the tenant's completed calls, as a share of all tenants'. */
  token_share: number;
  /** Times a session of the tenant was paused, and by reason when the scheduler gives one. */
  pauses: number;
  pauses_by_reason: Record<string, number>;
  /** Refusals of the tenant's calls (retried ones included), by reason. */
  rejected: Record<string, number>;
}

/** Fairness over the intervals when two or more tenants had sessions waiting. */
export interface FairnessStats {
  /** Jain's index over service share ÷ weight of the tenants that took part. */
  jain: number;
  /** Largest ÷ smallest service share ÷ weight among them; null when one of them got none. */
  share_over_weight_max_over_min: number | null;
  /** How long two or more tenants had sessions waiting, s. */
  contended_s: number;
  /** The tenants the index is over: those that waited or held service in those intervals. */
  tenants: string[];
  /** The fairness mode the scheduler was given, when the run set one. */
  mode?: FairnessMode;
}
