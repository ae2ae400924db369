/**
 * @module Error messages with their causes: `fetch failed` alone says nothing,
 * `fetch failed (ECONNREFUSED 127.0.0.1:9)` says what to fix.
 */

interface SystemErrorFields {
  code?: unknown;
  address?: unknown;
  port?: unknown;
  hostname?: unknown;
  syscall?: unknown;
}

/** One error's own words: its code and address when it is a system error, else its message. */
function ownWords(error: Error & SystemErrorFields): string {
  if (typeof error.code === "string" && (error.address !== undefined || error.hostname !== undefined)) {
    const host = String(error.address ?? error.hostname);
    const where =
      error.port !== undefined ? `${host.includes(":") ? `[${host}]` : host}:${error.port}` : host;
    return `${error.code} ${where}`;
  }
  if (typeof error.code === "string" && !error.message.includes(error.code))
    return `${error.message} (${error.code})`;
  return error.message;
}

/**
 * The message of `error` followed by its causes, outermost first; an
 * AggregateError (one try per address) lists each of its errors.
 */
export function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const words =
    error instanceof AggregateError && error.errors.length > 0
      ? error.errors.map((inner) => describeError(inner)).join(", ")
      : ownWords(error);
  const cause = (error as { cause?: unknown }).cause;
  if (cause === undefined || cause === null) return words;
  return `${words} (${describeError(cause)})`;
}
