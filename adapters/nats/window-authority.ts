/**
 * @module One session window per replica shared by every frontend, on
 * JetStream KV (bucket `sluice-windows`, key = replica id). The entry holds
 * the window size, each frontend's claim of it, and a lease naming the one
 * frontend that runs the replica's window law. Every change is a
 * compare-and-set on the entry's revision (retried on conflict), so claims
 * never add up past the size: a frontend admits sessions only into slots it
 * claimed, takes more only while Σ claims < size, and gives back what it does
 * not use. Lease and claim expiry are judged by each frontend's own clock
 * watching a counter change (no wall clocks compared across machines).
 */

import type { KV, KvEntry, QueuedIterator } from "nats";
import { type Cancel, type Clock, realClock } from "../../src/clock.js";
import type { WindowAuthority, WindowGrant, WindowTick } from "../../src/sessions/window-authority.js";
import type { SchedulerEvents } from "../../src/types.js";
import { idFromKvKey, kvKey } from "./protocol.js";
import {
  decodeEntry,
  encoder,
  isRevisionConflict,
  positive,
  type Share,
  type ShareView,
  type WindowEntry,
} from "./window-entry.js";

export {
  type ClaimRecord,
  isRevisionConflict,
  type ShareView,
  WINDOWS_BUCKET,
  type WindowEntry,
} from "./window-entry.js";

/** What the authority needs from the scheduler (`src/scheduler.ts` provides it). */
export interface WindowScheduler {
  applyWindow(replicaId: string, size: number, accepting: boolean): void;
  /** This frontend's demand on the replica's window, in the window's unit (sessions or tokens). */
  windowCounts(replicaId: string): { active: number; paused: number; waiting: number };
  addEvents(events: SchedulerEvents): void;
}

/** Options of {@link KvWindowAuthority}. */
export interface KvWindowAuthorityOptions {
  /** The `sluice-windows` bucket. */
  kv: KV;
  /** This frontend's id (a claim key); `[-_a-zA-Z0-9]`, unique among frontends. */
  frontendId: string;
  /** Time source for lease and claim expiry. Default real time. */
  clock?: Clock;
  /** A leader whose term has not moved for this long is replaced, ms. Default 6000 (3 control ticks). */
  leaseMs?: number;
  /** The leader drops a claim whose beat has not moved for this long, ms. Default 10000. */
  claimTtlMs?: number;
  /** A frontend rewrites an unchanged claim this often so it stays alive, ms. Default claimTtlMs / 3. */
  heartbeatMs?: number;
  /** Free slots a frontend keeps claimed for its next session while no other frontend waits. Default 1. */
  spareSlots?: number;
  /**
   * A place handed over with a session is kept for its next holder this long at most, ms, unless that
   * holder's returning demand shows in the entry sooner (then the yield to returning sessions takes
   * over). Default claimTtlMs.
   */
  lendMs?: number;
  /** Compare-and-set attempts per update before waiting for the next tick. Default 16. */
  maxAttempts?: number;
  /** Failures of background KV work (they never reach the request path). */
  onError?: (err: unknown) => void;
}

/**
 * A `WindowAuthority` over JetStream KV. `decide()` answers at once with the
 * window this frontend may fill (its grant) and starts a background update;
 * grants that change between ticks are pushed with `scheduler.applyWindow`.
 * While NATS is unreachable it grants `accepting: false` (no new sessions;
 * active ones continue on the claim already held).
 */
export class KvWindowAuthority implements WindowAuthority {
  readonly frontendId: string;
  private readonly kv: KV;
  private readonly clock: Clock;
  private readonly leaseMs: number;
  private readonly claimTtlMs: number;
  private readonly heartbeatMs: number;
  private readonly spareSlots: number;
  private readonly lendMs: number;
  private readonly maxAttempts: number;
  private readonly onError: (err: unknown) => void;
  private readonly shares = new Map<string, Share>();
  private scheduler: WindowScheduler | undefined;
  private connected = true;
  private closed = false;
  private watcher: QueuedIterator<KvEntry> | undefined;
  private cancelWatchRetry: Cancel | undefined;
  private watching: Promise<void> | undefined;

  constructor(options: KvWindowAuthorityOptions) {
    if (!/^[-_a-zA-Z0-9]+$/.test(options.frontendId)) {
      throw new RangeError(`frontendId must match [-_a-zA-Z0-9]+, got ${JSON.stringify(options.frontendId)}`);
    }
    this.kv = options.kv;
    this.frontendId = options.frontendId;
    this.clock = options.clock ?? realClock;
    this.leaseMs = positive("leaseMs", options.leaseMs ?? 6000);
    this.claimTtlMs = positive("claimTtlMs", options.claimTtlMs ?? 10_000);
    this.heartbeatMs = positive("heartbeatMs", options.heartbeatMs ?? this.claimTtlMs / 3);
    if (this.heartbeatMs >= this.claimTtlMs) {
      throw new RangeError(`heartbeatMs (${this.heartbeatMs}) must be below claimTtlMs (${this.claimTtlMs})`);
    }
    const spare = options.spareSlots ?? 1;
    if (!(Number.isInteger(spare) && spare >= 0))
      throw new RangeError(`spareSlots must be an integer ≥ 0, got ${spare}`);
    this.spareSlots = spare;
    this.lendMs = positive("lendMs", options.lendMs ?? this.claimTtlMs);
    const attempts = options.maxAttempts ?? 16;
    if (!(Number.isInteger(attempts) && attempts >= 1)) {
      throw new RangeError(`maxAttempts must be a positive integer, got ${attempts}`);
    }
    this.maxAttempts = attempts;
    this.onError = options.onError ?? (() => {});
  }

  /** Binds the scheduler: grants are pushed to it, and its session events trigger claim updates. */
  bind(scheduler: WindowScheduler): void {
    this.scheduler = scheduler;
    // Grants made between the scheduler's first tick and now reach it at once rather than at its next tick.
    for (const share of this.shares.values()) this.apply(share, share.grant);
    scheduler.addEvents({
      session: (e) => {
        const share = e.replica === null ? undefined : this.shares.get(e.replica);
        if (!share) return;
        // A session admitted, paused or closed changes what this frontend needs: claim more or give back,
        // judged on a fresh read (another frontend may be waiting for exactly this slot).
        share.stale = true;
        void this.sync(share);
      },
    });
  }

  /** Follows the bucket so claims freed by other frontends are taken up at once, not at the next tick. */
  startWatch(): void {
    if (this.watching || this.closed) return;
    this.watching = this.watchLoop();
  }

  decide(tick: WindowTick): WindowGrant {
    const share = this.share(tick.replica);
    share.tick = tick;
    share.tickPending = true;
    if (tick.fresh) share.lawPending = true;
    // Sessions wait here for slots: look again rather than trust a copy that may predate a slot given back.
    if (tick.local.active + tick.local.paused + tick.local.waiting > share.claim) share.stale = true;
    void this.sync(share);
    return { size: share.grant, accepting: this.accepting(share) };
  }

  handedOver(replica: string, place: number): void {
    const share = this.shares.get(replica);
    if (!share || !(place > 0)) return;
    share.lent += place;
    share.lends++;
    share.lentUntil = this.clock.now() + this.lendMs;
    // Not granted here from this moment: the next local fill must not hand the place to a new session.
    this.apply(share, Math.max(0, share.grant - place));
    share.stale = true;
    void this.sync(share);
  }

  /** NATS went away or came back. Away: no new sessions anywhere. Back: re-read and re-claim at once. */
  setConnected(connected: boolean): void {
    if (this.connected === connected) return;
    this.connected = connected;
    if (connected) {
      // The watch's consumer may not have survived the outage: follow the bucket afresh.
      this.watcher?.stop();
    }
    for (const share of this.shares.values()) {
      if (connected) {
        share.stale = true;
        share.blind = true;
        void this.sync(share);
      } else {
        this.apply(share, share.grant);
      }
    }
  }

  /** Whether the last KV round trip worked. */
  get isConnected(): boolean {
    return this.connected;
  }

  /** Runs one update of every replica's share now (tests, shutdown). */
  async syncAll(): Promise<void> {
    await Promise.all([...this.shares.values()].map((share) => this.sync(share)));
  }

  /** This frontend's view of a replica's shared window. */
  view(replica: string): ShareView | undefined {
    const share = this.shares.get(replica);
    if (!share) return undefined;
    return {
      replica,
      size: share.entry?.size,
      leader: share.entry?.leader,
      claim: share.claim,
      grant: share.grant,
      accepting: this.accepting(share),
      claims: { ...(share.entry?.claims ?? {}) },
      revision: share.revision,
    };
  }

  /**
   * Gives every claim back and resigns every lease, so other frontends take
   * over at once rather than after the timeouts. Best effort; idempotent.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.cancelWatchRetry?.();
    this.watcher?.stop();
    await Promise.all(
      [...this.shares.values()].map(async (share) => {
        for (let attempt = 0; attempt < 4 && this.connected; attempt++) {
          try {
            if (share.stale || !share.entry) await this.read(share);
            const entry = share.entry;
            if (!entry) return;
            const mine = entry.claims[this.frontendId] !== undefined;
            if (!mine && entry.leader !== this.frontendId) return;
            const next: WindowEntry = { ...entry, claims: { ...entry.claims } };
            delete next.claims[this.frontendId];
            if (next.leader === this.frontendId) next.leader = null;
            await this.kv.update(share.key, encoder.encode(JSON.stringify(next)), share.revision);
            return;
          } catch (err) {
            if (!isRevisionConflict(err)) return;
            share.stale = true;
          }
        }
      }),
    );
    await this.watching?.catch(() => {});
  }

  private share(replica: string): Share {
    let share = this.shares.get(replica);
    if (!share) {
      share = {
        replica,
        key: kvKey(replica),
        entry: undefined,
        revision: 0,
        stale: true,
        blind: false,
        claim: 0,
        grant: 0,
        applied: undefined,
        tick: undefined,
        tickPending: false,
        lawPending: false,
        running: undefined,
        again: false,
        lastWriteAt: Number.NEGATIVE_INFINITY,
        lastOkAt: Number.NEGATIVE_INFINITY,
        demand: 0,
        keep: 0,
        lent: 0,
        lentUntil: Number.NEGATIVE_INFINITY,
        lends: 0,
        leaderSeen: undefined,
        claimSeen: new Map(),
      };
      this.shares.set(replica, share);
    }
    return share;
  }

  private accepting(share: Share): boolean {
    if (!this.connected || this.closed || !share.tick?.accepting) return false;
    // A claim not confirmed for a claim lifetime may have been dropped by the leader: take no new sessions on it.
    return this.clock.now() - share.lastOkAt <= this.claimTtlMs;
  }

  /** Pushes the local window to the scheduler when it changed. */
  private apply(share: Share, grant: number): void {
    share.grant = grant;
    const accepting = this.accepting(share);
    if (share.applied && share.applied.size === grant && share.applied.accepting === accepting) return;
    // Before `bind` there is no scheduler to push to: its next tick reads the grant from `decide`.
    if (!this.scheduler) return;
    share.applied = { size: grant, accepting };
    this.scheduler.applyWindow(share.replica, grant, accepting);
  }

  /**
   * Coalesces updates: one runs at a time per replica; a request during it
   * makes it run once more. Resolves when the run that covers this request ended.
   */
  private sync(share: Share): Promise<void> {
    if (this.closed) return Promise.resolve();
    if (share.running) {
      share.again = true;
      return share.running;
    }
    share.running = (async () => {
      try {
        do {
          share.again = false;
          await this.syncOnce(share);
        } while (share.again && !this.closed);
      } catch (err) {
        this.onError(err);
      } finally {
        share.running = undefined;
      }
    })();
    return share.running;
  }

  private async read(share: Share): Promise<void> {
    const { value, revision } = decodeEntry(await this.kv.get(share.key));
    if (share.blind) {
      share.blind = false;
      share.leaderSeen = undefined;
      share.claimSeen.clear();
    }
    this.observe(share, value, revision);
    share.stale = false;
  }

  /** Records an entry seen (read, watched or written) and when its lease term and claim beats last moved. */
  private observe(share: Share, value: WindowEntry | undefined, revision: number): void {
    if (revision !== 0 && revision < share.revision) return;
    const now = this.clock.now();
    share.entry = value;
    share.revision = revision;
    if (!value) return;
    const seen = share.leaderSeen;
    if (!seen || seen.leader !== value.leader || seen.term !== value.term) {
      share.leaderSeen = { leader: value.leader, term: value.term, at: now };
    }
    for (const [frontend, claim] of Object.entries(value.claims)) {
      const last = share.claimSeen.get(frontend);
      if (!last || last.beat !== claim.beat) share.claimSeen.set(frontend, { beat: claim.beat, at: now });
    }
    share.claim = value.claims[this.frontendId]?.n ?? 0;
  }

  private async syncOnce(share: Share): Promise<void> {
    for (let attempt = 0; attempt < this.maxAttempts; attempt++) {
      if (this.closed) return;
      try {
        if (share.stale) await this.read(share);
      } catch (err) {
        share.stale = true;
        share.blind = true;
        this.apply(share, share.grant);
        throw err;
      }
      const now = this.clock.now();
      const plan = this.plan(share, now);
      if (!plan.next) {
        share.lastOkAt = now;
        share.tickPending = false;
        this.apply(share, plan.grant);
        return;
      }
      // Shrink here before giving slots back, so no session is admitted into a slot another frontend now owns.
      if (plan.grant < share.grant) this.apply(share, plan.grant);
      const lends = share.lends;
      try {
        const data = encoder.encode(JSON.stringify(plan.next));
        const revision =
          share.revision === 0
            ? await this.kv.create(share.key, data)
            : await this.kv.update(share.key, data, share.revision);
        this.observe(share, plan.next, revision);
        share.lastWriteAt = now;
        share.lastOkAt = now;
        share.tickPending = false;
        if (plan.lawApplied) share.lawPending = false;
        // A hand-over while this write was out shrank the grant below this plan: the next round plans again.
        if (share.lends === lends) this.apply(share, plan.grant);
        return;
      } catch (err) {
        if (isRevisionConflict(err)) {
          share.stale = true;
          continue;
        }
        share.stale = true;
        share.blind = true;
        this.apply(share, share.grant);
        throw err;
      }
    }
    // Lost every race this round: try again with the next tick or event.
    share.stale = true;
  }

  /** The next entry (null: nothing to write) and the local grant, from the entry last seen and local counts. */
  private plan(share: Share, now: number): { next: WindowEntry | null; grant: number; lawApplied: boolean } {
    const me = this.frontendId;
    const tick = share.tick;
    const counts = this.scheduler?.windowCounts(share.replica) ?? {
      active: tick?.local.active ?? 0,
      paused: tick?.local.paused ?? 0,
      waiting: tick?.local.waiting ?? 0,
    };
    const existing = share.entry;
    const next: WindowEntry = existing
      ? { ...existing, claims: { ...existing.claims } }
      : { size: Math.max(1, Math.round(tick?.proposedSize ?? 1)), leader: null, term: 0, claims: {} };
    let write = existing === undefined;
    let lawApplied = false;

    const leads = next.leader === me;
    const leaseLapsed =
      next.leader === null ||
      (!leads && share.leaderSeen !== undefined && now - share.leaderSeen.at > this.leaseMs);
    if (leads || leaseLapsed) {
      if (!leads) {
        next.leader = me;
        next.term++;
        write = true;
      } else if (share.tickPending) {
        next.term++;
        write = true;
      }
      if (share.lawPending && tick?.fresh) {
        const size = Math.max(1, Math.round(tick.law(next.size)));
        if (size !== next.size) next.size = size;
        lawApplied = true;
        write = true;
      }
      for (const frontend of Object.keys(next.claims)) {
        if (frontend === me) continue;
        const seen = share.claimSeen.get(frontend);
        if (!seen || now - seen.at > this.claimTtlMs) {
          if (!seen) {
            // Never seen it move: start its clock now rather than dropping it on first sight.
            share.claimSeen.set(frontend, { beat: next.claims[frontend]!.beat, at: now });
            continue;
          }
          delete next.claims[frontend];
          write = true;
        }
      }
    }

    let others = 0;
    let othersUnmet = 0;
    let othersBackUnmet = 0;
    let live = 1;
    for (const [frontend, claim] of Object.entries(next.claims)) {
      if (frontend === me) continue;
      others += claim.n;
      othersUnmet += Math.max(0, claim.want - claim.n);
      othersBackUnmet += Math.max(0, Math.min(claim.back ?? 0, claim.want - claim.n));
      if (claim.n > 0 || claim.want > 0) live++;
    }
    const demand = counts.active + counts.paused + counts.waiting;
    share.demand = demand;
    share.keep = counts.active + counts.paused;
    // A place handed over with a session stays claimed here until its next holder's demand shows (then
    // the yield below gives it up) or the lend lapses (that holder never came for it).
    if (othersBackUnmet > 0 || now >= share.lentUntil) share.lent = 0;
    const lent = share.lent;
    // Returning sessions elsewhere lack room: new sessions here wait for them.
    const mine = (othersBackUnmet > 0 ? share.keep : demand) + lent;
    const wanted = Math.min(next.size, mine + (othersUnmet > 0 || lent > 0 ? 0 : this.spareSlots));
    const room = next.size - others;
    // Never below the sessions active here: a running step is not interrupted, it pauses at its boundary.
    const claim = Math.max(0, room >= wanted ? wanted : Math.max(counts.active, room));
    const fair = Math.floor(next.size / live);
    const fairGrant = claim <= room ? claim : Math.max(0, Math.min(claim, Math.max(room, fair)));
    // Lent places are not filled here; never below the sessions active here.
    const grant = lent > 0 ? Math.max(Math.min(fairGrant, counts.active), fairGrant - lent) : fairGrant;

    const previous = next.claims[me];
    if (claim === 0 && demand === 0) {
      if (previous) {
        delete next.claims[me];
        write = true;
      }
    } else {
      const unmetChanged = previous !== undefined && previous.want > previous.n !== demand > claim;
      const backChanged = previous !== undefined && (previous.back ?? 0) !== counts.paused;
      const heartbeatDue = now - share.lastWriteAt >= this.heartbeatMs;
      if (!previous || previous.n !== claim || unmetChanged || backChanged || heartbeatDue || write) {
        next.claims[me] = {
          n: claim,
          want: demand,
          beat: (previous?.beat ?? 0) + 1,
          ...(counts.paused > 0 ? { back: counts.paused } : {}),
        };
        write = true;
      }
    }
    return { next: write ? next : null, grant, lawApplied };
  }

  private async watchLoop(): Promise<void> {
    while (!this.closed) {
      try {
        const watcher = await this.kv.watch({ key: ">" });
        this.watcher = watcher;
        if (this.closed) {
          watcher.stop();
          return;
        }
        for await (const entry of watcher) {
          const share = this.shares.get(idFromKvKey(entry.key));
          if (!share) continue;
          const { value, revision } = decodeEntry(entry);
          if (revision <= share.revision && revision !== 0) continue;
          this.observe(share, value, revision);
          share.stale = false;
          const unmet = share.demand > share.claim;
          const squeezed = share.grant < share.claim;
          const overSpare = value !== undefined && this.othersUnmet(value) > 0 && share.claim > share.demand;
          const yieldDue = value !== undefined && this.othersBackUnmet(value) > 0 && share.claim > share.keep;
          if (unmet || squeezed || overSpare || yieldDue) void this.sync(share);
        }
      } catch (err) {
        this.onError(err);
      }
      if (this.closed) return;
      // The watch ends when the server goes away; follow again once it is back.
      await new Promise<void>((resolve) => {
        this.cancelWatchRetry = this.clock.setTimeout(resolve, 500);
      });
    }
  }

  private othersBackUnmet(entry: WindowEntry): number {
    let unmet = 0;
    for (const [frontend, claim] of Object.entries(entry.claims)) {
      if (frontend !== this.frontendId) unmet += Math.max(0, Math.min(claim.back ?? 0, claim.want - claim.n));
    }
    return unmet;
  }

  private othersUnmet(entry: WindowEntry): number {
    let unmet = 0;
    for (const [frontend, claim] of Object.entries(entry.claims)) {
      if (frontend !== this.frontendId) unmet += Math.max(0, claim.want - claim.n);
    }
    return unmet;
  }
}
