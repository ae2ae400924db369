/** @module Retry-After as RFC 9110 defines it, read in one place: delay seconds or an HTTP date. */

/**
 * Seconds to wait from a `Retry-After` value: a non-negative number of seconds,
 * or an HTTP date taken against `nowMs` (wall-clock time by definition, so only
 * edge adapters read it). Undefined when absent or unreadable.
 */
export function parseRetryAfter(
  value: string | null | undefined,
  nowMs: number = Date.now(),
): number | undefined {
  const text = value?.trim();
  if (!text) return undefined;
  if (/^\d+(\.\d+)?$/.test(text)) return Number(text);
  // An HTTP date names its day and month; a bare number in another form ("-3") is no date.
  if (!/[a-z]/i.test(text)) return undefined;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, (at - nowMs) / 1000);
}
