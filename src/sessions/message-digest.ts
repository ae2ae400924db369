/**
 * @module Digests of a call's prompt and of the output sluice returned for it, unit by unit, for
 * session inference (docs/routing.md, "Inferred sessions"). A chat prompt's units are its
 * messages; a token prompt's units are blocks of tokens. Each unit's digest is chained over every
 * unit before it, so two equal chain entries mean two equal prompt prefixes.
 */

import { blockHashLanes, renderBlockHash } from "../routing/block-hash.js";
import type { CallInput, ChatMessage } from "../types.js";

/** Tokens per unit of a token prompt: the router's block size (a partial last block is checked token by token). */
export const INFERENCE_TOKEN_BLOCK = 64;

/**
 * A prompt cut into chained units. `lanes` holds each unit's chain entry as two 32-bit words
 * (unit i at `2i`, `2i + 1`), covering units 0…i; {@link unitKey} renders one as a key. Entries
 * stay numbers because a match looks most of them up and finds few. A token prompt also keeps
 * its tokens (a matched point's partial last block is checked against them).
 */
export type PromptDigest =
  | { kind: "messages"; units: number; lanes: Int32Array; seed: string }
  | { kind: "tokens"; units: number; lanes: Int32Array; tokens: readonly number[]; seed: string };

/** The chain entry covering a prompt's first `units` units (1 ≤ units ≤ `prompt.units`) as a key. */
export function unitKey(prompt: PromptDigest, units: number): string {
  return renderBlockHash(prompt.lanes[2 * units - 2]!, prompt.lanes[2 * units - 1]!);
}

/** The lanes of the chain entry covering a prompt's first `units` units, or undefined for none. */
function entryLanes(prompt: PromptDigest, units: number): readonly [number, number] | undefined {
  return units === 0 ? undefined : [prompt.lanes[2 * units - 2]!, prompt.lanes[2 * units - 1]!];
}

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
  /** The key's two 32-bit words, as a digest's `lanes` hold them (what an index may file the key under). */
  lanes: readonly [number, number];
  /** Units the key covers. */
  units: number;
  tail: readonly number[];
}

const SEP = "\u0000";
const CALL_SEP = "\u0002";
const ARG_SEP = "\u0001";

/**
 * Two 32-bit lanes over a string's UTF-16 code units (FNV-1a and a murmur-style mix), finalised.
 * Units are taken two to a 32-bit word: a prompt is hashed whole on every call, and this halves
 * the multiplications per character, the whole of the digest's cost on long prompts.
 */
function stringLanes(text: string, out: number[]): void {
  let a = 0x811c9dc5;
  let b = 0x2545f491 ^ text.length;
  const pairs = text.length & ~1;
  for (let i = 0; i < pairs; i += 2) {
    const c = text.charCodeAt(i) | (text.charCodeAt(i + 1) << 16);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x5bd1e995);
    b ^= b >>> 15;
  }
  if (pairs < text.length) {
    const c = text.charCodeAt(pairs);
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
    const lanes = blockHashLanes(digests, 2, messageSeed);
    return { kind: "messages", units: lanes.length / 2, lanes, seed: messageSeed };
  }
  if (input.kind === "tokens") {
    const tokenSeed = `t${SEP}${seed}`;
    const lanes = blockHashLanes(input.tokens, INFERENCE_TOKEN_BLOCK, tokenSeed);
    return { kind: "tokens", units: lanes.length / 2, lanes, tokens: input.tokens, seed: tokenSeed };
  }
  return undefined;
}

/**
 * The point `prompt` followed by `output` reaches; undefined when nothing was returned (an empty
 * output continues nothing: the next prompt could not be told from a retry of this one).
 */
export function chainEnd(prompt: PromptDigest, output: ReturnedOutput): ChainEnd | undefined {
  const last = entryLanes(prompt, prompt.units);
  if (prompt.kind === "messages") {
    if ((output.text ?? "").trim() === "" && (output.toolCalls ?? "") === "") return undefined;
    const outputLanes: number[] = [];
    stringLanes(outputKey(output), outputLanes);
    const end = blockHashLanes(outputLanes, 2, prompt.seed, last);
    return {
      key: renderBlockHash(end[0]!, end[1]!),
      lanes: [end[0]!, end[1]!],
      units: prompt.units + 1,
      tail: [],
    };
  }
  const generated = output.tokens ?? [];
  if (generated.length === 0) return undefined;
  const full = prompt.units * INFERENCE_TOKEN_BLOCK;
  const rest = prompt.tokens.slice(full).concat(generated as number[]);
  // Only the last entry is the parent of the next block: the rest of the chain is not hashed again.
  const added = blockHashLanes(rest, INFERENCE_TOKEN_BLOCK, prompt.seed, last);
  const blocks = added.length / 2;
  if (blocks === 0 && last === undefined) return undefined;
  const [a, b] = blocks === 0 ? last! : [added[2 * blocks - 2]!, added[2 * blocks - 1]!];
  return {
    key: renderBlockHash(a, b),
    lanes: [a, b],
    units: prompt.units + blocks,
    tail: rest.slice(blocks * INFERENCE_TOKEN_BLOCK),
  };
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
