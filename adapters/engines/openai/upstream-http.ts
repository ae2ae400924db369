/** @module Small HTTP facts about an upstream's answers: success, bounded body reads, network error codes, Retry-After. */

import { parseRetryAfter } from "../../openai-api/retry-after.js";
import type { UpstreamResponse } from "./transport.js";

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function isSuccess(response: UpstreamResponse): boolean {
  return response.status >= 200 && response.status < 300;
}

/** Reads a body as text up to `limit` bytes; throws when larger or aborted. */
export async function readText(
  response: UpstreamResponse,
  limit: number,
  signal: AbortSignal,
): Promise<string> {
  const parts: Uint8Array[] = [];
  let size = 0;
  try {
    for await (const part of response.body) {
      size += part.byteLength;
      if (size > limit) throw new Error(`body larger than ${limit} bytes`);
      parts.push(part);
    }
  } catch (error) {
    response.cancel();
    throw signal.aborted ? new Error("aborted", { cause: error }) : error;
  }
  return Buffer.concat(parts).toString("utf8");
}

/** Connection-level failures: nothing listens there (or the host is gone), as opposed to a slow or bad answer. */
const UNREACHABLE_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
]);

export function isUnreachable(error: unknown): boolean {
  return UNREACHABLE_CODES.has(describeNetworkError(error));
}

/** The error's system code (`ECONNREFUSED`, …) found along its causes, else its message. */
export function describeNetworkError(error: unknown): string {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && current instanceof Error; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = current.cause;
  }
  return error instanceof Error ? error.message : String(error);
}

/** Retry-After from the upstream: delta seconds or an HTTP date (a date already past asks for at least 1 s). */
export function retryAfterOf(response: UpstreamResponse): number | undefined {
  const header = response.header("retry-after");
  const seconds = parseRetryAfter(header);
  if (seconds === undefined) return undefined;
  return /^\s*\d/.test(header ?? "") ? seconds : Math.max(1, seconds);
}
