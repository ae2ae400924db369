/** @module API keys: who a caller is (tenant, priority, admin) and how fast they may call, compared in constant time. */

import { createHash, timingSafeEqual } from "node:crypto";
import { readFile } from "node:fs/promises";
import { z } from "zod";
import { type Clock, realClock } from "../../src/clock.js";

const keyEntrySchema = z.strictObject({
  /** Tenant the key belongs to (logs, future quotas). */
  tenant: z.string().min(1),
  /** Scheduling priority; higher is more important. Only a key sets it, never a header. */
  priority: z.number().int().default(0),
  /** Sustained calls per second; absent means no rate limit. */
  rps: z.number().positive().optional(),
  /** Calls allowed in a burst above the sustained rate; defaults to max(1, ⌈rps⌉). */
  burst: z.number().int().positive().optional(),
  /** May read the admin routes (`/v1/admin/*`, `/dashboard`). */
  admin: z.boolean().default(false),
});

/** The API key file: `{ "<key>": { "tenant", "priority"?, "rps"?, "burst"?, "admin"? } }`. */
export const apiKeysSchema = z.record(
  z.string().min(8, "a key must have at least 8 characters"),
  keyEntrySchema,
);

/** What a key grants, as the scheduler and the HTTP layer see it. */
export interface ApiKeyIdentity {
  tenant: string;
  priority: number;
  admin: boolean;
  /** Index of the key in the file, for the rate limiter; never the key itself. */
  readonly slot: number;
}

/**
 * Where a key stands with its rate limit, as OpenAI's `x-ratelimit-*-requests` headers say it:
 * the bucket's capacity, the calls left in it, and the seconds until it is full again.
 */
export interface RateStanding {
  limit: number;
  remaining: number;
  resetSeconds: number;
}

/**
 * A rate-limit verdict: allowed, or refused with a wait in whole seconds (≥ 1);
 * `standing` is present when the key has a rate limit.
 */
export type RateDecision =
  | { allowed: true; standing?: RateStanding }
  | { allowed: false; retryAfterSeconds: number; standing: RateStanding };

interface Slot {
  digest: Buffer;
  identity: ApiKeyIdentity;
  rps: number | undefined;
  burst: number;
  tokens: number;
  refilledAtMs: number;
}

/** Options of `ApiKeys`. */
export interface ApiKeysOptions {
  /** Time source of the rate limiter; default real time. */
  clock?: Clock;
}

function digestOf(key: string): Buffer {
  return createHash("sha256").update(key, "utf8").digest();
}

/**
 * The configured API keys. `lookup` compares the presented key against every
 * stored key's SHA-256 digest with `timingSafeEqual` and never stops early, so
 * the time it takes says nothing about which key (or how much of one) matched.
 * `take` applies the key's token bucket (rate `rps`, capacity `burst`).
 */
export class ApiKeys {
  private readonly slots: Slot[];
  private readonly clock: Clock;

  constructor(entries: z.input<typeof apiKeysSchema>, options: ApiKeysOptions = {}) {
    const parsed = apiKeysSchema.safeParse(entries);
    if (!parsed.success) throw new RangeError(`invalid API keys: ${z.prettifyError(parsed.error)}`);
    this.clock = options.clock ?? realClock;
    const now = this.clock.now();
    this.slots = Object.entries(parsed.data).map(([key, entry], slot) => {
      const burst = entry.burst ?? Math.max(1, Math.ceil(entry.rps ?? 1));
      return {
        digest: digestOf(key),
        identity: { tenant: entry.tenant, priority: entry.priority, admin: entry.admin, slot },
        rps: entry.rps,
        burst,
        tokens: burst,
        refilledAtMs: now,
      };
    });
  }

  /** Parses a key file's JSON text; errors name the source. */
  static parse(text: string, source: string, options?: ApiKeysOptions): ApiKeys {
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (err) {
      throw new RangeError(`API keys from ${source} are not valid JSON: ${(err as Error).message}`);
    }
    try {
      return new ApiKeys(json as z.input<typeof apiKeysSchema>, options);
    } catch (err) {
      throw new RangeError(`${source}: ${(err as Error).message}`);
    }
  }

  /** Loads a key file. */
  static async fromFile(path: string, options?: ApiKeysOptions): Promise<ApiKeys> {
    let text: string;
    try {
      text = await readFile(path, "utf8");
    } catch (err) {
      throw new RangeError(`cannot read API keys file ${JSON.stringify(path)}: ${(err as Error).message}`);
    }
    return ApiKeys.parse(text, path, options);
  }

  /**
   * Keys from `SLUICE_API_KEYS`: inline JSON when the value starts with `{`,
   * else the path of a key file. Undefined when the variable is unset or empty.
   */
  static async fromEnv(
    env: Record<string, string | undefined> = process.env,
    options?: ApiKeysOptions,
  ): Promise<ApiKeys | undefined> {
    const value = env.SLUICE_API_KEYS?.trim();
    if (!value) return undefined;
    if (value.startsWith("{")) return ApiKeys.parse(value, "SLUICE_API_KEYS", options);
    return ApiKeys.fromFile(value, options);
  }

  /** Number of keys configured. */
  get size(): number {
    return this.slots.length;
  }

  /** Whether any key may read the admin routes. */
  get hasAdminKey(): boolean {
    return this.slots.some((slot) => slot.identity.admin);
  }

  /** The identity a presented key grants, or undefined. Runs in time independent of which key matched. */
  lookup(presented: string): ApiKeyIdentity | undefined {
    const digest = digestOf(presented);
    let found: ApiKeyIdentity | undefined;
    for (const slot of this.slots) {
      // No early exit: every stored key is compared whatever matched before.
      if (timingSafeEqual(slot.digest, digest)) found = slot.identity;
    }
    return found;
  }

  /** Spends one call from the key's bucket. */
  take(identity: ApiKeyIdentity): RateDecision {
    const slot = this.slots[identity.slot];
    if (!slot || slot.rps === undefined) return { allowed: true };
    const now = this.clock.now();
    slot.tokens = Math.min(
      slot.burst,
      slot.tokens + (Math.max(0, now - slot.refilledAtMs) / 1000) * slot.rps,
    );
    slot.refilledAtMs = now;
    const rps = slot.rps;
    const standing = (): RateStanding => ({
      limit: slot.burst,
      remaining: Math.floor(slot.tokens),
      resetSeconds: Math.max(0, (slot.burst - slot.tokens) / rps),
    });
    if (slot.tokens >= 1) {
      slot.tokens -= 1;
      return { allowed: true, standing: standing() };
    }
    return {
      allowed: false,
      retryAfterSeconds: Math.max(1, Math.ceil((1 - slot.tokens) / rps)),
      standing: standing(),
    };
  }
}

/** Compares two secrets in time independent of where they differ. */
export function secretsEqual(a: string, b: string): boolean {
  return timingSafeEqual(digestOf(a), digestOf(b));
}
