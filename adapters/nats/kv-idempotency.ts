/**
 * @module Idempotency-Keys shared by every frontend on JetStream KV (bucket `sluice-idempotency`): a
 * retry that reaches another frontend than its first request finds the key running there, or its
 * kept response. Keys are claimed with a compare-and-set, so two copies of one request arriving at
 * two frontends at once never both run.
 */

import { createHash } from "node:crypto";
import type { KV, KvEntry, NatsConnection } from "nats";
import { StorageType } from "nats";
import { Refusal } from "../../src/errors.js";
import { type IdempotencyLedger, isFinalStatus, type KeyState } from "../jobs/idempotency.js";
import type { IdempotencyRecord } from "../jobs/types.js";
import { isRevisionConflict } from "./window-authority.js";

/** Name of the KV bucket holding the keys. */
export const IDEMPOTENCY_BUCKET = "sluice-idempotency";

/** Options of {@link KvIdempotencyKeys.open}. */
export interface KvIdempotencyOptions {
  nc: NatsConnection;
  /** How long a finished request's response is kept, ms (the bucket's max age). Default 24 h. */
  ttlMs?: number;
  /** Most bytes the bucket holds; once full, further responses are not kept (their keys are freed). Default 256 MiB. */
  maxBytes?: number;
  /** Largest response body kept, bytes. Default 1 MiB less room for headers (a KV value is one NATS message). */
  maxBodyBytes?: number;
  /**
   * How long a running key holds without its frontend renewing it, ms: a frontend that dies stops
   * renewing, and a retry then runs anew (as with the embedded ledger, whose running keys die with it).
   * Default 30000.
   */
  runningLeaseMs?: number;
  /** Most keyed requests running at once in this frontend; beyond, 503 until one ends. Default 10000. */
  maxInProgress?: number;
  /** Wall clock, ms since the epoch. */
  now?: () => number;
}

/** What the bucket holds under a key. */
type KeyValue =
  | { state: "running"; fingerprint: string; until: number }
  | { state: "stored"; record: IdempotencyRecord };

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function decode(entry: KvEntry | null): KeyValue | undefined {
  if (entry?.operation !== "PUT" || entry.value.byteLength === 0) return undefined;
  return JSON.parse(decoder.decode(entry.value)) as KeyValue;
}

const encode = (value: KeyValue) => encoder.encode(JSON.stringify(value));

/** A bucket key for a tenant's key: any characters, any length in; a fixed-size KV-safe name out. */
const bucketKey = (tenant: string, key: string) =>
  createHash("sha256").update(tenant).update("\n").update(key).digest("hex");

/** How often a frontend renews its running keys, as a share of the lease. */
const RENEWALS_PER_LEASE = 3;

/** How often a retry waiting for another frontend's request looks at its key again, ms. */
const WAIT_POLL_MS = 100;

/** The shared ledger of Idempotency-Keys. */
export class KvIdempotencyKeys implements IdempotencyLedger {
  readonly maxBodyBytes: number;
  private readonly ttlMs: number;
  private readonly kv: KV;
  private readonly runningLeaseMs: number;
  private readonly maxInProgress: number;
  private readonly now: () => number;
  /** Keys this frontend runs → their bucket revision (renewed) and a promise settled when they end. */
  private readonly running = new Map<
    string,
    { fingerprint: string; revision: number; ended: Promise<void> }
  >();
  private readonly renewal: ReturnType<typeof setInterval>;
  private storedCount = 0;

  private constructor(kv: KV, ttlMs: number, options: KvIdempotencyOptions, maxPayload: number) {
    this.kv = kv;
    this.ttlMs = ttlMs;
    this.maxBodyBytes = options.maxBodyBytes ?? maxPayload - 8192;
    this.runningLeaseMs = options.runningLeaseMs ?? 30_000;
    this.maxInProgress = options.maxInProgress ?? 10_000;
    this.now = options.now ?? Date.now;
    for (const [name, value] of [
      ["maxBodyBytes", this.maxBodyBytes],
      ["runningLeaseMs", this.runningLeaseMs],
      ["maxInProgress", this.maxInProgress],
    ] as const) {
      if (!(Number.isFinite(value) && value > 0))
        throw new RangeError(`${name} must be positive, got ${value}`);
    }
    this.renewal = setInterval(() => void this.renew(), this.runningLeaseMs / RENEWALS_PER_LEASE);
    this.renewal.unref();
  }

  /** Opens (creating when missing) the bucket. */
  static async open(options: KvIdempotencyOptions): Promise<KvIdempotencyKeys> {
    const ttlMs = options.ttlMs ?? 24 * 3600_000;
    const maxBytes = options.maxBytes ?? 256 * 1024 * 1024;
    for (const [name, value] of [
      ["ttlMs", ttlMs],
      ["maxBytes", maxBytes],
    ] as const) {
      if (!(Number.isFinite(value) && value > 0))
        throw new RangeError(`${name} must be positive, got ${value}`);
    }
    const kv = await options.nc.jetstream().views.kv(IDEMPOTENCY_BUCKET, {
      history: 1,
      ttl: ttlMs,
      max_bytes: maxBytes,
      storage: StorageType.File,
    });
    return new KvIdempotencyKeys(kv, ttlMs, options, options.nc.info?.max_payload ?? 1024 * 1024);
  }

  /** Keys whose response is kept, as of the last sweep. */
  get size(): number {
    return this.storedCount;
  }

  get inProgress(): number {
    return this.running.size;
  }

  async begin(tenant: string, key: string, fingerprint: string): Promise<KeyState> {
    const id = bucketKey(tenant, key);
    try {
      for (;;) {
        const entry = await this.kv.get(id);
        const value = decode(entry);
        const now = this.now();
        if (value?.state === "running" && value.until > now) {
          if (value.fingerprint !== fingerprint) return { kind: "reused" };
          return { kind: "in_progress", ended: this.running.get(id)?.ended ?? this.endOf(id) };
        }
        if (value?.state === "stored" && value.record.expiresAt > now) {
          return value.record.fingerprint === fingerprint
            ? { kind: "replay", record: value.record }
            : { kind: "reused" };
        }
        if (this.running.size >= this.maxInProgress) throw tooMany();
        const claim = encode({ state: "running", fingerprint, until: now + this.runningLeaseMs });
        let revision: number;
        try {
          // A key absent, deleted, expired or left by a dead frontend is taken only if nobody took it meanwhile.
          revision =
            value === undefined
              ? await this.kv.create(id, claim)
              : await this.kv.update(id, claim, entry!.revision);
        } catch (err) {
          if (isRevisionConflict(err)) continue;
          throw err;
        }
        return this.claimed(id, fingerprint, revision);
      }
    } catch (err) {
      if (err instanceof Refusal) throw err;
      // Without the ledger a retry could run twice: refuse for now, and the client's retry comes back.
      throw new Refusal("unavailable", `Idempotency-Keys cannot be checked now (${(err as Error).message})`, {
        retryAfterSeconds: 1,
        scope: "fleet",
      });
    }
  }

  private claimed(id: string, fingerprint: string, revision: number): KeyState {
    let end = () => {};
    const ended = new Promise<void>((resolve) => {
      end = resolve;
    });
    const entry = { fingerprint, revision, ended };
    this.running.set(id, entry);
    let settled = false;
    const release = async () => {
      this.running.delete(id);
      end();
      await this.kv.delete(id, { previousSeq: entry.revision }).catch(() => {});
    };
    return {
      kind: "new",
      finish: async (response) => {
        if (settled) return;
        settled = true;
        if (!isFinalStatus(response.status) || Buffer.byteLength(response.body) > this.maxBodyBytes) {
          await release();
          return;
        }
        const storedAt = this.now();
        const record: IdempotencyRecord = { ...response, storedAt, expiresAt: storedAt + this.ttlMs };
        try {
          await this.kv.update(id, encode({ state: "stored", record }), entry.revision);
          this.storedCount++;
          this.running.delete(id);
          end();
        } catch {
          // The bucket is full, or the claim lapsed and another request holds the key now: not kept.
          await release();
        }
      },
      abandon: () => {
        if (settled) return;
        settled = true;
        void release();
      },
    };
  }

  /** Settles once a key running at another frontend is no longer running there, or after a lease at most. */
  private async endOf(id: string): Promise<void> {
    const giveUpAt = this.now() + this.runningLeaseMs;
    while (this.now() < giveUpAt) {
      await new Promise((resolve) => setTimeout(resolve, WAIT_POLL_MS).unref());
      const value = decode(await this.kv.get(id).catch(() => null));
      if (value?.state !== "running" || value.until <= this.now()) return;
    }
  }

  /** Renews this frontend's running keys, so no other frontend takes them for dead. */
  private async renew(): Promise<void> {
    for (const [id, entry] of this.running) {
      try {
        entry.revision = await this.kv.update(
          id,
          encode({
            state: "running",
            fingerprint: entry.fingerprint,
            until: this.now() + this.runningLeaseMs,
          }),
          entry.revision,
        );
      } catch {
        // Lost to a slow renewal: the request still ends here, and its response may not be kept.
      }
    }
  }

  /** Counts the kept responses for the gauge; the bucket's max age forgets old ones by itself. */
  sweep(): void {
    void this.kv
      .status()
      .then((status) => {
        this.storedCount = status.values;
      })
      .catch(() => {});
  }

  close(): void {
    clearInterval(this.renewal);
  }
}

function tooMany(): Refusal {
  return new Refusal("unavailable", "too many requests with an Idempotency-Key are running; retry shortly", {
    retryAfterSeconds: 1,
    scope: "fleet",
  });
}
