/** @module The bounded map of response ids to the replica (and session) that produced them. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ResponseOrigins } from "../../src/sessions/response-origins.js";

describe("ResponseOrigins", () => {
  test("remembers where a response was produced, with its session when it had one", () => {
    const origins = new ResponseOrigins(4);
    origins.remember("resp_a", { replica: "r0", sessionId: "s1" });
    origins.remember("resp_b", { replica: "r1" });
    assert.deepEqual(origins.lookup("resp_a"), { replica: "r0", sessionId: "s1" });
    assert.deepEqual(origins.lookup("resp_b"), { replica: "r1" });
    assert.equal(origins.lookup("resp_c"), undefined);
  });

  test("stays within its capacity, forgetting the least recently produced or continued first", () => {
    const origins = new ResponseOrigins(3);
    for (const id of ["r1", "r2", "r3"]) origins.remember(id, { replica: "x" });
    // Continuing r1 refreshes it: r2 is now the oldest.
    assert.ok(origins.lookup("r1"));
    origins.remember("r4", { replica: "x" });
    assert.equal(origins.size, 3);
    assert.equal(origins.lookup("r2"), undefined);
    for (const id of ["r1", "r3", "r4"]) assert.ok(origins.lookup(id), id);
    for (let i = 0; i < 1000; i++) origins.remember(`bulk-${i}`, { replica: "y" });
    assert.equal(origins.size, 3);
    assert.deepEqual(origins.lookup("bulk-999"), { replica: "y" });
  });

  test("remembering an id again moves it to the replica named last", () => {
    const origins = new ResponseOrigins(2);
    origins.remember("r", { replica: "a" });
    origins.remember("r", { replica: "b", sessionId: "s" });
    assert.equal(origins.size, 1);
    assert.deepEqual(origins.lookup("r"), { replica: "b", sessionId: "s" });
  });

  test("a capacity that is not a positive integer is refused, naming the value", () => {
    assert.throws(() => new ResponseOrigins(0), /positive integer, got 0/);
    assert.throws(() => new ResponseOrigins(1.5), /got 1.5/);
  });
});
