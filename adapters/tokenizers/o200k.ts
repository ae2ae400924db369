/** @module The default tokenizer: OpenAI's o200k_base BPE (gpt-tokenizer), a close count for most current models. */

import { encode } from "gpt-tokenizer/encoding/o200k_base";
import type { Tokenizer } from "../../src/tokenizer.js";

// Text that looks like a special token (`<|endoftext|>`) in a prompt is ordinary text to count,
// not a control token and not an error: allow none and forbid none.
const PLAIN_TEXT = { allowedSpecial: new Set<string>(), disallowedSpecial: new Set<string>() };

/** Creates the o200k_base tokenizer. The encoding tables are shared by every instance. */
export function createO200kTokenizer(): Tokenizer {
  return {
    name: "o200k_base",
    encode(text: string): number[] {
      return encode(text, PLAIN_TEXT);
    },
  };
}
