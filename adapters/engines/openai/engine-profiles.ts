/**
 * @module Engine profiles: which engine a metrics page is, and the signals it states. vLLM's (and
 * NIM's), SGLang's, llama.cpp's and TGI's pages are read in `vllm-profile.ts`,
 * `sglang-profile.ts`, `llamacpp-profile.ts` and `tgi-profile.ts`.
 *
 * One rule runs through them: the engine's own statement wins over a value
 * derived from other series, and a series the page does not carry is
 * unknown, never zero. A zero read from a missing series is a measurement
 * sluice would act on (a hit rate of 0 cuts the session window, a KV usage of
 * 0 grows it); an unknown one is reported as such and left to the operator.
 */

import type { ParsedExposition } from "./exposition.js";
import { LLAMACPP_CORE, llamacppSignals } from "./llamacpp-profile.js";
import type { EngineProfileName, ScrapedSignals } from "./profile-types.js";
import { type ByName, groupByName } from "./series-lookup.js";
import { SGLANG_CORE, sglangSignals } from "./sglang-profile.js";
import { TGI_CORE, tgiSignals } from "./tgi-profile.js";
import { NIM_CORE, nimSignals, VLLM_CORE, vllmSignals } from "./vllm-profile.js";

export {
  ALL_SIGNAL_FIELDS,
  type CapacitySource,
  ENGINE_PROFILES,
  type EngineFlavor,
  type EngineProfileName,
  type ScrapedSignals,
  type SignalField,
  unknownEngineSignals,
} from "./profile-types.js";

/**
 * A page whose engine series carry another prefix than the engine's own, renamed to the engine's:
 * - `sglang_name` for `sglang:name`: so SGLang's router re-exports its workers' series, and so
 *   some SGLang builds printed their own (sglang issue #12618, "sglang: -> sglang_"; its Grafana
 *   dashboard followed in PR #15758, and later went back);
 * - `ray_vllm:name` for `vllm:name`: vLLM served by Ray Serve, whose metrics agent prefixes every
 *   application series with `ray_` (DataDog's vLLM integration maps the same names back).
 * The names mean the same.
 */
function renamedPrefix(byName: ByName, from: string, to: string): ByName {
  const renamed: ByName = new Map();
  for (const [name, list] of byName) {
    if (name.startsWith(from)) renamed.set(`${to}${name.slice(from.length)}`, list);
  }
  return renamed;
}

/**
 * Maps a parsed page to engine signals, or undefined when it neither carries
 * nor declares (`# TYPE`) the core series of vLLM, SGLang, llama.cpp or TGI,
 * nor carries NIM's (a garbage page, or another server's metrics). A forced
 * `profile` reads the page as that engine's whatever it carries (`unknown`: never).
 *
 * - Counters and request gauges are summed over label sets (several models,
 *   data-parallel ranks); KV usage, a ratio per rank, is averaged; series
 *   repeated per `tp_rank` count once.
 * - vLLM: capacity is the engine's `kv_cache_size_tokens` when stated, else
 *   `num_gpu_blocks × block_size` (marked `derived`); hit rate from the token
 *   counters `prefix_cache_{queries,hits}_total` (or their `gpu_` names).
 * - NIM for LLMs: vLLM's names without the prefix, read as vLLM's; `num_request_max` is `max_num_seqs`.
 * - SGLang: capacity is `max_total_num_tokens`; hit rate from
 *   `cached_tokens_total` over `prompt_tokens_total`, unknown while either is missing;
 *   names written `sglang_…` are read as `sglang:…`.
 * - vLLM under Ray Serve (`ray_vllm:…`): read as vLLM's, profile `ray-` + vLLM's.
 * - Every missing signal is listed in `unknown`; a missing prefix-cache pair
 *   reads as 0 queries (the meter's "not measured"), never as 0 hits.
 * - Data-parallel size = distinct `dp_rank` or `engine` label values over the engine's series (1 when absent).
 * - A second KV tier in host memory (vLLM's KV connector / CPU offloading,
 *   LMCache, SGLang HiCache) fills the `host…` fields; a page without one
 *   leaves them absent (one tier). A tier whose size is not stated reads
 *   `hostKvCapacityTokens: 0` and lists `hostKvCapacityTokens` as unknown.
 */
export function signalsFromExposition(
  page: ParsedExposition,
  profile: EngineProfileName = "auto",
): ScrapedSignals | undefined {
  const byName = groupByName(page.samples);
  const declared = new Set(page.types.keys());
  // A declared family counts: an engine whose stat logger never recorded prints its families'
  // # TYPE lines without a sample, and every signal of such a page is unknown, not the page foreign.
  const carries = (name: string) => byName.has(name) || declared.has(name);
  switch (profile) {
    case "vllm":
      return vllmSignals(byName, declared);
    case "sglang":
      return sglangSignals(byName);
    case "nim":
      return nimSignals(byName, declared);
    case "llamacpp":
      return llamacppSignals(page);
    case "tgi":
      return tgiSignals(page);
    case "unknown":
      return undefined;
    case "auto":
      break;
  }
  if (VLLM_CORE.some(carries)) return vllmSignals(byName, declared);
  if (SGLANG_CORE.some(carries)) return sglangSignals(byName);
  const sglangUnderscored = renamedPrefix(byName, "sglang_", "sglang:");
  if (SGLANG_CORE.some((n) => sglangUnderscored.has(n))) return sglangSignals(sglangUnderscored);
  const rayServed = renamedPrefix(byName, "ray_vllm:", "vllm:");
  if (VLLM_CORE.some((n) => rayServed.has(n))) {
    const signals = vllmSignals(
      rayServed,
      new Set([...declared].filter((n) => n.startsWith("ray_vllm:")).map((n) => n.slice("ray_".length))),
    );
    signals.profile = `ray-${signals.profile}`;
    return signals;
  }
  if (byName.has("num_requests_running") && NIM_CORE.some((n) => byName.has(n)))
    return nimSignals(byName, declared);
  if (LLAMACPP_CORE.some(carries)) return llamacppSignals(page);
  if (TGI_CORE.some(carries)) return tgiSignals(page);
  return undefined;
}
