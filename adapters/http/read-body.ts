/** @module Reads a JSON request body under a byte limit, refusing as soon as the limit is crossed. */

import type { Readable } from "node:stream";
import { Refusal } from "../../src/errors.js";

/** Default request body limit: 4 MiB. */
export const DEFAULT_BODY_LIMIT_BYTES = 4 * 1024 * 1024;

function tooLarge(limitBytes: number, seen: number | undefined): Refusal {
  const size = seen === undefined ? "" : ` (at least ${seen} bytes)`;
  return new Refusal("body_too_large", `request body is larger than the ${limitBytes}-byte limit${size}`);
}

/**
 * Reads the body as text, at most `limitBytes` bytes. A `content-length` over
 * the limit is refused before reading; a body that grows past the limit while
 * streaming is refused the moment it does, and the rest is not read.
 */
export async function readBodyText(
  request: Request,
  limitBytes: number,
  incoming?: Readable,
): Promise<string> {
  const declared = request.headers.get("content-length");
  if (declared !== null) {
    const length = Number(declared);
    if (Number.isFinite(length) && length > limitBytes) throw tooLarge(limitBytes, length);
  }
  // Reading the Node request stream directly skips building a web Request around it (a large share of a
  // small call's cost) and enforces the limit just the same.
  if (incoming) return readNodeBody(incoming, limitBytes);
  const read = await readStreamCapped(request.body, limitBytes);
  if (read.over !== undefined) throw tooLarge(limitBytes, read.over);
  return Buffer.from(read.bytes.buffer, read.bytes.byteOffset, read.bytes.byteLength).toString("utf8");
}

/**
 * Reads a web stream whole while it stays within `limitBytes`; past the limit it stops reading,
 * cancels the stream and says how many bytes it had seen (`over`). An absent stream is empty.
 */
export async function readStreamCapped(
  stream: ReadableStream<Uint8Array> | null,
  limitBytes: number,
): Promise<{ bytes: Uint8Array<ArrayBuffer>; over?: number }> {
  if (!stream) return { bytes: new Uint8Array(0) };
  const reader = stream.getReader();
  const parts: Uint8Array[] = [];
  let total = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.byteLength;
      if (total > limitBytes) {
        await reader.cancel().catch(() => {});
        return { bytes: new Uint8Array(0), over: total };
      }
      parts.push(value);
    }
  } finally {
    reader.releaseLock();
  }
  const bytes = new Uint8Array(total);
  let offset = 0;
  for (const part of parts) {
    bytes.set(part, offset);
    offset += part.byteLength;
  }
  return { bytes };
}

/**
 * Reads a Node request stream under the limit. Past the limit it stops reading and leaves the stream
 * paused, never destroyed: destroying would reset the connection before the 413 reaches the client
 * (the refusal's sender closes the connection once the 413 is out; see `linger.ts`).
 */
function readNodeBody(incoming: Readable, limitBytes: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let total = 0;
    const cleanup = () => {
      incoming.off("data", onData);
      incoming.off("end", onEnd);
      incoming.off("error", onError);
      incoming.off("close", onClose);
    };
    const onData = (part: Buffer) => {
      total += part.byteLength;
      if (total > limitBytes) {
        cleanup();
        incoming.pause();
        reject(tooLarge(limitBytes, total));
        return;
      }
      parts.push(part);
    };
    const onEnd = () => {
      cleanup();
      resolve(Buffer.concat(parts, total).toString("utf8"));
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    const onClose = () => {
      cleanup();
      reject(new Refusal("invalid_request", "the request body ended before it was complete"));
    };
    incoming.on("data", onData);
    incoming.once("end", onEnd);
    incoming.once("error", onError);
    incoming.once("close", onClose);
    if (incoming.readableEnded) onEnd();
  });
}

/** Deepest nesting of arrays and objects a JSON body may have. */
export const MAX_JSON_DEPTH = 128;

/**
 * The deepest nesting of `[` and `{` in a JSON text, stopping as soon as it
 * passes `limit`. A linear scan before `JSON.parse`: a body nested thousands
 * deep parses, but every later recursive walk over it (`JSON.stringify` when
 * forwarding, rendering tool calls) would overflow the stack.
 */
export function jsonDepthExceeds(text: string, limit: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // backslash: the next character is escaped
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > limit) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

/** Reads and parses a JSON body; bad JSON, or JSON nested deeper than {@link MAX_JSON_DEPTH}, is a 400 `invalid_request`. */
export async function readJsonBody(
  request: Request,
  limitBytes: number,
  incoming?: Readable,
): Promise<unknown> {
  const text = await readBodyText(request, limitBytes, incoming);
  if (text.trim() === "")
    throw new Refusal("invalid_request", "request body is empty; expected a JSON object");
  if (jsonDepthExceeds(text, MAX_JSON_DEPTH)) {
    throw new Refusal(
      "invalid_request",
      `request body nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels`,
    );
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Refusal("invalid_request", `request body is not valid JSON: ${(err as Error).message}`);
  }
}
