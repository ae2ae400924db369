/** @module Picks a tokenizer from a command-line spec: `o200k` (default) or the path of a Hugging Face `tokenizer.json`. */

import type { Tokenizer } from "../../src/tokenizer.js";
import { createHfTokenizer } from "./hf.js";
import { createO200kTokenizer } from "./o200k.js";

export { createHfTokenizer, type HfTokenizerOptions } from "./hf.js";
export { createO200kTokenizer } from "./o200k.js";

/**
 * Creates the tokenizer named by `spec`: undefined, `""`, `o200k` or `o200k_base` → o200k_base;
 * a path ending in `.json` → that Hugging Face `tokenizer.json`. Anything else is an error
 * naming the value.
 */
export function createTokenizer(spec?: string): Tokenizer {
  const s = spec?.trim() ?? "";
  if (s === "" || s === "o200k" || s === "o200k_base") return createO200kTokenizer();
  if (s.toLowerCase().endsWith(".json")) return createHfTokenizer(s);
  throw new RangeError(
    `tokenizer should be "o200k" or the path of a tokenizer.json, got ${JSON.stringify(spec)}`,
  );
}
