/** @module The shapes every engine profile produces, apart from the profiles themselves (so each profile file imports no other). */

import type { EngineSignals } from "../../../src/engine.js";

/** Which engine a page came from. */
export type EngineFlavor = "vllm" | "sglang" | "llamacpp" | "tgi" | "unknown";

/** Signals a page may fail to state; `prefixCache` covers both prefix-cache counters. */
export type SignalField =
  | "kvUsage"
  | "prefixCache"
  | "running"
  | "waiting"
  | "preemptions"
  | "kvCapacityTokens"
  | "blockSize"
  | "maxNumSeqs"
  | "hostKvCapacityTokens";

/** Where the KV capacity of a page came from. */
export type CapacitySource = "engine" | "derived" | "unknown";

/** Signals read from one scrape: everything but the scrape time and health, which the scraper owns. */
export type ScrapedSignals = Omit<
  EngineSignals,
  "readAtMs" | "healthy" | "profile" | "unknown" | "kvCapacitySource"
> & {
  flavor: EngineFlavor;
  /** `vllm-v0`, `vllm-v1`, `vllm` (generation not told apart), `nim`, `sglang`, `sglang-legacy`, `llamacpp`, `tgi`, `unknown` (metrics unreadable); `+hybrid` for attention + mamba models. */
  profile: string;
  /** Signals the page does not carry; their fields hold placeholders (0, or 1 for the data-parallel size). */
  unknown: SignalField[];
  kvCapacitySource: CapacitySource;
};

/**
 * A profile an operator can force on an upstream (`--engine-profile`): `auto` detects it from the
 * page (the default); `unknown` reads no metrics at all and serves the engine on its health alone.
 */
export const ENGINE_PROFILES = ["auto", "vllm", "sglang", "nim", "llamacpp", "tgi", "unknown"] as const;
export type EngineProfileName = (typeof ENGINE_PROFILES)[number];

/** Every signal a page can leave unknown, in the order the start-up line names them. */
export const ALL_SIGNAL_FIELDS: readonly SignalField[] = [
  "kvUsage",
  "prefixCache",
  "running",
  "waiting",
  "preemptions",
  "kvCapacityTokens",
  "blockSize",
  "maxNumSeqs",
];

/**
 * An engine whose metrics sluice cannot read (another server, metrics off, a 404): every signal
 * unknown, placeholders in the fields (the meter, the window law and the budget read them as
 * unknown through `unknown`).
 */
export function unknownEngineSignals(): ScrapedSignals {
  return {
    flavor: "unknown",
    profile: "unknown",
    unknown: [...ALL_SIGNAL_FIELDS],
    kvCapacitySource: "unknown",
    kvUsage: 0,
    prefixQueryTokens: 0,
    prefixHitTokens: 0,
    running: 0,
    waiting: 0,
    preemptions: 0,
    kvCapacityTokens: 0,
    blockSize: 0,
    maxNumSeqs: 0,
    dataParallelSize: 1,
  };
}

/** The host tier's signals, merged into a page's signals when the page shows one. */
export type HostTierSignals = Pick<
  EngineSignals,
  | "hostKvCapacityTokens"
  | "hostKvUsage"
  | "hostPrefixQueryTokens"
  | "hostPrefixHitTokens"
  | "hostLoadTokensPerSecond"
>;
