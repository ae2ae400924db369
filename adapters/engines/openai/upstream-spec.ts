/**
 * @module Named upstreams: `--upstream [NAME=]URL` and `--kv-capacity-tokens [NAME=]N`,
 * and the start-up lines that say what sluice made of each upstream's metrics.
 */

import type { EngineSignals } from "../../../src/engine.js";

/** One upstream as configured. */
export interface UpstreamSpec {
  /** Replica id: used in metrics labels, `x-sluice-replica`, error messages and the admin state. */
  name: string;
  /** The upstream's base URL as given. */
  url: string;
  /** KV capacity (tokens) to use when the engine states none. */
  kvCapacityTokens?: number;
}

/** A setting that cannot be read; `setting` names the flag it came from (`--upstream`, `--kv-capacity-tokens`). */
export class UpstreamSpecError extends Error {
  constructor(
    readonly setting: "--upstream" | "--kv-capacity-tokens",
    readonly expected: string,
    readonly value: string,
  ) {
    super(`${setting} takes ${expected}, got ${JSON.stringify(value)}`);
    this.name = "UpstreamSpecError";
  }
}

/** Names appear in HTTP headers and metric labels: letters, digits, `.`, `_`, `-`; no `:` or `/`, so a URL never reads as one. */
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const NAMED = /^([^=:/]+)=(.*)$/;

/** Reads `NAME=URL` or a plain `URL`; a plain URL is named after its host:port. */
export function parseUpstreamSpec(raw: string): UpstreamSpec {
  const text = raw.trim();
  const named = NAMED.exec(text);
  const name = named ? named[1]!.trim() : undefined;
  const urlText = named ? named[2]!.trim() : text;
  if (name !== undefined && !NAME.test(name)) {
    throw new UpstreamSpecError(
      "--upstream",
      "NAME=URL with a name of letters, digits, '.', '_' or '-'",
      raw,
    );
  }
  let url: URL;
  try {
    url = new URL(urlText);
  } catch {
    throw new UpstreamSpecError("--upstream", "an http(s) URL, optionally as NAME=URL", raw);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new UpstreamSpecError("--upstream", "an http(s) URL, optionally as NAME=URL", raw);
  }
  return { name: name ?? url.host, url: urlText };
}

/** `--kv-capacity-tokens` values: `N` for every upstream, `NAME=N` for one. */
export interface KvCapacitySpec {
  all?: number;
  byName: Map<string, number>;
}

export function parseKvCapacitySpecs(values: readonly string[]): KvCapacitySpec {
  const spec: KvCapacitySpec = { byName: new Map() };
  for (const raw of values) {
    const text = raw.trim();
    const named = /^([^=]+)=(.*)$/.exec(text);
    const number = (named ? named[2]! : text).trim();
    const tokens = Number(number);
    if (!/^[0-9]+$/.test(number) || !Number.isSafeInteger(tokens) || tokens < 1) {
      throw new UpstreamSpecError("--kv-capacity-tokens", "a positive number of tokens, N or NAME=N", raw);
    }
    if (named) spec.byName.set(named[1]!.trim(), tokens);
    else spec.all = tokens;
  }
  return spec;
}

/**
 * Resolves the configured upstreams: names unique, capacities matched to
 * names. Every upstream is named the same way however many there are — its
 * given name, else its host:port — so a replica keeps its id when another is added.
 */
export function resolveUpstreams(
  upstreams: readonly string[],
  kvCapacityTokens: readonly string[] = [],
): UpstreamSpec[] {
  const capacity = parseKvCapacitySpecs(kvCapacityTokens);
  const specs = upstreams.map(parseUpstreamSpec);
  const seen = new Set<string>();
  for (const spec of specs) {
    if (seen.has(spec.name)) {
      throw new UpstreamSpecError(
        "--upstream",
        `distinct names (two upstreams are named ${spec.name}; name them with NAME=URL)`,
        spec.url,
      );
    }
    seen.add(spec.name);
    const tokens = capacity.byName.get(spec.name) ?? capacity.all;
    if (tokens !== undefined) spec.kvCapacityTokens = tokens;
  }
  for (const name of capacity.byName.keys()) {
    if (!seen.has(name)) {
      throw new UpstreamSpecError(
        "--kv-capacity-tokens",
        `the name of an --upstream (${[...seen].join(", ")})`,
        name,
      );
    }
  }
  return specs;
}

/**
 * What sluice made of an upstream's metrics, for the start-up log: its
 * profile, where the KV capacity came from, the signals it cannot read, and
 * a warning when the token budget must stay off for want of a capacity.
 */
export function describeUpstream(
  name: string,
  url: string,
  signals: EngineSignals,
): { line: string; warning?: string } {
  if (!signals.profile) {
    return {
      line: `sluice: upstream ${name} (${url}): no engine metrics read yet`,
      warning:
        `sluice: warning: upstream ${name} answered no vLLM or SGLang metrics at start-up; ` +
        "until it does, its signals are unknown and its token budget is off",
    };
  }
  const capacity =
    signals.kvCapacityTokens > 0
      ? `KV capacity ${signals.kvCapacityTokens} tokens (${signals.kvCapacitySource ?? "engine"})`
      : "KV capacity unknown";
  const unknown =
    signals.unknown && signals.unknown.length > 0 ? `; not published: ${signals.unknown.join(", ")}` : "";
  const ranks = signals.dataParallelSize > 1 ? `; ${signals.dataParallelSize} data-parallel ranks` : "";
  const line = `sluice: upstream ${name} (${url}): ${signals.profile}; ${capacity}${ranks}${unknown}`;
  if (signals.kvCapacityTokens > 0) return { line };
  return {
    line,
    warning:
      `sluice: warning: upstream ${name} states no KV capacity, so its token budget is off; ` +
      `set --kv-capacity-tokens ${name}=N to turn it on`,
  };
}
