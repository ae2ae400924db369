/** @module Error messages carry their causes. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { describeError } from "../../adapters/cli/error-cause.js";

/** A system error shaped as Node's net module makes them. */
function systemError(code: string, address: string, port: number): Error {
  return Object.assign(new Error(`connect ${code} ${address}:${port}`), {
    code,
    address,
    port,
    syscall: "connect",
  });
}

test("a wrapped system error shows its code and address", () => {
  const error = new TypeError("fetch failed", { cause: systemError("ECONNREFUSED", "127.0.0.1", 8000) });
  assert.equal(describeError(error), "fetch failed (ECONNREFUSED 127.0.0.1:8000)");
});

test("every address tried is listed (localhost: IPv6 and IPv4)", () => {
  const both = new AggregateError([
    systemError("ECONNREFUSED", "::1", 8000),
    systemError("ECONNREFUSED", "127.0.0.1", 8000),
  ]);
  const error = new TypeError("fetch failed", { cause: both });
  assert.equal(describeError(error), "fetch failed (ECONNREFUSED [::1]:8000, ECONNREFUSED 127.0.0.1:8000)");
});

test("a name that does not resolve, and errors without causes", () => {
  const lookup = Object.assign(new Error("getaddrinfo ENOTFOUND engine.invalid"), {
    code: "ENOTFOUND",
    hostname: "engine.invalid",
  });
  assert.equal(
    describeError(new TypeError("fetch failed", { cause: lookup })),
    "fetch failed (ENOTFOUND engine.invalid)",
  );
  assert.equal(describeError(new Error("plain")), "plain");
  assert.equal(describeError("text"), "text");
});
