/** @module The `Tokenizer` port. */

/** Turns text into token ids. Implementations live in `adapters/tokenizers`. */
export interface Tokenizer {
  /** A short name, e.g. `o200k_base` or the path of a `tokenizer.json`. */
  readonly name: string;
  encode(text: string): number[];
}
