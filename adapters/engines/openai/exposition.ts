/** @module The Prometheus text exposition format read into samples: no engine's meaning, which lives in the profiles. */

/** One sample line of an exposition. */
export interface MetricSample {
  /** Sample name as written (`vllm:prefix_cache_hits_total`, `x_bucket`, …). */
  name: string;
  labels: Readonly<Record<string, string>>;
  /** The value; `NaN`, `Infinity` and `-Infinity` are kept as such. */
  value: number;
  /** Optional sample timestamp (ms since the epoch), as the exposition gave it. */
  timestampMs?: number;
}

/** A parsed exposition: every well-formed sample, the declared types, and how many lines were unreadable. */
export interface ParsedExposition {
  samples: MetricSample[];
  /** `# TYPE` declarations: metric family name → type (`counter`, `gauge`, …). */
  types: Map<string, string>;
  /** `# HELP` texts, unescaped. */
  help: Map<string, string>;
  /** Lines that were neither comments, blank, nor well-formed samples (skipped, never fatal). */
  invalidLines: number;
}

/**
 * Parses the Prometheus text exposition format (0.0.4), and the parts of
 * OpenMetrics a scrape may meet (`# EOF`, exemplars, quoted metric names).
 * Never throws: a malformed line is counted in `invalidLines` and skipped,
 * so one bad line cannot hide a whole page of good samples.
 */
export function parsePrometheusText(text: string): ParsedExposition {
  const out: ParsedExposition = { samples: [], types: new Map(), help: new Map(), invalidLines: 0 };
  let start = 0;
  const length = text.length;
  while (start <= length) {
    let end = text.indexOf("\n", start);
    if (end === -1) end = length;
    let line = text.slice(start, end);
    start = end + 1;
    if (line.endsWith("\r")) line = line.slice(0, -1);
    parseLine(line, out);
    if (end === length) break;
  }
  return out;
}

function parseLine(raw: string, out: ParsedExposition): void {
  const line = raw.trim();
  if (line === "") return;
  if (line.startsWith("#")) {
    parseComment(line, out);
    return;
  }
  const sample = parseSample(line);
  if (sample) out.samples.push(sample);
  else out.invalidLines++;
}

function parseComment(line: string, out: ParsedExposition): void {
  // `# HELP name text` and `# TYPE name type`; every other comment is free text.
  const match = /^#\s+(HELP|TYPE)\s+(\S+)(?:\s+(.*))?$/.exec(line);
  if (!match) return;
  const [, keyword, name, rest = ""] = match;
  if (keyword === "TYPE") out.types.set(name!, rest.trim().toLowerCase());
  else out.help.set(name!, unescapeHelp(rest));
}

function unescapeHelp(text: string): string {
  return text.replace(/\\(\\|n)/g, (_, c: string) => (c === "n" ? "\n" : "\\"));
}

const NAME_START = /[a-zA-Z_:]/;
const NAME_CHAR = /[a-zA-Z0-9_:]/;
const LABEL_START = /[a-zA-Z_]/;
const LABEL_CHAR = /[a-zA-Z0-9_]/;

/** A cursor over one line; every reader returns undefined on malformed input. */
class Cursor {
  pos = 0;
  constructor(readonly s: string) {}

  done(): boolean {
    return this.pos >= this.s.length;
  }

  peek(): string {
    return this.s[this.pos] ?? "";
  }

  skipSpace(): number {
    const from = this.pos;
    while (this.peek() === " " || this.peek() === "\t") this.pos++;
    return this.pos - from;
  }

  ident(start: RegExp, rest: RegExp): string | undefined {
    if (!start.test(this.peek())) return undefined;
    const from = this.pos++;
    while (!this.done() && rest.test(this.peek())) this.pos++;
    return this.s.slice(from, this.pos);
  }

  /** A double-quoted string with `\\`, `\"` and `\n` escapes; the cursor sits on the opening quote. */
  quoted(): string | undefined {
    if (this.peek() !== '"') return undefined;
    this.pos++;
    let value = "";
    while (!this.done()) {
      const c = this.s[this.pos++]!;
      if (c === '"') return value;
      if (c === "\\") {
        const next = this.s[this.pos++];
        if (next === "n") value += "\n";
        else if (next === "\\" || next === '"') value += next;
        // Unknown escapes are kept verbatim, as Prometheus itself does.
        else if (next !== undefined) value += `\\${next}`;
        else return undefined;
      } else value += c;
    }
    return undefined;
  }

  token(): string {
    const from = this.pos;
    while (!this.done() && this.peek() !== " " && this.peek() !== "\t") this.pos++;
    return this.s.slice(from, this.pos);
  }
}

function parseSample(line: string): MetricSample | undefined {
  const cur = new Cursor(line);
  let name = cur.ident(NAME_START, NAME_CHAR);
  const labels: Record<string, string> = {};
  let gap = cur.skipSpace();
  if (cur.peek() === "{") {
    cur.pos++;
    const setName = name === undefined ? (n: string) => (name = n) : undefined;
    if (!parseLabels(cur, labels, setName)) return undefined;
    gap = cur.skipSpace();
  }
  if (name === undefined || gap === 0) return undefined;
  const value = parseValue(cur.token());
  if (value === undefined) return undefined;
  const sample: MetricSample = { name, labels, value };
  cur.skipSpace();
  if (cur.done() || cur.peek() === "#") return sample; // `# {…} v` is an OpenMetrics exemplar: ignored
  const ts = Number(cur.token());
  if (!Number.isFinite(ts)) return undefined;
  // Prometheus text timestamps are integer ms; a fractional one is OpenMetrics seconds.
  sample.timestampMs = Number.isInteger(ts) ? ts : ts * 1000;
  cur.skipSpace();
  if (!cur.done() && cur.peek() !== "#") return undefined;
  return sample;
}

/**
 * Reads `name="value",…}`; the cursor sits after `{`. A bare quoted string is
 * the metric name in UTF-8 exposition (`{"my.metric", a="b"}`), handed to `setName`.
 */
function parseLabels(cur: Cursor, labels: Record<string, string>, setName?: (n: string) => void): boolean {
  for (;;) {
    cur.skipSpace();
    if (cur.peek() === "}") {
      cur.pos++;
      return true;
    }
    let label: string | undefined;
    if (cur.peek() === '"') {
      const quoted = cur.quoted();
      if (quoted === undefined) return false;
      cur.skipSpace();
      if (cur.peek() !== "=") {
        if (!setName) return false;
        setName(quoted);
        setName = undefined;
        if (!afterLabel(cur)) return false;
        continue;
      }
      label = quoted;
    } else {
      label = cur.ident(LABEL_START, LABEL_CHAR);
      if (label === undefined) return false;
      cur.skipSpace();
    }
    if (cur.peek() !== "=") return false;
    cur.pos++;
    cur.skipSpace();
    const value = cur.quoted();
    if (value === undefined) return false;
    labels[label] = value;
    if (!afterLabel(cur)) return false;
  }
}

function afterLabel(cur: Cursor): boolean {
  cur.skipSpace();
  if (cur.peek() === ",") {
    cur.pos++;
    return true;
  }
  return cur.peek() === "}";
}

function parseValue(token: string): number | undefined {
  if (token === "") return undefined;
  const lower = token.toLowerCase();
  if (lower === "nan") return Number.NaN;
  if (lower === "+inf" || lower === "inf" || lower === "+infinity" || lower === "infinity") {
    return Number.POSITIVE_INFINITY;
  }
  if (lower === "-inf" || lower === "-infinity") return Number.NEGATIVE_INFINITY;
  const value = Number(token);
  return Number.isNaN(value) ? undefined : value;
}
