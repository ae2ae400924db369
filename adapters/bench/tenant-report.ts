/** @module The per-tenant table of a `tenants` workload's document: every run's tenants, then the tenants run alone. */

import type { AloneRow, FairnessStats, TenantStats } from "./run.js";

/** The fields of a document the table reads (a recorded JSON file or a fresh run's output). */
export interface TenantDocLike {
  results: {
    policy: string;
    load: number;
    tenants?: Record<string, TenantStats>;
    fairness?: FairnessStats;
  }[];
  alone?: AloneRow[];
}

function fixed(value: number | null | undefined, digits: number): string {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "–";
}

const HEAD = [
  "policy",
  "load",
  "tenant",
  "weight",
  "band",
  "sessions",
  "done",
  "1st admission p50 s",
  "1st admission p99 s",
  "TTFT p50 s",
  "TTFT p99 s",
  "session mean s",
  "session p99 s",
  "service share",
  "share ÷ weight",
  "token share",
  "pauses",
  "refused",
  "Jain",
];

function line(
  policy: string,
  load: number,
  tenant: string,
  t: TenantStats,
  jain: string,
  weights: number,
): string[] {
  const refused = Object.entries(t.rejected)
    .map(([reason, n]) => `${reason}:${n}`)
    .join(" ");
  return [
    policy,
    String(load),
    tenant,
    String(t.weight),
    t.band,
    String(t.sessions),
    String(t.completed),
    fixed(t.first_admission_wait_p50_s, 2),
    fixed(t.first_admission_wait_p99_s, 2),
    fixed(t.ttft_p50_s, 3),
    fixed(t.ttft_p99_s, 3),
    fixed(t.session_completion_mean_s, 1),
    fixed(t.session_completion_p99_s, 1),
    fixed(t.service_share, 3),
    weights > 0 ? fixed(t.service_share / (t.weight / weights), 3) : "–",
    fixed(t.token_share, 3),
    String(t.pauses),
    refused || "-",
    jain,
  ];
}

/**
 * The table as text cells, a header first: per run and tenant its numbers
 * (share ÷ weight: the service share over the tenant's share of the weights),
 * Jain's index on each run's first line ("–" when no two tenants ever waited
 * at once); then each tenant run alone. Empty
 * when the document has no tenants.
 */
export function tenantCells(doc: TenantDocLike): string[][] {
  const rows: string[][] = [];
  for (const result of doc.results) {
    if (!result.tenants) continue;
    const entries = Object.entries(result.tenants);
    const weights = entries.reduce((sum, [, t]) => sum + t.weight, 0);
    entries.forEach(([tenant, t], i) => {
      rows.push(
        line(
          result.policy,
          result.load,
          tenant,
          t,
          i > 0
            ? ""
            : result.fairness && result.fairness.contended_s > 0
              ? fixed(result.fairness.jain, 3)
              : "–",
          weights,
        ),
      );
    });
  }
  for (const a of doc.alone ?? [])
    rows.push(line(`${a.policy} (${a.tenant} alone)`, a.load, a.tenant, a.stats, "", 0));
  return rows.length > 0 ? [HEAD, ...rows] : [];
}

/** The table as aligned text (stdout), or "" without tenants. */
export function renderTenantTable(doc: TenantDocLike): string {
  const cells = tenantCells(doc);
  if (cells.length === 0) return "";
  const widths = cells[0]!.map((_, i) => Math.max(...cells.map((row) => row[i]!.length)));
  return cells
    .map((row) =>
      row
        .map((cell, i) => cell.padEnd(widths[i]!))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}
