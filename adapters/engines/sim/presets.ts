/** @module Step-time model and presets of the simulated replica (docs/simulator.md). */

/** Names of the built-in presets. */
export type PresetName =
  | "h100-llama3-8b"
  | "h100x2-qwen3-32b"
  | "h100x4-llama3-70b"
  | "h100x8-llama3-70b"
  | "instant";

/** Every number that shapes a simulated replica; one data-parallel rank unless noted. */
export interface SimParams {
  /** Fixed cost of one engine step, ms. */
  c0: number;
  /** Linear-layer cost per uncached prefill token, ms. */
  cPrefill: number;
  /** Linear-layer cost per decode sequence, ms. */
  cDec: number;
  /** Attention cost per context token of a decode sequence (KV read), ms. */
  cKv: number;
  /** Prefill attention cost per (new token, attended token) pair, ms. */
  cPfattn: number;
  /** Tokens the linear layers process for the price of none (`floor_credit = cPrefill · floorCreditTokens`). */
  floorCreditTokens: number;
  /** KV cache capacity per rank, tokens; the rank has `floor(kvCapacityTokens / blockSize)` blocks. */
  kvCapacityTokens: number;
  /** KV block size, tokens. */
  blockSize: number;
  /** Most calls running at once per rank (vLLM `max_num_seqs`). */
  maxNumSeqs: number;
  /** Most tokens computed in one step per rank (vLLM `max_num_batched_tokens`; chunked prefill). */
  maxNumBatchedTokens: number;
  /** Longest prompt + output a call may have, tokens (capped at the KV capacity). */
  maxModelLen: number;
  /**
   * When true every call completes at once, with no batching, queueing or step
   * time; tokens, prefix-cache hits and KV blocks are still counted. For
   * measuring the overhead of everything in front of the engine.
   */
  instant: boolean;
  /**
   * Host-memory KV tier per rank, tokens (`floor(hostKvTokens / blockSize)`
   * blocks); 0 (default) means one tier. Blocks evicted from GPU memory move
   * there (LRU), and a prefix found there is loaded back over PCIe instead of
   * recomputed — vLLM's offloading connector, LMCache, SGLang HiCache.
   */
  hostKvTokens: number;
  /** KV bytes of one token for the whole model: layers · kv_heads · head_dim · 2 (K and V) · 2 (BF16). */
  kvBytesPerToken: number;
  /** GPUs one rank spans (tensor parallelism): each loads its 1/TP share of a block over its own PCIe link. */
  tensorParallelSize: number;
  /** Effective host-to-GPU load bandwidth per GPU, GB/s (10⁹ bytes/s). */
  hostLoadGBps: number;
  /**
   * Effective KV transfer bandwidth per GPU between a prefill and a decode
   * replica (disaggregated serving), GB/s: what one GPU's RDMA NIC moves.
   */
  kvTransferGBps: number;
}

/** Any subset of {@link SimParams}, applied on top of a preset. */
export type PresetOverrides = Partial<SimParams> & { base?: PresetName };

const DEFAULTS = {
  floorCreditTokens: 128,
  blockSize: 16,
  maxNumSeqs: 256,
  maxNumBatchedTokens: 8192,
  instant: false,
  hostKvTokens: 0,
  // PCIe Gen5 x16 moves ~64 GB/s raw; pinned-memory block copies reach ~25 GB/s in practice.
  hostLoadGBps: 25,
  // A 400 Gb/s NIC per GPU (ConnectX-7, as in DGX H100) carries 50 GB/s raw; NIXL/UCX reads of scattered
  // 16-token blocks reach about half of it, so 25 GB/s per GPU.
  kvTransferGBps: 25,
} as const;

/** Bytes of KV per token, BF16: layers · kv_heads · head_dim · 2 (K and V) · 2 bytes. */
function kvBytes(layers: number, kvHeads: number, headDim: number): number {
  return layers * kvHeads * headDim * 2 * 2;
}

/**
 * The presets of docs/simulator.md (BF16, H100 SXM, gpu_memory_utilization 0.9).
 * `instant` keeps the 8B preset's KV size so prefix-cache counts stay meaningful.
 */
export const PRESETS: Readonly<Record<PresetName, Readonly<SimParams>>> = {
  "h100-llama3-8b": {
    ...DEFAULTS,
    c0: 7.0,
    cPrefill: 0.022,
    cDec: 0.015,
    cKv: 4.9e-5,
    cPfattn: 1.3e-6,
    kvCapacityTokens: 439_000,
    maxModelLen: 131_072,
    kvBytesPerToken: kvBytes(32, 8, 128),
    tensorParallelSize: 1,
  },
  "h100x2-qwen3-32b": {
    ...DEFAULTS,
    c0: 15,
    cPrefill: 0.053,
    cDec: 0.02,
    cKv: 4.9e-5,
    cPfattn: 2.6e-6,
    kvCapacityTokens: 307_000,
    maxModelLen: 40_960,
    kvBytesPerToken: kvBytes(64, 8, 128),
    tensorParallelSize: 2,
  },
  "h100x4-llama3-70b": {
    ...DEFAULTS,
    c0: 18,
    cPrefill: 0.066,
    cDec: 0.025,
    cKv: 3.1e-5,
    cPfattn: 1.6e-6,
    kvCapacityTokens: 461_000,
    maxModelLen: 131_072,
    kvBytesPerToken: kvBytes(80, 8, 128),
    tensorParallelSize: 4,
  },
  "h100x8-llama3-70b": {
    ...DEFAULTS,
    c0: 12,
    cPrefill: 0.0405,
    cDec: 0.02,
    cKv: 1.5e-5,
    cPfattn: 8.2e-7,
    kvCapacityTokens: 1_350_000,
    maxModelLen: 131_072,
    kvBytesPerToken: kvBytes(80, 8, 128),
    tensorParallelSize: 8,
  },
  instant: {
    ...DEFAULTS,
    c0: 0,
    cPrefill: 0,
    cDec: 0,
    cKv: 0,
    cPfattn: 0,
    kvCapacityTokens: 439_000,
    maxModelLen: 131_072,
    kvBytesPerToken: kvBytes(32, 8, 128),
    tensorParallelSize: 1,
    instant: true,
  },
};

/** The preset used when none is named. */
export const DEFAULT_PRESET: PresetName = "h100-llama3-8b";

/** Default model name per preset (what `/v1/models` lists unless `model` is given). */
export const PRESET_MODELS: Readonly<Record<PresetName, string>> = {
  "h100-llama3-8b": "meta-llama/Llama-3.1-8B-Instruct",
  "h100x2-qwen3-32b": "Qwen/Qwen3-32B",
  "h100x4-llama3-70b": "meta-llama/Llama-3.1-70B-Instruct",
  "h100x8-llama3-70b": "meta-llama/Llama-3.1-70B-Instruct",
  instant: "sim-instant",
};

/** Whether `name` is a built-in preset. */
export function isPresetName(name: unknown): name is PresetName {
  return typeof name === "string" && Object.hasOwn(PRESETS, name);
}

const NON_NEGATIVE: readonly (keyof SimParams)[] = [
  "c0",
  "cPrefill",
  "cDec",
  "cKv",
  "cPfattn",
  "floorCreditTokens",
  "hostKvTokens",
];
const POSITIVE_INT: readonly (keyof SimParams)[] = [
  "kvCapacityTokens",
  "blockSize",
  "maxNumSeqs",
  "maxNumBatchedTokens",
  "maxModelLen",
  "kvBytesPerToken",
  "tensorParallelSize",
];

/**
 * Resolves a preset (by name, or overrides on top of `base`, default
 * `h100-llama3-8b`) plus further overrides into validated parameters.
 * `maxModelLen` is capped at the KV capacity: a call that cannot fit the
 * cache could never run. Errors name the value received.
 */
export function resolveSimParams(
  preset: PresetName | PresetOverrides | undefined,
  overrides: Partial<SimParams> = {},
): SimParams {
  let base: PresetName = DEFAULT_PRESET;
  let presetOverrides: Partial<SimParams> = {};
  if (typeof preset === "string") {
    if (!isPresetName(preset)) {
      throw new RangeError(
        `preset should be one of ${Object.keys(PRESETS).join(", ")}, got ${JSON.stringify(preset)}`,
      );
    }
    base = preset;
  } else if (preset !== undefined) {
    const { base: named, ...rest } = preset;
    if (named !== undefined) {
      if (!isPresetName(named)) {
        throw new RangeError(
          `preset.base should be one of ${Object.keys(PRESETS).join(", ")}, got ${JSON.stringify(named)}`,
        );
      }
      base = named;
    }
    presetOverrides = rest;
  }
  const merged: SimParams = { ...PRESETS[base] };
  for (const source of [presetOverrides, overrides]) {
    for (const [key, value] of Object.entries(source)) {
      if (value !== undefined && Object.hasOwn(merged, key))
        (merged as unknown as Record<string, unknown>)[key] = value;
    }
  }
  for (const key of NON_NEGATIVE) {
    const value = merged[key] as number;
    if (!(Number.isFinite(value) && value >= 0))
      throw new RangeError(`${key} should be a finite number ≥ 0, got ${value}`);
  }
  for (const key of POSITIVE_INT) {
    const value = merged[key] as number;
    if (!(Number.isInteger(value) && value >= 1))
      throw new RangeError(`${key} should be a positive integer, got ${value}`);
  }
  if (!Number.isInteger(merged.hostKvTokens))
    throw new RangeError(`hostKvTokens should be an integer ≥ 0, got ${merged.hostKvTokens}`);
  for (const key of ["hostLoadGBps", "kvTransferGBps"] as const) {
    if (!(Number.isFinite(merged[key]) && merged[key] > 0))
      throw new RangeError(`${key} should be a finite number > 0, got ${merged[key]}`);
  }
  if (typeof merged.instant !== "boolean")
    throw new RangeError(`instant should be a boolean, got ${merged.instant}`);
  if (merged.kvCapacityTokens < merged.blockSize) {
    throw new RangeError(
      `kvCapacityTokens should hold at least one block of ${merged.blockSize} tokens, got ${merged.kvCapacityTokens}`,
    );
  }
  const capacity = Math.floor(merged.kvCapacityTokens / merged.blockSize) * merged.blockSize;
  merged.maxModelLen = Math.min(merged.maxModelLen, capacity);
  return merged;
}

/** The work of one engine step, as the step-time model sees it. */
export interface StepShape {
  /** Uncached prefill tokens computed in the step (recomputed ones included). */
  prefillTokens: number;
  /** Decode sequences in the step. */
  decodeSeqs: number;
  /** Σ context tokens of the decode sequences (each counts the token it decodes). */
  decodeContextTokens: number;
  /** Σ t_i·(s_i + t_i/2) over the prefill chunks: t_i new tokens on top of s_i already in KV. */
  prefillPairs: number;
  /** Tokens loaded from the host tier in the step (prefix hits there); default 0. */
  hostLoadTokens?: number;
}

/**
 * Time to load one token's KV from the host tier, ms: its bytes split over
 * the rank's GPUs, each over its own link at `hostLoadGBps`
 * (`kvBytesPerToken / tensorParallelSize / (hostLoadGBps · 10⁹)` s). Zero
 * for the `instant` preset.
 */
export function hostLoadMsPerToken(params: SimParams): number {
  if (params.instant) return 0;
  return (params.kvBytesPerToken / params.tensorParallelSize / (params.hostLoadGBps * 1e9)) * 1000;
}

/**
 * Time to move one token's KV from a prefill replica to a decode replica, ms:
 * its bytes split over the TP group's GPUs, each pulling its share over its
 * own NIC at `kvTransferGBps` (`kvBytesPerToken / tensorParallelSize /
 * (kvTransferGBps · 10⁹)` s). Zero for the `instant` preset.
 */
export function kvTransferMsPerToken(params: SimParams): number {
  if (params.instant) return 0;
  return (params.kvBytesPerToken / params.tensorParallelSize / (params.kvTransferGBps * 1e9)) * 1000;
}

/**
 * Duration of one step, ms (docs/simulator.md):
 * `c0 + max(0, cPrefill·P + cDec·D − cPrefill·floorCreditTokens) + cKv·K + cPfattn·Σ t_i(s_i + t_i/2) + t_load·H`
 * with H the tokens loaded from the host tier in the step and `t_load` from
 * {@link hostLoadMsPerToken}. The load is serial with the step: the batch
 * waits for it, which overstates its cost when an engine overlaps loads
 * with compute (vLLM loads asynchronously) — a hit in host memory is never
 * modelled cheaper than it is.
 */
export function stepTimeMs(params: SimParams, step: StepShape): number {
  const linear = params.cPrefill * step.prefillTokens + params.cDec * step.decodeSeqs;
  const credit = params.cPrefill * params.floorCreditTokens;
  const load = step.hostLoadTokens ? hostLoadMsPerToken(params) * step.hostLoadTokens : 0;
  return (
    params.c0 +
    Math.max(0, linear - credit) +
    params.cKv * step.decodeContextTokens +
    params.cPfattn * step.prefillPairs +
    load
  );
}

/** Prefill throughput of one rank implied by the model, tokens/s (`1000 / cPrefill`; 1e9 when prefill is free). */
export function prefillTokensPerSecond(params: SimParams): number {
  return params.cPrefill > 0 ? 1000 / params.cPrefill : 1e9;
}
