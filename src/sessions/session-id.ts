/** @module What a session id may be, decided once for every door (HTTP path and headers, NATS headers, the sessions API). */

import { Refusal } from "../errors.js";

/** Longest session id, characters. */
export const MAX_SESSION_ID_LENGTH = 256;

const PRINTABLE = /^[\x21-\x7e]+$/;

/** Whether `id` is a session id: 1–256 printable ASCII characters, no spaces. */
export function isSessionId(id: unknown): id is string {
  return typeof id === "string" && id.length > 0 && id.length <= MAX_SESSION_ID_LENGTH && PRINTABLE.test(id);
}

/** Returns `id` when it is a session id; otherwise a 400 `invalid_request` naming `param` (a header or field). */
export function checkSessionId(id: unknown, param = "session_id"): string {
  if (isSessionId(id)) return id;
  throw new Refusal(
    "invalid_request",
    `${param} must be 1–${MAX_SESSION_ID_LENGTH} printable ASCII characters without spaces`,
    { param },
  );
}
