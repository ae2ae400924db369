/** @module Workload files (docs/benchmarks.md): zod schemas, defaults, and errors that name the offending field. */

import { readFileSync } from "node:fs";
import { z } from "zod";
import type { Range } from "./prng.js";

/** A workload file or built-in definition that does not parse. */
export class WorkloadError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WorkloadError";
  }
}

/** `[min, max]`, or one number meaning `[n, n]`; both ends ≥ 0 and min ≤ max. */
const range = (what: string) =>
  z
    .union([z.number().nonnegative(), z.tuple([z.number().nonnegative(), z.number().nonnegative()])])
    .transform((value): Range => (typeof value === "number" ? [value, value] : [value[0], value[1]]))
    .refine(([min, max]) => min <= max, { message: `${what} must be [min, max] with min ≤ max` });

const positiveIntRange = (what: string) =>
  range(what).refine(([min, max]) => Math.floor(max) >= Math.max(1, Math.ceil(min)), {
    message: `${what} must allow at least one whole number ≥ 1`,
  });

const slo = z.strictObject({
  ttft_s: z.number().positive(),
  tpot_s: z.number().positive(),
});

/**
 * One class of sessions of unequal size (docs/benchmarks.md `classes`): its share of
 * the sessions, and any of the agents ranges it overrides for them.
 */
const agentsClassSchema = z.strictObject({
  share: z.number().positive().max(1),
  name: z.string().min(1).optional(),
  steps: positiveIntRange("steps").optional(),
  tool_output_tokens: range("tool_output_tokens").optional(),
  output_tokens: positiveIntRange("output_tokens").optional(),
  tool_wait_s: range("tool_wait_s").optional(),
});

/** docs/benchmarks.md `kind: "agents"`. Omitted fields take the documented example values. */
export const agentsSpecSchema = z.strictObject({
  kind: z.literal("agents"),
  sessions: z.number().int().positive().default(64),
  steps: positiveIntRange("steps").default([20, 20]),
  system_prompt_tokens: z.number().int().nonnegative().default(2000),
  tool_output_tokens: range("tool_output_tokens").default([500, 3000]),
  output_tokens: positiveIntRange("output_tokens").default([100, 400]),
  tool_wait_s: range("tool_wait_s").default([1, 5]),
  arrival: z
    .union([z.literal("batch"), z.strictObject({ rate_per_s: z.number().positive() })])
    .default("batch"),
  slo: slo.default({ ttft_s: 5, tpot_s: 0.1 }),
  /** Sessions of unequal size; the sessions no class claims (1 − Σ share) take the ranges above. */
  classes: z
    .array(agentsClassSchema)
    .min(1)
    .refine((classes) => classes.reduce((sum, c) => sum + c.share, 0) <= 1 + 1e-9, {
      message: "the shares of the classes must add up to at most 1",
    })
    .optional(),
  seed: z.number().int().default(1),
});

/** docs/benchmarks.md `kind: "mooncake"`: replay of a Mooncake trace (`trace` relative to the file, the cwd or the repo). */
export const mooncakeSpecSchema = z.strictObject({
  kind: z.literal("mooncake"),
  trace: z.string().min(1),
  time_scale: z.number().positive().default(1),
  limit: z.number().int().positive().optional(),
  slo: slo.default({ ttft_s: 5, tpot_s: 0.1 }),
});

const mixedLane = z.strictObject({
  rate_per_s: z.number().nonnegative(),
  input_tokens: positiveIntRange("input_tokens"),
  output_tokens: positiveIntRange("output_tokens"),
  slo,
});

/** docs/benchmarks.md `kind: "mixed"`: open-loop interactive chat beside bulk document jobs. */
export const mixedSpecSchema = z.strictObject({
  kind: z.literal("mixed"),
  duration_s: z.number().positive(),
  interactive: mixedLane,
  bulk: mixedLane,
  seed: z.number().int().default(1),
});

/** Any workload a tenant's part may be (every kind but `tenants`). */
const partWorkloadSchema = z.discriminatedUnion("kind", [
  agentsSpecSchema,
  mooncakeSpecSchema,
  mixedSpecSchema,
]);

/** The priority bands of docs/configuration.md's tenants file, highest first. */
export const TENANT_BANDS = ["protected", "standard", "sheddable"] as const;
export type TenantBand = (typeof TENANT_BANDS)[number];

/** One tenant of a `tenants` workload, as a tenants file describes it (weight > 0, band, optional max share). */
const tenantSchema = z.strictObject({
  weight: z.number().positive().default(1),
  band: z.enum(TENANT_BANDS).default("standard"),
  max_share: z.number().positive().max(1).optional(),
});

/** One tenant's sub-workload, shifted by `start_s`. */
const tenantPartSchema = z.strictObject({
  tenant: z.string().min(1),
  start_s: z.number().nonnegative().default(0),
  workload: partWorkloadSchema,
});

/** `kind: "tenants"`: several tenants' workloads on one fleet, each part naming a tenant of `tenants`. */
export const tenantsSpecSchema = z
  .strictObject({
    kind: z.literal("tenants"),
    tenants: z
      .record(z.string().min(1), tenantSchema)
      .refine((tenants) => Object.keys(tenants).length > 0, { message: "at least one tenant" }),
    parts: z.array(tenantPartSchema).min(1),
  })
  .superRefine((spec, ctx) => {
    spec.parts.forEach((part, i) => {
      if (!Object.hasOwn(spec.tenants, part.tenant)) {
        ctx.addIssue({
          code: "custom",
          path: ["parts", i, "tenant"],
          message: `names no tenant of "tenants" (${Object.keys(spec.tenants).join(", ")})`,
        });
      }
    });
  });

export const workloadSpecSchema = z.union([partWorkloadSchema, tenantsSpecSchema]);

export type AgentsSpec = z.output<typeof agentsSpecSchema>;
export type AgentsClass = z.output<typeof agentsClassSchema>;
export type MooncakeSpec = z.output<typeof mooncakeSpecSchema>;
export type MixedSpec = z.output<typeof mixedSpecSchema>;
export type TenantsSpec = z.output<typeof tenantsSpecSchema>;
export type TenantDef = z.output<typeof tenantSchema>;
/** A workload a tenant's part may be. */
export type PartSpec = z.output<typeof partWorkloadSchema>;
export type WorkloadSpec = z.output<typeof workloadSpecSchema>;
/** What a workload file may contain (ranges as numbers or pairs, defaults omitted). */
export type WorkloadSpecInput = z.input<typeof workloadSpecSchema>;

function fieldPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out === "" ? String(part) : `.${String(part)}`;
  }
  return out || "(root)";
}

/** One line per problem, each naming the field: `unknown field "bulk.rate"`, `field "sessions": …`. */
export function describeIssues(error: z.ZodError): string {
  const lines: string[] = [];
  for (const issue of error.issues) {
    if (issue.code === "unrecognized_keys") {
      for (const key of issue.keys) lines.push(`unknown field "${fieldPath([...issue.path, key])}"`);
    } else if (issue.code === "invalid_union" && issue.path.length === 0 && "discriminator" in issue) {
      lines.push(`field "kind": expected "agents", "mooncake" or "mixed"`);
    } else if (issue.code === "invalid_union" && issue.path.length > 0 && "discriminator" in issue) {
      const path = issue.path.at(-1) === "kind" ? issue.path : [...issue.path, "kind"];
      lines.push(`field "${fieldPath(path)}": expected "agents", "mooncake" or "mixed"`);
    } else {
      lines.push(`field "${fieldPath(issue.path)}": ${issue.message}`);
    }
  }
  return lines.join("; ");
}

/** Validates a parsed workload definition; throws `WorkloadError` naming every bad or unknown field. */
export function parseWorkloadSpec(value: unknown, source = "workload"): WorkloadSpec {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new WorkloadError(`${source}: a workload is a JSON object, got ${JSON.stringify(value)}`);
  }
  const kind = (value as { kind?: unknown }).kind;
  const schema =
    kind === "tenants"
      ? tenantsSpecSchema
      : kind === "agents" || kind === "mooncake" || kind === "mixed"
        ? partWorkloadSchema
        : undefined;
  if (!schema) {
    throw new WorkloadError(
      `${source}: field "kind" must be "agents", "mooncake", "mixed" or "tenants", got ${JSON.stringify(kind)}`,
    );
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new WorkloadError(`${source}: ${describeIssues(parsed.error)}`);
  return parsed.data;
}

/** Reads and validates a workload JSON file. */
export function readWorkloadFile(path: string): WorkloadSpec {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new WorkloadError(`cannot read workload file ${path}: ${(error as Error).message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new WorkloadError(`workload file ${path} is not JSON: ${(error as Error).message}`);
  }
  return parseWorkloadSpec(json, path);
}
