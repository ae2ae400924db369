/** @module Abort plumbing shared by the request path. */

/**
 * Aborts `controller` when `source` aborts; returns the function that stops
 * following it. Cheaper than `AbortSignal.any`, and nothing stays attached to
 * a long-lived source once the call is over.
 */
export function followAbort(source: AbortSignal | undefined, controller: AbortController): () => void {
  if (!source) return () => undefined;
  if (source.aborted) {
    controller.abort(source.reason);
    return () => undefined;
  }
  const onAbort = () => controller.abort(source.reason);
  source.addEventListener("abort", onAbort, { once: true });
  return () => source.removeEventListener("abort", onAbort);
}
