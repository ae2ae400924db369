/** @module Hostile input for the fuzzers: JSON written byte for byte (prototype keys, absurd numbers, deep nesting), request bodies mutated from valid ones, hostile header values and ids. */

import fc from "fast-check";

/**
 * Cases per property, as a fraction of the full counts written beside each property. `npm test` runs
 * the short pass (0.1: about 1,350 cases, the same ones every run); `npm run test:reliability` sets
 * `FUZZ_SCALE=1` for the long pass (over 13,000).
 */
export const SCALE = Number(process.env.FUZZ_SCALE ?? "0.1");
export const runs = (n: number) => Math.max(1, Math.round(n * SCALE));
/** A fixed seed unless asked otherwise, so a failure in CI replays; fast-check prints the seed and path. */
export const SEED = process.env.FUZZ_SEED === undefined ? 20_261_130 : Number(process.env.FUZZ_SEED);

export const FC_OPTIONS = { seed: SEED, endOnFailure: true, includeErrorInReport: true } as const;

/** Gives a generated value a short description, so a failure report names the case instead of dumping megabytes. */
export function described<T extends object>(value: T, summary: string): T {
  return Object.assign(value, { [fc.toStringMethod]: () => summary });
}

// --- JSON with full control over its text -----------------------------------------------------

/** JSON text spliced in as it is (numbers JSON.stringify cannot write, deep nesting). */
export class Raw {
  constructor(readonly text: string) {}
}
/** An object as an entry list: duplicate keys and `__proto__` stay own keys of the text. */
export class Obj {
  constructor(readonly entries: [string, V][]) {}
  with(key: string, value: V | undefined): Obj {
    const rest = this.entries.filter(([k]) => k !== key);
    return new Obj(value === undefined ? rest : [...rest, [key, value]]);
  }
  get(key: string): V | undefined {
    return this.entries.find(([k]) => k === key)?.[1];
  }
}
export type V = Raw | Obj | V[] | string | number | boolean | null;

export function encode(value: V): string {
  if (value instanceof Raw) return value.text;
  if (value instanceof Obj)
    return `{${value.entries.map(([k, v]) => `${JSON.stringify(k)}:${encode(v)}`).join(",")}}`;
  if (Array.isArray(value)) return `[${value.map(encode).join(",")}]`;
  return JSON.stringify(value) ?? "null";
}

export const nested = (depth: number, open: "[" | '{"a":') =>
  new Raw(
    open === "["
      ? `${"[".repeat(depth)}${"]".repeat(depth)}`
      : `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`,
  );

export const PROTO_KEYS = [
  "__proto__",
  "constructor",
  "prototype",
  "toString",
  "hasOwnProperty",
  "valueOf",
  "__defineGetter__",
];

export const keyArb = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom(...PROTO_KEYS) },
  { weight: 2, arbitrary: fc.string({ unit: "binary", maxLength: 12 }) },
  {
    weight: 1,
    arbitrary: fc.constantFrom("model", "messages", "max_tokens", "stream", "n", "role", "content"),
  },
);

export const numberArb: fc.Arbitrary<V> = fc.oneof(
  fc.constantFrom<V>(
    0,
    -1,
    1,
    -0.5,
    0.5,
    2 ** 31,
    2 ** 53,
    -(2 ** 53),
    Number.MAX_SAFE_INTEGER,
    1e308,
    -1e308,
    4096,
    4097,
    131_072,
    131_073,
    1e21,
  ),
  fc.constantFrom(
    new Raw("1e400"),
    new Raw("-1e400"),
    new Raw("-0"),
    new Raw("1e-400"),
    new Raw("9007199254740993"),
    new Raw("123456789012345678901234567890"),
    new Raw("1.0"),
    new Raw("1E3"),
  ),
  fc.integer({ min: -(2 ** 31), max: 2 ** 31 }),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
);

export const stringArb: fc.Arbitrary<V> = fc.oneof(
  { weight: 4, arbitrary: fc.string({ unit: "binary", maxLength: 40 }) },
  { weight: 2, arbitrary: fc.string({ unit: "binary-ascii", maxLength: 40 }) },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      "",
      " ",
      "\ud800",
      "a\udfffb",
      "\u0000",
      "\r\n\r\nHTTP/1.1 200 OK",
      "interactive",
      "bulk",
      "user",
      "__proto__",
      "sim-instant",
      "meta-llama/Llama-3.1-8B-Instruct",
    ),
  },
  { weight: 1, arbitrary: fc.constantFrom("x".repeat(100_000), "é".repeat(30_000), "🦀".repeat(10_000)) },
);

export const leafArb: fc.Arbitrary<V> = fc.oneof(numberArb, stringArb, fc.boolean(), fc.constant(null));

export const hostileArb: fc.Arbitrary<V> = fc.letrec<{ value: V }>((tie) => ({
  value: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    { weight: 6, arbitrary: leafArb },
    { weight: 1, arbitrary: fc.array(tie("value"), { maxLength: 4 }) },
    {
      weight: 1,
      arbitrary: fc
        .array(fc.tuple(keyArb, tie("value")), { maxLength: 4 })
        .map((entries) => new Obj(entries as [string, V][])),
    },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.constantFrom(10, 127, 128, 129, 1000, 20_000), fc.constantFrom<"[" | '{"a":'>("[", '{"a":'))
        .map(([depth, open]) => nested(depth, open)),
    },
  ),
})).value;

// --- request bodies ------------------------------------------------------------------------------

export const message = (role: V, content: V) =>
  new Obj([
    ["role", role],
    ["content", content],
  ]);

export function chatTemplate(model: string): Obj {
  return new Obj([
    ["model", model],
    ["messages", [message("user", "hello there")]],
    ["max_tokens", 4],
  ]);
}

export function completionTemplate(model: string): Obj {
  return new Obj([
    ["model", model],
    ["prompt", "once upon a time"],
    ["max_tokens", 4],
  ]);
}

export type Mutation = (body: Obj) => Obj;

export const CHAT_FIELDS = [
  "model",
  "messages",
  "max_tokens",
  "max_completion_tokens",
  "stream",
  "stream_options",
  "temperature",
  "top_p",
  "n",
  "tools",
  "response_format",
  "user",
];
export const COMPLETION_FIELDS = [
  "model",
  "prompt",
  "max_tokens",
  "stream",
  "stream_options",
  "temperature",
  "n",
  "echo",
];

export const messagesArb: fc.Arbitrary<V> = fc.oneof(
  fc.constant<V>([]),
  fc.array(
    fc
      .tuple(
        fc.oneof(fc.constantFrom<V>("user", "assistant", "system", "tool", ""), leafArb),
        fc.oneof(
          { weight: 3, arbitrary: stringArb },
          { weight: 1, arbitrary: hostileArb },
          {
            weight: 1,
            arbitrary: fc
              .array(
                fc.oneof(
                  fc.constant<V>(
                    new Obj([
                      ["type", "text"],
                      ["text", "part"],
                    ]),
                  ),
                  fc.constant<V>(new Obj([["type", "image_url"]])),
                  hostileArb,
                ),
                { maxLength: 4 },
              )
              .map((parts) => parts as V),
          },
        ),
        fc.option(
          fc.tuple(fc.constantFrom("name", "tool_call_id", "tool_calls", "__proto__", "extra"), hostileArb),
        ),
      )
      .map(([role, content, extra]) => {
        const m = message(role, content);
        return extra ? m.with(extra[0], extra[1]) : m;
      }),
    { minLength: 1, maxLength: 6 },
  ),
  // Long conversations: the tokenizer and the context check see every one.
  fc
    .constantFrom(50, 2000, 10_000)
    .map((n) =>
      Array.from({ length: n }, (_, i) =>
        message(i % 2 === 0 ? "user" : "assistant", `turn ${i} of a long talk`),
      ),
    ),
);

export function mutationArb(fields: readonly string[]): fc.Arbitrary<Mutation> {
  return fc.oneof(
    {
      weight: 5,
      arbitrary: fc.tuple(fc.constantFrom(...fields), hostileArb).map(
        ([f, v]) =>
          (b: Obj) =>
            b.with(f, v),
      ),
    },
    { weight: 2, arbitrary: fc.constantFrom(...fields).map((f) => (b: Obj) => b.with(f, undefined)) },
    {
      weight: 3,
      arbitrary: messagesArb.map(
        (m) => (b: Obj) => (b.get("messages") === undefined ? b : b.with("messages", m)),
      ),
    },
    {
      weight: 2,
      arbitrary: fc.tuple(keyArb, hostileArb).map(
        ([k, v]) =>
          (b: Obj) =>
            new Obj([...b.entries, [k, v]]),
      ),
    },
    {
      weight: 2,
      arbitrary: fc
        .oneof(numberArb, fc.constantFrom<V>(1, 2, 8, 64, 1024, 1025, 4096, 130_000, 131_072, 10_000_000))
        .map((n) => (b: Obj) => b.with("max_tokens", n)),
    },
    {
      weight: 1,
      arbitrary: fc
        .oneof(
          fc.array(fc.oneof(fc.nat({ max: 300_000 }), numberArb), { minLength: 0, maxLength: 8 }),
          fc.constant<V>([[1, 2, 3]]),
          fc.constant<V>([[1], [2]]),
          fc.constant<V>(["a", "b"]),
          fc.constant<V>([[]]),
        )
        .map((p) => (b: Obj) => (b.get("prompt") === undefined ? b : b.with("prompt", p as V))),
    },
    { weight: 1, arbitrary: fc.constant((b: Obj) => b.with("stream", true)) },
  );
}

export type BodySpec = { klass: string; bytes: Uint8Array | string | undefined };

export function preview(bytes: Uint8Array | string | undefined): string {
  if (bytes === undefined) return "no body";
  const text = typeof bytes === "string" ? bytes : Buffer.from(bytes).toString("latin1");
  return `${text.length} chars: ${JSON.stringify(text.slice(0, 160))}${text.length > 160 ? "…" : ""}`;
}

export function bodyArb(template: Obj, fields: readonly string[]): fc.Arbitrary<BodySpec> {
  return rawBodyArb(template, fields).map((b) => described(b, `${b.klass} body, ${preview(b.bytes)}`));
}

export function rawBodyArb(template: Obj, fields: readonly string[]): fc.Arbitrary<BodySpec> {
  const valid = encode(template);
  return fc.oneof(
    {
      weight: 4,
      arbitrary: fc
        .array(mutationArb(fields), { maxLength: 1 })
        .map((ms) => ({ klass: "valid-or-nearly", bytes: encode(ms.reduce((b, m) => m(b), template)) })),
    },
    {
      weight: 10,
      arbitrary: fc
        .array(mutationArb(fields), { minLength: 1, maxLength: 3 })
        .map((ms) => ({ klass: "mutated-json", bytes: encode(ms.reduce((b, m) => m(b), template)) })),
    },
    {
      weight: 2,
      arbitrary: fc.uint8Array({ maxLength: 300 }).map((bytes) => ({ klass: "random-bytes", bytes })),
    },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.uint8Array({ minLength: 1, maxLength: 4 }), fc.nat({ max: valid.length }))
        .map(([junk, at]) => {
          // Invalid UTF-8 inside an otherwise valid body.
          const text = Buffer.from(valid);
          return {
            klass: "invalid-utf8",
            bytes: Buffer.concat([
              text.subarray(0, at),
              Buffer.from(junk.map((b) => b | 0x80)),
              text.subarray(at),
            ]),
          };
        }),
    },
    {
      weight: 1,
      arbitrary: fc
        .nat({ max: valid.length - 1 })
        .map((n) => ({ klass: "truncated-json", bytes: valid.slice(0, n) })),
    },
    { weight: 1, arbitrary: fc.json({ maxDepth: 3 }).map((text) => ({ klass: "random-json", bytes: text })) },
    { weight: 1, arbitrary: hostileArb.map((v) => ({ klass: "hostile-json", bytes: encode(v) })) },
    { weight: 1, arbitrary: fc.constant({ klass: "empty-body", bytes: undefined }) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        {
          klass: "huge-content",
          bytes: encode(template.with("messages", [message("user", "word ".repeat(600_000))])),
        },
        { klass: "over-body-limit", bytes: encode(template.with("pad", "p".repeat(5 * 1024 * 1024))) },
        { klass: "deep-nesting", bytes: encode(template.with("tool_choice", nested(100_000, "["))) },
        {
          klass: "deep-nesting",
          bytes: encode(
            template.with("messages", [message("user", "hi").with("tool_calls", [nested(50_000, '{"a":')])]),
          ),
        },
        {
          klass: "wide-array",
          bytes: encode(
            template.with(
              "logit_bias",
              Array.from({ length: 200_000 }, (_, i) => i),
            ),
          ),
        },
        // Runs of one character: whole, their BPE would be quadratic (minutes for 4 MiB).
        ...PATHOLOGICAL_TEXT.map((text) => ({
          klass: "pathological-text",
          bytes: encode(
            template.get("prompt") !== undefined
              ? template.with("prompt", text)
              : template.with("messages", [message("user", text)]),
          ),
        })),
      ),
    },
  );
}

/** Texts that are cheap to send and expensive to tokenize naively. */
export const PATHOLOGICAL_TEXT = [
  "é".repeat(2_000_000),
  "a".repeat(4_000_000),
  " ".repeat(3_000_000),
  "漢".repeat(1_300_000),
  "!".repeat(4_000_000),
];

// --- headers -------------------------------------------------------------------------------------

/** Header values a `Request` can carry: any byte but NUL, CR and LF (those need a raw socket). */
export const headerValueArb = fc.string({
  unit: fc
    .integer({ min: 1, max: 255 })
    .filter((c) => c !== 10 && c !== 13)
    .map((c) => String.fromCharCode(c)),
  minLength: 1,
  maxLength: 160,
});

export const safeIdArb = fc.stringMatching(/^[\x21-\x7e]{1,24}$/);

export function sessionBodyArb(): fc.Arbitrary<BodySpec> {
  return fc.oneof(
    {
      weight: 4,
      arbitrary: fc
        .record(
          {
            id: fc.oneof(
              safeIdArb,
              stringArb,
              hostileArb,
              fc.constantFrom<V>("__proto__", "constructor", "x".repeat(129)),
            ),
            lane: fc.oneof(fc.constantFrom<V>("interactive", "bulk", "overflow"), hostileArb),
            metadata: fc.oneof(
              hostileArb,
              fc.constant<V>(new Obj([["__proto__", new Obj([["polluted", true]])]])),
              fc.constant<V>(
                new Obj([["constructor", new Obj([["prototype", new Obj([["polluted", true]])]])]]),
              ),
            ),
            extra: fc.tuple(keyArb, hostileArb),
          },
          { requiredKeys: [] },
        )
        .map((r) => {
          const entries: [string, V][] = [];
          if (r.id !== undefined) entries.push(["id", r.id]);
          if (r.lane !== undefined) entries.push(["lane", r.lane]);
          if (r.metadata !== undefined) entries.push(["metadata", r.metadata]);
          if (r.extra) entries.push(r.extra as [string, V]);
          return { klass: "session-open", bytes: encode(new Obj(entries)) };
        }),
    },
    {
      weight: 1,
      arbitrary: fc.uint8Array({ maxLength: 100 }).map((bytes) => ({ klass: "random-bytes", bytes })),
    },
    { weight: 1, arbitrary: fc.constant({ klass: "empty-body", bytes: undefined }) },
  );
}
