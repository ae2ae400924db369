/** @module Request ids: echoed when the client's is safe to log and repeat, generated otherwise. */

import { randomUUID } from "node:crypto";

/** Longest client request id sluice repeats, in characters. */
export const MAX_REQUEST_ID_LENGTH = 128;

// Printable ASCII only: an id lands in logs, headers and JSON, so control bytes and
// non-ASCII text (header injection, log forging) are replaced rather than escaped.
const SAFE_ID = /^[\x20-\x7e]+$/;

/**
 * The request id for a call: the client's `x-request-id` when it is printable
 * ASCII of at most 128 characters (surrounding spaces trimmed), else a fresh one.
 */
export function sanitizeRequestId(value: string | null | undefined): string {
  const trimmed = value?.trim();
  if (trimmed && trimmed.length <= MAX_REQUEST_ID_LENGTH && SAFE_ID.test(trimmed)) return trimmed;
  return newRequestId();
}

/** A fresh request id. */
export function newRequestId(): string {
  return `req-${randomUUID()}`;
}
