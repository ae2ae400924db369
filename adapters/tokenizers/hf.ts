/** @module Model-exact token counts from a Hugging Face `tokenizer.json` (BPE, WordPiece, Unigram, WordLevel). */

import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import type { Tokenizer } from "../../src/tokenizer.js";

/** Options of {@link createHfTokenizer}. */
export interface HfTokenizerOptions {
  /**
   * Path of the model's `tokenizer_config.json`. Default: the file of that name beside
   * `tokenizer.json` when it exists, else an empty config.
   */
  configPath?: string;
  /**
   * Whether the tokenizer adds its special tokens (BOS and the like) to each encoded text.
   * Default false: sluice encodes messages one by one and adds its own per-message markers,
   * so a BOS per message would overcount.
   */
  addSpecialTokens?: boolean;
}

function readJson(path: string, what: string): object {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new Error(`cannot read ${what} ${JSON.stringify(path)}: ${(error as Error).message}`);
  }
  try {
    const value: unknown = JSON.parse(text);
    if (value === null || typeof value !== "object") throw new Error("not a JSON object");
    return value;
  } catch (error) {
    throw new Error(`${what} ${JSON.stringify(path)} is not valid JSON: ${(error as Error).message}`);
  }
}

/** Loads a Hugging Face `tokenizer.json` from disk (synchronously: this runs once, at start-up). */
export function createHfTokenizer(path: string, options: HfTokenizerOptions = {}): Tokenizer {
  const json = readJson(path, "tokenizer file");
  const besideConfig = join(dirname(path), "tokenizer_config.json");
  const configPath = options.configPath ?? (existsSync(besideConfig) ? besideConfig : undefined);
  const config: Record<string, unknown> = {
    // The library reads a WordLevel model's unknown token from the config, not the model.
    unk_token: (json as { model?: { unk_token?: unknown } }).model?.unk_token,
    ...(configPath === undefined ? {} : readJson(configPath, "tokenizer config")),
  };
  let hf: HfTokenizer;
  try {
    hf = new HfTokenizer(json, config);
  } catch (error) {
    throw new Error(`tokenizer file ${JSON.stringify(path)} is not usable: ${(error as Error).message}`);
  }
  const encodeOptions = { add_special_tokens: options.addSpecialTokens ?? false };
  return {
    name: path,
    encode(text: string): number[] {
      const ids = hf.encode(text, encodeOptions).ids;
      // A piece the vocabulary lacks (no unknown token configured) still counts as one token.
      for (let i = 0; i < ids.length; i++) if (ids[i] === undefined) ids[i] = -1;
      return ids;
    },
  };
}
