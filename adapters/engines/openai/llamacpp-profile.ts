/**
 * @module llama.cpp's `llama-server` (started with `--metrics`): what its `llamacpp:` series say.
 *
 * The page is small: requests processing (slots busy) and deferred (waiting for a slot), prompt
 * and generated token counters, decode calls and busy slots per decode. It states no KV usage
 * (builds before mid-2025 printed `llamacpp:kv_cache_usage_ratio`, read when present), no
 * capacity and no prefix-cache counters: the capacity comes from `/props` and `/slots`, and the
 * hit rate from each call's `usage.prompt_tokens_details.cached_tokens` (or `timings.cache_n`),
 * which the scraper adds up (`scraper.ts`). See docs/engines.md.
 */

import type { ParsedExposition } from "./exposition.js";
import { type ScrapedSignals, type SignalField, unknownEngineSignals } from "./profile-types.js";
import { clamp01, groupByName, mean, pick, sum } from "./series-lookup.js";

/** Series only llama-server prints: any one of them makes a page llama.cpp's. */
export const LLAMACPP_CORE = [
  "llamacpp:requests_processing",
  "llamacpp:requests_deferred",
  "llamacpp:prompt_tokens_total",
  "llamacpp:tokens_predicted_total",
  "llamacpp:n_decode_total",
];

/** Reads a llama-server page; every signal it does not state is listed in `unknown`. */
export function llamacppSignals(page: ParsedExposition): ScrapedSignals {
  const byName = groupByName(page.samples);
  const unknown: SignalField[] = [];
  const running = pick(byName, "llamacpp:requests_processing");
  const waiting = pick(byName, "llamacpp:requests_deferred");
  const kv = pick(byName, "llamacpp:kv_cache_usage_ratio");
  if (!kv) unknown.push("kvUsage");
  // Prefix-cache hits are per call (the scraper fills them once a call reported them).
  unknown.push("prefixCache");
  if (!running) unknown.push("running");
  if (!waiting) unknown.push("waiting");
  // llama.cpp has no preemption: a slot keeps its request to the end (or shifts its context).
  unknown.push("preemptions", "kvCapacityTokens", "blockSize", "maxNumSeqs");
  return {
    // Every other signal stays as an engine without readable metrics has it.
    ...unknownEngineSignals(),
    flavor: "llamacpp",
    profile: "llamacpp",
    unknown,
    kvUsage: clamp01(mean(kv)),
    running: sum(running),
    waiting: sum(waiting),
  };
}

/** What `/props` says about capacity: slots (`--parallel`) and each slot's context, tokens. */
export interface LlamacppProps {
  totalSlots?: number;
  slotContextTokens?: number;
}

function positiveInt(value: unknown): number | undefined {
  return typeof value === "number" && Number.isFinite(value) && value > 0 ? Math.floor(value) : undefined;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Reads `GET /props`: `total_slots` and `default_generation_settings.n_ctx` (one slot's context). */
export function llamacppProps(body: unknown): LlamacppProps {
  if (!isObject(body)) return {};
  const props: LlamacppProps = {};
  const slots = positiveInt(body.total_slots);
  if (slots !== undefined) props.totalSlots = slots;
  const settings = body.default_generation_settings;
  const nCtx = isObject(settings) ? positiveInt(settings.n_ctx) : undefined;
  if (nCtx !== undefined) props.slotContextTokens = nCtx;
  return props;
}

/** What `/slots` says: the slots, those processing, and their contexts added up (tokens). */
export interface LlamacppSlots {
  slots: number;
  processing: number;
  contextTokens: number;
  /** The largest slot context: the longest prompt plus output one call can have, tokens. */
  largestSlotTokens: number;
}

/** Reads `GET /slots` (an array, one object per slot); undefined when the body is not one. */
export function llamacppSlots(body: unknown): LlamacppSlots | undefined {
  if (!Array.isArray(body) || body.length === 0) return undefined;
  const read: LlamacppSlots = { slots: 0, processing: 0, contextTokens: 0, largestSlotTokens: 0 };
  for (const slot of body) {
    if (!isObject(slot)) return undefined;
    read.slots++;
    if (slot.is_processing === true) read.processing++;
    const nCtx = positiveInt(slot.n_ctx) ?? 0;
    read.contextTokens += nCtx;
    read.largestSlotTokens = Math.max(read.largestSlotTokens, nCtx);
  }
  return read;
}
