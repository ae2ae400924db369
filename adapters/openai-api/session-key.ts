/**
 * @module The session key a call names, read the same way over HTTP, NATS and batch lines
 * (`docs/clients.md`): the headers real clients send, first present wins, then the body's
 * `metadata.session_id`; the parent a child session names; `x-dynamo-session-final`; and the
 * `prompt_cache_key` placement hint, which is never a key.
 */

import { Refusal } from "../../src/errors.js";
import { isSessionId, MAX_SESSION_ID_LENGTH } from "../../src/sessions/session-id.js";

/**
 * Session key headers, first present wins (`docs/clients.md` says which client sends which).
 * `x-claude-code-session-id` with `x-claude-code-agent-id` beside it names `<session>/<agent>`.
 */
export const SESSION_HEADERS = [
  "x-session-id",
  "x-dynamo-session-id",
  "thread-id",
  "x-claude-code-session-id",
  "x-session-affinity",
  "session-id",
  "session_id",
  "conversation_id",
  "x-opencode-session",
] as const;

/** Claude Code's subagent header: with it, the key is `<session>/<agent>` and the session is the parent. */
export const CLAUDE_CODE_AGENT_HEADER = "x-claude-code-agent-id";

/** Headers naming the parent of a child session (a fork, a subagent), first present wins. */
export const PARENT_HEADERS = [
  "x-parent-session-id",
  "x-codex-parent-thread-id",
  "x-dynamo-parent-session-id",
] as const;

/** Dynamo's end-of-session header: `true` closes the session when this step ends. */
export const FINAL_HEADER = "x-dynamo-session-final";

/** Every request header read here, for CORS. */
export const SESSION_REQUEST_HEADERS: readonly string[] = [
  ...SESSION_HEADERS,
  CLAUDE_CODE_AGENT_HEADER,
  ...PARENT_HEADERS,
  FINAL_HEADER,
];

/** Where a call's session key came from, as `x-sluice-session-source` says it (`inferred` is decided elsewhere). */
export type SessionKeySource = "header" | "body" | "none";

/** What a call says about its session. */
export interface SessionKeyRead {
  /** The client's key (not yet scoped by tenant); absent for a call that names none. */
  key?: string;
  source: SessionKeySource;
  /** The header or body field the key came from. */
  from?: string;
  /** The parent session's key (same tenant), for a child's first placement. */
  parent?: string;
  /** `x-dynamo-session-final: true`: the session closes when this step ends. */
  final: boolean;
  /** `prompt_cache_key` from the body: a placement hint only. */
  cacheHint?: string;
}

/** Longest `prompt_cache_key` used as a hint, characters; a longer one is still passed to the engine. */
const MAX_CACHE_HINT_LENGTH = 1024;

/**
 * Checks one key as a client sent it. Empty, over 256 bytes, spaces or control characters: a 400
 * `invalid_request` whose `param` names the header or field, never a key trimmed or merged silently.
 */
export function checkSessionKey(value: unknown, from: string): string {
  if (typeof value !== "string") {
    throw new Refusal("invalid_request", `${from} must be a string session key`, { param: from });
  }
  if (isSessionId(value)) return value;
  const text = value as string;
  const bytes = Buffer.byteLength(text, "utf8");
  const problem =
    text.length === 0
      ? "is empty"
      : bytes > MAX_SESSION_ID_LENGTH
        ? `is ${bytes} bytes long`
        : "contains a space, a control character or a non-ASCII character";
  throw new Refusal(
    "invalid_request",
    `${from} ${problem}: a session key is 1–${MAX_SESSION_ID_LENGTH} printable ASCII characters without spaces`,
    { param: from },
  );
}

/**
 * Reads what a call says about its session. `header` reads one header by its lower-case name
 * (undefined when absent); `first` names headers read before the standard list (NATS's
 * `Sluice-Session`); `body` is the call's JSON body, `fallback` a body-level key read after
 * `metadata.session_id` (the Responses API's `conversation`). A header present counts even when
 * empty: an empty key is refused, not skipped. `user` and `safety_identifier` are never keys.
 */
export function readSessionKey(
  header: (name: string) => string | undefined,
  options: { body?: unknown; first?: readonly string[]; fallback?: { from: string; key: string } } = {},
): SessionKeyRead {
  const read: SessionKeyRead = { source: "none", final: finalOf(header(FINAL_HEADER)) };
  for (const name of [...(options.first ?? []), ...SESSION_HEADERS]) {
    const value = header(name);
    if (value === undefined) continue;
    const key = checkSessionKey(value.trim() === "" ? "" : value.trim(), name);
    read.source = "header";
    read.from = name;
    read.key = key;
    if (name === "x-claude-code-session-id") {
      const agent = header(CLAUDE_CODE_AGENT_HEADER);
      if (agent !== undefined) {
        const child = `${key}/${checkSessionKey(agent.trim(), CLAUDE_CODE_AGENT_HEADER)}`;
        read.key = checkSessionKey(child, `${name}/${CLAUDE_CODE_AGENT_HEADER}`);
        read.parent = key;
      }
    }
    break;
  }
  const body = isRecord(options.body) ? options.body : undefined;
  if (read.key === undefined && body && isRecord(body.metadata) && body.metadata.session_id !== undefined) {
    read.key = checkSessionKey(body.metadata.session_id, "metadata.session_id");
    read.source = "body";
    read.from = "metadata.session_id";
  }
  if (read.key === undefined && options.fallback) {
    read.key = checkSessionKey(options.fallback.key, options.fallback.from);
    read.source = "body";
    read.from = options.fallback.from;
  }
  for (const name of PARENT_HEADERS) {
    const value = header(name);
    if (value === undefined) continue;
    read.parent = checkSessionKey(value.trim(), name);
    break;
  }
  if (read.parent !== undefined && (read.key === undefined || read.parent === read.key)) delete read.parent;
  const hint = cacheHintOf(body);
  if (hint !== undefined) read.cacheHint = hint;
  return read;
}

/** A body's `prompt_cache_key` as a placement hint: a non-empty string within {@link MAX_CACHE_HINT_LENGTH}. */
export function cacheHintOf(body: { prompt_cache_key?: unknown } | undefined): string | undefined {
  const hint = body?.prompt_cache_key;
  return typeof hint === "string" && hint !== "" && hint.length <= MAX_CACHE_HINT_LENGTH ? hint : undefined;
}

/** `x-dynamo-session-final`: `true` or `false` in any case (absent is false); anything else is a 400. */
function finalOf(value: string | undefined): boolean {
  if (value === undefined) return false;
  const flag = value.trim().toLowerCase();
  if (flag === "true") return true;
  if (flag === "false") return false;
  throw new Refusal(
    "invalid_request",
    `${FINAL_HEADER} must be "true" or "false", got ${JSON.stringify(value)}`,
    {
      param: FINAL_HEADER,
    },
  );
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
