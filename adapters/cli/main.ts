/** @module The `sluice` command line: dispatches to one module per subcommand. */

import { closest, packageVersion } from "./command-line.js";

const COMMANDS: Record<
  string,
  { summary: string; load: () => Promise<{ run(argv: string[]): Promise<number> }> }
> = {
  serve: {
    summary: "run the scheduler (simulated replicas unless --upstream)",
    load: () => import("./serve.js"),
  },
  sim: { summary: "run one simulated vLLM-like replica as an HTTP server", load: () => import("./sim.js") },
  bench: {
    summary: "compare policies on simulated replicas in virtual time",
    load: () => import("./bench.js"),
  },
  tune: {
    summary: "suggest the waiting limit from two /metrics scrapes (Little's law)",
    load: () => import("./tune.js"),
  },
  gate: {
    summary: "run the per-rank gate as a sidecar in front of one engine",
    load: () => import("./gate.js"),
  },
};

function usage(): string {
  const lines = ["usage: sluice <command> [flags]", "", "commands:"];
  for (const [name, { summary }] of Object.entries(COMMANDS)) lines.push(`  ${name.padEnd(8)} ${summary}`);
  lines.push(
    "",
    "  -h, --help   this text",
    "  --version    print the version",
    "",
    "Run `sluice <command> --help` for a command's flags.",
  );
  return lines.join("\n");
}

/** `sluice <command> …`; resolves with the exit status. */
export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === "--version" || name === "-V") {
    process.stdout.write(`sluice ${packageVersion()}\n`);
    return 0;
  }
  if (name === "help" && rest[0] && COMMANDS[rest[0]]) return main([rest[0], "--help"]);
  if (!name || name === "--help" || name === "-h" || name === "help") {
    (name ? process.stdout : process.stderr).write(`${usage()}\n`);
    return name ? 0 : 2;
  }
  const command = COMMANDS[name];
  if (!command) {
    const suggestion = closest(name, Object.keys(COMMANDS));
    process.stderr.write(
      `sluice: unknown command "${name}"${suggestion ? `; did you mean ${suggestion}?` : ""}\n\n${usage()}\n`,
    );
    return 2;
  }
  const module = await command.load();
  return module.run(rest);
}

const code = await main(process.argv.slice(2));
if (code !== 0 || process.env.SLUICE_EXIT_ON_RETURN === "1") process.exitCode = code;
