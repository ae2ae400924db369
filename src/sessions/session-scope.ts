/**
 * @module A session belongs to its tenant (`docs/clients.md`): the same key sent by two tenants names
 * two sessions. Inside the scheduler a session is known by its scoped id: the key itself for the
 * `default` tenant (calls without an API key), `<tenant> <key>` for any other. A key never holds a
 * space (`session-id.ts`), so no key of one tenant can spell another tenant's scoped id.
 */

import { DEFAULT_TENANT } from "../tenants/tenant-ledger.js";

/** The scheduler's id of `key` sent by `tenant` (no tenant, or an empty name, is the `default` tenant). */
export function scopedSessionId(key: string, tenant: string | undefined): string {
  return tenant === undefined || tenant === "" || tenant === DEFAULT_TENANT ? key : `${tenant} ${key}`;
}

/** Inverse of {@link scopedSessionId}: the client's key and its tenant. */
export function unscopeSessionId(id: string): { key: string; tenant: string } {
  const space = id.lastIndexOf(" ");
  return space < 0
    ? { key: id, tenant: DEFAULT_TENANT }
    : { key: id.slice(space + 1), tenant: id.slice(0, space) };
}
