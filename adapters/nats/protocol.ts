/**
 * @module The NATS API's names (docs/nats.md): subjects, headers, and how ids that
 * are not valid subject tokens or KV keys are written into them. Shared by the
 * service, the shared state and the client so both ends spell them alike.
 */

/** Subject prefix of every endpoint. */
export const SUBJECT_PREFIX = "sluice.v1";

/** Endpoint subjects. */
export const SUBJECTS = {
  chat: `${SUBJECT_PREFIX}.chat`,
  responses: `${SUBJECT_PREFIX}.responses`,
  sessionsOpen: `${SUBJECT_PREFIX}.sessions.open`,
  sessionsClose: `${SUBJECT_PREFIX}.sessions.close`,
  sessionsGet: `${SUBJECT_PREFIX}.sessions.get`,
} as const;

/** Request and reply headers (NATS headers are case-sensitive; these are the canonical spellings). */
export const HEADERS = {
  session: "Sluice-Session",
  /** On a reply: where the session the call was counted in came from, `header`, `body`, `inferred` or `none` (as HTTP's `x-sluice-session-source`). */
  sessionSource: "Sluice-Session-Source",
  lane: "Sluice-Lane",
  requestId: "Sluice-Request-Id",
  deadlineMs: "Sluice-Deadline-Ms",
  /** How long the requester expects to be away after this step, ms (a retention hint, docs/how-it-works.md#session-window-tokens-of-cache-footprint). */
  expectedIdleMs: "Sluice-Expected-Idle-Ms",
  /** The longest the call may wait in a sluice queue, ms: it only shortens the lane's residence time. */
  queueTtlMs: "Sluice-Queue-Ttl-Ms",
  stream: "Sluice-Stream",
  done: "Sluice-Done",
  /**
   * Asked by the requester: send an empty heartbeat message (header
   * `Sluice-Heartbeat: true`) to the reply subject this often while the call
   * runs, ms, so a requester learns of a dead frontend long before its timeout.
   */
  heartbeatMs: "Sluice-Heartbeat-Ms",
  /** Marks a heartbeat message (no payload; not a reply). */
  heartbeat: "Sluice-Heartbeat",
  /** How long the requester waits for the whole call, ms; the service cancels the call after it. */
  timeoutMs: "Sluice-Timeout-Ms",
  replica: "Sluice-Replica",
  queueMs: "Sluice-Queue-Ms",
  retryAfter: "Retry-After",
  /**
   * Set by a frontend forwarding an HTTP `GET`/`DELETE` of a session to its holder: the tenant the
   * session belongs to (a client's own copy of it is dropped when a request is handed over).
   */
  tenant: "Sluice-Tenant",
  /** Set on a request one frontend hands to the frontend that holds its session (never forwarded twice). */
  forwardedBy: "Sluice-Forwarded-By",
  event: "Sluice-Event",
  serviceError: "Nats-Service-Error",
  serviceErrorCode: "Nats-Service-Error-Code",
} as const;

/** Prefix of the session event subjects: `sluice.v1.events.session.<id>`. */
export const SESSION_EVENTS_PREFIX = `${SUBJECT_PREFIX}.events.session`;

/** What one frontend answers on its own subjects (requests handed over by other frontends, and a liveness ping). */
export type FrontendRequestKind =
  | "chat"
  | "responses"
  | "sessions.open"
  | "sessions.close"
  | "sessions.get"
  | "sessions.release"
  | "ping";

/** Subject prefix only one frontend listens on: `sluice.v1.frontends.<id>`. */
export function frontendSubjectBase(frontendId: string): string {
  return `${SUBJECT_PREFIX}.frontends.${subjectToken(frontendId)}`;
}

/** Subject of one kind of request to one frontend. */
export function frontendSubject(frontendId: string, kind: FrontendRequestKind): string {
  return `${frontendSubjectBase(frontendId)}.${kind}`;
}

/**
 * An id written as one subject token. Ids are printable ASCII; the three
 * characters a token cannot hold (`.`, `*`, `>`) and `%` itself are
 * percent-encoded, so ordinary ids (uuids, `sess-…`) appear unchanged.
 */
export function subjectToken(id: string): string {
  return id.replace(/[%.*>\s]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, "0")}`);
}

/** The subject a session's state changes are published on. */
export function sessionEventSubject(sessionId: string): string {
  return `${SESSION_EVENTS_PREFIX}.${subjectToken(sessionId)}`;
}

const PLAIN_KEY = /^[-_a-zA-Z0-9]+$/;

/**
 * An id as a JetStream KV key. Keys allow only `[-/_=.a-zA-Z0-9]`: ids made of
 * `[-_a-zA-Z0-9]` are used as they are (readable in `nats kv get`); any other
 * id becomes `=` + base64url of its UTF-8 bytes, which no plain id can collide with.
 */
export function kvKey(id: string): string {
  if (PLAIN_KEY.test(id)) return id;
  return `=${Buffer.from(id, "utf8").toString("base64url")}`;
}

/** Inverse of {@link kvKey}. */
export function idFromKvKey(key: string): string {
  return key.startsWith("=") ? Buffer.from(key.slice(1), "base64url").toString("utf8") : key;
}
