/** @module The operator's log: pino, one JSON object a line when not on a terminal, readable lines on one. */

import { pino } from "pino";

/** Levels `--log-level` accepts, most severe first; `silent` writes nothing. */
export const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** The logger every adapter takes: pino's, so child loggers, levels and serializers work as pino documents. */
export type Logger = pino.Logger;

/** Options of `createLogger`. */
export interface LoggerOptions {
  /** Lowest level written. Default `info`. */
  level?: LogLevel;
  /**
   * `json`: one object a line (for collectors); `pretty`: `HH:MM:SS.mmm LEVEL message key=value` lines
   * for a person; `auto` (default): pretty when the output is a terminal, JSON otherwise.
   */
  format?: "json" | "pretty" | "auto";
  /** Where lines go, one call per line without its newline. Default: standard error. */
  write?: (line: string) => void;
  /** Whether the output is a terminal, for `auto`. Default: standard error's `isTTY`. */
  isTTY?: boolean;
}

/** Whether a string is a level `--log-level` accepts. */
export function isLogLevel(value: string): value is LogLevel {
  return (LOG_LEVELS as readonly string[]).includes(value);
}

const LEVEL_NAMES: Record<number, string> = {
  10: "TRACE",
  20: "DEBUG",
  30: "INFO",
  40: "WARN",
  50: "ERROR",
  60: "FATAL",
};

/** Fields every line carries that the readable form shows in its own place (or not at all). */
const FRAME_FIELDS = new Set(["level", "time", "msg", "pid", "hostname", "name"]);

function formatValue(value: unknown): string {
  if (typeof value === "string") return /^[\w.:/@+-]+$/.test(value) ? value : JSON.stringify(value);
  return JSON.stringify(value) ?? String(value);
}

/** One pino JSON line as a line a person reads: time, level, message, then the fields as key=value. */
export function prettyLine(json: string): string {
  let entry: Record<string, unknown>;
  try {
    entry = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json;
  }
  const time = typeof entry.time === "number" ? new Date(entry.time).toISOString().slice(11, 23) : "";
  const level = LEVEL_NAMES[entry.level as number] ?? String(entry.level);
  const fields = Object.entries(entry)
    .filter(([key]) => !FRAME_FIELDS.has(key))
    .map(([key, value]) => `${key}=${formatValue(value)}`);
  return [time, level.padEnd(5), String(entry.msg ?? ""), ...fields].filter(Boolean).join(" ");
}

/**
 * Builds the logger. Writes are synchronous (a line is out before the call
 * returns), so a crash or an exit right after a line never loses it, and
 * tests read what was logged without waiting.
 */
export function createLogger(options: LoggerOptions = {}): Logger {
  const level = options.level ?? "info";
  if (!isLogLevel(level))
    throw new RangeError(`log level must be one of ${LOG_LEVELS.join(", ")}, got ${level}`);
  const write = options.write ?? ((line: string) => process.stderr.write(`${line}\n`));
  const isTTY = options.isTTY ?? process.stderr.isTTY === true;
  const format = options.format ?? "auto";
  const pretty = format === "pretty" || (format === "auto" && isTTY);
  const destination = {
    write(chunk: string) {
      for (const line of chunk.split("\n")) if (line) write(pretty ? prettyLine(line) : line);
    },
  };
  return pino(
    {
      level,
      base: { name: "sluice" },
      timestamp: pino.stdTimeFunctions.epochTime,
    },
    destination,
  );
}

/** A logger that writes nothing (library use, tests that do not look at logs). */
export function silentLogger(): Logger {
  return pino({ level: "silent" });
}
