/** @module Call headers read the same way over HTTP and NATS: one parser per header, one message per mistake. */

import { Refusal } from "../../src/errors.js";
import type { Lane } from "../../src/types.js";

const LANES: readonly Lane[] = ["interactive", "bulk"];

/** The session key headers, in the order they are read (`session-key.ts` reads them). */
export { SESSION_HEADERS } from "./session-key.js";

/** The declared lane (`x-sluice-lane`, NATS `Sluice-Lane`): interactive or bulk, any case; anything else is a 400 naming the header. */
export function declaredLaneOf(name: string, value: string | undefined): Lane | undefined {
  if (value === undefined) return undefined;
  const lane = value.trim().toLowerCase();
  if ((LANES as readonly string[]).includes(lane)) return lane as Lane;
  throw new Refusal(
    "invalid_request",
    `${name} must be "interactive" or "bulk", got ${JSON.stringify(value)}`,
    {
      param: name,
    },
  );
}

/** A positive number of milliseconds (`x-sluice-deadline-ms`, NATS `Sluice-Deadline-Ms` and `Sluice-Timeout-Ms`). */
export function positiveMsOf(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const trimmed = value.trim();
  const ms = Number(trimmed);
  if (trimmed === "" || !Number.isFinite(ms) || ms <= 0) {
    throw new Refusal(
      "invalid_request",
      `${name} must be a positive number of milliseconds, got ${JSON.stringify(value)}`,
      {
        param: name,
      },
    );
  }
  return ms;
}

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

/**
 * The longest a call may wait in a sluice queue, ms (`x-sluice-queue-ttl-ms` over HTTP,
 * `Sluice-Queue-Ttl-Ms` over NATS): a non-negative number (0: it may not wait for token budget),
 * or undefined when absent. It can only shorten a lane's residence time. Anything else is a 400.
 */
export function queueTtlMsOf(name: string, value: string | undefined): number | undefined {
  return expectedIdleMsOf(name, value);
}
