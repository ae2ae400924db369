/**
 * @module Settings: one entry per flag. Each names the option it sets, its
 * environment variables and its zod schema (type, range, default); from that
 * entry come the text coercion of flags and environment values, the docs/configuration.md
 * order of sources, the `--help` lines and docs/configuration.md. Adding a
 * flag is adding one entry.
 */

import { z } from "zod";
import { ConfigError } from "./config-error.js";

/** How a setting's text becomes a value; inferred from its schema. */
export type SettingKind = "int" | "number" | "enum" | "string" | "list" | "boolean";

/** Where a resolved value came from (docs/configuration.md order: flag, canonical env, Dynamo alias env). */
export type SettingSource = "flag" | "env" | "alias";

/** One flag and everything said about it. */
export interface Setting {
  /** Flag name without dashes (`window-unit`). */
  readonly flag: string;
  /** Dotted path of the option it sets (`config.window.unit`, `port`). */
  readonly path: string;
  /** Help and docs section. */
  readonly topic: string;
  /** The value's schema: type, range and default (the default is documentation; callers fill it in). */
  readonly schema: z.ZodType;
  readonly kind: SettingKind;
  /** Typed placeholder for help (`<int>`, `<tokens|sessions>`). */
  readonly placeholder: string;
  readonly help: string;
  /** Canonical variable; null: flag only. */
  readonly env: string | null;
  /** Dynamo's name for the same setting (docs/configuration.md). */
  readonly alias?: string;
  /** What an invalid value should have been, in words (`an integer from 400 to 599`). */
  readonly expects: string;
  /** The default in words when the schema holds none (`engine max_num_seqs`). */
  readonly defaultText?: string;
  /** A secret (a key): messages never repeat its value, and an invalid variable stops start-up (fail closed). */
  readonly secret?: boolean;
  /** A list's items in one text (a flag's value or the variable); default: split at every comma. */
  readonly splitItems?: (text: string) => string[];
}

/** What a setting entry states; the rest is derived. */
export interface SettingSpec {
  flag: string;
  path: string;
  topic: string;
  schema: z.ZodType;
  help: string;
  /** Default `SLUICE_<FLAG>`; null for a flag-only setting. */
  env?: string | null;
  alias?: string;
  placeholder?: string;
  expects?: string;
  defaultText?: string;
  secret?: boolean;
  /** A list whose items may hold commas (`--upstream role=…,name=…,url=…`) splits its text this way. */
  splitItems?: (text: string) => string[];
}

interface Def {
  type: string;
  innerType?: z.ZodType;
  defaultValue?: unknown;
  element?: z.ZodType;
  checks?: { _zod: { def: { check: string; value?: unknown; inclusive?: boolean; format?: string } } }[];
}

const defOf = (schema: z.ZodType): Def => (schema as unknown as { def: Def }).def;

const WRAPPERS = new Set(["default", "prefault", "optional", "nullable", "readonly"]);

/** The schema under `.default()`, `.optional()` and the like. */
export function innerSchema(schema: z.ZodType): z.ZodType {
  let current = schema;
  for (let def = defOf(current); WRAPPERS.has(def.type) && def.innerType; def = defOf(current)) {
    current = def.innerType;
  }
  return current;
}

/** The schema's default value, if it declares one. */
export function schemaDefault(schema: z.ZodType): unknown {
  let current = schema;
  for (let def = defOf(current); WRAPPERS.has(def.type) && def.innerType; def = defOf(current)) {
    if (def.type === "default") return def.defaultValue;
    current = def.innerType;
  }
  return undefined;
}

/** The field schema at `path` inside an object schema (wrappers looked through). */
export function fieldSchema(root: z.ZodType, path: string): z.ZodType {
  let current: z.ZodType = root;
  for (const key of path.split(".")) {
    const shape = (innerSchema(current) as unknown as { shape?: Record<string, z.ZodType> }).shape;
    const next = shape?.[key];
    if (!next) throw new Error(`no field ${path} in the schema`);
    current = next;
  }
  return current;
}

interface NumberBounds {
  integer: boolean;
  min?: { value: number; inclusive: boolean };
  max?: { value: number; inclusive: boolean };
}

function numberBounds(schema: z.ZodType): NumberBounds {
  const bounds: NumberBounds = { integer: false };
  for (const check of defOf(schema).checks ?? []) {
    const def = check._zod.def;
    if (def.format === "safeint" || def.check === "number_format") bounds.integer = true;
    if (def.check === "greater_than" && typeof def.value === "number")
      bounds.min = { value: def.value, inclusive: def.inclusive ?? true };
    if (def.check === "less_than" && typeof def.value === "number")
      bounds.max = { value: def.value, inclusive: def.inclusive ?? true };
  }
  if (bounds.integer && bounds.min && !bounds.min.inclusive)
    bounds.min = { value: Math.floor(bounds.min.value) + 1, inclusive: true };
  if (bounds.integer && bounds.max && !bounds.max.inclusive)
    bounds.max = { value: Math.ceil(bounds.max.value) - 1, inclusive: true };
  if (bounds.integer && bounds.max && bounds.max.value >= Number.MAX_SAFE_INTEGER) delete bounds.max;
  if (bounds.integer && bounds.min && bounds.min.value <= Number.MIN_SAFE_INTEGER) delete bounds.min;
  return bounds;
}

/** A number's range in words, as error messages and docs say it. */
function describeNumber(bounds: NumberBounds): string {
  const { min, max } = bounds;
  if (bounds.integer) {
    if (min && max) return `an integer from ${min.value} to ${max.value}`;
    if (min?.value === 1 && !max) return "a positive integer";
    if (min?.value === 0 && !max) return "a non-negative integer";
    if (min) return `an integer ≥ ${min.value}`;
    return "an integer";
  }
  if (min && max) {
    if (min.inclusive && max.inclusive) return `a number from ${min.value} to ${max.value}`;
    if (!min.inclusive && !max.inclusive) return `a number between ${min.value} and ${max.value} (exclusive)`;
    return `a number ${min.inclusive ? "≥" : ">"} ${min.value} and ${max.inclusive ? "≤" : "<"} ${max.value}`;
  }
  if (min?.value === 0) return min.inclusive ? "a non-negative number" : "a positive number";
  if (min) return `a number ${min.inclusive ? "≥" : ">"} ${min.value}`;
  if (max) return `a number ${max.inclusive ? "≤" : "<"} ${max.value}`;
  return "a number";
}

function kindOf(inner: z.ZodType): SettingKind {
  const type = defOf(inner).type;
  if (type === "number") return numberBounds(inner).integer ? "int" : "number";
  if (type === "enum") return "enum";
  if (type === "array") return "list";
  if (type === "boolean") return "boolean";
  return "string";
}

/** Upper snake case of a flag: `window-kv-low` → `SLUICE_WINDOW_KV_LOW`. */
export function envNameOf(flag: string): string {
  return `SLUICE_${flag.toUpperCase().replace(/-/g, "_")}`;
}

/** Completes a setting entry: kind, placeholder, expectation and variable from its schema. */
export function defineSetting(spec: SettingSpec): Setting {
  const inner = innerSchema(spec.schema);
  const kind = kindOf(inner);
  const options = kind === "enum" ? (inner as unknown as { options: string[] }).options : [];
  const bounds = kind === "int" || kind === "number" ? numberBounds(inner) : undefined;
  const placeholder =
    spec.placeholder ??
    (kind === "int"
      ? "<int>"
      : kind === "number"
        ? "<number>"
        : kind === "enum"
          ? `<${options.join("|")}>`
          : kind === "list"
            ? "<value>"
            : kind === "boolean"
              ? ""
              : "<text>");
  const expects =
    spec.expects ??
    (bounds
      ? describeNumber(bounds)
      : kind === "enum"
        ? `one of ${options.join(" | ")}`
        : kind === "boolean"
          ? "true or false"
          : "a non-empty value");
  return {
    flag: spec.flag,
    path: spec.path,
    topic: spec.topic,
    schema: spec.schema,
    kind,
    placeholder,
    help: spec.help,
    env: spec.env === undefined ? envNameOf(spec.flag) : spec.env,
    ...(spec.alias ? { alias: spec.alias } : {}),
    expects,
    ...(spec.defaultText ? { defaultText: spec.defaultText } : {}),
    ...(spec.secret ? { secret: true } : {}),
    ...(spec.splitItems ? { splitItems: spec.splitItems } : {}),
  };
}

/** The default as help and docs show it, or undefined when there is none. */
export function defaultShown(setting: Setting): string | undefined {
  if (setting.defaultText) return setting.defaultText;
  const value = schemaDefault(setting.schema);
  if (value === undefined) return undefined;
  if (Array.isArray(value)) return value.length > 0 ? value.join(",") : undefined;
  if (value === false) return undefined;
  return String(value);
}

const INTEGER_TEXT = /^[0-9]+$/;
const NUMBER_TEXT = /^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$/;
const TRUE_TEXT = new Set(["1", "true", "yes", "on"]);
const FALSE_TEXT = new Set(["0", "false", "no", "off"]);

/** One piece of text as the value of `setting` (list items one at a time); undefined when invalid. */
function parseOne(setting: Setting, raw: string): { value: unknown } | undefined {
  const text = raw.trim();
  const schema =
    setting.kind === "list"
      ? innerSchema(defOf(innerSchema(setting.schema)).element ?? z.string())
      : innerSchema(setting.schema);
  let candidate: unknown = text;
  switch (setting.kind === "list" ? kindOf(schema) : setting.kind) {
    case "int":
      if (!INTEGER_TEXT.test(text)) return undefined;
      candidate = Number(text);
      break;
    case "number":
      if (!NUMBER_TEXT.test(text)) return undefined;
      candidate = Number(text);
      break;
    case "boolean": {
      const lower = text.toLowerCase();
      if (TRUE_TEXT.has(lower)) candidate = true;
      else if (FALSE_TEXT.has(lower)) candidate = false;
      else return undefined;
      break;
    }
    default:
      if (text === "") return undefined;
  }
  const parsed = schema.safeParse(candidate);
  return parsed.success ? { value: parsed.data } : undefined;
}

/** Splits a list value: repeated flags, each comma-separated like the variable (or as the setting splits it); blanks dropped. */
function listItems(raw: string | readonly string[], setting?: Setting): string[] {
  const split = setting?.splitItems ?? ((text: string) => text.split(","));
  const parts = (typeof raw === "string" ? [raw] : raw).flatMap((part) => split(part));
  return parts.map((part) => part.trim()).filter((part) => part.length > 0);
}

/**
 * Parses the text of one source (a flag's value or values, or a variable).
 * Surrounding spaces are accepted; integers take decimal digits only (no
 * sign, fraction or exponent). Returns undefined when the text is invalid.
 */
export function parseSettingText(
  setting: Setting,
  raw: string | readonly string[],
): { value: unknown } | undefined {
  if (setting.kind === "list") {
    const values: unknown[] = [];
    for (const item of listItems(raw, setting)) {
      const one = parseOne(setting, item);
      if (!one) return undefined;
      values.push(one.value);
    }
    return { value: values };
  }
  const text = typeof raw === "string" ? raw : raw[raw.length - 1];
  return text === undefined ? undefined : parseOne(setting, text);
}

/** The first invalid list item (for the message), else the whole text. */
function offending(setting: Setting, raw: string | readonly string[]): string {
  if (setting.kind === "list") {
    for (const item of listItems(raw, setting)) if (!parseOne(setting, item)) return item;
  }
  return typeof raw === "string" ? raw : (raw[raw.length - 1] ?? "");
}

/** A flag's value is set; `true` for a boolean flag given bare. */
export type FlagValue = string | readonly string[] | true;

/** The docs/configuration.md message for an invalid flag. */
export function invalidFlag(setting: Setting, raw: string | readonly string[]): ConfigError {
  const value = setting.secret ? "…" : offending(setting, raw);
  return new ConfigError(`--${setting.flag} takes ${setting.expects}, got ${JSON.stringify(value)}`, {
    flag: `--${setting.flag}`,
    value,
  });
}

/**
 * Resolves one setting from its sources in docs/configuration.md order: the flag, then the
 * canonical variable, then the Dynamo alias. Undefined when none gives a
 * value (the caller's default applies).
 *
 * @throws ConfigError when the flag's value is invalid, or a secret's variable
 *   is; any other invalid variable is reported through `warn` (naming it) and
 *   the next source is tried.
 */
export function resolveSetting(
  setting: Setting,
  flag: FlagValue | undefined,
  env: Record<string, string | undefined>,
  warn: (message: string) => void,
): { value: unknown; source: SettingSource } | undefined {
  if (flag !== undefined) {
    if (flag === true) {
      if (setting.kind === "boolean") return { value: true, source: "flag" };
      throw new ConfigError(`--${setting.flag} needs a value: ${setting.placeholder}`, {
        flag: `--${setting.flag}`,
      });
    }
    const parsed = parseSettingText(setting, flag);
    if (!parsed) throw invalidFlag(setting, flag);
    return { value: parsed.value, source: "flag" };
  }
  const variables: [string, SettingSource][] = [];
  if (setting.env) variables.push([setting.env, "env"]);
  if (setting.alias) variables.push([setting.alias, "alias"]);
  for (const [variable, source] of variables) {
    const raw = env[variable];
    if (raw === undefined) continue;
    if (setting.kind === "list" && raw.trim() === "") continue;
    const parsed = parseSettingText(setting, raw);
    if (parsed) return { value: parsed.value, source };
    const next = source === "env" && setting.alias ? `${setting.alias} or the default` : "the default";
    if (setting.secret) {
      // Falling back past a bad secret would run without it (an admin API left open): fail closed.
      throw new ConfigError(`${variable} takes ${setting.expects}; refusing to start without it`, {
        variable,
      });
    }
    const shown = JSON.stringify(raw);
    warn(`ignoring ${variable}=${shown}: expected ${setting.expects}; falling back to ${next}`);
  }
  return undefined;
}

/** Sets `value` at a dotted `path` inside `target`, creating objects on the way. */
function setPath(target: Record<string, unknown>, path: string, value: unknown): void {
  const keys = path.split(".");
  let node = target;
  for (const key of keys.slice(0, -1)) {
    const next = node[key];
    if (typeof next === "object" && next !== null) node = next as Record<string, unknown>;
    else {
      const created: Record<string, unknown> = {};
      node[key] = created;
      node = created;
    }
  }
  node[keys[keys.length - 1]!] = value;
}

/** What `resolveSettings` found: the values set explicitly, nested by path, and where each came from. */
export interface ResolvedSettings {
  values: Record<string, unknown>;
  /** By flag name; settings left to their defaults are absent. */
  sources: Record<string, SettingSource>;
}

/**
 * Resolves every setting (docs/configuration.md) into a nested object holding only what a
 * flag or variable set; defaults stay with the code that owns them.
 */
export function resolveSettings(
  settings: readonly Setting[],
  input: {
    flags?: Record<string, FlagValue | undefined>;
    env?: Record<string, string | undefined>;
    warn?: (message: string) => void;
  },
): ResolvedSettings {
  const flags = input.flags ?? {};
  const env = input.env ?? {};
  const warn = input.warn ?? (() => {});
  const values: Record<string, unknown> = {};
  const sources: Record<string, SettingSource> = {};
  for (const setting of settings) {
    const found = resolveSetting(setting, flags[setting.flag], env, warn);
    if (!found) continue;
    setPath(values, setting.path, found.value);
    sources[setting.flag] = found.source;
  }
  return { values, sources };
}
