/**
 * @module Session keys over NATS against a real nats-server: `Sluice-Session` and the HTTP header
 * names, odd keys refused, the final step, and sessions scoped by tenant, attacked from another
 * tenant's API key (chat steps, `sessions.get`, `sessions.close`, `sessions.open`).
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { connect, type Msg, type NatsConnection } from "nats";
import { ApiKeys } from "../../adapters/http/api-keys.js";
import { connectNatsFrontend, type NatsFrontend } from "../../adapters/nats/frontend.js";
import { type NatsServerProcess, startNatsServer } from "../../adapters/nats/nats-server-process.js";
import { HEADERS, kvKey, SUBJECTS } from "../../adapters/nats/protocol.js";
import { type NatsService, startNatsService } from "../../adapters/nats/service.js";
import { SESSIONS_BUCKET } from "../../adapters/nats/session-directory.js";
import type { Scheduler } from "../../src/scheduler.js";
import {
  assertServiceError,
  chatBody,
  eventually,
  fastSim,
  hdrs,
  json,
  makeScheduler,
} from "./nats-harness.js";

let server: NatsServerProcess;
let serverNc: NatsConnection;
let client: NatsConnection;

before(async () => {
  server = await startNatsServer();
  serverNc = await connect({ servers: server.url });
  client = await connect({ servers: server.url });
});

after(async () => {
  await client?.close();
  await serverNc?.close();
  await server?.close();
});

const A = { Authorization: "Bearer sk-tenant-a-123" };
const B = { Authorization: "Bearer sk-tenant-b-456" };
const ADMIN = { Authorization: "Bearer sk-admin-789abc" };

const apiKeys = () =>
  new ApiKeys({
    "sk-tenant-a-123": { tenant: "a" },
    "sk-tenant-b-456": { tenant: "b" },
    "sk-admin-789abc": { tenant: "ops", admin: true },
  });

function useService(withKeys: boolean) {
  const ctx = {} as { scheduler: Scheduler; service: NatsService };
  before(async () => {
    ctx.scheduler = makeScheduler().scheduler;
    const keys = withKeys ? apiKeys() : undefined;
    ctx.service = await startNatsService({
      nc: serverNc,
      scheduler: ctx.scheduler,
      probeIntervalMs: 20,
      ...(keys ? { keys } : {}),
    });
  });
  after(async () => {
    await ctx.service.stop();
    await ctx.scheduler.stop();
  });
  return ctx;
}

const request = (subject: string, body: unknown, headers: Record<string, string> = {}): Promise<Msg> =>
  client.request(subject, json(body), { timeout: 10_000, headers: hdrs(headers) });

const isError = (msg: Msg) => msg.headers?.get(HEADERS.serviceErrorCode) !== "";

async function assertIdle(scheduler: Scheduler) {
  await eventually(() => scheduler.idleCheck().permits === 0, "permits released");
  assert.deepEqual(scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
}

describe("NATS session keys without API keys", () => {
  const ctx = useService(false);

  test("Sluice-Session first, then the HTTP names in their order; the reply names the session", async () => {
    const both = await request(SUBJECTS.chat, chatBody("hi"), {
      "x-session-id": "from-http-name",
      [HEADERS.session]: "from-sluice",
    });
    assert.equal(isError(both), false, both.string());
    assert.equal(both.headers?.get(HEADERS.session), "from-sluice");
    assert.equal(both.headers?.get(HEADERS.sessionSource), "header");
    const codex = await request(SUBJECTS.chat, chatBody("hi"), { "session-id": "conv", "thread-id": "t-1" });
    assert.equal(codex.headers?.get(HEADERS.session), "t-1");
    const claude = await request(SUBJECTS.chat, chatBody("hi"), {
      "X-Claude-Code-Session-Id": "cc",
      "X-Claude-Code-Agent-Id": "sub",
    });
    assert.equal(claude.headers?.get(HEADERS.session), "cc/sub", "header names in any case");
    const body = await request(SUBJECTS.chat, chatBody("hi", { metadata: { session_id: "in-body" } }));
    assert.equal(body.headers?.get(HEADERS.session), "in-body");
    assert.equal(body.headers?.get(HEADERS.sessionSource), "body");
    const none = await request(SUBJECTS.chat, chatBody("hi", { user: "u-1" }));
    assert.equal(none.headers?.get(HEADERS.sessionSource), "none");
    for (const id of ["from-sluice", "t-1", "cc/sub", "in-body"]) {
      assert.equal(ctx.scheduler.getSession(id)?.steps, 1, id);
      ctx.scheduler.closeSession(id);
    }
    assert.equal(ctx.scheduler.getSession("from-http-name"), undefined);
    assert.equal(ctx.scheduler.getSession("conv"), undefined);
    await assertIdle(ctx.scheduler);
  });

  test("odd keys are a 400 naming the header", async () => {
    for (const [headers, param] of [
      [{ [HEADERS.session]: "" }, HEADERS.session],
      [{ [HEADERS.session]: "x".repeat(257) }, HEADERS.session],
      [{ "x-session-id": "two words" }, "x-session-id"],
      [{ "x-dynamo-session-final": "soon", [HEADERS.session]: "k" }, "x-dynamo-session-final"],
    ] as const) {
      const msg = await request(SUBJECTS.chat, chatBody("hi"), headers);
      const error = assertServiceError(msg, 400, "invalid_request");
      assert.equal(error.param, param);
    }
    assert.equal(ctx.scheduler.state().sessions.total, 0);
    await assertIdle(ctx.scheduler);
  });

  test("x-dynamo-session-final: true closes the session after that step", async () => {
    await request(SUBJECTS.chat, chatBody("hi"), { "x-dynamo-session-id": "dyn" });
    const last = await request(SUBJECTS.chat, chatBody("bye"), {
      "x-dynamo-session-id": "dyn",
      "x-dynamo-session-final": "true",
    });
    assert.equal(isError(last), false, last.string());
    await eventually(() => ctx.scheduler.getSession("dyn")?.state === "closed", "the session closed");
    await assertIdle(ctx.scheduler);
  });
});

describe("NATS sessions are scoped by tenant", () => {
  const ctx = useService(true);

  test("with keys, a request without one is a 401", async () => {
    assertServiceError(await request(SUBJECTS.chat, chatBody("hi")), 401, "unauthorized");
    assertServiceError(await request(SUBJECTS.sessionsGet, { id: "x" }), 401, "unauthorized");
    assertServiceError(
      await request(SUBJECTS.chat, chatBody("hi"), { Authorization: "Bearer sk-unknown-000" }),
      401,
      "unauthorized",
    );
  });

  test("another tenant can neither see, close nor join a session by its key", async () => {
    const first = await request(SUBJECTS.chat, chatBody("hi"), { ...A, [HEADERS.session]: "shared" });
    assert.equal(isError(first), false, first.string());

    const mine = await request(SUBJECTS.sessionsGet, { id: "shared" }, A);
    assert.equal(isError(mine), false);
    assert.equal(mine.json<{ tenant: string }>().tenant, "a");

    assertServiceError(await request(SUBJECTS.sessionsGet, { id: "shared" }, B), 404, "session_not_found");
    assertServiceError(
      await request(SUBJECTS.sessionsGet, { id: "shared", tenant: "a" }, B),
      404,
      "session_not_found",
    );
    assertServiceError(await request(SUBJECTS.sessionsGet, { id: "a shared" }, B), 404, "session_not_found");
    assertServiceError(await request(SUBJECTS.sessionsClose, { id: "shared" }, B), 404, "session_not_found");
    assert.equal(ctx.scheduler.getSession("shared", "a")?.state, "active", "A keeps its place");

    // B's steps under A's key, by every door, are B's own session.
    for (const name of [HEADERS.session, "x-session-id", "thread-id"]) {
      const b = await request(SUBJECTS.chat, chatBody("hi"), { ...B, [name]: "shared" });
      assert.equal(isError(b), false, b.string());
    }
    const opened = await request(SUBJECTS.sessionsOpen, { id: "shared" }, B);
    assert.equal(isError(opened), false, opened.string());
    assert.equal(ctx.scheduler.getSession("shared", "a")?.steps, 1);
    assert.equal(ctx.scheduler.getSession("shared", "b")?.steps, 3);

    // An admin names the tenant it means.
    const seen = await request(SUBJECTS.sessionsGet, { id: "shared", tenant: "a" }, ADMIN);
    assert.equal(seen.json<{ tenant: string; steps: number }>().steps, 1);

    const closed = await request(SUBJECTS.sessionsClose, { id: "shared" }, A);
    assert.equal(isError(closed), false);
    assert.equal(ctx.scheduler.getSession("shared", "a")?.state, "closed");
    assert.equal(ctx.scheduler.getSession("shared", "b")?.state, "active");
    ctx.scheduler.closeSession("shared", "b");
    await assertIdle(ctx.scheduler);
  });

  test("session events go out under the client's key, naming its tenant", async () => {
    const seen: { id: string; tenant: string; event: string }[] = [];
    const sub = client.subscribe("sluice.v1.events.session.evt-key");
    void (async () => {
      for await (const msg of sub) seen.push(msg.json());
    })();
    await client.flush();
    await request(SUBJECTS.chat, chatBody("hi"), { ...A, [HEADERS.session]: "evt-key" });
    await request(SUBJECTS.sessionsClose, { id: "evt-key" }, A);
    await eventually(() => seen.some((e) => e.event === "closed"), "the closed event");
    sub.unsubscribe();
    assert.ok(seen.every((e) => e.id === "evt-key" && e.tenant === "a"));
    await assertIdle(ctx.scheduler);
  });
});

describe("two frontends sharing the session directory (JetStream KV)", () => {
  const fleet: { frontend: NatsFrontend; scheduler: Scheduler }[] = [];
  before(async () => {
    const sim = fastSim("shared-0");
    for (const id of ["fe-one", "fe-two"]) {
      const frontend = await connectNatsFrontend({ servers: server.url, frontendId: id });
      const { scheduler } = makeScheduler({
        engines: [sim],
        ...(frontend.windowAuthority ? { windowAuthority: frontend.windowAuthority } : {}),
        ...(frontend.sessionDirectory ? { sessionDirectory: frontend.sessionDirectory } : {}),
      });
      await frontend.attach(scheduler, { keys: apiKeys() });
      fleet.push({ frontend, scheduler });
    }
  });
  after(async () => {
    for (const { frontend, scheduler } of fleet) {
      await frontend.close();
      await scheduler.stop();
    }
  });

  test("the same key from two tenants is two directory entries and two sessions, whichever frontend answers", async () => {
    for (let step = 0; step < 3; step++) {
      const a = await request(SUBJECTS.chat, chatBody(`a step ${step}`), {
        ...A,
        [HEADERS.session]: "fleet-key",
      });
      assert.equal(isError(a), false, a.string());
    }
    const b = await request(SUBJECTS.chat, chatBody("b step"), { ...B, [HEADERS.session]: "fleet-key" });
    assert.equal(isError(b), false, b.string());
    const steps = (tenant: string) =>
      fleet.reduce((sum, { scheduler }) => sum + (scheduler.getSession("fleet-key", tenant)?.steps ?? 0), 0);
    assert.equal(steps("a"), 3, "A's steps stayed in A's session");
    assert.equal(steps("b"), 1, "B's step opened B's own");
    assert.equal(steps("default"), 0);
    // Asked through the queue group (either frontend), B never reaches A's session.
    for (let i = 0; i < 4; i++) {
      const theirs = await request(SUBJECTS.sessionsGet, { id: "fleet-key" }, B);
      assert.equal(theirs.json<{ steps: number; tenant: string }>().tenant, "b");
      const mine = await request(SUBJECTS.sessionsGet, { id: "fleet-key" }, A);
      assert.equal(mine.json<{ steps: number }>().steps, 3);
    }
    for (const { frontend } of fleet) await frontend.sessionDirectory?.flush();
    const kv = await client.jetstream().views.kv(SESSIONS_BUCKET);
    assert.ok(await kv.get(kvKey("a fleet-key")), "A's entry");
    assert.ok(await kv.get(kvKey("b fleet-key")), "B's entry");
    assert.equal((await kv.get(kvKey("fleet-key")))?.value.length ?? 0, 0, "no unscoped entry");
    for (const headers of [A, B]) await request(SUBJECTS.sessionsClose, { id: "fleet-key" }, headers);
    for (const { scheduler } of fleet) await assertIdle(scheduler);
  });
});
