/** @module `--tenants FILE`: tenants' weights, bands and caps, read and checked once at start-up (docs/tenants.md). */

import { readFile } from "node:fs/promises";

import { type TenantSpec, tenantsSchema } from "../../src/config/scheduler-config.js";

/**
 * Parses a tenants file's text: `{ "<tenant>": { "weight"?, "band"?, "max_share"? } }`.
 * Throws an Error naming the tenant, the field and the value received.
 */
export function parseTenants(text: string): Record<string, TenantSpec> {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new Error(`not JSON: ${(err as Error).message}`);
  }
  const parsed = tenantsSchema.safeParse(json);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((issue) => {
    let value: unknown = json;
    for (const key of issue.path) value = (value as Record<PropertyKey, unknown> | undefined)?.[key];
    const where = issue.path.length > 0 ? issue.path.map(String).join(".") : "(the file)";
    return `${where}: ${issue.message}, got ${JSON.stringify(value)}`;
  });
  throw new Error(lines.join("; "));
}

/** Reads and parses a tenants file. */
export async function loadTenantsFile(path: string): Promise<Record<string, TenantSpec>> {
  return parseTenants(await readFile(path, "utf8"));
}
