import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { expectedIdleMsOf } from "../../adapters/openai-api/call-headers.js";
import { parseRetryAfter } from "../../adapters/openai-api/retry-after.js";
import { Refusal } from "../../src/errors.js";

describe("Retry-After", () => {
  it("reads delay seconds and HTTP dates (RFC 9110), and nothing else", () => {
    assert.equal(parseRetryAfter("7"), 7);
    assert.equal(parseRetryAfter(" 2.5 "), 2.5);
    const now = Date.parse("Tue, 01 Dec 2026 10:00:00 GMT");
    assert.equal(parseRetryAfter("Tue, 01 Dec 2026 10:00:30 GMT", now), 30);
    assert.equal(parseRetryAfter("Tue, 01 Dec 2026 09:59:00 GMT", now), 0, "a date past means now");
    assert.equal(parseRetryAfter(undefined), undefined);
    assert.equal(parseRetryAfter(""), undefined);
    assert.equal(parseRetryAfter("soon"), undefined);
    assert.equal(parseRetryAfter("-3"), undefined);
  });
});

describe("expected idle header", () => {
  it("takes non-negative milliseconds and refuses anything else naming the header", () => {
    assert.equal(expectedIdleMsOf("x-sluice-expected-idle-ms", "1500"), 1500);
    assert.equal(expectedIdleMsOf("x-sluice-expected-idle-ms", " 0 "), 0);
    assert.equal(expectedIdleMsOf("x-sluice-expected-idle-ms", undefined), undefined);
    for (const bad of ["", "-1", "soon", "NaN"]) {
      assert.throws(
        () => expectedIdleMsOf("Sluice-Expected-Idle-Ms", bad),
        (error: unknown) =>
          error instanceof Refusal && error.status === 400 && error.param === "Sluice-Expected-Idle-Ms",
      );
    }
  });
});
