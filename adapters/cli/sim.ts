/** @module `sluice sim`: one simulated vLLM-like replica as an HTTP server (OpenAI API + vLLM-named `/metrics`). */

import { z } from "zod";
import { defineSetting, type Setting } from "../../src/config/settings.js";
import type { ReplicaRole } from "../../src/engine.js";
import { startSimServer } from "../engines/sim/http-server.js";
import type { SimParams } from "../engines/sim/presets.js";
import { DEFAULT_PRESET, PRESETS, type PresetName } from "../engines/sim/presets.js";
import { type CommandSpec, runCommand } from "./command-line.js";
import { describeError } from "./error-cause.js";

const SERVER = "Server";
const REPLICA = "Replica";
const presetNames = Object.keys(PRESETS) as [PresetName, ...PresetName[]];

function simSetting(
  flag: string,
  path: string,
  topic: string,
  schema: z.ZodType,
  help: string,
  extra: { placeholder?: string; defaultText?: string; expects?: string } = {},
): Setting {
  return defineSetting({ flag, path, topic, schema, help, env: null, ...extra });
}

/** Every flag of `sluice sim` (flags only). */
export const SIM_SETTINGS: readonly Setting[] = [
  simSetting(
    "port",
    "port",
    SERVER,
    z.number().int().min(0).max(65535).default(8000),
    "TCP port; 0 picks a free one",
  ),
  simSetting("host", "host", SERVER, z.string().default("127.0.0.1"), "interface to listen on", {
    placeholder: "<address>",
    expects: "an interface address",
  }),
  simSetting(
    "preset",
    "preset",
    REPLICA,
    z.enum(presetNames).default(DEFAULT_PRESET),
    "simulated engine and GPU",
    { placeholder: "<preset>" },
  ),
  simSetting("model", "model", REPLICA, z.string(), "served model name", {
    placeholder: "<name>",
    defaultText: "per preset",
  }),
  simSetting(
    "role",
    "role",
    REPLICA,
    z.enum(["prefill", "decode", "both"]).default("both"),
    "role in a disaggregated fleet: prefill answers kv_transfer_params, decode pulls the KV they name (docs/disaggregated.md)",
    { placeholder: "<prefill|decode|both>" },
  ),
  simSetting(
    "pd",
    "pd",
    REPLICA,
    z.enum(["vllm", "sglang"]).default("vllm"),
    "request flow of a prefill or decode replica: vllm (kv_transfer_params) or sglang (SGLang's PD mode: bootstrap_host, bootstrap_port, bootstrap_room on both requests; the bootstrap port is the server's own)",
    { placeholder: "<vllm|sglang>" },
  ),
  simSetting(
    "data-parallel-size",
    "dataParallelSize",
    REPLICA,
    z.number().int().min(1).max(1024).default(1),
    "data-parallel ranks, each with its own batch and KV; a request picks one with the x-data-parallel-rank header",
  ),
  simSetting("max-num-seqs", "maxNumSeqs", REPLICA, z.number().int().positive(), "running calls per rank", {
    defaultText: "per preset",
  }),
  simSetting(
    "max-num-batched-tokens",
    "maxNumBatchedTokens",
    REPLICA,
    z.number().int().positive(),
    "tokens per step per rank",
    { defaultText: "per preset" },
  ),
  simSetting(
    "kv-capacity-tokens",
    "kvCapacityTokens",
    REPLICA,
    z.number().int().min(16),
    "KV cache per rank, tokens",
    {
      defaultText: "per preset",
    },
  ),
  simSetting(
    "sim-host-kv-tokens",
    "hostKvTokens",
    REPLICA,
    z.number().int().nonnegative(),
    "host-memory KV tier per rank, tokens: GPU evictions spill there and load back at PCIe rate (docs/tiers.md)",
    { defaultText: "0: none" },
  ),
  simSetting(
    "max-model-len",
    "maxModelLen",
    REPLICA,
    z.number().int().positive(),
    "longest prompt + output, tokens",
    {
      defaultText: "per preset",
    },
  ),
  simSetting(
    "default-max-tokens",
    "defaultMaxTokens",
    REPLICA,
    z.number().int().positive().default(1024),
    "output tokens when a request sets none",
  ),
  simSetting(
    "seed",
    "seed",
    REPLICA,
    z.number().int().nonnegative().default(0),
    "seed of the generated tokens",
  ),
  simSetting(
    "tokenizer",
    "tokenizer",
    REPLICA,
    z.string().default("o200k"),
    "o200k, or the path of a tokenizer.json",
    {
      placeholder: "<o200k|path>",
      expects: "o200k or the path of a tokenizer.json",
    },
  ),
];

/** `sluice sim` for help and the parser. */
export const SIM_COMMAND: CommandSpec = {
  name: "sim",
  usage: "sluice sim [flags]",
  summary:
    "Runs one simulated vLLM-like replica in real time: POST /v1/chat/completions, POST /v1/completions,\n" +
    "POST /v1/responses, GET /v1/models, GET /metrics (vLLM metric names), GET /health.\n" +
    "Runs until SIGINT or SIGTERM.",
  settings: SIM_SETTINGS,
  footer: "exit status: 0 after a clean stop, 1 could not start, 2 bad flags",
};

/** Where `run` writes and what stops it (tests pass their own). */
export interface SimRunIo {
  stdout?: (text: string) => void;
  stderr?: (text: string) => void;
  /** Stops the server like SIGINT does. */
  stop?: AbortSignal;
}

interface SimFlags {
  port?: number;
  host?: string;
  preset?: PresetName;
  model?: string;
  dataParallelSize?: number;
  role?: ReplicaRole;
  pd?: "vllm" | "sglang";
  maxNumSeqs?: number;
  maxNumBatchedTokens?: number;
  kvCapacityTokens?: number;
  hostKvTokens?: number;
  maxModelLen?: number;
  defaultMaxTokens?: number;
  seed?: number;
  tokenizer?: string;
}

/** `sluice sim`: returns 0 after a clean stop, 2 on an invalid flag, 1 when the server cannot start. */
export function run(argv: string[], io: SimRunIo = {}): Promise<number> {
  const stdout = io.stdout ?? ((text: string) => process.stdout.write(text));
  const stderr = io.stderr ?? ((text: string) => process.stderr.write(text));
  return runCommand(SIM_COMMAND, argv, (line) => serveSim(line.values as SimFlags, io, stdout, stderr), {
    stdout,
    stderr,
  });
}

async function serveSim(
  flags: SimFlags,
  io: SimRunIo,
  stdout: (text: string) => void,
  stderr: (text: string) => void,
): Promise<number> {
  const {
    port = 8000,
    host = "127.0.0.1",
    preset,
    model,
    dataParallelSize,
    defaultMaxTokens,
    seed,
    tokenizer,
  } = flags;
  const overrides: Partial<SimParams> = {};
  if (flags.maxNumSeqs !== undefined) overrides.maxNumSeqs = flags.maxNumSeqs;
  if (flags.maxNumBatchedTokens !== undefined) overrides.maxNumBatchedTokens = flags.maxNumBatchedTokens;
  if (flags.kvCapacityTokens !== undefined) overrides.kvCapacityTokens = flags.kvCapacityTokens;
  if (flags.hostKvTokens !== undefined) overrides.hostKvTokens = flags.hostKvTokens;
  if (flags.maxModelLen !== undefined) overrides.maxModelLen = flags.maxModelLen;
  // Listening for signals before starting, so one that arrives while starting still stops cleanly.
  let stopWaiting = () => {};
  const stopped = new Promise<void>((resolve) => {
    const done = (): void => {
      stopWaiting();
      resolve();
    };
    stopWaiting = () => {
      process.off("SIGINT", done);
      process.off("SIGTERM", done);
      io.stop?.removeEventListener("abort", done);
    };
    process.once("SIGINT", done);
    process.once("SIGTERM", done);
    if (io.stop?.aborted) done();
    else io.stop?.addEventListener("abort", done, { once: true });
  });
  let server: Awaited<ReturnType<typeof startSimServer>>;
  try {
    server = await startSimServer({
      port,
      host,
      ...(preset !== undefined ? { preset: { base: preset, ...overrides } } : { preset: overrides }),
      ...(model !== undefined ? { model } : {}),
      ...(dataParallelSize !== undefined ? { dataParallelSize } : {}),
      ...(flags.role !== undefined ? { role: flags.role } : {}),
      ...(flags.pd !== undefined && flags.pd !== "vllm" ? { pd: flags.pd } : {}),
      ...(defaultMaxTokens !== undefined ? { defaultMaxTokens } : {}),
      ...(seed !== undefined ? { seed } : {}),
      ...(tokenizer !== undefined ? { tokenizer } : {}),
    });
  } catch (error) {
    stopWaiting();
    const message = (error as Error).message;
    if (error instanceof RangeError) {
      stderr(`sluice sim: ${message}\n`);
      return 2;
    }
    stderr(`sluice sim: cannot start: ${describeError(error)}\n`);
    return 1;
  }
  const p = server.engine.params;
  stdout(
    `sluice sim: ${server.engine.model} (${preset ?? DEFAULT_PRESET}, ${server.engine.role === "both" ? "" : `${server.engine.role}${flags.pd === "sglang" ? " (SGLang's PD mode)" : ""}, `}${server.engine.dataParallelSize} rank(s), ` +
      `${server.engine.blocksPerRank()} blocks of ${p.blockSize} tokens per rank, max_num_seqs ${p.maxNumSeqs}) ` +
      `listening on ${server.url}\n`,
  );

  await stopped;
  await server.close();
  stdout("sluice sim: stopped\n");
  return 0;
}
