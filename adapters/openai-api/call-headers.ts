/** @module Call headers read the same way over HTTP and NATS: one parser per header, one message per mistake. */

import { Refusal } from "../../src/errors.js";
import type { Lane } from "../../src/types.js";

const LANES: readonly Lane[] = ["interactive", "bulk"];

/** Session key headers, first present wins (SPEC 7): HTTP requests, batch lines and the fleet's take-over read the same list. */
export const SESSION_HEADERS = [
  "x-session-id",
  "x-claude-code-session-id",
  "x-session-affinity",
  "session-id",
  "session_id",
  "x-dynamo-session-id",
] as const;

/**
 * The session key named by the first session header present with a non-blank value, trimmed, and
 * that header's name; `header` reads one header by its lower-case name. The caller judges the key.
 */
export function sessionHeaderOf(
  header: (name: string) => unknown,
): { name: (typeof SESSION_HEADERS)[number]; value: string } | undefined {
  for (const name of SESSION_HEADERS) {
    const value = header(name);
    if (typeof value === "string" && value.trim() !== "") return { name, value: value.trim() };
  }
  return undefined;
}

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
