/** @module Which refusals tell a client to come back later (and so carry Retry-After), and which do not. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  isRetryableStatus,
  Refusal,
  renderRefusal,
  tellsToComeBackLater,
  toRefusal,
} from "../../src/errors.js";

describe("retryable refusals", () => {
  it("counts 429, 503 and 529 as come-back-later statuses, and no other", () => {
    for (const status of [429, 503, 529]) assert.equal(isRetryableStatus(status), true, `${status}`);
    for (const status of [400, 404, 413, 500, 501, 502, 504])
      assert.equal(isRetryableStatus(status), false, `${status}`);
  });

  it("gives an internal error (500) no Retry-After, and a job runner nothing to retry", () => {
    const internal = toRefusal(new Error("boom"));
    assert.equal(internal.status, 500);
    assert.equal(internal.retryAfterSeconds, undefined);
    assert.equal(renderRefusal(internal, "req-1").headers["retry-after"], undefined);
    assert.equal(tellsToComeBackLater(internal), false);
  });

  it("keeps Retry-After on a gate rejection whatever status the operator gave it", () => {
    const overloaded = new Refusal("worker_overloaded", "full", { status: 500, retryAfterSeconds: 2 });
    assert.equal(overloaded.retryAfterSeconds, 2);
    assert.equal(tellsToComeBackLater(overloaded), true);
    const busy = new Refusal("token_budget_exhausted", "no room", { retryAfterSeconds: 3.2 });
    assert.equal(busy.retryAfterSeconds, 4);
    assert.equal(tellsToComeBackLater(busy), true);
  });
});
