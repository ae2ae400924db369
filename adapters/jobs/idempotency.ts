/**
 * @module Idempotency-Key on any POST (IETF httpapi idempotency-key draft): a retry of a request that
 * already ran gets the stored response instead of running it twice.
 */

import { createHash } from "node:crypto";
import type { Context } from "hono";
import { Refusal } from "../../src/errors.js";
import type { ApiKeys } from "../http/api-keys.js";
import { readStreamCapped } from "../http/read-body.js";
import { prefersAsync } from "./prefer.js";
import type { LmdbJobStore } from "./store.js";
import type { IdempotencyRecord } from "./types.js";

/** Options of {@link IdempotencyKeys}. */
export interface IdempotencyOptions {
  store: LmdbJobStore;
  /** How long a finished request's response is kept for its key, ms. Default 24 h. */
  ttlMs?: number;
  /** Most responses kept (oldest forgotten first), memory index and disk alike. Default 10000. */
  maxRecords?: number;
  /** Most keyed requests running at once; beyond, 503 until one ends. Default 10000. */
  maxInProgress?: number;
  /** Largest response body kept, bytes; a larger response is not kept and its key is freed. Default 4 MiB. */
  maxBodyBytes?: number;
  /** Wall clock, ms since the epoch. */
  now?: () => number;
}

/** What a keyed request finds. */
export type KeyState =
  | {
      kind: "new";
      finish(response: Omit<IdempotencyRecord, "storedAt" | "expiresAt">): Promise<void>;
      abandon(): void;
    }
  | { kind: "replay"; record: IdempotencyRecord }
  /** `ended` settles when the first request ends (kept or not). */
  | { kind: "in_progress"; ended: Promise<void> }
  | { kind: "reused" };

/**
 * Where keys are kept: `IdempotencyKeys` in this process and its embedded store, or a shared one
 * (JetStream KV with `--nats`, `adapters/nats/kv-idempotency.ts`) so a retry reaching another
 * frontend finds its key.
 */
export interface IdempotencyLedger {
  /** Looks a key up and, when new, claims it for this request until `finish` or `abandon`. */
  begin(tenant: string, key: string, fingerprint: string): Promise<KeyState>;
  /** Largest response body kept, bytes. */
  readonly maxBodyBytes: number;
  /** Keys whose response is kept (as far as this process knows). */
  readonly size: number;
  /** Keys whose first request runs in this process. */
  readonly inProgress: number;
  /** Forgets responses past their time (a shared ledger may leave that to its store). */
  sweep(): void;
}

/** Response headers a replay gives back; the request id is the replay's own. */
const KEPT_HEADERS = [
  "content-type",
  "location",
  "preference-applied",
  "x-sluice-lane",
  "x-sluice-replica",
  "x-sluice-queue-ms",
];

/** Statuses whose response is final for the key; anything else (429, 5xx, 409 …) frees the key so a retry runs anew. */
export function isFinalStatus(status: number): boolean {
  if (status >= 200 && status < 300) return true;
  return status >= 400 && status < 500 && ![408, 409, 425, 429].includes(status);
}

const scoped = (tenant: string, key: string) => `${tenant}\n${key}`;

/**
 * The keys, scoped per tenant: running ones in memory (a crash ends those requests, so there is
 * nothing to keep), finished ones in the store with an index in memory, both bounded.
 */
export class IdempotencyKeys implements IdempotencyLedger {
  private readonly store: LmdbJobStore;
  readonly ttlMs: number;
  private readonly maxRecords: number;
  private readonly maxInProgress: number;
  readonly maxBodyBytes: number;
  private readonly now: () => number;
  /** Running keys → the fingerprint of their request and a promise settled when it ends. */
  private readonly running = new Map<string, { fingerprint: string; ended: Promise<void> }>();
  /** Finished keys, oldest stored first → expiry (ms). */
  private readonly index = new Map<string, { tenant: string; key: string; expiresAt: number }>();

  constructor(options: IdempotencyOptions) {
    this.store = options.store;
    this.ttlMs = options.ttlMs ?? 24 * 3600_000;
    this.maxRecords = options.maxRecords ?? 10_000;
    this.maxInProgress = options.maxInProgress ?? 10_000;
    this.maxBodyBytes = options.maxBodyBytes ?? 4 * 1024 * 1024;
    this.now = options.now ?? Date.now;
    for (const [name, value] of [
      ["ttlMs", this.ttlMs],
      ["maxRecords", this.maxRecords],
      ["maxInProgress", this.maxInProgress],
      ["maxBodyBytes", this.maxBodyBytes],
    ] as const) {
      if (!(Number.isFinite(value) && value > 0))
        throw new RangeError(`${name} must be positive, got ${value}`);
    }
    const now = this.now();
    const found: { tenant: string; key: string; storedAt: number; expiresAt: number }[] = [];
    const stale: [string, string][] = [];
    for (const { key, value } of this.store.idempotency.getRange()) {
      if (value.expiresAt <= now) stale.push(key);
      else found.push({ tenant: key[0], key: key[1], storedAt: value.storedAt, expiresAt: value.expiresAt });
    }
    found.sort((a, b) => a.storedAt - b.storedAt);
    for (const entry of found) this.index.set(scoped(entry.tenant, entry.key), entry);
    if (stale.length > 0) this.forget(stale);
    this.evictOverflow();
  }

  /** Keys whose response is kept now. */
  get size(): number {
    return this.index.size;
  }

  /** Keys whose first request still runs. */
  get inProgress(): number {
    return this.running.size;
  }

  async begin(tenant: string, key: string, fingerprint: string): Promise<KeyState> {
    const id = scoped(tenant, key);
    const first = this.running.get(id);
    if (first !== undefined) {
      return first.fingerprint === fingerprint
        ? { kind: "in_progress", ended: first.ended }
        : { kind: "reused" };
    }
    const entry = this.index.get(id);
    if (entry && entry.expiresAt > this.now()) {
      const record = this.store.idempotency.get([tenant, key]);
      if (record) return record.fingerprint === fingerprint ? { kind: "replay", record } : { kind: "reused" };
    }
    if (entry) this.drop(id);
    if (this.running.size >= this.maxInProgress) {
      throw new Refusal(
        "unavailable",
        "too many requests with an Idempotency-Key are running; retry shortly",
        {
          retryAfterSeconds: 1,
          scope: "fleet",
        },
      );
    }
    let end = () => {};
    const ended = new Promise<void>((resolve) => {
      end = resolve;
    });
    this.running.set(id, { fingerprint, ended });
    let settled = false;
    return {
      kind: "new",
      finish: async (response) => {
        if (settled) return;
        settled = true;
        try {
          if (!isFinalStatus(response.status) || Buffer.byteLength(response.body) > this.maxBodyBytes) return;
          const storedAt = this.now();
          const record: IdempotencyRecord = { ...response, storedAt, expiresAt: storedAt + this.ttlMs };
          await this.store.commit(() => this.store.idempotency.put([tenant, key], record));
          this.index.delete(id);
          this.index.set(id, { tenant, key, expiresAt: record.expiresAt });
          this.evictOverflow();
        } finally {
          this.running.delete(id);
          end();
        }
      },
      abandon: () => {
        if (settled) return;
        settled = true;
        this.running.delete(id);
        end();
      },
    };
  }

  /** Forgets responses past their time. */
  sweep(): void {
    const now = this.now();
    const stale: [string, string][] = [];
    for (const [id, entry] of this.index) {
      if (entry.expiresAt <= now) {
        stale.push([entry.tenant, entry.key]);
        this.index.delete(id);
      }
    }
    if (stale.length > 0) this.forget(stale);
  }

  private drop(id: string): void {
    const entry = this.index.get(id);
    if (!entry) return;
    this.index.delete(id);
    this.forget([[entry.tenant, entry.key]]);
  }

  private evictOverflow(): void {
    const evicted: [string, string][] = [];
    for (const [id, entry] of this.index) {
      if (this.index.size <= this.maxRecords) break;
      this.index.delete(id);
      evicted.push([entry.tenant, entry.key]);
    }
    if (evicted.length > 0) this.forget(evicted);
  }

  private forget(keys: [string, string][]): void {
    // Forgetting is housekeeping: a store closing meanwhile loses nothing that matters.
    this.store
      .commit(() => {
        for (const key of keys) this.store.idempotency.remove(key);
      })
      .catch(() => {});
  }
}

/** Reads a body as bytes under a limit (a multipart upload is not text). */
export async function readBodyBytes(request: Request, limitBytes: number): Promise<Uint8Array<ArrayBuffer>> {
  const tooLarge = (seen: number) =>
    new Refusal(
      "body_too_large",
      `request body is larger than the ${limitBytes}-byte limit (at least ${seen} bytes)`,
    );
  const declared = Number(request.headers.get("content-length") ?? Number.NaN);
  if (Number.isFinite(declared) && declared > limitBytes) throw tooLarge(declared);
  const read = await readStreamCapped(request.body, limitBytes);
  if (read.over !== undefined) throw tooLarge(read.over);
  return read.bytes;
}

/**
 * What makes two requests "the same": method, path and body. A multipart body is compared by its
 * fields and file contents, since a client encodes each retry with a new boundary.
 */
async function fingerprintOf(
  method: string,
  path: string,
  contentType: string,
  body: Uint8Array<ArrayBuffer>,
): Promise<string> {
  const hash = createHash("sha256").update(`${method}\n${path}\n`);
  if (/^multipart\/form-data/i.test(contentType)) {
    try {
      const form = await new Response(body, { headers: { "content-type": contentType } }).formData();
      const entries: [string, FormDataEntryValue][] = [];
      form.forEach((value, name) => {
        entries.push([name, value]);
      });
      for (const [name, value] of entries) {
        hash.update(`\n${name}=`);
        if (typeof value === "string") hash.update(value);
        else hash.update(`file:${value.name}:`).update(new Uint8Array(await value.arrayBuffer()));
      }
      return hash.digest("hex");
    } catch {
      // not parseable: compare the bytes
    }
  }
  return hash.update(body).digest("hex");
}

/** Options of {@link idempotencyMiddleware}. */
export interface IdempotencyMiddlewareOptions {
  keys: IdempotencyLedger;
  /** API keys: a request's key is scoped to its tenant. */
  apiKeys?: ApiKeys | undefined;
  /** Body limit of a path, bytes. */
  bodyLimitOf: (path: string) => number;
}

/** How long a retried job creation waits for the first to end before it is told 409, ms. */
const JOB_CREATION_WAIT_MS = 10_000;

/** Whether a POST creates a job (a batch, or a call answered `202 Accepted`). */
function createsJob(path: string, prefer: string | undefined): boolean {
  if (path === "/v1/batches") return true;
  return (path === "/v1/chat/completions" || path === "/v1/completions") && prefersAsync(prefer);
}

const KEY_PATTERN = /^[\x21-\x7e][\x20-\x7e]{0,254}$/;

function bearerOf(header: string | undefined): string | undefined {
  const match = /^Bearer\s+(.+)$/i.exec(header?.trim() ?? "");
  return match?.[1]?.trim() || undefined;
}

/**
 * The middleware: runs before every POST route. A request without `Idempotency-Key` passes untouched.
 * With one, its body is read here (so it can be compared) and handed on to the route.
 */
export function idempotencyMiddleware(options: IdempotencyMiddlewareOptions) {
  const { keys, apiKeys } = options;
  return async function idempotency(c: Context, next: () => Promise<void>): Promise<Response | undefined> {
    if (c.req.method !== "POST") return void (await next());
    const rawKey = c.req.header("idempotency-key");
    if (rawKey === undefined) return void (await next());
    // The draft sends the key as a structured-field string: "…" (quotes optional here).
    const key = rawKey.trim().replace(/^"(.*)"$/, "$1");
    if (!KEY_PATTERN.test(key)) {
      throw new Refusal("invalid_request", "Idempotency-Key must be 1–255 printable ASCII characters", {
        param: "idempotency-key",
      });
    }
    let tenant = "";
    if (apiKeys && apiKeys.size > 0) {
      const presented = bearerOf(c.req.header("authorization"));
      const identity = presented === undefined ? undefined : apiKeys.lookup(presented);
      // An unknown caller is refused by the route; there is nothing to keep for it.
      if (!identity) return void (await next());
      tenant = identity.tenant;
    }
    const raw = c.req.raw;
    const body = await readBodyBytes(raw, options.bodyLimitOf(c.req.path));
    const fingerprint = await fingerprintOf("POST", c.req.path, raw.headers.get("content-type") ?? "", body);
    // The route reads the body again from the request, not from the socket (already drained here).
    c.req.raw = new Request(raw.url, { method: "POST", headers: raw.headers, body, signal: raw.signal });
    const env = c.env as Record<string, unknown> | undefined;
    if (env && "incoming" in env) c.env = { ...env, incoming: undefined };

    let state = await keys.begin(tenant, key, fingerprint);
    if (state.kind === "in_progress" && createsJob(c.req.path, c.req.header("prefer"))) {
      // Creating a job takes a moment: the retry waits for the first and gets the same job.
      await Promise.race([
        state.ended,
        new Promise((resolve) => setTimeout(resolve, JOB_CREATION_WAIT_MS).unref()),
      ]);
      state = await keys.begin(tenant, key, fingerprint);
    }
    if (state.kind === "in_progress") {
      throw new Refusal(
        "idempotency_in_progress",
        "a request with this Idempotency-Key is still running; retry after it ends",
        { retryAfterSeconds: 1, param: "idempotency-key" },
      );
    }
    if (state.kind === "reused") {
      throw new Refusal(
        "idempotency_key_reused",
        "this Idempotency-Key was used with a different request; use a new key for a new request",
        { param: "idempotency-key" },
      );
    }
    if (state.kind === "replay") {
      return new Response(state.record.body, {
        status: state.record.status,
        headers: { ...state.record.headers, "idempotent-replayed": "true" },
      });
    }
    try {
      await next();
    } catch (err) {
      state.abandon();
      throw err;
    }
    const response = c.res;
    const headers: Record<string, string> = {};
    for (const name of KEPT_HEADERS) {
      const value = response.headers.get(name);
      if (value !== null) headers[name] = value;
    }
    if (!isFinalStatus(response.status)) {
      state.abandon();
      return undefined;
    }
    if (!response.body) {
      await state.finish({ fingerprint, status: response.status, headers, body: "" });
      return undefined;
    }
    // A stream is recorded as the client reads it (so a client that leaves still cancels the call) and kept
    // once it has ended; the key stays "in progress" until then.
    if (/text\/event-stream/i.test(response.headers.get("content-type") ?? "")) {
      c.res = new Response(
        recordingStream(response.body, keys.maxBodyBytes, state, {
          fingerprint,
          status: response.status,
          headers,
        }),
        {
          status: response.status,
          headers: response.headers,
        },
      );
      return undefined;
    }
    try {
      const text = await readCapped(response.clone(), keys.maxBodyBytes);
      if (text === undefined) state.abandon();
      else await state.finish({ fingerprint, status: response.status, headers, body: text });
    } catch {
      state.abandon();
    }
    return undefined;
  };
}

/** Passes a stream through untouched, keeping a copy for the key once it ends whole. */
function recordingStream(
  body: ReadableStream<Uint8Array>,
  limit: number,
  state: KeyState & { kind: "new" },
  meta: Omit<IdempotencyRecord, "storedAt" | "expiresAt" | "body">,
): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  const parts: Uint8Array[] = [];
  let total = 0;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let next: ReadableStreamReadResult<Uint8Array>;
        try {
          next = await reader.read();
        } catch (err) {
          state.abandon();
          controller.error(err);
          return;
        }
        if (next.done) {
          controller.close();
          if (total > limit) state.abandon();
          else
            await state
              .finish({ ...meta, body: Buffer.concat(parts, total).toString("utf8") })
              .catch(() => {});
          return;
        }
        total += next.value.byteLength;
        if (total <= limit) parts.push(next.value);
        else parts.length = 0;
        controller.enqueue(next.value);
      },
      cancel(reason) {
        state.abandon();
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}

/** The body as text, or undefined past `limit` bytes (then reading stops). */
async function readCapped(response: Response, limit: number): Promise<string | undefined> {
  const read = await readStreamCapped(response.body, limit);
  return read.over !== undefined ? undefined : Buffer.from(read.bytes).toString("utf8");
}
