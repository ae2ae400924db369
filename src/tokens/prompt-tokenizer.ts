/** @module Incremental prompt tokenization: each chat message is tokenized once and cached, so a session's step pays only for its new messages. */

import { LRUCache } from "lru-cache";
import { Refusal } from "../errors.js";
import type { Tokenizer } from "../tokenizer.js";
import type { ChatMessage } from "../types.js";

/** Options of {@link PromptTokenizer}. */
export interface PromptTokenizerOptions {
  /** Most messages kept in the cache (entries). Default 65,536. */
  cacheEntries?: number;
  /**
   * Most tokens kept in the cache, summed over entries. Default 8,388,608 (about 100 MB with
   * the rendered text): bounds memory when messages are large, whatever `cacheEntries` says.
   */
  cacheTokens?: number;
}

/** Work counters: what was actually run through the tokenizer, and how often the cache answered. */
export interface PromptTokenizerStats {
  /** Characters passed to the tokenizer (cache misses and `text()` calls). */
  tokenizedChars: number;
  /** Tokens the tokenizer produced for them. */
  tokenizedTokens: number;
  cacheHits: number;
  cacheMisses: number;
}

interface CachedMessage {
  rendered: string;
  tokens: readonly number[];
}

/**
 * Renders one message with a fixed template: a role header line (`<|role|>` or
 * `<|role:name|>`, `<|tool:call_id|>` for tool results), the content, tool calls as JSON, and a
 * closing `<|end|>` line. The markers are plain text: they tokenize into a few ordinary tokens,
 * which is the order of magnitude of an engine chat template's per-message overhead.
 */
export function renderChatMessage(message: ChatMessage): string {
  let header = String(message.role);
  if (typeof message.tool_call_id === "string") header += `:${message.tool_call_id}`;
  else if (typeof message.name === "string") header += `:${message.name}`;
  let out = `<|${header}|>\n${renderContent(message.content)}`;
  if (message.tool_calls !== undefined && message.tool_calls !== null) {
    out += `\n${stringifyToolCalls(message.tool_calls)}`;
  }
  return `${out}\n<|end|>\n`;
}

/** Tool calls as JSON; nesting too deep to serialize is the caller's error (400), not a crash (500). */
function stringifyToolCalls(toolCalls: unknown): string {
  try {
    return JSON.stringify(toolCalls);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    throw new Refusal("invalid_request", "tool_calls nest too deeply to be read", { param: "tool_calls" });
  }
}

function renderContent(content: unknown): string {
  if (content === undefined || content === null) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    const parts: string[] = [];
    for (const part of content) {
      if (typeof part === "string") parts.push(part);
      else if (part && typeof part === "object") {
        const p = part as { type?: unknown; text?: unknown };
        if (typeof p.text === "string") parts.push(p.text);
        // A non-text part (image, audio) has no text to count; its type marks its place.
        else parts.push(`<|${typeof p.type === "string" ? p.type : "part"}|>`);
      }
    }
    return parts.join("\n");
  }
  return JSON.stringify(content);
}

/** Messages up to this length are their own cache key: V8 hashes such strings natively and fully. */
const INLINE_KEY_CHARS = 8192;
/** Characters sampled for the key of a longer message. */
const SAMPLED_CHARS = 2048;

/**
 * The cache key of a rendered message. A long text is keyed by its length and a hash of an even
 * sample of its characters (cheaper than hashing every character, and V8 hashes strings over 16K
 * characters by length alone); a key collision is caught by comparing the stored text.
 */
function cacheKey(rendered: string): string {
  const n = rendered.length;
  if (n <= INLINE_KEY_CHARS) return rendered;
  const stride = Math.ceil(n / SAMPLED_CHARS);
  let h1 = 0xdeadbeef ^ n;
  let h2 = 0x41c6ce57 ^ n;
  for (let i = 0; i < n; i += stride) {
    const c = rendered.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 2654435761);
    h2 = Math.imul(h2 ^ c, 1597334677);
  }
  for (let i = n - 64; i < n; i++) {
    const c = rendered.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 2654435761);
    h2 = Math.imul(h2 ^ c, 1597334677);
  }
  return `\u0000${n}:${(h1 >>> 0).toString(36)}:${(h2 >>> 0).toString(36)}`;
}

/**
 * Longest run of one kind (whitespace, or not) handed to the tokenizer in one piece, chars. BPE merges
 * inside one pre-token cost O(n²): 4 MiB of "aaaa…", of spaces or of an unbroken CJK paragraph would
 * hold the event loop for minutes. Ordinary text has no such runs and is tokenized whole, exactly.
 */
export const MAX_PIECE_RUN = 256;
/** How far back from a forced cut to look for a letter–digit boundary (a pre-token boundary for o200k-style tokenizers), chars. */
const CUT_SEARCH = 32;

function isSpace(c: number): boolean {
  return c === 32 || (c >= 9 && c <= 13) || c === 0xa0 || c === 0x3000 || (c >= 0x2000 && c <= 0x200a);
}

function isAsciiLetter(c: number): boolean {
  return (c >= 65 && c <= 90) || (c >= 97 && c <= 122);
}

function isAsciiDigit(c: number): boolean {
  return c >= 48 && c <= 57;
}

/**
 * Splits a text so that no piece holds a run of more than `maxRun` characters of one kind; a text
 * without such runs is returned as one piece. A cut inside a run of non-space characters goes to a
 * letter–digit boundary when one is near (no token changes there), else where the run reaches
 * `maxRun` (the count may then differ by a token from tokenizing the run whole). Never splits a
 * surrogate pair.
 */
export function splitLongRuns(text: string, maxRun = MAX_PIECE_RUN): string[] {
  if (text.length <= maxRun) return [text];
  const pieces: string[] = [];
  let start = 0;
  let runStart = 0;
  let runSpace = isSpace(text.charCodeAt(0));
  for (let i = 1; i < text.length; i++) {
    const space = isSpace(text.charCodeAt(i));
    if (space !== runSpace) {
      runStart = i;
      runSpace = space;
      continue;
    }
    if (i - runStart < maxRun) continue;
    let cut = i;
    if (!space) {
      for (let j = i; j > i - CUT_SEARCH && j > runStart + 1; j--) {
        const a = text.charCodeAt(j - 1);
        const b = text.charCodeAt(j);
        if ((isAsciiLetter(a) && isAsciiDigit(b)) || (isAsciiDigit(a) && isAsciiLetter(b))) {
          cut = j;
          break;
        }
      }
    }
    const code = text.charCodeAt(cut);
    if (code >= 0xdc00 && code <= 0xdfff) cut++; // a low surrogate stays with its high one
    if (cut >= text.length) break;
    pieces.push(text.slice(start, cut));
    start = cut;
    runStart = cut;
    i = cut;
  }
  pieces.push(text.slice(start));
  return pieces;
}

/** Concatenates token arrays natively, in slices that stay far below the engine's argument limit. */
function concatAll(parts: readonly (readonly number[])[]): number[] {
  if (parts.length === 1) return parts[0]!.slice();
  let out: number[] = [];
  for (let i = 0; i < parts.length; i += 4096) out = out.concat(...parts.slice(i, i + 4096));
  return out;
}

function positiveInt(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 1) {
    throw new RangeError(`${name} should be a positive integer, got ${value}`);
  }
  return value;
}

/**
 * Counts a prompt's tokens with the model's tokenizer — never an estimate. Chat prompts are
 * tokenized message by message; each message's tokens are cached by its rendered text, so a
 * session whose context grows by a few messages per step tokenizes only those.
 */
export class PromptTokenizer {
  readonly tokenizer: Tokenizer;
  private readonly cache: LRUCache<string, CachedMessage>;
  private counters: PromptTokenizerStats = {
    tokenizedChars: 0,
    tokenizedTokens: 0,
    cacheHits: 0,
    cacheMisses: 0,
  };

  constructor(tokenizer: Tokenizer, options: PromptTokenizerOptions = {}) {
    this.tokenizer = tokenizer;
    const max = positiveInt("cacheEntries", options.cacheEntries ?? 65_536);
    const maxSize = positiveInt("cacheTokens", options.cacheTokens ?? 8_388_608);
    this.cache = new LRUCache<string, CachedMessage>({
      max,
      maxSize,
      // One extra unit so an empty message still has a positive size.
      sizeCalculation: (entry) => entry.tokens.length + 1,
    });
  }

  /**
   * The token ids of a chat prompt: the rendered messages' tokens, concatenated in order. With
   * `limitTokens`, stops as soon as more than that many were counted and returns that prefix
   * (longer than the limit: enough to refuse the prompt without tokenizing all of it).
   */
  chat(messages: readonly ChatMessage[], limitTokens = Number.POSITIVE_INFINITY): number[] {
    const parts: (readonly number[])[] = [];
    let total = 0;
    for (const message of messages) {
      const tokens = this.message(message, limitTokens - total);
      parts.push(tokens);
      total += tokens.length;
      if (total > limitTokens) break;
    }
    return concatAll(parts);
  }

  /** The token ids of one rendered message (cached; a message cut short by `limitTokens` is not). */
  message(message: ChatMessage, limitTokens = Number.POSITIVE_INFINITY): readonly number[] {
    const rendered = renderChatMessage(message);
    const key = cacheKey(rendered);
    const hit = this.cache.get(key);
    // A sampled key may collide; the stored text makes that a miss instead of a wrong count.
    if (hit !== undefined && hit.rendered === rendered) {
      this.counters.cacheHits++;
      return hit.tokens;
    }
    this.counters.cacheMisses++;
    const { tokens, complete } = this.encode(rendered, limitTokens);
    if (complete) this.cache.set(key, { rendered, tokens });
    return tokens;
  }

  /** The token ids of a plain-text prompt (legacy completions); `limitTokens` as for {@link chat}. Not cached: it is one string. */
  text(prompt: string, limitTokens = Number.POSITIVE_INFINITY): number[] {
    return this.encode(prompt, limitTokens).tokens;
  }

  /** Work counters since construction (or the last `resetStats`). */
  stats(): PromptTokenizerStats {
    return { ...this.counters };
  }

  resetStats(): void {
    this.counters = { tokenizedChars: 0, tokenizedTokens: 0, cacheHits: 0, cacheMisses: 0 };
  }

  /** Tokenizes piece by piece (see {@link splitLongRuns}), stopping once more than `limitTokens` were counted. */
  private encode(text: string, limitTokens: number): { tokens: number[]; complete: boolean } {
    const pieces = splitLongRuns(text);
    const parts: number[][] = [];
    let total = 0;
    let chars = 0;
    let complete = true;
    for (let i = 0; i < pieces.length; i++) {
      const piece = pieces[i]!;
      const tokens = this.tokenizer.encode(piece);
      parts.push(tokens);
      total += tokens.length;
      chars += piece.length;
      if (total > limitTokens && i < pieces.length - 1) {
        complete = false;
        break;
      }
    }
    this.counters.tokenizedChars += chars;
    this.counters.tokenizedTokens += total;
    return { tokens: parts.length === 1 ? parts[0]! : concatAll(parts), complete };
  }
}
