/** @module Reads a JSON request body under a byte limit, refusing as soon as the limit is crossed. */

import { Refusal } from "../../src/errors.js";

/** Default request body limit: 4 MiB. */
export const DEFAULT_BODY_LIMIT_BYTES = 4 * 1024 * 1024;

function tooLarge(limitBytes: number, seen: number | undefined): Refusal {
  const size = seen === undefined ? "" : ` (at least ${seen} bytes)`;
  return new Refusal("body_too_large", `request body is larger than the ${limitBytes}-byte limit${size}`);
}

/**
 * Reads the body as text, at most `limitBytes` bytes. A `content-length` over
 * the limit is refused before reading; a body that grows past the limit while
 * streaming is refused the moment it does, and the rest is not read.
 */
export async function readBodyText(request: Request, limitBytes: number): Promise<string> {
  const declared = request.headers.get("content-length");
  if (declared !== null) {
    const length = Number(declared);
    if (Number.isFinite(length) && length > limitBytes) throw tooLarge(limitBytes, length);
  }
  const body = request.body;
  if (!body) return "";
  const reader = body.getReader();
  const parts: Uint8Array[] = [];
  let total = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.byteLength;
      if (total > limitBytes) {
        await reader.cancel().catch(() => {});
        throw tooLarge(limitBytes, total);
      }
      parts.push(value);
    }
  } finally {
    reader.releaseLock();
  }
  return Buffer.concat(parts, total).toString("utf8");
}

/** Reads and parses a JSON body; bad JSON is a 400 `invalid_request`. */
export async function readJsonBody(request: Request, limitBytes: number): Promise<unknown> {
  const text = await readBodyText(request, limitBytes);
  if (text.trim() === "")
    throw new Refusal("invalid_request", "request body is empty; expected a JSON object");
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Refusal("invalid_request", `request body is not valid JSON: ${(err as Error).message}`);
  }
}
