/**
 * @module Named upstreams: `--upstream [NAME=]URL` (or `role=ROLE,name=NAME,url=URL[,pd=vllm|sglang,bootstrap_port=N][,profile=P]`),
 * `--kv-capacity-tokens [NAME=]N` and `--engine-profile [NAME=]PROFILE`,
 * and the start-up lines that say what sluice made of each upstream's metrics.
 */

import type { EngineSignals, ReplicaRole } from "../../../src/engine.js";
import { PD_PROTOCOLS, type PdProtocol } from "./pd-protocol.js";
import { ENGINE_PROFILES, type EngineProfileName } from "./profile-types.js";

/** One upstream as configured. */
export interface UpstreamSpec {
  /** Replica id: used in metrics labels, `x-sluice-replica`, error messages and the admin state. */
  name: string;
  /** The upstream's base URL as given. */
  url: string;
  /** Its role in a disaggregated fleet; absent: `both`. */
  role?: ReplicaRole;
  /** The disaggregated request flow it speaks (`pd-protocol.ts`); absent: vLLM's. */
  pd?: PdProtocol;
  /** SGLang prefill server: its bootstrap server's port; absent: the one its server info states, else 8998. */
  bootstrapPort?: number;
  /** KV capacity (tokens) to use when the engine states none. */
  kvCapacityTokens?: number;
  /** The profile its metrics are read with; absent: detected (`auto`). */
  profile?: EngineProfileName;
}

/** A setting that cannot be read; `setting` names the flag it came from (`--upstream`, `--kv-capacity-tokens`). */
export class UpstreamSpecError extends Error {
  constructor(
    readonly setting: "--upstream" | "--kv-capacity-tokens" | "--engine-profile",
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
const FIELDS =
  "role=prefill|decode|both,name=NAME,url=URL[,pd=vllm|sglang][,bootstrap_port=N][,profile=PROFILE]";
const KEYS = ["role", "name", "url", "pd", "bootstrap_port", "profile"];
const PROFILES_TEXT = ENGINE_PROFILES.join("|");

function isProfile(text: string): text is EngineProfileName {
  return (ENGINE_PROFILES as readonly string[]).includes(text);
}

/**
 * Reads the key form `role=prefill,name=p0,url=http://…` (keys in any order;
 * `url` required, `name` and `role` optional; `pd` and `bootstrap_port` for a
 * prefill or decode replica only, `bootstrap_port` with `pd=sglang` on a prefill
 * replica only). Keys may also be separated by
 * `;`, since `SLUICE_UPSTREAM` separates upstreams with commas. A URL holding
 * a comma or a semicolon must use the `NAME=URL` form, with no role.
 */
function parseFieldSpec(raw: string, text: string): UpstreamSpec {
  const fields = new Map<string, string>();
  for (const part of text.split(/[,;]/)) {
    const eq = part.indexOf("=");
    const key = eq < 0 ? "" : part.slice(0, eq).trim();
    if (!KEYS.includes(key) || fields.has(key)) {
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
  if (role !== undefined) spec.role = role as ReplicaRole;
  const pd = fields.get("pd");
  if (pd !== undefined) {
    if (!PD_PROTOCOLS.includes(pd as PdProtocol) || (role !== "prefill" && role !== "decode")) {
      throw new UpstreamSpecError(
        "--upstream",
        `pd=vllm or pd=sglang on a prefill or decode replica (${FIELDS})`,
        raw,
      );
    }
    spec.pd = pd as PdProtocol;
  }
  const port = fields.get("bootstrap_port");
  if (port !== undefined) {
    const number = Number(port);
    if (!/^[0-9]+$/.test(port) || number < 1 || number > 65535 || role !== "prefill" || pd !== "sglang") {
      throw new UpstreamSpecError(
        "--upstream",
        `bootstrap_port=N (1–65535) on a prefill replica with pd=sglang (${FIELDS})`,
        raw,
      );
    }
    spec.bootstrapPort = number;
  }
  const profile = fields.get("profile");
  if (profile !== undefined) {
    if (!isProfile(profile)) {
      throw new UpstreamSpecError("--upstream", `profile=${PROFILES_TEXT} (${FIELDS})`, raw);
    }
    spec.profile = profile;
  }
  return spec;
}

/**
 * Splits a variable's (or one flag's) text into upstreams at commas, keeping a key-form
 * upstream's own keys together: `role=prefill,name=p0,url=…,role=decode,name=d0,url=…` is two
 * upstreams, a new one beginning at a key the current one already has, or at a part that is
 * not a key. Plain URLs and `NAME=URL` items split at every comma.
 */
export function splitUpstreamItems(text: string): string[] {
  const items: string[] = [];
  let keys: Set<string> | undefined;
  for (const raw of text.split(",")) {
    const part = raw.trim();
    if (part === "") continue;
    const key = /^([a-z_]+)=/.exec(part)?.[1];
    const field = key !== undefined && KEYS.includes(key) ? key : undefined;
    if (keys && field !== undefined && !keys.has(field)) {
      items[items.length - 1] += `,${part}`;
      keys.add(field);
      continue;
    }
    items.push(part);
    keys = field === undefined ? undefined : new Set([field]);
  }
  return items;
}

/** Reads `NAME=URL`, a plain `URL` (named after its host:port) or the key form with a role. */
export function parseUpstreamSpec(raw: string): UpstreamSpec {
  const text = raw.trim();
  if (/^(role|name|url|pd|bootstrap_port|profile)=/.test(text) && /[,;]/.test(text))
    return parseFieldSpec(raw, text);
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

/** `--engine-profile` values: `PROFILE` for every upstream, `NAME=PROFILE` for one. */
export interface EngineProfileSpec {
  all?: EngineProfileName;
  byName: Map<string, EngineProfileName>;
}

export function parseEngineProfileSpecs(values: readonly string[]): EngineProfileSpec {
  const spec: EngineProfileSpec = { byName: new Map() };
  for (const raw of values) {
    const text = raw.trim();
    const named = /^([^=]+)=(.*)$/.exec(text);
    const profile = (named ? named[2]! : text).trim();
    if (!isProfile(profile)) {
      throw new UpstreamSpecError("--engine-profile", `a profile, ${PROFILES_TEXT}, or NAME=PROFILE`, raw);
    }
    if (named) spec.byName.set(named[1]!.trim(), profile);
    else spec.all = profile;
  }
  return spec;
}

/**
 * Resolves the configured upstreams: names unique, capacities and profiles matched to
 * names. Every upstream is named the same way however many there are — its
 * given name, else its host:port — so a replica keeps its id when another is added.
 */
export function resolveUpstreams(
  upstreams: readonly string[],
  kvCapacityTokens: readonly string[] = [],
  engineProfiles: readonly string[] = [],
): UpstreamSpec[] {
  const capacity = parseKvCapacitySpecs(kvCapacityTokens);
  const profiles = parseEngineProfileSpecs(engineProfiles);
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
    // The upstream's own profile= key wins over the flag's value for every upstream.
    const profile = profiles.byName.get(spec.name) ?? spec.profile ?? profiles.all;
    if (profile !== undefined) spec.profile = profile;
  }
  // The prefill and decode replica of a call speak one request flow: the fleet speaks one.
  const flows = new Set(
    specs.filter((s) => s.role === "prefill" || s.role === "decode").map((s) => s.pd ?? "vllm"),
  );
  if (flows.size > 1) {
    throw new UpstreamSpecError(
      "--upstream",
      "one pd= for every prefill and decode replica (a prefill and a decode replica must speak the same flow)",
      specs.map((s) => `${s.name}:${s.pd ?? "vllm"}`).join(", "),
    );
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
  for (const name of profiles.byName.keys()) {
    if (!seen.has(name)) {
      throw new UpstreamSpecError(
        "--engine-profile",
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
      line: `sluice: upstream ${name} (${url}): not answering yet`,
      warning:
        `sluice: warning: upstream ${name} answered neither its metrics nor /health nor /v1/models at start-up; ` +
        "it is unhealthy until it answers, and its signals are unknown",
    };
  }
  if (signals.warning !== undefined) {
    return {
      line: `sluice: upstream ${name} (${url}): ${signals.profile}; signals unknown`,
      warning: `sluice: warning: ${signals.warning}`,
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
