/**
 * @module Digests of a call's prompt and of the output sluice returned for it, unit by unit, for
 * session inference (docs/routing.md, "Inferred sessions"). A chat prompt's units are its
 * messages; a token prompt's units are blocks of tokens. Each unit's digest is chained over every
 * unit before it, so two equal chain entries mean two equal prompt prefixes.
 */

import { blockHashes, extendBlockHashes } from "../routing/block-hash.js";
import type { CallInput, ChatMessage } from "../types.js";

/** Tokens per unit of a token prompt: the router's block size (a partial last block is checked token by token). */
export const INFERENCE_TOKEN_BLOCK = 64;

/**
 * A prompt cut into chained units. `chain[i]` covers units 0…i. A token prompt also keeps its
 * tokens (a matched point's partial last block is checked against them) and the tokens after its
 * last full block.
 */
export type PromptDigest =
  | { kind: "messages"; chain: readonly string[]; digests: readonly number[]; seed: string }
  | { kind: "tokens"; chain: readonly string[]; tokens: readonly number[]; seed: string };

/** What sluice returned for a call, in the form the client will send it back. */
export interface ReturnedOutput {
  /** Generated token ids (token prompts). */
  tokens?: readonly number[];
  /** The assistant message's text (chat prompts); reasoning is not part of it. */
  text?: string;
  /** Tool calls the assistant made, as {@link toolCallsText} renders them (names and arguments, no ids). */
  toolCalls?: string;
}

/**
 * The point a finished call's prompt and output reach: the next step of its session sends a
 * prompt that begins with exactly this. `key` is the chain entry of its last full unit; `tail`
 * the tokens after that (token prompts), which a match must also find.
 */
export interface ChainEnd {
  key: string;
  /** Units the key covers. */
  units: number;
  tail: readonly number[];
}

const SEP = "\u0000";
const CALL_SEP = "\u0002";
const ARG_SEP = "\u0001";

/** Two 32-bit lanes over a string's UTF-16 code units (FNV-1a and a murmur-style mix), finalised. */
function stringLanes(text: string, out: number[]): void {
  let a = 0x811c9dc5;
  let b = 0x2545f491 ^ text.length;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x5bd1e995);
    b ^= b >>> 15;
  }
  a ^= a >>> 16;
  a = Math.imul(a, 0x85ebca6b);
  a ^= a >>> 13;
  b = Math.imul(b ^ (b >>> 16), 0xc2b2ae35);
  b ^= b >>> 16;
  out.push(a >>> 0, b >>> 0);
}

/** Reasoning an engine writes into the content (`<think>…</think>` first): clients often drop it. */
const LEADING_THINK = /^\s*<think>[\s\S]*?<\/think>/;

/** A message content's text: strings as they are, the text of text parts; reasoning parts left out. */
export function contentText(content: unknown): string {
  let text: string;
  if (typeof content === "string") text = content;
  else if (Array.isArray(content)) {
    text = "";
    for (const part of content) {
      if (typeof part === "string") text += part;
      else if (part !== null && typeof part === "object") {
        const p = part as { type?: unknown; text?: unknown; image_url?: { url?: unknown } };
        if (typeof p.type === "string" && /reason|think/.test(p.type)) continue;
        if (typeof p.text === "string") text += p.text;
        else if (typeof p.image_url?.url === "string") text += p.image_url.url;
      }
    }
  } else return "";
  return text.replace(LEADING_THINK, "").trim();
}

/** Tool-call arguments compared as JSON values when they parse (clients re-serialise them), else as text. */
function canonicalArguments(args: string): string {
  const trimmed = args.trim();
  if (trimmed === "") return "";
  try {
    return JSON.stringify(JSON.parse(trimmed));
  } catch {
    return trimmed;
  }
}

/** Renders tool calls as `name␁arguments` joined by `␂`; ids are left out (clients and engines rename them). */
export function toolCallsText(calls: unknown): string {
  if (!Array.isArray(calls)) return "";
  const parts: string[] = [];
  for (const call of calls) {
    if (call === null || typeof call !== "object") continue;
    const fn = (call as { function?: { name?: unknown; arguments?: unknown } }).function;
    const name = typeof fn?.name === "string" ? fn.name : "";
    const args = typeof fn?.arguments === "string" ? fn.arguments : "";
    parts.push(`${name}${ARG_SEP}${args}`);
  }
  return parts.join(CALL_SEP);
}

/** Canonical form of a rendered tool-call text (arguments as JSON), for prompt and output alike. */
function canonicalToolCalls(text: string): string {
  if (text === "") return "";
  return text
    .split(CALL_SEP)
    .map((call) => {
      const at = call.indexOf(ARG_SEP);
      return at < 0 ? call : `${call.slice(0, at)}${ARG_SEP}${canonicalArguments(call.slice(at + 1))}`;
    })
    .join(CALL_SEP);
}

/** The text a message is compared by: role, name, content text and tool calls; no reasoning, no tool-call ids. */
export function messageKey(message: ChatMessage): string {
  const m = message as ChatMessage & { name?: unknown };
  const name = typeof m.name === "string" ? m.name : "";
  return `${message.role}${SEP}${name}${SEP}${contentText(message.content)}${SEP}${canonicalToolCalls(toolCallsText(message.tool_calls))}`;
}

/** The assistant message a client sends back for what sluice returned. */
function outputKey(output: ReturnedOutput): string {
  const text = (output.text ?? "").replace(LEADING_THINK, "").trim();
  return `assistant${SEP}${SEP}${text}${SEP}${canonicalToolCalls(output.toolCalls ?? "")}`;
}

/**
 * A prompt's digest, or undefined for prompts inference does not read (plain text completions).
 * @param seed separates hash spaces (the tenant): chains of different seeds never meet
 */
export function digestPrompt(input: CallInput, seed = ""): PromptDigest | undefined {
  if (input.kind === "chat") {
    const digests: number[] = [];
    for (const message of input.messages) stringLanes(messageKey(message), digests);
    // Each message's two lanes make one block of the chained block hash.
    const messageSeed = `m${SEP}${seed}`;
    return { kind: "messages", chain: blockHashes(digests, 2, messageSeed), digests, seed: messageSeed };
  }
  if (input.kind === "tokens") {
    const tokenSeed = `t${SEP}${seed}`;
    return {
      kind: "tokens",
      chain: blockHashes(input.tokens, INFERENCE_TOKEN_BLOCK, tokenSeed),
      tokens: input.tokens,
      seed: tokenSeed,
    };
  }
  return undefined;
}

/**
 * The point `prompt` followed by `output` reaches; undefined when nothing was returned (an empty
 * output continues nothing: the next prompt could not be told from a retry of this one).
 */
export function chainEnd(prompt: PromptDigest, output: ReturnedOutput): ChainEnd | undefined {
  if (prompt.kind === "messages") {
    if ((output.text ?? "").trim() === "" && (output.toolCalls ?? "") === "") return undefined;
    const digests = prompt.digests.slice();
    stringLanes(outputKey(output), digests);
    const parent = prompt.chain.at(-1);
    const last = extendBlockHashes(
      parent === undefined ? [] : [parent],
      digests.slice(-2),
      2,
      prompt.seed,
    ).at(-1)!;
    return { key: last, units: prompt.chain.length + 1, tail: [] };
  }
  const generated = output.tokens ?? [];
  if (generated.length === 0) return undefined;
  const full = prompt.chain.length * INFERENCE_TOKEN_BLOCK;
  const rest = prompt.tokens.slice(full).concat(generated as number[]);
  // Only the last entry is the parent of the next block: the rest of the chain is not copied.
  const last = prompt.chain.at(-1);
  const chain = extendBlockHashes(last === undefined ? [] : [last], rest, INFERENCE_TOKEN_BLOCK, prompt.seed);
  if (chain.length === 0) return undefined;
  const added = chain.length - (last === undefined ? 0 : 1);
  const tail = rest.slice(added * INFERENCE_TOKEN_BLOCK);
  return { key: chain.at(-1)!, units: prompt.chain.length + added, tail };
}

/** Whether a prompt continues a chain end found at its `units`-th chain entry: its tokens there begin with the end's tail. */
export function continuesTail(prompt: PromptDigest, units: number, tail: readonly number[]): boolean {
  if (tail.length === 0) return true;
  if (prompt.kind !== "tokens") return false;
  const start = units * INFERENCE_TOKEN_BLOCK;
  if (start + tail.length > prompt.tokens.length) return false;
  for (let i = 0; i < tail.length; i++) if (prompt.tokens[start + i] !== tail[i]) return false;
  return true;
}
