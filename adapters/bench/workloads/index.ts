/** @module Built-in named workloads, workload files, and compiling either at an offered load. */

import { existsSync } from "node:fs";
import { basename, dirname, resolve } from "node:path";
import type { StepModel } from "../cost-model.js";
import { callWorkMs } from "../cost-model.js";
import { buildAdversarialWorkload } from "./adversarial.js";
import { buildAgentsWorkload } from "./agents.js";
import { buildMixedWorkload } from "./mixed.js";
import { buildMooncakeWorkload } from "./mooncake-replay.js";
import type { AgentsSpec, MixedSpec, PartSpec, TenantsSpec, WorkloadSpec } from "./schema.js";
import { parseWorkloadSpec, readWorkloadFile, WorkloadError } from "./schema.js";
import { buildTenantsWorkload } from "./tenants.js";
import type { Workload } from "./types.js";

/** What a built-in workload needs to know about the fleet it runs on. */
export interface FleetContext {
  replicas: number;
  model: StepModel;
}

/** A built-in workload: its spec (possibly sized to the fleet) and the fleet and loads it runs on by default. */
export interface NamedWorkload {
  summary: string;
  replicas: number;
  preset: string;
  loads: number[];
  spec(fleet: FleetContext): WorkloadSpec;
  /** Built from its spec by a builder of its own rather than by the spec's kind (built-in only). */
  build?(spec: WorkloadSpec, options: { name: string; load: number }): Workload;
  /** `tenants` workloads: tenants whose parts are also run alone, as the reference of their targets. */
  alone?: string[];
}

const AGENTS = {
  kind: "agents",
  sessions: 64,
  steps: [20, 20],
  system_prompt_tokens: 2000,
  tool_output_tokens: [500, 3000],
  output_tokens: [100, 400],
  tool_wait_s: [1, 5],
  arrival: "batch",
  slo: { ttft_s: 5, tpot_s: 0.1 },
  seed: 1,
} as const;

/** `agents` with every session's draw from one of three size classes (the documented `agents-mixed`). */
const AGENTS_MIXED = {
  ...AGENTS,
  classes: [
    { name: "small", share: 0.6, tool_output_tokens: [50, 300] },
    { name: "medium", share: 0.2, tool_output_tokens: [300, 2000] },
    { name: "large", share: 0.2, tool_output_tokens: [1000, 6000] },
  ],
} as const;

/**
 * The regimes where admission must not cost users (docs/benchmarks.md): each one an
 * agents spec, sized so every policy runs in seconds of wall time.
 */
const REGIMES = {
  burst: {
    kind: "agents",
    sessions: 300,
    steps: [1, 1],
    system_prompt_tokens: 800,
    tool_output_tokens: [100, 1000],
    output_tokens: [32, 128],
    tool_wait_s: [0, 0],
    arrival: "batch",
    slo: { ttft_s: 5, tpot_s: 0.1 },
    seed: 1,
  },
  light: {
    kind: "agents",
    sessions: 40,
    steps: [5, 10],
    system_prompt_tokens: 2000,
    tool_output_tokens: [200, 1500],
    output_tokens: [50, 300],
    tool_wait_s: [5, 30],
    arrival: { rate_per_s: 0.2 },
    slo: { ttft_s: 2, tpot_s: 0.1 },
    seed: 1,
  },
  steady: {
    kind: "agents",
    sessions: 200,
    steps: [5, 5],
    system_prompt_tokens: 2000,
    tool_output_tokens: [300, 2000],
    output_tokens: [100, 400],
    tool_wait_s: [1, 5],
    arrival: { rate_per_s: 1 },
    slo: { ttft_s: 2, tpot_s: 0.1 },
    seed: 1,
  },
  long: {
    kind: "agents",
    sessions: 4,
    steps: [40, 40],
    system_prompt_tokens: 2000,
    tool_output_tokens: [1000, 3000],
    output_tokens: [100, 400],
    tool_wait_s: [1, 5],
    arrival: "batch",
    slo: { ttft_s: 5, tpot_s: 0.1 },
    seed: 1,
  },
  chat: {
    kind: "agents",
    sessions: 360,
    steps: [3, 6],
    system_prompt_tokens: 500,
    tool_output_tokens: [20, 300],
    output_tokens: [100, 500],
    tool_wait_s: [10, 60],
    arrival: { rate_per_s: 3 },
    slo: { ttft_s: 2, tpot_s: 0.1 },
    seed: 1,
  },
} as const;

/**
 * Relative arrival rates of the `mixed` lanes (10 chat calls per document
 * job), before scaling to the fleet.
 */
const MIXED_BASE = {
  kind: "mixed",
  duration_s: 120,
  interactive: {
    rate_per_s: 10,
    input_tokens: [200, 2000],
    output_tokens: [50, 300],
    slo: { ttft_s: 2, tpot_s: 0.1 },
  },
  bulk: {
    rate_per_s: 1,
    input_tokens: [8000, 16000],
    output_tokens: [200, 1000],
    slo: { ttft_s: 60, tpot_s: 0.2 },
  },
  seed: 1,
} as const;

/**
 * `mixed` with arrival rates scaled so that load 1 offers exactly the fleet's
 * ideal capacity (`idealCapacityRps`: every replica perfectly batched, step
 * overheads amortised away). Real engines sustain less than that, so load
 * 1.5 is at least 1.5× what the fleet can serve.
 */
export function mixedAtCapacity(fleet: FleetContext): MixedSpec {
  const probe = parseWorkloadSpec(structuredClone(MIXED_BASE), "mixed") as MixedSpec;
  const calls = buildMixedWorkload(probe).calls;
  let workMs = 0;
  for (const call of calls) workMs += callWorkMs(fleet.model, call);
  const offeredFraction = workMs / (probe.duration_s * 1000 * fleet.replicas);
  const scale = offeredFraction > 0 ? 1 / offeredFraction : 1;
  const round = (rate: number) => Math.round(rate * scale * 1000) / 1000;
  return {
    ...probe,
    interactive: { ...probe.interactive, rate_per_s: round(probe.interactive.rate_per_s) },
    bulk: { ...probe.bulk, rate_per_s: round(probe.bulk.rate_per_s) },
  };
}

/** The agents sessions of the tenants workloads: `agents`, sized per part. */
function agentsPart(sessions: number, seed: number, overrides: Record<string, unknown> = {}): PartSpec {
  return { ...structuredClone(AGENTS), sessions, seed, ...overrides } as unknown as PartSpec;
}

function tenantsSpec(name: string, value: Record<string, unknown>): TenantsSpec {
  return parseWorkloadSpec({ kind: "tenants", ...value }, name) as TenantsSpec;
}

/**
 * The tenants workloads (docs/benchmarks.md): a noisy neighbour, weights,
 * bands, and calls of very unequal size. Each part has a seed of its own, so
 * no two tenants share a system prompt.
 */
const TENANTS_WORKLOADS: Record<string, NamedWorkload> = {
  "tenants-noisy": {
    summary:
      "tenant A: 64 agents sessions at 0 s; tenant B (same weight): 4 sessions of the same kind at 60 s; 1 replica",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    alone: ["B"],
    spec: () =>
      tenantsSpec("tenants-noisy", {
        tenants: { A: { weight: 1 }, B: { weight: 1 } },
        parts: [
          { tenant: "A", start_s: 0, workload: agentsPart(64, 1) },
          { tenant: "B", start_s: 60, workload: agentsPart(4, 2) },
        ],
      }),
  },
  "tenants-weighted": {
    summary:
      "four tenants of weights 1:2:3:4, each with 6 × its weight agents sessions at 0 s (all backlogged); 1 replica",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () =>
      tenantsSpec("tenants-weighted", {
        tenants: { w1: { weight: 1 }, w2: { weight: 2 }, w3: { weight: 3 }, w4: { weight: 4 } },
        parts: [1, 2, 3, 4].map((w) => ({ tenant: `w${w}`, start_s: 0, workload: agentsPart(6 * w, w) })),
      }),
  },
  "tenants-bands": {
    summary:
      "a sheddable tenant's 64 agents sessions at 0 s fill the window; a protected tenant's 4 sessions arrive at 60 s; 1 replica",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    alone: ["ops"],
    spec: () =>
      tenantsSpec("tenants-bands", {
        tenants: { batch: { band: "sheddable" }, ops: { band: "protected" } },
        parts: [
          { tenant: "batch", start_s: 0, workload: agentsPart(64, 1) },
          { tenant: "ops", start_s: 60, workload: agentsPart(4, 2) },
        ],
      }),
  },
  "tenants-sizes": {
    summary:
      "tenant large: 16 one-call sessions of 32k–120k tokens; tenant small: 800 one-call sessions of 1–2k tokens; all at 0 s, the token budget saturated; 1 replica",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () =>
      tenantsSpec("tenants-sizes", {
        tenants: { large: { weight: 1 }, small: { weight: 1 } },
        parts: [
          {
            tenant: "large",
            start_s: 0,
            workload: agentsPart(16, 1, {
              steps: [1, 1],
              system_prompt_tokens: 0,
              tool_output_tokens: [32_000, 120_000],
              output_tokens: [100, 400],
              tool_wait_s: [0, 0],
              slo: { ttft_s: 60, tpot_s: 0.2 },
            }),
          },
          {
            tenant: "small",
            start_s: 0,
            workload: agentsPart(800, 2, {
              steps: [1, 1],
              system_prompt_tokens: 0,
              tool_output_tokens: [1_000, 2_000],
              output_tokens: [100, 400],
              tool_wait_s: [0, 0],
              slo: { ttft_s: 5, tpot_s: 0.1 },
            }),
          },
        ],
      }),
  },
};

/** The built-in workloads, with the parameters. */
export const NAMED_WORKLOADS: Record<string, NamedWorkload> = {
  agents: {
    summary: "64 ReAct sessions × 20 steps on 1 replica, batch arrival (thrashes a single replica's KV)",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () => parseWorkloadSpec(structuredClone(AGENTS), "agents"),
  },
  "agents-256": {
    summary: "256 ReAct sessions × 20 steps on 4 replicas, batch arrival",
    replicas: 4,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () => parseWorkloadSpec({ ...structuredClone(AGENTS), sessions: 256 }, "agents-256"),
  },
  "agents-mixed": {
    summary:
      "64 ReAct sessions × 20 steps on 1 replica, tool outputs by class: 60 % 50–300, 20 % 300–2,000, 20 % 1,000–6,000",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () => parseWorkloadSpec(structuredClone(AGENTS_MIXED), "agents-mixed"),
  },
  burst: {
    summary: "300 one-step sessions at once on 2 replicas (system prompt 800, output 32–128)",
    replicas: 2,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () => parseWorkloadSpec(structuredClone(REGIMES.burst), "burst"),
  },
  light: {
    summary:
      "40 Poisson sessions (0.2/s) of 5–10 steps with 5–30 s tool waits on 1 replica, far below capacity",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () => parseWorkloadSpec(structuredClone(REGIMES.light), "light"),
  },
  steady: {
    summary: "200 Poisson sessions (1/s) of 5 steps on 2 replicas, moderate load",
    replicas: 2,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () => parseWorkloadSpec(structuredClone(REGIMES.steady), "steady"),
  },
  long: {
    summary: "4 sessions × 40 steps with tool outputs of 1,000–3,000 tokens on 1 replica",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () => parseWorkloadSpec(structuredClone(REGIMES.long), "long"),
  },
  chat: {
    summary: "360 Poisson conversations (3/s) of 3–6 turns, think time 10–60 s, output 100–500, on 1 replica",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () => parseWorkloadSpec(structuredClone(REGIMES.chat), "chat"),
  },
  mixed: {
    summary: "interactive chat + bulk documents, Poisson, load 1 = the fleet's ideal capacity",
    replicas: 2,
    preset: "h100-llama3-8b",
    loads: [1, 1.5, 2],
    spec: (fleet) => mixedAtCapacity(fleet),
  },
  adversarial: {
    summary:
      "32 agent sessions with identical openers on 1 replica: forks, dropped reasoning, compacted histories (for --session-keys off)",
    replicas: 1,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () =>
      parseWorkloadSpec(
        {
          kind: "agents",
          sessions: 32,
          steps: [8, 8],
          system_prompt_tokens: 2000,
          tool_output_tokens: [100, 1500],
          output_tokens: [64, 256],
          tool_wait_s: [1, 5],
          seed: 1,
        },
        "adversarial",
      ),
    build: (spec, options) => buildAdversarialWorkload(spec as AgentsSpec, options),
  },
  mooncake: {
    summary: "replay of the whole Mooncake conversation trace (12,031 requests, ~1 h) on 4 replicas",
    replicas: 4,
    preset: "h100-llama3-8b",
    loads: [1],
    spec: () =>
      parseWorkloadSpec(
        {
          kind: "mooncake",
          trace: "../shared/traces/mooncake-conversation.jsonl",
          time_scale: 1,
          // The agents SLO: 2 s would be missed by 4 % of this trace's calls even alone on a replica.
          slo: { ttft_s: 5, tpot_s: 0.1 },
        },
        "mooncake",
      ),
  },
  ...TENANTS_WORKLOADS,
};

/** A workload chosen by name or file, not yet compiled at a load. */
export interface ResolvedWorkload {
  name: string;
  spec: WorkloadSpec;
  /** Folder of the workload file (relative trace paths start there). */
  baseDir?: string;
  /** The built-in definition, when it was one. */
  named?: NamedWorkload;
}

/** Looks a workload up by built-in name, or reads it from a JSON file. */
export function resolveWorkload(nameOrFile: string, fleet: FleetContext): ResolvedWorkload {
  const named = Object.hasOwn(NAMED_WORKLOADS, nameOrFile) ? NAMED_WORKLOADS[nameOrFile] : undefined;
  if (named) return { name: nameOrFile, spec: named.spec(fleet), named };
  if (nameOrFile.endsWith(".json") || existsSync(nameOrFile)) {
    const path = resolve(nameOrFile);
    return {
      name: basename(nameOrFile).replace(/\.json$/, ""),
      spec: readWorkloadFile(path),
      baseDir: dirname(path),
    };
  }
  throw new WorkloadError(
    `unknown workload "${nameOrFile}": not a file, and not one of ${Object.keys(NAMED_WORKLOADS).join(", ")}`,
  );
}

/**
 * Overrides the seed of a spec that has one (`mooncake` replays a fixed trace
 * and has none). A `tenants` workload shifts every part's seed by `seed − 1`,
 * so seed 1 is the workload as written and the parts keep seeds of their own.
 */
export function withSeed(spec: WorkloadSpec, seed: number | undefined): WorkloadSpec {
  if (seed === undefined || spec.kind === "mooncake") return spec;
  if (spec.kind === "tenants") {
    return {
      ...spec,
      parts: spec.parts.map((part) =>
        part.workload.kind === "mooncake"
          ? part
          : { ...part, workload: { ...part.workload, seed: part.workload.seed + seed - 1 } },
      ),
    };
  }
  return { ...spec, seed };
}

/** Compiles a spec into calls at an offered-load multiplier. */
export function compileWorkload(
  spec: WorkloadSpec,
  options: { name: string; load: number; baseDir?: string },
): Workload {
  switch (spec.kind) {
    case "agents":
      return buildAgentsWorkload(spec, options);
    case "mixed":
      return buildMixedWorkload(spec, options);
    case "mooncake":
      return buildMooncakeWorkload(spec, options);
    case "tenants":
      return buildTenantsWorkload(spec, options, compileWorkload);
  }
}
