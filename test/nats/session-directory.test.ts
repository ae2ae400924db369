/**
 * @module The session directory decides who holds a session. A KV that is
 * connected but too slow to answer must not be read as "nobody holds it":
 * the step is refused with 503 instead of opening a second copy of a session
 * held elsewhere (the cause of a fleet stall seen on a loaded machine: the
 * second copy's window place stayed taken until its idle timeout).
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { connect, type KV, type NatsConnection } from "nats";
import { type NatsServerProcess, startNatsServer } from "../../adapters/nats/nats-server-process.js";
import { frontendSubject, kvKey } from "../../adapters/nats/protocol.js";
import { KvSessionDirectory, SESSIONS_BUCKET } from "../../adapters/nats/session-directory.js";
import { Refusal } from "../../src/errors.js";

let server: NatsServerProcess;
let nc: NatsConnection;
let kv: KV;

before(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  kv = await nc.jetstream().views.kv(SESSIONS_BUCKET);
});

after(async () => {
  await nc?.close();
  await server?.close();
});

/** The real bucket, with reads held back until `release()` (a JetStream slowed by a loaded machine). */
function slowReads(bucket: KV): { kv: KV; release(): void } {
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  const slowed = new Proxy(bucket, {
    get(target, property, receiver) {
      if (property === "get") {
        return async (key: string) => {
          await released;
          return target.get(key);
        };
      }
      const value = Reflect.get(target, property, receiver);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  return { kv: slowed, release };
}

const notHeld = async () => ({ kind: "not-held" }) as const;

describe("a session directory whose KV answers too slowly", () => {
  test("refuses a take-over with 503 unavailable instead of reading the session as new", async () => {
    await kv.put(
      kvKey("held-elsewhere"),
      new TextEncoder().encode(
        JSON.stringify({ id: "held-elsewhere", state: "active", replica: "r0", frontend: "other", at: 0 }),
      ),
    );
    const slow = slowReads(kv);
    const directory = new KvSessionDirectory({ kv: slow.kv, nc, frontendId: "here", claimTimeoutMs: 100 });
    let askedHolder = false;
    await assert.rejects(
      directory.takeOver("held-elsewhere", async () => {
        askedHolder = true;
        return notHeld();
      }),
      (err: unknown) => err instanceof Refusal && err.status === 503 && err.reason === "unavailable",
    );
    assert.equal(askedHolder, false);
    await assert.rejects(
      directory.route("held-elsewhere", { claim: true }),
      (err: unknown) => err instanceof Refusal && err.status === 503,
    );
    // A close or read served here would act on a stale local copy while the holder keeps it open.
    await assert.rejects(
      directory.route("held-elsewhere", { claim: false }),
      (err: unknown) => err instanceof Refusal && err.status === 503,
    );
    slow.release();
    // The record was never overwritten by the refused claims.
    const stored = await kv.get(kvKey("held-elsewhere"));
    assert.equal((stored?.json() as { frontend: string } | undefined)?.frontend, "other");
  });

  test("once KV answers, the same take-over asks the holder and claims the session", async () => {
    await kv.put(
      kvKey("moving"),
      new TextEncoder().encode(
        JSON.stringify({ id: "moving", state: "active", replica: "r1", frontend: "other", at: 0, steps: 3 }),
      ),
    );
    const directory = new KvSessionDirectory({ kv, nc, frontendId: "here", claimTimeoutMs: 5000 });
    const handover = await directory.takeOver("moving", async (owner) => {
      assert.equal(owner, "other");
      return { kind: "released", handover: { replica: "r1", steps: 3, tokens: 40 } };
    });
    assert.deepEqual(handover, { replica: "r1", steps: 3, tokens: 40 });
    const stored = (await kv.get(kvKey("moving")))?.json() as { frontend: string; replica: string };
    assert.equal(stored.frontend, "here");
    assert.equal(stored.replica, "r1");
  });

  test("a claim that loses to the old holder's last write keeps the history that holder handed over", async () => {
    const record = (steps: number) =>
      new TextEncoder().encode(
        JSON.stringify({
          id: "raced",
          state: "active",
          replica: "r0",
          frontend: "old",
          at: 0,
          steps,
          tokens: 90,
        }),
      );
    await kv.put(kvKey("raced"), record(2));
    const directory = new KvSessionDirectory({ kv, nc, frontendId: "new", claimTimeoutMs: 5000 });
    const answers: string[] = [];
    const handover = await directory.takeOver("raced", async () => {
      if (answers.length > 0) {
        // The old holder closed its copy when it released it: asked again, it holds nothing.
        answers.push("not-held");
        return notHeld();
      }
      // The old holder's write from its step's start lands after this take-over read the entry.
      await kv.put(kvKey("raced"), record(2));
      answers.push("released");
      return { kind: "released", handover: { replica: "r0", steps: 3, tokens: 120 } };
    });
    assert.deepEqual(answers, ["released"]);
    assert.deepEqual(handover, { replica: "r0", steps: 3, tokens: 120 });
    const stored = (await kv.get(kvKey("raced")))?.json() as { frontend: string; steps: number } | undefined;
    assert.equal(stored?.frontend, "new");
    assert.equal(stored?.steps, 3);
  });
});

function holdRecord(id: string, frontend: string): Promise<number> {
  return kv.put(
    kvKey(id),
    new TextEncoder().encode(
      JSON.stringify({ id, state: "active", replica: "r2", frontend, at: 0, steps: 4 }),
    ),
  );
}

const holderOf = async (id: string) =>
  ((await kv.get(kvKey(id)))?.json() as { frontend: string } | undefined)?.frontend;

describe("a holder that does not answer", () => {
  test("one not yet resubscribed (a NATS restart) keeps its session: asked again until it answers", async () => {
    await holdRecord("reconnecting", "late");
    const directory = new KvSessionDirectory({ kv, nc, frontendId: "here", holderGraceMs: 5000 });
    // The holder's connection comes back 300 ms after the step arrives.
    let sub: ReturnType<NatsConnection["subscribe"]> | undefined;
    const back = setTimeout(() => {
      sub = nc.subscribe(frontendSubject("late", "ping"), { callback: (_e, m) => m.respond() });
    }, 300);
    try {
      assert.deepEqual(await directory.route("reconnecting", { claim: true }), {
        owner: "other",
        frontendId: "late",
      });
      assert.ok(sub, "answered only once it was back");
    } finally {
      clearTimeout(back);
      sub?.unsubscribe();
    }
    assert.equal(await holderOf("reconnecting"), "late", "never claimed from a live holder");
  });

  test("one with no subscriber for the whole grace is gone: its session is claimed with its record", async () => {
    await holdRecord("orphaned", "dead");
    const directory = new KvSessionDirectory({ kv, nc, frontendId: "here", holderGraceMs: 300 });
    assert.deepEqual(await directory.route("orphaned", { claim: true }), { owner: "self" });
    assert.equal(await holderOf("orphaned"), "here");

    // A take-over asking the same dead holder to release: gone too, and its record is the history.
    await holdRecord("orphaned-http", "dead-too");
    const handover = await directory.takeOver("orphaned-http", async (owner, id) => {
      await nc.request(frontendSubject(owner, "sessions.release"), new TextEncoder().encode(id));
      throw new Error("unreachable: nobody subscribes to a dead holder's subject");
    });
    assert.deepEqual(handover, { replica: "r2", steps: 4, tokens: 0 });
    assert.equal(await holderOf("orphaned-http"), "here");
  });

  test("one that is subscribed but slow is alive: the step is refused with 503, the session not taken", async () => {
    await holdRecord("busy-holder", "slow");
    const sub = nc.subscribe(frontendSubject("slow", "ping"), { callback: () => {} });
    try {
      const directory = new KvSessionDirectory({ kv, nc, frontendId: "here", pingTimeoutMs: 100 });
      await assert.rejects(
        directory.route("busy-holder", { claim: true }),
        (err: unknown) => err instanceof Refusal && err.status === 503 && err.reason === "unavailable",
      );
      assert.equal(await holderOf("busy-holder"), "slow");
    } finally {
      sub.unsubscribe();
    }
  });
});
