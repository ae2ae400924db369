/** @module `ConfigError`: a setting sluice cannot start with (the CLI exits with status 2). */

/** What was wrong, for callers that render their own message. */
export interface ConfigErrorDetails {
  /** The command-line flag, with its dashes (`--request-queue-limit`). */
  flag?: string;
  /** The environment variable, when the value came from one. */
  variable?: string;
  /** The value received, as given. */
  value?: unknown;
}

/**
 * An invalid setting. The message names the flag (or variable) and the value
 * received, so it can be printed as is; start-up fails with `exitStatus`.
 */
export class ConfigError extends Error {
  readonly flag: string | undefined;
  readonly variable: string | undefined;
  readonly value: unknown;
  /** The process exit status an invalid setting ends start-up with (docs/configuration.md). */
  readonly exitStatus = 2;

  constructor(message: string, details: ConfigErrorDetails = {}) {
    super(message);
    this.name = "ConfigError";
    this.flag = details.flag;
    this.variable = details.variable;
    this.value = details.value;
  }
}
