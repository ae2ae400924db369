/**
 * @module The shared window's compare-and-set protocol under every
 * interleaving fast-check can find: three frontends race on an in-memory KV
 * (each request applied atomically at one point, answered at another) while
 * sessions arrive and leave; Σ active sessions and Σ claims never exceed the
 * window. Plus the lease in virtual time.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import type { KV } from "nats";
import { KvWindowAuthority, type WindowEntry } from "../../adapters/nats/window-authority.js";
import { VirtualClock } from "../../src/clock.js";
import type { WindowTick } from "../../src/sessions/window-authority.js";
import type { SchedulerEvents } from "../../src/types.js";

const REPLICA = "r0";
const decoder = new TextDecoder();

/** Storage several `MemoryKv` views share (one per frontend, each with its own network timing). */
class KvStore {
  readonly entries = new Map<string, { value: Uint8Array; revision: number }>();
  seq = 0;
  readonly violations: string[] = [];
}

/** A JetStream KV stand-in: every request is applied at one scheduled point and answered at a later one. */
class MemoryKv {
  private readonly store: KvStore;

  constructor(
    private readonly step: () => Promise<void>,
    store?: KvStore,
  ) {
    this.store = store ?? new KvStore();
  }

  get entries() {
    return this.store.entries;
  }

  get violations() {
    return this.store.violations;
  }

  /** Another view of the same storage, with its own timing. */
  view(step: () => Promise<void>): MemoryKv {
    return new MemoryKv(step, this.store);
  }

  private async roundTrip<T>(apply: () => T): Promise<T> {
    await this.step();
    const result = apply();
    await this.step();
    return result;
  }

  private check(key: string, value: Uint8Array): void {
    const entry = JSON.parse(decoder.decode(value)) as WindowEntry;
    const claimed = Object.values(entry.claims).reduce((sum, c) => sum + c.n, 0);
    if (claimed > entry.size) this.violations.push(`${key}: Σ claims ${claimed} > size ${entry.size}`);
  }

  private conflict(): Error {
    return Object.assign(new Error("wrong last sequence"), { api_error: { code: 400, err_code: 10071 } });
  }

  get(key: string) {
    return this.roundTrip(() => {
      const entry = this.entries.get(key);
      return entry ? { key, value: entry.value, revision: entry.revision, operation: "PUT" as const } : null;
    });
  }

  create(key: string, value: Uint8Array) {
    return this.roundTrip(() => {
      if (this.entries.has(key)) throw this.conflict();
      this.check(key, value);
      const revision = ++this.store.seq;
      this.entries.set(key, { value, revision });
      return revision;
    });
  }

  update(key: string, value: Uint8Array, revision: number) {
    return this.roundTrip(() => {
      if (this.entries.get(key)?.revision !== revision) throw this.conflict();
      this.check(key, value);
      const next = ++this.store.seq;
      this.entries.set(key, { value, revision: next });
      return next;
    });
  }

  value(key: string): WindowEntry | undefined {
    const entry = this.entries.get(key);
    return entry ? (JSON.parse(decoder.decode(entry.value)) as WindowEntry) : undefined;
  }
}

/** A frontend's admission as the authority sees it: sessions admitted only while active < granted window. */
class FakeFrontend {
  active = 0;
  waiting = 0;
  /** Sessions handed over from another frontend, waiting here for a place (they go before new ones). */
  returning = 0;
  grant = 0;
  accepting = false;
  readonly listeners: SchedulerEvents[] = [];
  readonly authority: KvWindowAuthority;

  constructor(
    readonly id: string,
    kv: MemoryKv,
    clock: VirtualClock,
    private readonly size: number,
    private readonly onAdmit: () => void,
    options: { lendMs?: number } = {},
  ) {
    this.authority = new KvWindowAuthority({
      kv: kv as unknown as KV,
      frontendId: id,
      clock,
      leaseMs: 1e9,
      claimTtlMs: 2e9,
      heartbeatMs: 1000,
      ...options,
    });
    this.authority.bind(this);
  }

  addEvents(events: SchedulerEvents): void {
    this.listeners.push(events);
  }

  windowCounts() {
    return { size: this.grant, active: this.active, paused: this.returning, waiting: this.waiting };
  }

  applyWindow(_replica: string, size: number, accepting: boolean): void {
    this.grant = size;
    this.accepting = accepting;
    this.admit();
  }

  arrive(): void {
    this.waiting++;
    this.admit();
  }

  close(): void {
    if (this.active === 0) return;
    this.active--;
    this.emit("closed");
  }

  /** An idle session here is handed to another frontend (its history and place go with it). */
  handOver(): void {
    this.active--;
    this.authority.handedOver(REPLICA, 1);
    this.emit("closed");
  }

  /** A session handed over by another frontend waits here for a place. */
  adopt(): void {
    this.returning++;
    this.admit();
  }

  tick(): void {
    const tick: WindowTick = {
      replica: REPLICA,
      proposedSize: this.size,
      law: (current) => current,
      fresh: true,
      accepting: true,
      local: { active: this.active, paused: this.returning, waiting: this.waiting },
    };
    const grant = this.authority.decide(tick);
    this.applyWindow(REPLICA, grant.size, grant.accepting);
  }

  private admit(): void {
    while (this.accepting && this.returning > 0 && this.active < this.grant) {
      this.returning--;
      this.active++;
      this.onAdmit();
      this.emit("admitted");
    }
    while (this.accepting && this.waiting > 0 && this.active < this.grant) {
      this.waiting--;
      this.active++;
      this.onAdmit();
      this.emit("admitted");
    }
  }

  private emit(event: "admitted" | "closed"): void {
    for (const l of this.listeners) l.session?.({ id: "s", event, replica: REPLICA });
  }
}

/** Runs scheduled tasks until none is left, letting the continuations they wake schedule theirs. */
async function settle(s: fc.Scheduler): Promise<void> {
  do {
    await s.waitAll();
    await new Promise((resolve) => setImmediate(resolve));
  } while (s.count() > 0);
}

describe("the shared window", () => {
  test("is never over-filled, whatever order requests and replies take", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        fc.integer({ min: 1, max: 4 }),
        fc.array(fc.record({ frontend: fc.nat(2), op: fc.constantFrom("arrive", "close", "tick", "tick") }), {
          minLength: 5,
          maxLength: 40,
        }),
        async (s, size, ops) => {
          const kv = new MemoryKv(() => s.schedule(Promise.resolve()).then(() => undefined));
          const clock = new VirtualClock();
          const violations: string[] = [];
          const frontends: FakeFrontend[] = [];
          const onAdmit = () => {
            const total = frontends.reduce((sum, f) => sum + f.active, 0);
            if (total > size) violations.push(`Σ active ${total} > ${size}`);
          };
          for (const id of ["fa", "fb", "fc"]) frontends.push(new FakeFrontend(id, kv, clock, size, onAdmit));
          for (const { frontend, op } of ops) {
            void s.schedule(Promise.resolve()).then(() => {
              const f = frontends[frontend]!;
              if (op === "arrive") f.arrive();
              else if (op === "close") f.close();
              else f.tick();
            });
          }
          await settle(s);
          // Let every frontend settle (heartbeats included), then check nobody waits while the window has room.
          for (let round = 0; round < 6; round++) {
            clock.advance(1001);
            for (const f of frontends) f.tick();
            await settle(s);
          }
          assert.deepEqual(violations, []);
          assert.deepEqual(kv.violations, []);
          const total = frontends.reduce((sum, f) => sum + f.active, 0);
          const waiting = frontends.reduce((sum, f) => sum + f.waiting, 0);
          assert.ok(total <= size);
          if (waiting > 0)
            assert.equal(total, size, `${waiting} waiting while only ${total} of ${size} slots are used`);
        },
      ),
      { numRuns: 500 },
    );
  });

  test("gives back what it does not use, so another frontend can take it", async () => {
    const kv = new MemoryKv(() => Promise.resolve());
    const clock = new VirtualClock();
    const a = new FakeFrontend("fa", kv, clock, 2, () => {});
    const b = new FakeFrontend("fb", kv, clock, 2, () => {});
    a.arrive();
    a.arrive();
    a.tick();
    await a.authority.syncAll();
    assert.equal(a.active, 2);
    b.arrive();
    b.tick();
    await b.authority.syncAll();
    assert.equal(b.active, 0, "the window is full");
    a.close();
    await a.authority.syncAll();
    b.tick();
    await b.authority.syncAll();
    assert.equal(b.active, 1);
    assert.deepEqual(
      Object.fromEntries(Object.entries(kv.value(REPLICA)!.claims).map(([id, c]) => [id, c.n])),
      { fa: 1, fb: 1 },
    );
  });
});

/** Network steps released one at a time by the test. */
class ManualSteps {
  private readonly pending: (() => void)[] = [];

  readonly step = (): Promise<void> => new Promise((resolve) => this.pending.push(resolve));

  /** Releases the next `count` steps, each as soon as it is waiting. */
  async release(count = 1): Promise<void> {
    for (let i = 0; i < count; i++) {
      for (let spins = 0; this.pending.length === 0; spins++) {
        if (spins > 100) throw new Error("no request is waiting for the network");
        await new Promise((resolve) => setImmediate(resolve));
      }
      this.pending.shift()!();
      await new Promise((resolve) => setImmediate(resolve));
    }
  }

  async releaseAll(): Promise<void> {
    for (let idle = 0; idle < 5; idle++) {
      while (this.pending.length > 0) {
        this.pending.shift()!();
        idle = 0;
        await new Promise((resolve) => setImmediate(resolve));
      }
      await new Promise((resolve) => setImmediate(resolve));
    }
  }
}

describe("giving slots back", () => {
  test("shrinks the local window before the slots are released, not after the reply", async () => {
    const store = new MemoryKv(() => Promise.resolve());
    const slow = new ManualSteps();
    const clock = new VirtualClock();
    let violations = 0;
    const frontends: FakeFrontend[] = [];
    const onAdmit = () => {
      if (frontends.reduce((sum, f) => sum + f.active, 0) > 2) violations++;
    };
    const a = new FakeFrontend("fa", store.view(slow.step), clock, 2, onAdmit);
    const b = new FakeFrontend("fb", store, clock, 2, onAdmit);
    frontends.push(a, b);
    a.arrive();
    a.arrive();
    a.tick();
    await slow.releaseAll();
    assert.equal(a.active, 2);
    b.arrive();
    b.tick();
    await b.authority.syncAll();
    assert.equal(b.active, 0);
    // a ends a session and gives its slot back: read (2 steps), then the write is applied but not yet answered.
    a.close();
    await slow.release(3);
    // b takes the slot in the meantime, and a new session reaches a before a's reply does.
    b.tick();
    await b.authority.syncAll();
    assert.equal(b.active, 1);
    a.arrive();
    await slow.releaseAll();
    assert.equal(violations, 0, "a admitted into the slot it had just given to b");
    assert.equal(a.active + b.active, 2);
  });
});

describe("a session handed to another frontend", () => {
  /** fa holds the mover and a newcomer waiting for a place; fb holds the stayer. The window (2) is full. */
  async function fullWindow(options: { lendMs?: number } = {}) {
    const kv = new MemoryKv(() => Promise.resolve());
    const clock = new VirtualClock();
    const a = new FakeFrontend("fa", kv, clock, 2, () => {}, options);
    const b = new FakeFrontend("fb", kv, clock, 2, () => {}, options);
    const round = async () => {
      for (const f of [a, b]) {
        f.tick();
        await f.authority.syncAll();
      }
    };
    a.arrive();
    await round();
    b.arrive();
    // fa gives up its spare place to fb's waiting session.
    await round();
    await round();
    a.arrive();
    await round();
    assert.deepEqual([a.active, a.waiting, b.active], [1, 1, 1]);
    return { kv, clock, a, b };
  }

  test("leaves its place to the session's next holder, not to a new session at the old holder", async () => {
    const { kv, a, b } = await fullWindow();
    a.handOver();
    // However long the next holder takes to show its demand, the old holder's ticks do not refill the place.
    for (let i = 0; i < 5; i++) {
      a.tick();
      await a.authority.syncAll();
    }
    assert.equal(a.active, 0, "the newcomer took the place handed over");
    assert.equal(kv.value(REPLICA)?.claims.fa?.n, 1, "the place stays claimed for the next holder");
    b.adopt();
    b.tick();
    await b.authority.syncAll();
    a.tick();
    await a.authority.syncAll();
    b.tick();
    await b.authority.syncAll();
    assert.deepEqual([b.active, b.returning, a.active, a.waiting], [2, 0, 0, 1]);
    // Once the moved session leaves, the newcomer gets its turn.
    b.close();
    await b.authority.syncAll();
    a.tick();
    await a.authority.syncAll();
    assert.equal(a.active, 1);
  });

  test("gives the place back to its own sessions when the next holder never comes for it", async () => {
    const { clock, a } = await fullWindow({ lendMs: 5000 });
    a.handOver();
    a.tick();
    await a.authority.syncAll();
    assert.equal(a.active, 0);
    clock.advance(5000);
    a.tick();
    await a.authority.syncAll();
    assert.equal(a.active, 1, "the lend lapsed");
  });
});

describe("the lease", () => {
  test("passes to another frontend when its holder stops renewing, and drops the holder's claim later", async () => {
    const kv = new MemoryKv(() => Promise.resolve());
    const clock = new VirtualClock();
    const options = { kv: kv as unknown as KV, clock, leaseMs: 3000, claimTtlMs: 5000, heartbeatMs: 1000 };
    const counts = { active: 1, paused: 0, waiting: 0 };
    const scheduler = (log: number[]) => ({
      addEvents: () => {},
      windowCounts: () => ({ size: null, ...counts }),
      applyWindow: (_r: string, size: number) => log.push(size),
    });
    const a = new KvWindowAuthority({ ...options, frontendId: "fa" });
    const b = new KvWindowAuthority({ ...options, frontendId: "fb" });
    a.bind(scheduler([]));
    b.bind(scheduler([]));
    let size = 8;
    const tick = (): WindowTick => ({
      replica: REPLICA,
      proposedSize: 8,
      law: (current) => current + 2,
      fresh: true,
      accepting: true,
      local: counts,
    });
    a.decide(tick());
    await a.syncAll();
    b.decide(tick());
    await b.syncAll();
    assert.equal(kv.value(REPLICA)!.leader, "fa");
    // Only the leader runs the law: one step per leader tick.
    size = kv.value(REPLICA)!.size;
    for (let i = 0; i < 3; i++) {
      clock.advance(1000);
      a.decide(tick());
      b.decide(tick());
      await a.syncAll();
      await b.syncAll();
    }
    assert.equal(kv.value(REPLICA)!.size, size + 6);
    // fa stops: no more ticks from it. fb takes over after the lease, and drops fa's claim after the claim TTL.
    for (let i = 0; i < 10; i++) {
      clock.advance(1000);
      b.decide(tick());
      await b.syncAll();
    }
    const entry = kv.value(REPLICA)!;
    assert.equal(entry.leader, "fb");
    assert.equal(entry.claims.fa, undefined);
    assert.equal(entry.claims.fb?.n, 2, "fb holds its active session plus one spare");
  });
});
