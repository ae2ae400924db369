/** @module The command line of every command, through the real entry point or each command's `run`. */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { run as runBench } from "../../adapters/cli/bench.js";
import { closest, parseCommandLine, renderHelp } from "../../adapters/cli/command-line.js";
import { GATE_COMMAND } from "../../adapters/cli/gate.js";
import { SERVE_COMMAND, serveOptionsFromArgs } from "../../adapters/cli/serve.js";
import { run as runSim } from "../../adapters/cli/sim.js";
import { run as runTune } from "../../adapters/cli/tune.js";
import { ConfigError } from "../../src/config/config-error.js";
import { resolveSchedulerConfig } from "../../src/config/scheduler-config.js";

const SLUICE = fileURLToPath(new URL("../../adapters/cli/sluice.js", import.meta.url));
const VERSION = (
  JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string }
).version;

function sluice(...argv: string[]) {
  return spawnSync(process.execPath, [SLUICE, ...argv], { encoding: "utf8", timeout: 60_000 });
}

function capture() {
  const out: string[] = [];
  const err: string[] = [];
  return {
    out,
    err,
    io: { stdout: (t: string) => out.push(t), stderr: (t: string) => err.push(t), env: {} },
  };
}

/** A port nothing listens on: bound, then released. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe("the process", () => {
  test("--version prints package.json's version, at the top and on a command", () => {
    const top = sluice("--version");
    assert.equal(top.status, 0, top.stderr);
    assert.equal(top.stdout.trim(), `sluice ${VERSION}`);
    const onCommand = sluice("gate", "--version");
    assert.equal(onCommand.status, 0, onCommand.stderr);
    assert.equal(onCommand.stdout.trim(), `sluice ${VERSION}`);
  });

  test("-h works on tune (it used to fail) and on the server commands", () => {
    for (const command of ["tune", "gate"]) {
      const result = sluice(command, "-h");
      assert.equal(result.status, 0, `${command}: ${result.stderr}`);
      assert.match(result.stdout, new RegExp(`^usage: sluice ${command}`));
    }
  });

  test("an unknown flag exits 2 with the nearest known flag", () => {
    const result = sluice("serve", "--windw-unit", "tokens");
    assert.equal(result.status, 2);
    assert.match(result.stderr, /unknown flag --windw-unit; did you mean --window-unit\?/);
    const command = sluice("serv");
    assert.equal(command.status, 2);
    assert.match(command.stderr, /unknown command "serv"; did you mean serve\?/);
  });
});

describe("each command's run", () => {
  test("-h and --help on sim, bench and tune print the help and return 0", async () => {
    for (const run of [runSim, runBench, runTune]) {
      for (const flag of ["-h", "--help"]) {
        const c = capture();
        assert.equal(await run([flag], c.io), 0);
        assert.match(c.out.join(""), /^usage: sluice \w+/);
        assert.match(c.out.join(""), /-h, --help/);
      }
    }
  });

  test("bench --load -1 is refused in sluice's words, not the argument parser's", async () => {
    const c = capture();
    assert.equal(await runBench(["--load", "-1"], c.io), 2);
    assert.equal(c.err.join(""), 'sluice bench: --load takes numbers > 0, got "-1"\n');
    const list = capture();
    assert.equal(await runBench(["--policies", "rr,fastest"], list.io), 2);
    assert.match(list.err.join(""), /--policies takes policies from .*, got "fastest"/);
    const typo = capture();
    assert.equal(await runBench(["--polices", "rr"], typo.io), 2);
    assert.match(typo.err.join(""), /did you mean --policies\?/);
    const missing = capture();
    assert.equal(await runBench(["--seed"], missing.io), 2);
    assert.match(missing.err.join(""), /--seed needs a value: <int>/);
  });

  test("tune against a dead address names the cause: ECONNREFUSED host:port", async () => {
    const port = await closedPort();
    const c = capture();
    assert.equal(await runTune(["--url", `http://127.0.0.1:${port}`, "--interval-s", "0.01"], c.io), 1);
    assert.match(c.err.join(""), new RegExp(`fetch failed \\(ECONNREFUSED 127\\.0\\.0\\.1:${port}\\)`));
  });
});

describe("help", () => {
  test("grouped by topic, every flag with a typed placeholder", () => {
    const help = renderHelp(SERVE_COMMAND);
    for (const topic of ["Server:", "Engines:", "Gate, per rank:", "Token window (--window-unit tokens):"]) {
      assert.ok(help.includes(`\n${topic}\n`), topic);
    }
    assert.match(help, /--port <int> +TCP port/);
    assert.match(help, /--window-unit <tokens\|sessions>/);
    assert.match(help, /--policy <rr\|gate\|gate-prefix\|concur\|sluice>/);
    assert.match(help, /--window-kv-low <number>/);
    assert.match(help, /env SLUICE_REQUEST_QUEUE_LIMIT or DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT/);
    for (const setting of GATE_COMMAND.settings)
      assert.ok(renderHelp(GATE_COMMAND).includes(`--${setting.flag}`));
  });

  test("a typo is matched to the nearest name only when it is close", () => {
    assert.equal(closest("window-kv-lo", ["window-kv-low", "window-kv-high"]), "window-kv-low");
    assert.equal(closest("prt", ["port", "host"]), "port");
    assert.equal(closest("zzzzzz", ["port", "host"]), undefined);
  });
});

describe("the session window's flags (docs/how-it-works.md#session-window-tokens-of-cache-footprint)", () => {
  test("flags and SLUICE_* variables set the token window and session fields; the result is a valid configuration", async () => {
    const warnings: string[] = [];
    const options = await serveOptionsFromArgs(
      [
        "--policy",
        "concur",
        "--window-unit",
        "tokens",
        "--window-initial-tokens",
        "200000",
        "--window-min-tokens=4096",
        "--window-max-tokens",
        "800000",
        "--window-decrease",
        "0.7",
        "--window-kv-low",
        "0.3",
        "--window-kv-high",
        "0.6",
        "--window-hit-low",
        "0.1",
        "--retention-quantile",
        "0.95",
      ],
      {
        SLUICE_WINDOW_INCREASE_TOKENS: " 12500 ",
        SLUICE_IDLE_TIMEOUT_MS: "90000",
        SLUICE_WINDOW_UNIT: "sessions",
      },
      (message) => warnings.push(message),
    );
    assert.deepEqual(warnings, []);
    assert.deepEqual(options.config, {
      policy: "concur",
      window: {
        unit: "tokens",
        initialTokens: 200_000,
        minTokens: 4096,
        maxTokens: 800_000,
        increaseTokens: 12_500,
        decrease: 0.7,
        kvLow: 0.3,
        kvHigh: 0.6,
        hitLow: 0.1,
      },
      sessions: { retentionQuantile: 0.95, idleTimeoutMs: 90_000 },
    });
    const config = resolveSchedulerConfig(options.config);
    assert.equal(config.window.unit, "tokens");
    assert.equal(config.sessions.retentionQuantile, 0.95);
  });

  test("an invalid value is refused with the flag's range", () => {
    const cases: [string[], RegExp][] = [
      [["--window-unit", "bytes"], /--window-unit takes one of tokens \| sessions, got "bytes"/],
      [["--window-min-tokens", "0"], /--window-min-tokens takes a positive integer, got "0"/],
      [["--retention-quantile", "0"], /--retention-quantile takes a number > 0 and ≤ 1, got "0"/],
      [["--idle-timeout-ms", "-5"], /--idle-timeout-ms takes a positive number, got "-5"/],
    ];
    for (const [argv, message] of cases) {
      assert.throws(() => parseCommandLine(SERVE_COMMAND, argv, {}, () => {}), message);
    }
  });

  test("a bad secret in the environment stops start-up instead of leaving the admin API open", async () => {
    await assert.rejects(
      serveOptionsFromArgs([], { SLUICE_ADMIN_KEY: "short" }, () => {}),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.message === "SLUICE_ADMIN_KEY takes at least 8 characters; refusing to start without it",
    );
    assert.throws(
      () => parseCommandLine(SERVE_COMMAND, ["--admin-key", "short"], {}, () => {}),
      /--admin-key takes at least 8 characters, got "…"/,
    );
  });

  test("settings that contradict each other fail before start-up, naming the flags", async () => {
    await assert.rejects(
      serveOptionsFromArgs(["--window-min", "10", "--window-max", "5"], {}, () => {}),
      (err: unknown) =>
        err instanceof ConfigError && err.message === "--window-min (10) must not exceed --window-max (5)",
    );
    await assert.rejects(
      serveOptionsFromArgs(["--window-min-tokens", "9000", "--window-max-tokens", "8000"], {}, () => {}),
      /--window-min-tokens \(9000\) must not exceed --window-max-tokens \(8000\)/,
    );
    await assert.rejects(
      serveOptionsFromArgs(["--window-kv-high", "0.1"], { SLUICE_WINDOW_KV_LOW: "0.3" }, () => {}),
      /--window-kv-low \(0\.3\) must not exceed --window-kv-high \(0\.1\)/,
    );
  });
});
