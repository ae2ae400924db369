/** @module A batch's input file: OpenAI's JSONL request lines, checked line by line before anything runs. */

import { toRefusal } from "../../src/errors.js";
import { SESSION_REQUEST_HEADERS } from "../openai-api/session-key.js";
import { sessionOfCall } from "./call-executor.js";
import { type BatchValidationError, JOB_CALL_ENDPOINTS, type JobEndpoint, type StoredCall } from "./types.js";

/** One request of a batch, ready to run. */
export interface BatchLine {
  customId: string;
  call: StoredCall;
}

/** Most lines one batch may hold (OpenAI's limit). */
export const MAX_BATCH_LINES = 50_000;

/** Most validation errors reported for one file: enough to fix it, not a copy of it. */
const MAX_REPORTED_ERRORS = 100;

/**
 * Parses an input file: `{ "custom_id", "method": "POST", "url": <the batch's endpoint>, "body" }` per
 * line. A line may also carry `"headers": { "x-session-id": … }` (any session header sluice reads), or
 * the same name inside its body: the line then runs as a step of that session and keeps its pinning.
 * Blank lines are skipped.
 */
export function parseBatchInput(
  text: string,
  endpoint: JobEndpoint,
  maxLines: number = MAX_BATCH_LINES,
): { lines: BatchLine[]; errors: BatchValidationError[] } {
  const lines: BatchLine[] = [];
  const errors: BatchValidationError[] = [];
  const seen = new Set<string>();
  const fail = (line: number, code: string, message: string, param: string | null = null) => {
    if (errors.length < MAX_REPORTED_ERRORS) errors.push({ code, message, param, line });
  };
  const rows = text.split("\n");
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i]?.trim() ?? "";
    if (row === "") continue;
    const lineNo = i + 1;
    let parsed: unknown;
    try {
      parsed = JSON.parse(row);
    } catch (err) {
      fail(lineNo, "invalid_json_line", `line ${lineNo} is not valid JSON: ${(err as Error).message}`);
      continue;
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      fail(lineNo, "invalid_json_line", `line ${lineNo} must be a JSON object`);
      continue;
    }
    const line = parsed as Record<string, unknown>;
    const customId = line.custom_id;
    if (typeof customId !== "string" || customId === "" || customId.length > 512) {
      fail(lineNo, "missing_required_parameter", "custom_id must be a non-empty string", "custom_id");
      continue;
    }
    if (seen.has(customId)) {
      fail(lineNo, "duplicate_custom_id", `custom_id ${JSON.stringify(customId)} appears twice`, "custom_id");
      continue;
    }
    seen.add(customId);
    if (line.method !== "POST") {
      fail(lineNo, "invalid_method", 'method must be "POST"', "method");
      continue;
    }
    if (line.url !== endpoint) {
      fail(
        lineNo,
        "mismatched_endpoint",
        `url ${JSON.stringify(line.url)} does not match the batch's endpoint ${endpoint}`,
        "url",
      );
      continue;
    }
    const body = line.body;
    if (typeof body !== "object" || body === null || Array.isArray(body)) {
      fail(lineNo, "invalid_request", "body must be a JSON object", "body");
      continue;
    }
    const headers = line.headers;
    if (
      headers !== undefined &&
      (typeof headers !== "object" || headers === null || Array.isArray(headers))
    ) {
      fail(lineNo, "invalid_request", "headers must be an object of strings", "headers");
      continue;
    }
    if (lines.length >= maxLines) {
      fail(lineNo, "too_many_requests", `a batch holds at most ${maxLines} requests`);
      break;
    }
    // A session may also be named inside the body under a session header's name; it is not forwarded.
    const forwarded = { ...(body as Record<string, unknown>) };
    const inBody: Record<string, unknown> = {};
    for (const name of SESSION_REQUEST_HEADERS) {
      if (name in forwarded) {
        inBody[name] = forwarded[name];
        delete forwarded[name];
      }
    }
    const call: StoredCall = {
      endpoint: JOB_CALL_ENDPOINTS[endpoint],
      body: forwarded,
      declaredLane: "bulk",
    };
    try {
      Object.assign(call, sessionOfCall(headers as Record<string, unknown> | undefined, forwarded, inBody));
    } catch (err) {
      const refusal = toRefusal(err);
      fail(lineNo, refusal.reason, `line ${lineNo}: ${refusal.message}`, refusal.param ?? null);
      continue;
    }
    lines.push({ customId, call });
  }
  if (lines.length === 0 && errors.length === 0) {
    errors.push({ code: "empty_file", message: "the input file holds no requests", param: null, line: null });
  }
  return { lines, errors };
}
