/**
 * @module The shared windows' stored form on JetStream KV (docs/scale-out.md): the entry under a
 * replica's key with each frontend's claim, its encoding, and a frontend's state of one share.
 */

import type { KvEntry } from "nats";
import type { WindowTick } from "../../src/sessions/window-authority.js";

/** Name of the KV bucket holding the shared windows. */
export const WINDOWS_BUCKET = "sluice-windows";

/** One frontend's share of a replica's window. */
export interface ClaimRecord {
  /** Slots claimed (sessions it may keep active on the replica). */
  n: number;
  /** Slots its sessions would use now (active, paused and waiting), so others leave it room. */
  want: number;
  /** Bumped on every write by its owner: a claim whose beat stops moving belongs to a frontend that is gone. */
  beat: number;
  /**
   * Of `want`, returning sessions (paused, dormant with a step waiting, handed over by another
   * frontend, or leaving a dead replica). While another frontend's returning sessions lack room,
   * a frontend claims nothing for its new ones: returning sessions go first fleet-wide.
   */
  back?: number;
}

/** The value stored under a replica's key. */
export interface WindowEntry {
  /** Window size: sessions allowed active on the replica across all frontends. */
  size: number;
  /** Frontend that runs the window law (holds the lease), or null when none does. */
  leader: string | null;
  /** Bumped by the leader on every control tick; a term that stops moving lets another frontend take over. */
  term: number;
  claims: Record<string, ClaimRecord>;
}

/** This frontend's view of one replica's shared window, for tests and `/v1/admin/state`-like reports. */
export interface ShareView {
  replica: string;
  size: number | undefined;
  leader: string | null | undefined;
  /** This frontend's claim as last written. */
  claim: number;
  /** The window this frontend applies locally (≤ claim). */
  grant: number;
  accepting: boolean;
  claims: Record<string, ClaimRecord>;
  revision: number;
}

/** A frontend's state of one replica's shared window: the authority's own bookkeeping. */
export interface Share {
  readonly replica: string;
  readonly key: string;
  entry: WindowEntry | undefined;
  /** Revision of `entry`; 0 when the key does not exist (or was never read). */
  revision: number;
  /** Whether `entry` may be stale (after a conflict, a reconnect, or never read). */
  stale: boolean;
  /**
   * Whether this frontend could not watch the entry for a while (outage,
   * failed reads): terms and beats that did not move meanwhile prove nothing,
   * so their clocks restart at the next read.
   */
  blind: boolean;
  claim: number;
  grant: number;
  applied: { size: number; accepting: boolean } | undefined;
  tick: WindowTick | undefined;
  /** A control tick since the last write: the leader renews its lease. */
  tickPending: boolean;
  /** A fresh control tick since the last write: the leader applies the window law once. */
  lawPending: boolean;
  /** The update in progress, if any. */
  running: Promise<void> | undefined;
  again: boolean;
  lastWriteAt: number;
  lastOkAt: number;
  demand: number;
  /** What this frontend keeps when returning sessions elsewhere wait: its active and returning sessions. */
  keep: number;
  /** Places of sessions handed to other frontends, kept claimed (never granted here) for their next holders. */
  lent: number;
  lentUntil: number;
  /** Bumped on every hand-over: a grant planned before one must not be applied after it. */
  lends: number;
  leaderSeen: { leader: string | null; term: number; at: number } | undefined;
  readonly claimSeen: Map<string, { beat: number; at: number }>;
}

export const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A duration option, checked once: a positive number of ms. */
export function positive(name: string, value: number): number {
  if (!(Number.isFinite(value) && value > 0))
    throw new RangeError(`${name} must be a positive number of ms, got ${value}`);
  return value;
}

/** Whether a KV write failed because the entry moved on (the compare-and-set lost). */
export function isRevisionConflict(err: unknown): boolean {
  const e = err as { api_error?: { err_code?: number }; message?: string } | undefined;
  return e?.api_error?.err_code === 10071 || /wrong last sequence/i.test(e?.message ?? "");
}

/** The entry stored under a key (none when deleted or unreadable), with its revision. */
export function decodeEntry(entry: KvEntry | null): { value: WindowEntry | undefined; revision: number } {
  if (entry?.operation !== "PUT" || entry.value.byteLength === 0) {
    // A deleted key keeps its revision: `create` accepts it, `update` would need it.
    return { value: undefined, revision: 0 };
  }
  try {
    const parsed = JSON.parse(decoder.decode(entry.value)) as WindowEntry;
    if (typeof parsed.size !== "number" || typeof parsed.claims !== "object" || parsed.claims === null) {
      return { value: undefined, revision: entry.revision };
    }
    return { value: parsed, revision: entry.revision };
  } catch {
    return { value: undefined, revision: entry.revision };
  }
}
