/** @module Shapes of what the job store keeps: OpenAI's batch and file objects, line results, asynchronous calls, idempotency records. */

import type { CallEndpoint } from "../../src/engine.js";
import type { Lane } from "../../src/types.js";

/** OpenAI's batch statuses, in the order a batch moves through them. */
export type BatchStatus =
  | "validating"
  | "failed"
  | "in_progress"
  | "finalizing"
  | "completed"
  | "expired"
  | "cancelling"
  | "cancelled";

/** Statuses a batch never leaves. */
export const TERMINAL_BATCH_STATUSES: ReadonlySet<BatchStatus> = new Set([
  "failed",
  "completed",
  "expired",
  "cancelled",
]);

/** Endpoints a batch (and an asynchronous call) can target. */
export type JobEndpoint = "/v1/chat/completions" | "/v1/completions" | "/v1/responses";

/** The call each job endpoint runs. */
export const JOB_CALL_ENDPOINTS: Readonly<Record<JobEndpoint, CallEndpoint>> = {
  "/v1/chat/completions": "chat",
  "/v1/completions": "completions",
  "/v1/responses": "responses",
};

export const JOB_ENDPOINTS = Object.keys(JOB_CALL_ENDPOINTS) as readonly JobEndpoint[];

/** One entry of a batch's `errors.data` (input file validation). */
export interface BatchValidationError {
  code: string;
  message: string;
  param: string | null;
  line: number | null;
}

/** The batch object as OpenAI's API returns it (times in Unix seconds). */
export interface BatchObject {
  id: string;
  object: "batch";
  endpoint: JobEndpoint;
  errors: { object: "list"; data: BatchValidationError[] } | null;
  input_file_id: string;
  completion_window: string;
  status: BatchStatus;
  output_file_id: string | null;
  error_file_id: string | null;
  created_at: number;
  in_progress_at: number | null;
  expires_at: number | null;
  finalizing_at: number | null;
  completed_at: number | null;
  failed_at: number | null;
  expired_at: number | null;
  cancelling_at: number | null;
  cancelled_at: number | null;
  request_counts: { total: number; completed: number; failed: number };
  metadata: Record<string, string> | null;
}

/** A batch with who owns it (never shown to clients). */
export interface BatchRecord {
  batch: BatchObject;
  tenant: string;
  priority: number;
}

/** The file object as OpenAI's API returns it. */
export interface FileObject {
  id: string;
  object: "file";
  bytes: number;
  created_at: number;
  filename: string;
  purpose: string;
  status: "processed";
  status_details: null;
  expires_at: number | null;
}

export interface FileRecord {
  file: FileObject;
  tenant: string;
}

/** A line's answer, in OpenAI's output-file line format. */
export interface LineResult {
  id: string;
  custom_id: string;
  response: { status_code: number; request_id: string; body: unknown } | null;
  error: { code: string; message: string } | null;
}

/** A call as it is kept to run later: everything the HTTP request said that the scheduler reads. */
export interface StoredCall {
  endpoint: CallEndpoint;
  body: Record<string, unknown>;
  sessionId?: string;
  /** The parent session's key (same tenant), a placement hint for a new child session. */
  parentSessionId?: string;
  /** The session closes when this call ends (`x-dynamo-session-final: true`). */
  finalStep?: boolean;
  declaredLane?: Lane;
  deadlineMs?: number;
}

export type AsyncJobStatus = "queued" | "in_progress" | "completed" | "failed" | "cancelled";

/** A single call answered `202 Accepted` (`Prefer: respond-async`), and its response once it ran. */
export interface AsyncJobRecord {
  id: string;
  object: "sluice.job";
  status: AsyncJobStatus;
  endpoint: JobEndpoint;
  created_at: number;
  started_at: number | null;
  completed_at: number | null;
  tenant: string;
  priority: number;
  request: StoredCall;
  /** The call's response: status, the headers a client reads (lane, replica) and the JSON body. */
  response: { status: number; headers: Record<string, string>; body: unknown } | null;
}

/** A finished request kept for its Idempotency-Key. */
export interface IdempotencyRecord {
  fingerprint: string;
  status: number;
  headers: Record<string, string>;
  body: string;
  /** ms since the epoch. */
  storedAt: number;
  expiresAt: number;
}
