/** @module The life of a long-running command (`sluice serve`, `sluice gate`): flags, start, run until a signal, close. */

import { ConfigError } from "../../src/config/config-error.js";
import { type CommandSpec, packageVersion, readArgv, renderHelp } from "./command-line.js";
import { describeError } from "./error-cause.js";

/** What a server command provides; `runServerCommand` does the rest. */
export interface ServerCommand<Options, Server> {
  /** Name, usage, summary and settings (help is generated from them). */
  spec: CommandSpec;
  /** Parses the flags; throws `ConfigError` or `RangeError` for bad ones. */
  parse(argv: string[]): Options | Promise<Options>;
  start(options: Options): Promise<Server>;
  /** Orderly shutdown (drains what is in flight). */
  close(server: Server): Promise<void>;
  /** A second signal during `close`: stop draining. */
  force?(server: Server): void;
  /** A last line for stderr once closed. */
  stopped?(server: Server): string;
}

function isUsageError(error: unknown): boolean {
  return error instanceof ConfigError || error instanceof RangeError;
}

/**
 * Runs a server command to completion; resolves with the exit status:
 * 0 after a signal and an orderly close, 2 for bad flags or configuration,
 * 1 when the server could not start.
 */
export async function runServerCommand<Options, Server>(
  command: ServerCommand<Options, Server>,
  argv: string[],
): Promise<number> {
  const say = (line: string) => process.stderr.write(`sluice ${command.spec.name}: ${line}\n`);
  let options: Options;
  try {
    const read = readArgv(command.spec, argv);
    if (read.kind === "help") {
      process.stdout.write(`${renderHelp(command.spec)}\n`);
      return 0;
    }
    if (read.kind === "version") {
      process.stdout.write(`sluice ${packageVersion()}\n`);
      return 0;
    }
    options = await command.parse(argv);
  } catch (error) {
    if (!isUsageError(error)) throw error;
    say((error as Error).message);
    return 2;
  }
  // Listening for signals before starting: one that arrives while the server starts (or just after
  // it says it is listening) still gets an orderly shutdown instead of the default, abrupt exit.
  let stopListening = () => {};
  const signalled = new Promise<NodeJS.Signals>((resolve) => {
    const stop = (received: NodeJS.Signals) => {
      stopListening();
      resolve(received);
    };
    stopListening = () => {
      process.off("SIGINT", stop);
      process.off("SIGTERM", stop);
    };
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
  let server: Server;
  try {
    server = await command.start(options);
  } catch (error) {
    stopListening();
    say(isUsageError(error) ? (error as Error).message : `cannot start: ${describeError(error)}`);
    return isUsageError(error) ? 2 : 1;
  }
  const signal = await signalled;
  say(`${signal}, shutting down`);
  const force = command.force;
  const onSecondSignal = force ? () => force(server) : undefined;
  if (onSecondSignal) {
    process.once("SIGINT", onSecondSignal);
    process.once("SIGTERM", onSecondSignal);
  }
  try {
    await command.close(server);
  } finally {
    if (onSecondSignal) {
      process.off("SIGINT", onSecondSignal);
      process.off("SIGTERM", onSecondSignal);
    }
  }
  const last = command.stopped?.(server);
  if (last) say(last);
  return 0;
}
