/**
 * @module The command line shared by every `sluice` command: reading argv
 * against a command's settings (unknown flags get a "did you mean"), `-h` /
 * `--help` and `--version` everywhere, help grouped by topic with typed
 * placeholders, and the docs/configuration.md resolution of flags and variables.
 */

import { readFileSync } from "node:fs";
import { z } from "zod";
import { ConfigError } from "../../src/config/config-error.js";
import {
  defaultShown,
  type FlagValue,
  type ResolvedSettings,
  resolveSettings,
  type Setting,
} from "../../src/config/settings.js";

function isHttpUrl(text: string): boolean {
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:";
  } catch {
    return false;
  }
}

/** An http(s) URL, as every command that takes one accepts it. */
export const httpUrl = z.string().refine(isHttpUrl);

/** A command as its help and parser see it. */
export interface CommandSpec {
  /** `serve`, `gate` … */
  name: string;
  /** The usage line after `usage: `. */
  usage: string;
  /** What the command does, a short paragraph. */
  summary: string;
  settings: readonly Setting[];
  /** Lines after the flags (exit statuses, notes). */
  footer?: string;
}

/** What argv asked for. */
export type CommandLine =
  | { kind: "help" }
  | { kind: "version" }
  | ({ kind: "run"; flags: Record<string, FlagValue> } & ResolvedSettings);

/** The version in package.json: two levels up from the source, three from the build in dist/. */
export function packageVersion(): string {
  for (const up of ["../../package.json", "../../../package.json"]) {
    try {
      const manifest = JSON.parse(readFileSync(new URL(up, import.meta.url), "utf8")) as {
        name?: string;
        version?: string;
      };
      if (manifest.name === "sluice" && manifest.version) return manifest.version;
    } catch {
      // Not at this level; try the next one up.
    }
  }
  return "unknown";
}

function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(
        previous[j]! + 1,
        current[j - 1]! + 1,
        previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    previous = current;
  }
  return previous[b.length]!;
}

/** The closest known name, when one is close enough to be a typo. */
export function closest(name: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Number.POSITIVE_INFINITY;
  for (const candidate of known) {
    const distance = candidate.startsWith(name) && name.length >= 3 ? 1 : editDistance(name, candidate);
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return bestDistance <= Math.max(2, Math.floor(name.length / 3)) ? best : undefined;
}

const HELP_FLAGS = new Set(["-h", "--help"]);

/**
 * Reads argv: `--flag value`, `--flag=value`, bare boolean flags, repeated
 * list flags. A value may start with a single dash (`--load -1` is the
 * value "-1", for the setting to refuse in its own words).
 *
 * @throws ConfigError for an unknown flag (with the nearest known one), a
 *   stray argument, or a flag missing its value.
 */
export function readArgv(
  spec: CommandSpec,
  argv: readonly string[],
): { kind: "help" } | { kind: "version" } | { kind: "flags"; flags: Record<string, FlagValue> } {
  const byFlag = new Map(spec.settings.map((setting) => [setting.flag, setting]));
  const flags: Record<string, FlagValue> = {};
  for (let i = 0; i < argv.length; i++) {
    const token = argv[i]!;
    if (HELP_FLAGS.has(token)) return { kind: "help" };
    if (token === "--version") return { kind: "version" };
    if (/^-[a-zA-Z]/.test(token)) {
      const suggestion = closest(token.replace(/^-+/, ""), [...byFlag.keys(), "help", "version"]);
      throw new ConfigError(
        `unknown flag ${token}${suggestion ? `; did you mean --${suggestion}?` : ""} (flags take two dashes; see sluice ${spec.name} --help)`,
        { flag: token },
      );
    }
    if (!token.startsWith("--") || token === "--") {
      throw new ConfigError(
        `unexpected argument ${JSON.stringify(token)}; flags are written --name value (see sluice ${spec.name} --help)`,
      );
    }
    const equals = token.indexOf("=");
    const name = token.slice(2, equals === -1 ? undefined : equals);
    const setting = byFlag.get(name);
    if (!setting) {
      const suggestion = closest(name, [...byFlag.keys(), "help", "version"]);
      throw new ConfigError(
        `unknown flag --${name}${suggestion ? `; did you mean --${suggestion}?` : ""} (see sluice ${spec.name} --help)`,
        { flag: `--${name}` },
      );
    }
    let value: string | true;
    if (equals !== -1) value = token.slice(equals + 1);
    else if (setting.kind === "boolean") value = true;
    else {
      const next = argv[i + 1];
      if (next === undefined || next.startsWith("--") || HELP_FLAGS.has(next)) {
        throw new ConfigError(`--${name} needs a value: ${setting.placeholder}`, { flag: `--${name}` });
      }
      value = next;
      i++;
    }
    if (setting.kind === "list" && value !== true) {
      const earlier = flags[name];
      flags[name] = Array.isArray(earlier) ? [...earlier, value] : [value];
    } else flags[name] = value;
  }
  return { kind: "flags", flags };
}

/**
 * Parses a command's argv and resolves its settings from flags, then
 * variables (docs/configuration.md). Only what a flag or variable set is in `values`.
 *
 * @throws ConfigError for a bad flag; bad variables only reach `warn`.
 */
export function parseCommandLine(
  spec: CommandSpec,
  argv: readonly string[],
  env: Record<string, string | undefined> = process.env,
  warn: (message: string) => void = (message) => process.stderr.write(`sluice ${spec.name}: ${message}\n`),
): CommandLine {
  const read = readArgv(spec, argv);
  if (read.kind !== "flags") return read;
  const flags = read.flags;
  return { kind: "run", flags, ...resolveSettings(spec.settings, { flags, env, warn }) };
}

const HEAD_WIDTH = 38;

function flagHead(setting: Setting): string {
  return `--${setting.flag}${setting.placeholder ? ` ${setting.placeholder}` : ""}`;
}

/** `default 8080; env SLUICE_PORT`, as help shows it under the description. */
function helpTail(setting: Setting): string {
  const parts: string[] = [];
  const shown = defaultShown(setting);
  if (shown !== undefined) parts.push(`default ${shown}`);
  if (setting.env) parts.push(`env ${setting.env}${setting.alias ? ` or ${setting.alias}` : ""}`);
  if (setting.kind === "list") parts.push("comma-separated or repeated");
  return parts.join("; ");
}

function helpLines(head: string, text: string, tail = ""): string[] {
  const indented = `  ${head}`;
  const pad = " ".repeat(HEAD_WIDTH);
  const lines =
    indented.length < HEAD_WIDTH ? [`${indented.padEnd(HEAD_WIDTH)}${text}`] : [indented, `${pad}${text}`];
  if (tail) lines.push(`${pad}(${tail})`);
  return lines;
}

/** The topics of `settings` in first-seen order, each with its settings. */
export function byTopic(settings: readonly Setting[]): Map<string, Setting[]> {
  const topics = new Map<string, Setting[]>();
  for (const setting of settings) {
    const group = topics.get(setting.topic) ?? [];
    group.push(setting);
    topics.set(setting.topic, group);
  }
  return topics;
}

/** The `--help` text of a command, generated from its settings. */
export function renderHelp(spec: CommandSpec): string {
  const lines = [`usage: ${spec.usage}`, "", spec.summary];
  if (spec.settings.some((setting) => setting.env)) {
    lines.push("", "Flags win over environment variables; a SLUICE_* variable wins over its Dynamo alias.");
  }
  for (const [topic, settings] of byTopic(spec.settings)) {
    lines.push("", `${topic}:`);
    for (const setting of settings)
      lines.push(...helpLines(flagHead(setting), setting.help, helpTail(setting)));
  }
  lines.push(
    "",
    "Other:",
    ...helpLines("-h, --help", "this text"),
    ...helpLines("--version", "print the version"),
  );
  if (spec.footer) lines.push("", spec.footer);
  return lines.join("\n");
}

/** Where a command writes (tests pass their own). */
export interface CommandIo {
  stdout?: (text: string) => void;
  stderr?: (text: string) => void;
  env?: Record<string, string | undefined>;
}

/**
 * Runs a short command: help and version answered here, a bad flag ends
 * with status 2 and its message, otherwise `body` gets the resolved settings.
 */
export async function runCommand(
  spec: CommandSpec,
  argv: readonly string[],
  body: (line: Extract<CommandLine, { kind: "run" }>) => Promise<number>,
  io: CommandIo = {},
): Promise<number> {
  const stdout = io.stdout ?? ((text: string) => process.stdout.write(text));
  const stderr = io.stderr ?? ((text: string) => process.stderr.write(text));
  let line: CommandLine;
  try {
    line = parseCommandLine(spec, argv, io.env ?? process.env, (message) =>
      stderr(`sluice ${spec.name}: ${message}\n`),
    );
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    stderr(`sluice ${spec.name}: ${error.message}\n`);
    return 2;
  }
  if (line.kind === "help") {
    stdout(`${renderHelp(spec)}\n`);
    return 0;
  }
  if (line.kind === "version") {
    stdout(`sluice ${packageVersion()}\n`);
    return 0;
  }
  try {
    return await body(line);
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    stderr(`sluice ${spec.name}: ${error.message}\n`);
    return 2;
  }
}
