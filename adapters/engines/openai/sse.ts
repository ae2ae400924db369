/** @module Splits a server-sent-events byte stream into whole events, keeping each event's exact bytes. */

/** One complete event: its bytes as received (terminating blank line included) and its parsed fields. */
export interface SseEvent {
  /** The event's bytes exactly as the upstream sent them, ready to forward untouched. */
  raw: Uint8Array;
  /** `data:` lines joined with `\n`; undefined when the event had none (a comment or keep-alive). */
  data: string | undefined;
  /** The `event:` field, when present. */
  event: string | undefined;
}

const LF = 0x0a;
const CR = 0x0d;
const EMPTY = new Uint8Array(0);
const decoder = new TextDecoder();

/**
 * Incremental splitter. Events end at a blank line; lines end with LF, CRLF
 * or CR (the SSE grammar), so a CR at the end of a chunk waits for the next
 * chunk to tell CRLF from CR. Work per byte is constant: scanning resumes
 * where it stopped.
 */
export class SseSplitter {
  private buf: Uint8Array = EMPTY;
  private scanFrom = 0;
  private lineStart = 0;

  /** Feeds bytes; returns the events they completed, in order. */
  push(bytes: Uint8Array): SseEvent[] {
    if (bytes.length === 0) return [];
    if (this.buf.length === 0) this.buf = bytes;
    else {
      const joined = new Uint8Array(this.buf.length + bytes.length);
      joined.set(this.buf, 0);
      joined.set(bytes, this.buf.length);
      this.buf = joined;
    }
    const events: SseEvent[] = [];
    let i = this.scanFrom;
    while (i < this.buf.length) {
      const c = this.buf[i]!;
      if (c !== LF && c !== CR) {
        i++;
        continue;
      }
      let terminator = 1;
      if (c === CR) {
        if (i + 1 >= this.buf.length) break; // CR or CRLF: the next chunk decides
        if (this.buf[i + 1] === LF) terminator = 2;
      }
      const blankLine = i === this.lineStart;
      i += terminator;
      if (blankLine) {
        const raw = this.buf.slice(0, i);
        this.buf = this.buf.subarray(i);
        i = 0;
        const event = parseEvent(raw);
        if (event) events.push(event);
      }
      this.lineStart = i;
    }
    this.scanFrom = i;
    return events;
  }

  /** Bytes of an unfinished event still held (non-zero at end of stream means the upstream cut an event short). */
  pendingBytes(): number {
    return this.buf.length;
  }
}

/** Parses one event's fields; undefined for a stray blank line, which carries nothing. */
export function parseEvent(raw: Uint8Array): SseEvent | undefined {
  const text = decoder.decode(raw);
  let data: string | undefined;
  let event: string | undefined;
  let sawField = false;
  for (const line of text.split(/\r\n|\r|\n/)) {
    if (line === "") continue;
    sawField = true;
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") data = data === undefined ? value : `${data}\n${value}`;
    else if (field === "event") event = value;
  }
  return sawField ? { raw, data, event } : undefined;
}
