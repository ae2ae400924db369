/**
 * @module Hugging Face Text Generation Inference (TGI): what its `tgi_` series and `/info` say.
 *
 * Its router prints the queue (`tgi_queue_size`), the batch running now (`tgi_batch_current_size`,
 * `tgi_batch_current_max_tokens`), request counters and histograms. It states no KV usage, no
 * capacity and no prefix-cache counters; `/info` states the limits (`max_total_tokens` per
 * request, `max_batch_total_tokens` for the batch, when the build states it). See docs/engines.md.
 */

import type { ParsedExposition } from "./exposition.js";
import { type ScrapedSignals, type SignalField, unknownEngineSignals } from "./profile-types.js";
import { groupByName, pick, sum } from "./series-lookup.js";

/** Series only TGI's router prints: any one of them makes a page TGI's. */
export const TGI_CORE = [
  "tgi_queue_size",
  "tgi_batch_current_size",
  "tgi_batch_current_max_tokens",
  "tgi_request_count",
];

/** A TGI page's signals, and the batch's token bound for a KV usage once `/info` gives the pool. */
export type TgiSignals = ScrapedSignals & { batchMaxTokens?: number };

/** Reads a TGI page; every signal it does not state is listed in `unknown`. */
export function tgiSignals(page: ParsedExposition): TgiSignals {
  const byName = groupByName(page.samples);
  const unknown: SignalField[] = [];
  const running = pick(byName, "tgi_batch_current_size");
  const waiting = pick(byName, "tgi_queue_size");
  const batchMax = pick(byName, "tgi_batch_current_max_tokens");
  unknown.push("kvUsage", "prefixCache");
  if (!running) unknown.push("running");
  if (!waiting) unknown.push("waiting");
  unknown.push("preemptions", "kvCapacityTokens", "blockSize", "maxNumSeqs");
  const signals: TgiSignals = {
    // Every other signal stays as an engine without readable metrics has it.
    ...unknownEngineSignals(),
    flavor: "tgi",
    profile: "tgi",
    unknown,
    running: sum(running),
    waiting: sum(waiting),
  };
  if (batchMax) signals.batchMaxTokens = sum(batchMax);
  return signals;
}

/** What TGI's `GET /info` states about limits. */
export interface TgiInfo {
  /** Prompt plus output of one request, tokens (`max_total_tokens`). */
  maxTotalTokens?: number;
  /** Prompt of one request, tokens (`max_input_tokens`, `max_input_length` before 2.0). */
  maxInputTokens?: number;
  /** Tokens the whole batch may hold (`max_batch_total_tokens`), when the build states it. */
  maxBatchTotalTokens?: number;
  /** Requests in a batch (`max_batch_size`), when set. */
  maxBatchSize?: number;
}

function positiveInt(value: unknown): number | undefined {
  return typeof value === "number" && Number.isFinite(value) && value > 0 ? Math.floor(value) : undefined;
}

/** Reads `GET /info`. */
export function tgiInfo(body: unknown): TgiInfo {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return {};
  const b = body as Record<string, unknown>;
  const info: TgiInfo = {};
  const total = positiveInt(b.max_total_tokens);
  if (total !== undefined) info.maxTotalTokens = total;
  const input = positiveInt(b.max_input_tokens ?? b.max_input_length);
  if (input !== undefined) info.maxInputTokens = input;
  const batch = positiveInt(b.max_batch_total_tokens);
  if (batch !== undefined) info.maxBatchTotalTokens = batch;
  const size = positiveInt(b.max_batch_size);
  if (size !== undefined) info.maxBatchSize = size;
  return info;
}
