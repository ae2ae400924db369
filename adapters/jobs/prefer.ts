/** @module The `Prefer` request header (RFC 7240): whether a client asks to be answered asynchronously. */

/** Whether `Prefer` asks for `respond-async` (preferences are comma-separated; parameters follow `;`). */
export function prefersAsync(header: string | undefined): boolean {
  if (!header) return false;
  return header
    .split(",")
    .some((preference) => preference.split(";")[0]?.trim().toLowerCase() === "respond-async");
}
