/**
 * @module Named upstreams: `--upstream [NAME=]URL` (or `role=ROLE,name=NAME,url=URL`) and `--kv-capacity-tokens [NAME=]N`,
 * and the start-up lines that say what sluice made of each upstream's metrics.
 */

import type { EngineSignals, ReplicaRole } from "../../../src/engine.js";

/** One upstream as configured. */
export interface UpstreamSpec {
  /** Replica id: used in metrics labels, `x-sluice-replica`, error messages and the admin state. */
  name: string;
  /** The upstream's base URL as given. */
  url: string;
  /** Its role in a disaggregated fleet; absent: `both`. */
  role?: ReplicaRole;
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

const ROLES: readonly ReplicaRole[] = ["prefill", "decode", "both"];
const FIELDS = "role=prefill|decode|both,name=NAME,url=URL";

/**
 * Reads the key form `role=prefill,name=p0,url=http://…` (keys in any order;
 * `url` required, `name` and `role` optional). Keys may also be separated by
 * `;`, since `SLUICE_UPSTREAM` separates upstreams with commas. A URL holding
 * a comma or a semicolon must use the `NAME=URL` form, with no role.
 */
function parseFieldSpec(raw: string, text: string): UpstreamSpec {
  const fields = new Map<string, string>();
  for (const part of text.split(/[,;]/)) {
    const eq = part.indexOf("=");
    const key = eq < 0 ? "" : part.slice(0, eq).trim();
    if (!["role", "name", "url"].includes(key) || fields.has(key)) {
      throw new UpstreamSpecError("--upstream", FIELDS, raw);
    }
    fields.set(key, part.slice(eq + 1).trim());
  }
  const url = fields.get("url");
  if (url === undefined) throw new UpstreamSpecError("--upstream", FIELDS, raw);
  const role = fields.get("role");
  if (role !== undefined && !ROLES.includes(role as ReplicaRole)) {
    throw new UpstreamSpecError("--upstream", `a role of prefill, decode or both (${FIELDS})`, raw);
  }
  const name = fields.get("name");
  const spec = parseUpstreamSpec(name === undefined ? url : `${name}=${url}`);
  return role === undefined ? spec : { ...spec, role: role as ReplicaRole };
}

/** Reads `NAME=URL`, a plain `URL` (named after its host:port) or the key form with a role. */
export function parseUpstreamSpec(raw: string): UpstreamSpec {
  const text = raw.trim();
  if (/^(role|name|url)=/.test(text) && /[,;]/.test(text)) return parseFieldSpec(raw, text);
  if (/^(role|url)=/.test(text)) return parseFieldSpec(raw, text);
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
