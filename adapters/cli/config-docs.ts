/**
 * @module docs/configuration.md, generated from the commands' settings so the
 * reference cannot drift from the code. `npm run docs:config` rewrites it;
 * test/cli/config-docs.test.ts fails when it is stale.
 */

import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { defaultShown, type Setting } from "../../src/config/settings.js";
import { BENCH_COMMAND } from "./bench.js";
import { byTopic, type CommandSpec } from "./command-line.js";
import { GATE_COMMAND } from "./gate.js";
import { SERVE_COMMAND } from "./serve.js";
import { SIM_COMMAND } from "./sim.js";
import { TUNE_COMMAND } from "./tune.js";

/** The commands documented, in the reference's order. */
export const DOCUMENTED_COMMANDS: readonly CommandSpec[] = [
  SERVE_COMMAND,
  GATE_COMMAND,
  SIM_COMMAND,
  BENCH_COMMAND,
  TUNE_COMMAND,
];

/** Where the reference lives. */
export const CONFIGURATION_DOC = fileURLToPath(new URL("../../docs/configuration.md", import.meta.url));

const cell = (text: string) => text.replace(/\|/g, "\\|").replace(/\n/g, " ");

function envCell(setting: Setting): string {
  if (!setting.env) return "—";
  return setting.alias ? `\`${setting.env}\`<br>alias \`${setting.alias}\`` : `\`${setting.env}\``;
}

function row(setting: Setting): string {
  const flag = `\`--${setting.flag}${setting.placeholder ? ` ${setting.placeholder}` : ""}\``;
  const accepts =
    setting.kind === "list" ? `${setting.expects}, comma-separated or repeated` : setting.expects;
  return `| ${[flag, envCell(setting), accepts, defaultShown(setting) ?? "—", setting.help].map(cell).join(" | ")} |`;
}

/** The whole reference as markdown. */
export function renderConfigurationDoc(commands: readonly CommandSpec[] = DOCUMENTED_COMMANDS): string {
  const lines = [
    "# Configuration reference",
    "",
    "<!-- Generated from the settings of each command (src/config/scheduler-settings.ts, adapters/cli/*.ts)",
    "     by `npm run docs:config`; do not edit by hand: test/cli/config-docs.test.ts fails when it is stale. -->",
    "",
    "Every flag of every `sluice` command, with its environment variable, what it accepts and its default.",
    "The scheduler's settings take their type, range and default from one zod schema",
    "(`schedulerConfigSchema` in src/config/scheduler-config.ts), so the command line accepts exactly what",
    "the scheduler does.",
    "",
    "How a value is found, per setting and independently of the others:",
    "",
    "1. the flag (`--name value` or `--name=value`);",
    "2. the canonical variable (`SLUICE_*`);",
    "3. the Dynamo alias variable (`DYN_BACKEND_ADMISSION_*`), for the gate limits;",
    "4. the default; the gate limits follow the engine's reported `max_num_seqs` until set.",
    "",
    "Surrounding spaces are accepted. Integers take decimal digits only (no sign, fraction or exponent).",
    "An invalid flag stops start-up with a message naming the flag and the value, and exit status 2.",
    "An invalid variable logs a warning naming it and falls back to the next source, except a secret",
    "(`SLUICE_ADMIN_KEY`): without it the admin API would be open, so an invalid one stops start-up.",
    "A list (`--upstream`, `--cors-origin`, `--policies`, `--load`) is comma-separated; a flag may also be repeated.",
    "Every command answers `-h`/`--help` (these tables, grouped the same way) and `--version`.",
    "API keys and the admin key are described in [http-api.md](http-api.md#api-keys).",
  ];
  for (const command of commands) {
    lines.push(
      "",
      `## sluice ${command.name}`,
      "",
      `Usage: \`${command.usage}\``,
      "",
      command.summary.replace(/\n/g, " "),
    );
    if (!command.settings.some((setting) => setting.env))
      lines.push("", "Flags only: no environment variables.");
    for (const [topic, settings] of byTopic(command.settings)) {
      lines.push(
        "",
        `### ${topic}`,
        "",
        "| flag | environment | accepts | default | meaning |",
        "|---|---|---|---|---|",
      );
      for (const setting of settings) lines.push(row(setting));
    }
  }
  return `${lines.join("\n")}\n`;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(CONFIGURATION_DOC, renderConfigurationDoc());
  process.stdout.write(`wrote ${CONFIGURATION_DOC}\n`);
}
