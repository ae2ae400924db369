/** @module The words simulated replicas generate: each pseudo-token is one short word. */

/** One generable token: its id and its text (a leading space and a word). */
export interface VocabularyEntry {
  id: number;
  text: string;
}

/** Short, common English words; each is one token in most BPE vocabularies when preceded by a space. */
export const WORDS: readonly string[] = [
  "the",
  "of",
  "and",
  "to",
  "in",
  "is",
  "it",
  "that",
  "for",
  "on",
  "was",
  "with",
  "as",
  "at",
  "by",
  "this",
  "from",
  "or",
  "be",
  "are",
  "an",
  "not",
  "but",
  "we",
  "can",
  "all",
  "one",
  "has",
  "will",
  "more",
  "so",
  "if",
  "out",
  "up",
  "new",
  "time",
  "use",
  "when",
  "into",
  "file",
  "data",
  "code",
  "line",
  "test",
  "run",
  "call",
  "step",
  "tool",
  "next",
  "then",
  "now",
  "done",
  "value",
  "list",
  "key",
  "read",
  "write",
  "check",
  "fix",
  "set",
  "get",
  "add",
  "open",
  "plan",
];

/**
 * The default vocabulary: `WORDS` with ids 1000, 1001, …. Servers that
 * tokenize prompts build one from their tokenizer instead
 * (`vocabularyFromTokenizer`), so a client that sends generated text back
 * re-tokenizes it into the same ids and keeps its prefix cacheable.
 */
export const DEFAULT_VOCABULARY: readonly VocabularyEntry[] = WORDS.map((word, i) => ({
  id: 1000 + i,
  text: ` ${word}`,
}));

/**
 * The words of `WORDS` that `encode` turns into exactly one token (with a
 * leading space), with that token's id. Falls back to the default vocabulary
 * when fewer than 8 words qualify.
 */
export function vocabularyFromTokenizer(encode: (text: string) => readonly number[]): VocabularyEntry[] {
  const out: VocabularyEntry[] = [];
  const seen = new Set<number>();
  for (const word of WORDS) {
    const text = ` ${word}`;
    const ids = encode(text);
    if (ids.length === 1 && !seen.has(ids[0]!)) {
      seen.add(ids[0]!);
      out.push({ id: ids[0]!, text });
    }
  }
  return out.length >= 8 ? out : DEFAULT_VOCABULARY.slice();
}
