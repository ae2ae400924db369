/** @module `sluice sim`: one simulated vLLM-like replica as an HTTP server (OpenAI API + vLLM-named `/metrics`). */

import { parseArgs } from "node:util";
import { startSimServer } from "../engines/sim/http-server.js";
import type { SimParams } from "../engines/sim/presets.js";
import { isPresetName, PRESETS, type PresetName } from "../engines/sim/presets.js";

const HELP = `usage: sluice sim [flags]

Runs one simulated vLLM-like replica in real time: POST /v1/chat/completions,
POST /v1/completions, GET /v1/models, GET /metrics (vLLM metric names), GET /health.

flags:
  --port N                      TCP port (default 8000; 0 picks a free one)
  --host ADDR                   interface to listen on (default 127.0.0.1)
  --preset NAME                 ${Object.keys(PRESETS).join(" | ")} (default h100-llama3-8b)
  --model NAME                  served model name (default per preset)
  --data-parallel-size N        data-parallel ranks, each with its own batch and KV (default 1);
                                a request picks one with the x-data-parallel-rank header
  --max-num-seqs N              running calls per rank (default 256)
  --max-num-batched-tokens N    tokens per step per rank (default 8192)
  --kv-capacity-tokens N        KV cache per rank, tokens (default per preset)
  --sim-host-kv-tokens N        host-memory KV tier per rank, tokens (default 0: none); GPU evictions
                                spill there and load back at PCIe rate (docs/tiers.md)
  --max-model-len N             longest prompt + output, tokens (default per preset)
  --default-max-tokens N        output tokens when a request sets none (default 1024)
  --seed N                      seed of the generated tokens (default 0)
  --tokenizer SPEC              o200k (default) or the path of a tokenizer.json
  -h, --help                    this text

Runs until SIGINT or SIGTERM.
`;

/** Where `run` writes and what stops it (tests pass their own). */
export interface SimRunIo {
  stdout?: (text: string) => void;
  stderr?: (text: string) => void;
  /** Stops the server like SIGINT does. */
  stop?: AbortSignal;
}

class FlagError extends Error {}

function integer(
  flag: string,
  raw: string | undefined,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number | undefined {
  if (raw === undefined) return undefined;
  const text = raw.trim();
  const value = /^\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!(Number.isSafeInteger(value) && value >= min && value <= max)) {
    const range = max === Number.MAX_SAFE_INTEGER ? `≥ ${min}` : `in [${min}, ${max}]`;
    throw new FlagError(`--${flag} should be an integer ${range}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

/** `sluice sim`: returns 0 after a clean stop, 2 on an invalid flag, 1 when the server cannot start. */
export async function run(argv: string[], io: SimRunIo = {}): Promise<number> {
  const stdout = io.stdout ?? ((text: string) => process.stdout.write(text));
  const stderr = io.stderr ?? ((text: string) => process.stderr.write(text));
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        port: { type: "string" },
        host: { type: "string" },
        preset: { type: "string" },
        model: { type: "string" },
        "data-parallel-size": { type: "string" },
        "max-num-seqs": { type: "string" },
        "max-num-batched-tokens": { type: "string" },
        "kv-capacity-tokens": { type: "string" },
        "sim-host-kv-tokens": { type: "string" },
        "max-model-len": { type: "string" },
        "default-max-tokens": { type: "string" },
        seed: { type: "string" },
        tokenizer: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    }).values;
  } catch (error) {
    stderr(`sluice sim: ${(error as Error).message}\n`);
    return 2;
  }
  if (values.help) {
    stdout(HELP);
    return 0;
  }
  const str = (name: string): string | undefined => values[name] as string | undefined;
  let port: number;
  let dataParallelSize: number | undefined;
  let defaultMaxTokens: number | undefined;
  let seed: number | undefined;
  let preset: PresetName | undefined;
  const overrides: Partial<SimParams> = {};
  try {
    port = integer("port", str("port"), 0, 65535) ?? 8000;
    dataParallelSize = integer("data-parallel-size", str("data-parallel-size"), 1, 1024);
    defaultMaxTokens = integer("default-max-tokens", str("default-max-tokens"), 1);
    seed = integer("seed", str("seed"), 0);
    const maxNumSeqs = integer("max-num-seqs", str("max-num-seqs"), 1);
    const maxNumBatchedTokens = integer("max-num-batched-tokens", str("max-num-batched-tokens"), 1);
    const kvCapacityTokens = integer("kv-capacity-tokens", str("kv-capacity-tokens"), 16);
    const maxModelLen = integer("max-model-len", str("max-model-len"), 1);
    if (maxNumSeqs !== undefined) overrides.maxNumSeqs = maxNumSeqs;
    if (maxNumBatchedTokens !== undefined) overrides.maxNumBatchedTokens = maxNumBatchedTokens;
    if (kvCapacityTokens !== undefined) overrides.kvCapacityTokens = kvCapacityTokens;
    const hostKvTokens = integer("sim-host-kv-tokens", str("sim-host-kv-tokens"), 0);
    if (hostKvTokens !== undefined) overrides.hostKvTokens = hostKvTokens;
    if (maxModelLen !== undefined) overrides.maxModelLen = maxModelLen;
    const presetFlag = str("preset");
    if (presetFlag !== undefined) {
      if (!isPresetName(presetFlag.trim())) {
        throw new FlagError(
          `--preset should be one of ${Object.keys(PRESETS).join(", ")}, got ${JSON.stringify(presetFlag)}`,
        );
      }
      preset = presetFlag.trim() as PresetName;
    }
    const model = str("model");
    if (model !== undefined && model.trim() === "")
      throw new FlagError(`--model should be a non-empty name, got ""`);
    const host = str("host");
    if (host !== undefined && host.trim() === "") throw new FlagError(`--host should be an address, got ""`);
  } catch (error) {
    if (error instanceof FlagError) {
      stderr(`sluice sim: ${error.message}\n`);
      return 2;
    }
    throw error;
  }

  let server: Awaited<ReturnType<typeof startSimServer>>;
  try {
    server = await startSimServer({
      port,
      host: str("host")?.trim() ?? "127.0.0.1",
      ...(preset !== undefined ? { preset: { base: preset, ...overrides } } : { preset: overrides }),
      ...(str("model") !== undefined ? { model: str("model")!.trim() } : {}),
      ...(dataParallelSize !== undefined ? { dataParallelSize } : {}),
      ...(defaultMaxTokens !== undefined ? { defaultMaxTokens } : {}),
      ...(seed !== undefined ? { seed } : {}),
      ...(str("tokenizer") !== undefined ? { tokenizer: str("tokenizer")! } : {}),
    });
  } catch (error) {
    const message = (error as Error).message;
    if (error instanceof RangeError) {
      stderr(`sluice sim: ${message}\n`);
      return 2;
    }
    stderr(`sluice sim: cannot start: ${message}\n`);
    return 1;
  }
  const p = server.engine.params;
  stdout(
    `sluice sim: ${server.engine.model} (${preset ?? "h100-llama3-8b"}, ${server.engine.dataParallelSize} rank(s), ` +
      `${server.engine.blocksPerRank()} blocks of ${p.blockSize} tokens per rank, max_num_seqs ${p.maxNumSeqs}) ` +
      `listening on ${server.url}\n`,
  );

  await new Promise<void>((resolve) => {
    const done = (): void => {
      process.off("SIGINT", done);
      process.off("SIGTERM", done);
      io.stop?.removeEventListener("abort", done);
      resolve();
    };
    process.once("SIGINT", done);
    process.once("SIGTERM", done);
    if (io.stop?.aborted) done();
    else io.stop?.addEventListener("abort", done, { once: true });
  });
  await server.close();
  stdout("sluice sim: stopped\n");
  return 0;
}
