/**
 * @module Session keys over HTTP as real clients send them (`docs/clients.md`): each header and its
 * precedence, Claude Code subagents and Codex threads as sessions of their own, the body's
 * `metadata.session_id`, odd keys refused, `x-dynamo-session-final`, parents and `prompt_cache_key`
 * as placement hints; and sessions scoped by tenant, attacked from another tenant's key.
 */

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { SESSION_HEADERS } from "../../adapters/openai-api/session-key.js";
import type { Engine, EngineCall } from "../../src/engine.js";
import {
  assertIdle,
  assertRefusal,
  chat,
  type Harness,
  type HarnessOptions,
  makeHarness,
} from "./harness.js";

const harnesses: Harness[] = [];
after(async () => {
  for (const h of harnesses) await h.close();
});

/** A harness whose engines record every call's body (what is passed through to the engine). */
function harness(options: HarnessOptions = {}) {
  const bodies: Record<string, unknown>[] = [];
  const h = makeHarness({
    replicas: 2,
    ...options,
    wrap: (engine: Engine) =>
      Object.assign(Object.create(engine) as Engine, {
        generate: (call: EngineCall) => {
          if (call.body) bodies.push(call.body);
          return engine.generate(call);
        },
      }),
  });
  harnesses.push(h);
  return { ...h, bodies };
}

const post = (json: unknown, headers: Record<string, string> = {}) => ({ method: "POST", json, headers });

const KEYS = {
  "sk-tenant-a-123": { tenant: "a" },
  "sk-tenant-b-456": { tenant: "b" },
  "sk-admin-789abc": { tenant: "ops", admin: true },
};
const asA = { authorization: "Bearer sk-tenant-a-123" };
const asB = { authorization: "Bearer sk-tenant-b-456" };
const asAdmin = { authorization: "Bearer sk-admin-789abc" };

describe("session keys: which one a call names", () => {
  test("every session header alone names the session, its source `header`", async () => {
    const { call, scheduler } = harness();
    for (const name of SESSION_HEADERS) {
      const key = `key-of-${name.replace(/_/g, "-")}`;
      const { response, text } = await call("/v1/chat/completions", post(chat(), { [name]: key }));
      assert.equal(response.status, 200, text);
      assert.equal(response.headers.get("x-sluice-session"), key, name);
      assert.equal(response.headers.get("x-sluice-session-source"), "header", name);
      assert.equal(scheduler.getSession(key)?.steps, 1, name);
      scheduler.closeSession(key);
    }
    assertIdle(scheduler);
  });

  test("first present wins, in the documented order, for every pair of headers", async () => {
    const { call, scheduler } = harness();
    for (let i = 0; i < SESSION_HEADERS.length; i++) {
      for (let j = i + 1; j < SESSION_HEADERS.length; j++) {
        const winner = SESSION_HEADERS[i]!;
        const loser = SESSION_HEADERS[j]!;
        // The later header first in the request: order of the request's headers must not matter.
        const { response } = await call(
          "/v1/chat/completions",
          post(chat(), { [loser]: `lose-${j}`, [winner]: `win-${i}` }),
        );
        assert.equal(response.headers.get("x-sluice-session"), `win-${i}`, `${winner} over ${loser}`);
      }
    }
    for (let i = 0; i < SESSION_HEADERS.length; i++) {
      assert.equal(scheduler.getSession(`lose-${i}`), undefined);
      scheduler.closeSession(`win-${i}`);
    }
    assertIdle(scheduler);
  });

  test("Codex: thread-id wins over the session-id its forks share, so two threads are two sessions", async () => {
    const { call, scheduler } = harness();
    for (const thread of ["thread-1", "thread-2"]) {
      const { response } = await call(
        "/v1/chat/completions",
        post(chat(), { "session-id": "codex-conversation", "thread-id": thread }),
      );
      assert.equal(response.headers.get("x-sluice-session"), thread);
    }
    assert.equal(scheduler.getSession("thread-1")?.steps, 1);
    assert.equal(scheduler.getSession("thread-2")?.steps, 1);
    assert.equal(scheduler.getSession("codex-conversation"), undefined, "the shared id merges nothing");
    scheduler.closeSession("thread-1");
    scheduler.closeSession("thread-2");
    assertIdle(scheduler);
  });

  test("Claude Code: a subagent is `<session>/<agent>`, apart from its parent session", async () => {
    const { call, scheduler } = harness();
    const parent = "3f1c2a4e-claude-session";
    await call("/v1/chat/completions", post(chat(), { "x-claude-code-session-id": parent }));
    const sub = await call(
      "/v1/chat/completions",
      post(chat(), { "x-claude-code-session-id": parent, "x-claude-code-agent-id": "agent-7" }),
    );
    assert.equal(sub.response.headers.get("x-sluice-session"), `${parent}/agent-7`);
    assert.equal(scheduler.getSession(parent)?.steps, 1, "the subagent's step is not the parent's");
    assert.equal(scheduler.getSession(`${parent}/agent-7`)?.steps, 1);
    // Its path is the key with the slash escaped.
    const view = await call(`/v1/sessions/${encodeURIComponent(`${parent}/agent-7`)}`);
    assert.equal(view.response.status, 200, view.text);
    scheduler.closeSession(parent);
    scheduler.closeSession(`${parent}/agent-7`);
    assertIdle(scheduler);
  });

  test("the body's metadata.session_id, after every header; source `body`", async () => {
    const { call, scheduler } = harness();
    const alone = await call("/v1/chat/completions", post(chat({ metadata: { session_id: "from-body" } })));
    assert.equal(alone.response.headers.get("x-sluice-session"), "from-body");
    assert.equal(alone.response.headers.get("x-sluice-session-source"), "body");
    const both = await call(
      "/v1/chat/completions",
      post(chat({ metadata: { session_id: "from-body" } }), { "x-opencode-session": "from-header" }),
    );
    assert.equal(both.response.headers.get("x-sluice-session"), "from-header");
    assert.equal(scheduler.getSession("from-body")?.steps, 1);
    scheduler.closeSession("from-body");
    scheduler.closeSession("from-header");
    assertIdle(scheduler);
  });

  test("user, safety_identifier and prompt_cache_key are never keys; the cache key reaches the engine", async () => {
    const { call, scheduler, bodies } = harness();
    const { response, text } = await call(
      "/v1/chat/completions",
      post(chat({ user: "user-1", safety_identifier: "hash-1", prompt_cache_key: "repo-main" })),
    );
    assert.equal(response.status, 200, text);
    assert.equal(response.headers.get("x-sluice-session"), null);
    assert.equal(response.headers.get("x-sluice-session-source"), "none");
    assert.equal(scheduler.state().sessions.total, 0);
    assert.equal(bodies.at(-1)?.prompt_cache_key, "repo-main", "passed through unchanged");
    assertIdle(scheduler);
  });

  test("odd keys are a 400 naming the header, never a crash, a trim or a merge", async () => {
    const { call, scheduler } = harness();
    const cases: [Record<string, string>, Record<string, unknown>, string][] = [
      [{ "x-session-id": "" }, {}, "x-session-id"],
      [{ "thread-id": "   " }, {}, "thread-id"],
      [{ "x-session-id": "k".repeat(257) }, {}, "x-session-id"],
      [{ "session-id": "has space" }, {}, "session-id"],
      [{ "x-session-id": "tab\there" }, {}, "x-session-id"],
      [{}, { metadata: { session_id: "ctl\u0001char" } }, "metadata.session_id"],
      [{}, { metadata: { session_id: "" } }, "metadata.session_id"],
      [{}, { metadata: { session_id: 42 } }, "metadata.session_id"],
      [{ "x-claude-code-session-id": "s", "x-claude-code-agent-id": "" }, {}, "x-claude-code-agent-id"],
      [{ "x-session-id": "child", "x-parent-session-id": "" }, {}, "x-parent-session-id"],
      [{ "x-dynamo-session-final": "maybe" }, {}, "x-dynamo-session-final"],
    ];
    for (const [headers, extra, param] of cases) {
      const { response, text } = await call("/v1/chat/completions", post(chat(extra), headers));
      assertRefusal(response, text, 400, "invalid_request", { param });
    }
    // 256 bytes is still a key.
    const longest = "k".repeat(256);
    const ok = await call("/v1/chat/completions", post(chat(), { "x-session-id": longest }));
    assert.equal(ok.response.status, 200, ok.text);
    assert.equal(scheduler.state().sessions.total, 1, "only the valid key opened a session");
    scheduler.closeSession(longest);
    assertIdle(scheduler);
  });
});

describe("session keys: end and parents", () => {
  test("x-dynamo-session-final: true closes the session when that step ends", async () => {
    const { call, scheduler } = harness();
    await call("/v1/chat/completions", post(chat(), { "x-dynamo-session-id": "dyn-1" }));
    assert.equal(scheduler.getSession("dyn-1")?.state, "active");
    const last = await call(
      "/v1/chat/completions",
      post(chat(), { "x-dynamo-session-id": "dyn-1", "x-dynamo-session-final": "true" }),
    );
    assert.equal(last.response.status, 200, last.text);
    assert.equal(scheduler.getSession("dyn-1")?.state, "closed");
    assert.equal(scheduler.getSession("dyn-1")?.steps, 2);
    // `false` keeps it open.
    await call(
      "/v1/chat/completions",
      post(chat(), { "x-dynamo-session-id": "dyn-2", "x-dynamo-session-final": "false" }),
    );
    assert.equal(scheduler.getSession("dyn-2")?.state, "active");
    scheduler.closeSession("dyn-2");
    assertIdle(scheduler);
  });

  test("a refused final step leaves the session open for the retry", async () => {
    const { call, scheduler } = harness();
    await call("/v1/chat/completions", post(chat(), { "x-dynamo-session-id": "dyn-r" }));
    const refused = await call(
      "/v1/chat/completions",
      post(chat({ max_tokens: 10_000_000 }), {
        "x-dynamo-session-id": "dyn-r",
        "x-dynamo-session-final": "true",
      }),
    );
    assert.equal(refused.response.status, 413, refused.text);
    assert.equal(scheduler.getSession("dyn-r")?.state, "active");
    await call(
      "/v1/chat/completions",
      post(chat(), { "x-dynamo-session-id": "dyn-r", "x-dynamo-session-final": "true" }),
    );
    assert.equal(scheduler.getSession("dyn-r")?.state, "closed");
    assertIdle(scheduler);
  });

  for (const [label, headerOf] of [
    ["x-parent-session-id", (parent: string) => ({ "x-parent-session-id": parent })],
    ["x-codex-parent-thread-id", (parent: string) => ({ "x-codex-parent-thread-id": parent })],
    ["x-dynamo-parent-session-id", (parent: string) => ({ "x-dynamo-parent-session-id": parent })],
  ] as const) {
    test(`a child named by ${label} is placed on its parent's replica`, async () => {
      const { call, scheduler } = harness();
      const parents = ["parent-one", "parent-two"];
      const replicaOf = new Map<string, string>();
      for (const [i, parent] of parents.entries()) {
        const { response } = await call(
          "/v1/chat/completions",
          post(chat({ messages: [{ role: "user", content: `task ${i} `.repeat(40 + i) }] }), {
            "x-session-id": parent,
          }),
        );
        replicaOf.set(parent, response.headers.get("x-sluice-replica")!);
      }
      assert.notEqual(replicaOf.get("parent-one"), replicaOf.get("parent-two"), "parents on two replicas");
      for (const parent of parents) {
        const child = await call(
          "/v1/chat/completions",
          post(chat({ messages: [{ role: "user", content: "one shared child prompt ".repeat(30) }] }), {
            "x-session-id": `${parent}-child`,
            ...headerOf(parent),
          }),
        );
        assert.equal(child.response.headers.get("x-sluice-replica"), replicaOf.get(parent), parent);
        assert.equal(scheduler.getSession(`${parent}-child`)?.steps, 1, "a session of its own");
      }
      for (const parent of parents) {
        scheduler.closeSession(parent);
        scheduler.closeSession(`${parent}-child`);
      }
      assertIdle(scheduler);
    });
  }

  test("a Claude Code subagent is placed beside its parent session", async () => {
    const { call, scheduler } = harness();
    const replicaOf = new Map<string, string>();
    for (const [i, parent] of ["cc-one", "cc-two"].entries()) {
      const { response } = await call(
        "/v1/chat/completions",
        post(chat({ messages: [{ role: "user", content: `repo ${i} `.repeat(40 + i) }] }), {
          "x-claude-code-session-id": parent,
        }),
      );
      replicaOf.set(parent, response.headers.get("x-sluice-replica")!);
    }
    assert.notEqual(replicaOf.get("cc-one"), replicaOf.get("cc-two"));
    for (const parent of ["cc-one", "cc-two"]) {
      const sub = await call(
        "/v1/chat/completions",
        post(chat({ messages: [{ role: "user", content: "explore the code ".repeat(30) }] }), {
          "x-claude-code-session-id": parent,
          "x-claude-code-agent-id": "explore",
        }),
      );
      assert.equal(sub.response.headers.get("x-sluice-replica"), replicaOf.get(parent), parent);
      scheduler.closeSession(parent);
      scheduler.closeSession(`${parent}/explore`);
    }
    assertIdle(scheduler);
  });

  test("a parent of another tenant is no hint: the child is placed as any new session", async () => {
    const { call, scheduler } = harness({ keys: KEYS });
    const replicaOf = new Map<string, string>();
    for (const [i, parent] of ["p-one", "p-two"].entries()) {
      const { response } = await call(
        "/v1/chat/completions",
        post(chat({ messages: [{ role: "user", content: `task ${i} `.repeat(40 + i) }] }), {
          ...asA,
          "x-session-id": parent,
        }),
      );
      replicaOf.set(parent, response.headers.get("x-sluice-replica")!);
    }
    const placed = new Set<string>();
    for (const parent of ["p-one", "p-two"]) {
      const child = await call(
        "/v1/chat/completions",
        post(chat({ messages: [{ role: "user", content: "one shared child prompt ".repeat(30) }] }), {
          ...asB,
          "x-session-id": `${parent}-child`,
          "x-parent-session-id": parent,
        }),
      );
      placed.add(child.response.headers.get("x-sluice-replica")!);
    }
    assert.equal(placed.size, 1, "both children follow their shared prefix, not A's sessions");
    for (const parent of ["p-one", "p-two"]) {
      scheduler.closeSession(parent, "a");
      scheduler.closeSession(`${parent}-child`, "b");
    }
    assertIdle(scheduler);
  });

  test("prompt_cache_key keeps one-off calls together without making them a session", async () => {
    const { call, scheduler } = harness();
    const replicas = new Set<string>();
    for (let i = 0; i < 4; i++) {
      const { response } = await call(
        "/v1/chat/completions",
        post(
          chat({
            prompt_cache_key: "proj-1",
            messages: [{ role: "user", content: `q${i} `.repeat(20 + i) }],
          }),
        ),
      );
      replicas.add(response.headers.get("x-sluice-replica")!);
    }
    assert.equal(replicas.size, 1);
    assert.equal(scheduler.state().sessions.total, 0);
    assertIdle(scheduler);
  });
});

describe("session keys are scoped by tenant (attacks from another tenant's key)", () => {
  async function aHoldsSession(h: ReturnType<typeof harness>) {
    const first = await h.call(
      "/v1/chat/completions",
      post(chat(), { ...asA, "x-session-id": "shared-key" }),
    );
    assert.equal(first.response.status, 200, first.text);
    return first.response.headers.get("x-sluice-replica");
  }

  test("GET: another tenant's key is a 404, as a key its own tenant does not hold", async () => {
    const h = harness({ keys: KEYS });
    await aHoldsSession(h);
    const mine = await h.call("/v1/sessions/shared-key", { headers: asA });
    assert.equal(mine.response.status, 200);
    assert.equal(mine.json().tenant, "a");
    assert.equal(mine.json().id, "shared-key");
    const theirs = await h.call("/v1/sessions/shared-key", { headers: asB });
    assertRefusal(theirs.response, theirs.text, 404, "session_not_found");
    assert.doesNotMatch(theirs.text, /sim-|steps|tokens/, "nothing of A's session leaks");
    // A non-admin asking for another tenant is still asking for its own.
    const asked = await h.call("/v1/sessions/shared-key?tenant=a", { headers: asB });
    assertRefusal(asked.response, asked.text, 404, "session_not_found");
    // A forged scoped id is not a key.
    const forged = await h.call(`/v1/sessions/${encodeURIComponent("a shared-key")}`, { headers: asB });
    assertRefusal(forged.response, forged.text, 404, "session_not_found");
    h.scheduler.closeSession("shared-key", "a");
    assertIdle(h.scheduler);
  });

  test("DELETE: another tenant cannot close it; its owner can", async () => {
    const h = harness({ keys: KEYS });
    await aHoldsSession(h);
    const theirs = await h.call("/v1/sessions/shared-key", { method: "DELETE", headers: asB });
    assertRefusal(theirs.response, theirs.text, 404, "session_not_found");
    assert.equal(h.scheduler.getSession("shared-key", "a")?.state, "active", "A keeps its place");
    const mine = await h.call("/v1/sessions/shared-key", { method: "DELETE", headers: asA });
    assert.equal(mine.response.status, 204);
    assert.equal(h.scheduler.getSession("shared-key", "a")?.state, "closed");
    assertIdle(h.scheduler);
  });

  test("steps: the same key from another tenant is another session, never a step of A's", async () => {
    const h = harness({ keys: KEYS });
    await aHoldsSession(h);
    for (const name of ["x-session-id", "thread-id", "session_id", "x-claude-code-session-id"]) {
      const b = await h.call("/v1/chat/completions", post(chat(), { ...asB, [name]: "shared-key" }));
      assert.equal(b.response.status, 200, b.text);
    }
    const viaBody = await h.call(
      "/v1/chat/completions",
      post(chat({ metadata: { session_id: "shared-key" } }), asB),
    );
    assert.equal(viaBody.response.status, 200);
    assert.equal(h.scheduler.getSession("shared-key", "a")?.steps, 1, "A's session saw only A's step");
    assert.equal(h.scheduler.getSession("shared-key", "b")?.steps, 5, "B's steps are B's own session");
    // The sessions route: B's own session of that key, never A's.
    const path = await h.call("/v1/sessions/shared-key/chat/completions", post(chat(), asB));
    assert.equal(path.response.status, 200);
    assert.equal(h.scheduler.getSession("shared-key", "a")?.steps, 1);
    h.scheduler.closeSession("shared-key", "b");
    const gone = await h.call("/v1/sessions/shared-key/chat/completions", post(chat(), asB));
    assertRefusal(gone.response, gone.text, 404, "session_not_found");
    assert.equal(h.scheduler.getSession("shared-key", "a")?.steps, 1);
    h.scheduler.closeSession("shared-key", "a");
    assertIdle(h.scheduler);
  });

  test("POST /v1/sessions with A's id opens B's own session", async () => {
    const h = harness({ keys: KEYS });
    await aHoldsSession(h);
    const opened = await h.call("/v1/sessions", post({ id: "shared-key" }, asB));
    assert.equal(opened.response.status, 201, opened.text);
    assert.equal(h.scheduler.getSession("shared-key", "a")?.steps, 1);
    assert.equal(h.scheduler.getSession("shared-key", "b")?.steps, 0);
    h.scheduler.closeSession("shared-key", "a");
    h.scheduler.closeSession("shared-key", "b");
    assertIdle(h.scheduler);
  });

  test("an admin key sees and closes every tenant's sessions", async () => {
    const h = harness({ keys: KEYS });
    await aHoldsSession(h);
    const seen = await h.call("/v1/sessions/shared-key", { headers: asAdmin });
    assert.equal(seen.response.status, 200, seen.text);
    assert.equal(seen.json().tenant, "a");
    // Two tenants holding the key: the admin names the one it means.
    await h.call("/v1/chat/completions", post(chat(), { ...asB, "x-session-id": "shared-key" }));
    const named = await h.call("/v1/sessions/shared-key?tenant=b", { headers: asAdmin });
    assert.equal(named.json().tenant, "b");
    const closed = await h.call("/v1/sessions/shared-key?tenant=b", { method: "DELETE", headers: asAdmin });
    assert.equal(closed.response.status, 204);
    assert.equal(h.scheduler.getSession("shared-key", "b")?.state, "closed");
    assert.equal(h.scheduler.getSession("shared-key", "a")?.state, "active");
    h.scheduler.closeSession("shared-key", "a");
    assertIdle(h.scheduler);
  });
});
