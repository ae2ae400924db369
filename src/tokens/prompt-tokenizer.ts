/** @module Incremental prompt tokenization: each chat message is tokenized once and cached, so a session's step pays only for its new messages. */

import { LRUCache } from "lru-cache";
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
    out += `\n${JSON.stringify(message.tool_calls)}`;
  }
  return `${out}\n<|end|>\n`;
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

  /** The token ids of a chat prompt: the rendered messages' tokens, concatenated in order. */
  chat(messages: readonly ChatMessage[]): number[] {
    const parts: (readonly number[])[] = [];
    for (const message of messages) parts.push(this.message(message));
    return concatAll(parts);
  }

  /** The token ids of one rendered message (cached). */
  message(message: ChatMessage): readonly number[] {
    const rendered = renderChatMessage(message);
    const key = cacheKey(rendered);
    const hit = this.cache.get(key);
    // A sampled key may collide; the stored text makes that a miss instead of a wrong count.
    if (hit !== undefined && hit.rendered === rendered) {
      this.counters.cacheHits++;
      return hit.tokens;
    }
    this.counters.cacheMisses++;
    const tokens = this.encode(rendered);
    this.cache.set(key, { rendered, tokens });
    return tokens;
  }

  /** The token ids of a plain-text prompt (legacy completions). Not cached: it is one string. */
  text(prompt: string): number[] {
    return this.encode(prompt);
  }

  /** Work counters since construction (or the last `resetStats`). */
  stats(): PromptTokenizerStats {
    return { ...this.counters };
  }

  resetStats(): void {
    this.counters = { tokenizedChars: 0, tokenizedTokens: 0, cacheHits: 0, cacheMisses: 0 };
  }

  private encode(text: string): number[] {
    const tokens = this.tokenizer.encode(text);
    this.counters.tokenizedChars += text.length;
    this.counters.tokenizedTokens += tokens.length;
    return tokens;
  }
}
