/** @module Call headers read the same way over HTTP and NATS: one parser per header, one message per mistake. */

import { Refusal } from "../../src/errors.js";

/**
 * The client's expected idle time after this step, ms (`x-sluice-expected-idle-ms`
 * over HTTP, `Sluice-Expected-Idle-Ms` over NATS): a non-negative number, or
 * undefined when absent. Anything else is a 400 naming the header.
 */
export function expectedIdleMsOf(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const trimmed = value.trim();
  const ms = Number(trimmed);
  if (trimmed === "" || !Number.isFinite(ms) || ms < 0) {
    throw new Refusal(
      "invalid_request",
      `${name} must be a non-negative number of milliseconds, got ${JSON.stringify(value)}`,
      { param: name },
    );
  }
  return ms;
}
