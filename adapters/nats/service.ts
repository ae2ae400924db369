/**
 * @module The NATS API of docs/nats.md on the services framework: `sluice.v1.chat`
 * (a step of a tool-call loop, whole or streamed one message per chunk) and
 * `sluice.v1.sessions.open|close|get`, discoverable through `$SRV.PING`,
 * `$SRV.INFO` and `$SRV.STATS`. Every instance joins one queue group, so
 * several frontends share the load; a step of a session another frontend
 * holds is handed to that frontend (the reply still goes straight to the
 * requester). Refusals are service errors carrying the docs/http-api.md envelope.
 */

import {
  headers as createHeaders,
  Empty,
  ErrorCode,
  Events,
  Match,
  type MsgHdrs,
  type NatsConnection,
  type NatsError,
  type Service,
  type ServiceMsg,
} from "nats";
import type { EngineChunk, EngineResult } from "../../src/engine.js";
import { Refusal, renderRefusal, toRefusal } from "../../src/errors.js";
import { isSessionId } from "../../src/sessions/session-id.js";
import { scopedSessionId, unscopeSessionId } from "../../src/sessions/session-scope.js";
import { DEFAULT_TENANT } from "../../src/tenants/tenant-ledger.js";
import type {
  AdmittedCall,
  CallRequest,
  LaneClass,
  OpenSessionInit,
  SchedulerEvents,
  SessionView,
} from "../../src/types.js";
import { DEFAULT_BODY_LIMIT_BYTES, jsonDepthExceeds, MAX_JSON_DEPTH } from "../http/read-body.js";
import { declaredLaneOf, expectedIdleMsOf, positiveMsOf, queueTtlMsOf } from "../openai-api/call-headers.js";
import { buildCallRequest, callBodyOf, responseContextOf } from "../openai-api/call-request.js";
import { collectCall, collectRaw } from "../openai-api/call-response.js";
import { deltaChunk, finishChunk, type ResponseContext, usageChunk } from "../openai-api/openai-format.js";
import { sanitizeRequestId } from "../openai-api/request-id.js";
import { openSessionBodySchema, parseBody } from "../openai-api/schemas.js";
import { readSessionKey } from "../openai-api/session-key.js";
import {
  type FrontendRequestKind,
  frontendSubject,
  frontendSubjectBase,
  HEADERS,
  SUBJECTS,
  sessionEventSubject,
} from "./protocol.js";
import type { Handover, SessionRouter } from "./session-directory.js";

export type { SessionRoute, SessionRouter } from "./session-directory.js";

/** What the NATS service needs from the scheduler (`src/scheduler.ts` provides it). */
export interface NatsServiceScheduler {
  submit(req: CallRequest): Promise<AdmittedCall>;
  openSession(init: OpenSessionInit): SessionView;
  /** The session `id` names for `tenant`; without one, `id` is the scheduler's scoped id. */
  getSession(id: string, tenant?: string): SessionView | undefined;
  closeSession(id: string, tenant?: string): boolean;
  models(): string[];
  addEvents(events: SchedulerEvents): void;
  /** Scale-out hand-over of a session to another frontend (see `Scheduler.releaseSession`). */
  releaseSession?(id: string): Handover | "busy" | undefined;
}

/** Options of {@link startNatsService}. */
export interface NatsServiceOptions {
  nc: NatsConnection;
  scheduler: NatsServiceScheduler;
  /** Service name (`$SRV.INFO.<name>`). Default "sluice". */
  name?: string;
  /** Queue group of every endpoint; instances with the same one share the load. Default "sluice". */
  queue?: string;
  /** Service version (semver). Default "0.1.0". */
  version?: string;
  /** Largest request payload, bytes. Default 4 MiB (the server's `max_payload` usually bounds it first). */
  bodyLimitBytes?: number;
  /**
   * Longest a call may hold its permit when the requester states no
   * `Sluice-Timeout-Ms`, ms; a stated timeout is capped at it. Default 600000.
   */
  callTimeoutMs?: number;
  /**
   * Streamed chunks are sent as requests (answered by nobody) at most this
   * often, ms, so a requester whose inbox is gone shows up as "no responders"
   * and its call is cancelled. Default 200.
   */
  probeIntervalMs?: number;
  /** This frontend's id (its own subject for handed-over steps). Default: none (no hand-over). */
  frontendId?: string;
  /** Keeps sessions on the frontend that holds them. Needs `frontendId`. */
  router?: SessionRouter;
  /**
   * How long a hand-over request waits for a step of the session running
   * here to end before answering "busy", ms. Default 10000.
   */
  releaseWaitMs?: number;
  /** Publishes session state changes on `sluice.v1.events.session.<id>`. Default true. */
  publishEvents?: boolean;
  /**
   * API keys, as over HTTP: when given (and not empty), every request carries `Authorization: Bearer KEY`
   * and belongs to that key's tenant; a session of one tenant is unknown to every other.
   */
  keys?: NatsApiKeys;
  /** Refusals decided here rather than in the scheduler (bad JSON, schema), for the metrics. */
  onRefusal?: (e: { reason: string; lane: LaneClass | undefined; status: number }) => void;
}

/** What the service needs of the API keys (`adapters/http/api-keys.ts` provides it). */
export interface NatsApiKeys {
  readonly size: number;
  lookup(presented: string): { tenant: string; priority: number; admin: boolean } | undefined;
}

/** Who sent a request: its key's tenant, priority and admin right (the `default` tenant without keys). */
interface Caller {
  tenant: string;
  priority?: number;
  admin: boolean;
}

/** A running NATS service. */
export interface NatsService {
  readonly service: Service;
  /** Calls from arrival to their last reply message. */
  readonly inFlight: number;
  /**
   * Graceful stop: leaves the queue group at once (so new requests go to the
   * other instances; those already delivered here are still served), lets
   * calls in flight finish for up to `timeoutMs`, then cancels the rest, each
   * answered with a 503 `unavailable` error (and `Sluice-Done` on a stream).
   * Idempotent; resolves once every call got its last message.
   */
  drain(timeoutMs: number): Promise<void>;
  /**
   * The first half of `drain`: leaves the queue group and resolves once every
   * request already delivered here reached the scheduler (bounded), so the
   * scheduler may then refuse new work without refusing those.
   */
  leave(): Promise<void>;
  /** `drain(0)`: stops taking requests and cancels calls in flight, each answered. Idempotent. */
  stop(): Promise<void>;
}

/** The call endpoints the NATS API serves (completions are HTTP only). */
type NatsCallEndpoint = "chat" | "responses";

/** Shortest heartbeat interval a requester may ask for, ms. */
export const MIN_HEARTBEAT_MS = 100;
/** Longest a cancelled call may take to send its last message during a stop, ms. */
const CANCEL_GRACE_MS = 2000;
/** Longest leaving the queue group may take (a connection down can hold a subscription's drain), ms. */
const LEAVE_TIMEOUT_MS = 2000;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function positiveOption(name: string, value: number): number {
  if (!(Number.isFinite(value) && value > 0))
    throw new RangeError(`${name} must be a positive number, got ${value}`);
  return value;
}

function headerOf(msg: ServiceMsg, name: string): string | undefined {
  const value = msg.headers?.get(name);
  return value === undefined || value === "" ? undefined : value;
}

function isTrue(value: string | undefined): boolean {
  return value !== undefined && /^(true|1|yes)$/i.test(value.trim());
}

/** A request header by name in any case, `undefined` only when absent (an empty value is present). */
function anyCaseHeader(msg: ServiceMsg, name: string): string | undefined {
  const hdrs = msg.headers;
  if (!hdrs?.has(name, Match.IgnoreCase)) return undefined;
  return hdrs.get(name, Match.IgnoreCase);
}

/** The caller of a request; with keys, a missing or unknown `Authorization: Bearer KEY` is a 401. */
function callerOf(msg: ServiceMsg, keys: NatsApiKeys | undefined): Caller {
  if (!keys || keys.size === 0) return { tenant: DEFAULT_TENANT, admin: false };
  const header = anyCaseHeader(msg, "authorization")?.trim();
  const presented = header ? /^Bearer\s+(.+)$/i.exec(header)?.[1]?.trim() : undefined;
  const identity = presented ? keys.lookup(presented) : undefined;
  if (!identity) {
    throw new Refusal(
      "unauthorized",
      "missing or unknown API key: send the header Authorization: Bearer KEY",
    );
  }
  return { tenant: identity.tenant, priority: identity.priority, admin: identity.admin };
}

function parseJson(data: Uint8Array, limitBytes: number, emptyAs?: unknown): unknown {
  if (data.byteLength > limitBytes) {
    throw new Refusal(
      "body_too_large",
      `request payload of ${data.byteLength} bytes exceeds the ${limitBytes}-byte limit`,
    );
  }
  const text = decoder.decode(data);
  if (text.trim() === "") {
    if (emptyAs !== undefined) return emptyAs;
    throw new Refusal("invalid_request", "request payload is empty; expected a JSON object");
  }
  if (jsonDepthExceeds(text, MAX_JSON_DEPTH)) {
    throw new Refusal(
      "invalid_request",
      `request payload nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels`,
    );
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Refusal("invalid_request", `request payload is not valid JSON: ${(err as Error).message}`);
  }
}

/** `{ "id": "…" }` of the session endpoints (an admin may add `"tenant"`). */
function sessionIdBody(data: Uint8Array, limitBytes: number): { id: string; tenant?: string } {
  const json = parseJson(data, limitBytes);
  const id = (json as { id?: unknown } | null)?.id;
  if (typeof json !== "object" || json === null || typeof id !== "string" || id.length === 0) {
    throw new Refusal("invalid_request", 'expected a JSON object { "id": "<session id>" }', { param: "id" });
  }
  const tenant = (json as { tenant?: unknown }).tenant;
  return typeof tenant === "string" ? { id, tenant } : { id };
}

/** The OpenAI chunk objects carried by one engine chunk: the upstream's own events, or one formatted from text. */
function chunkObjects(chunk: EngineChunk, ctx: ResponseContext, first: boolean): unknown[] {
  const event = (chunk as EngineChunk & { event?: unknown }).event;
  if (event !== undefined) return [event];
  if (chunk.raw) {
    const out: unknown[] = [];
    for (const line of decoder.decode(chunk.raw).split(/\r?\n/)) {
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "" || data === "[DONE]") continue;
      try {
        out.push(JSON.parse(data));
      } catch {
        // An upstream event that is not JSON carries nothing a chunk consumer could read.
      }
    }
    return out;
  }
  // A Responses API stream is the engine's own events only: there is no chunk format to write text in.
  if (ctx.endpoint === "responses" || (chunk.text === "" && !first)) return [];
  return [deltaChunk(ctx, chunk.text, first)];
}

/** Refusal headers: the service error pair, `Retry-After`, the request id and lane. */
function refusalHeaders(
  refusal: Refusal,
  requestId: string,
): { hdrs: MsgHdrs; body: Uint8Array; status: number } {
  const rendered = renderRefusal(refusal, requestId);
  const hdrs = createHeaders();
  hdrs.set(HEADERS.requestId, requestId);
  const retryAfter = rendered.headers["retry-after"];
  if (retryAfter !== undefined) hdrs.set(HEADERS.retryAfter, retryAfter);
  const lane = rendered.headers["x-sluice-lane"];
  if (lane !== undefined) hdrs.set(HEADERS.lane, lane);
  return { hdrs, body: encoder.encode(JSON.stringify(rendered.body)), status: rendered.status };
}

/**
 * Starts the NATS service on `nc` for `scheduler` and, unless told not to,
 * publishes the scheduler's session events. Resolves once every endpoint
 * subscribed.
 */
export async function startNatsService(options: NatsServiceOptions): Promise<NatsService> {
  const { nc, scheduler, router } = options;
  const name = options.name ?? "sluice";
  const queue = options.queue ?? "sluice";
  const bodyLimit = options.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES;
  if (!(Number.isInteger(bodyLimit) && bodyLimit > 0)) {
    throw new RangeError(`bodyLimitBytes must be a positive integer, got ${bodyLimit}`);
  }
  const callTimeoutMs = positiveOption("callTimeoutMs", options.callTimeoutMs ?? 600_000);
  const probeIntervalMs = positiveOption("probeIntervalMs", options.probeIntervalMs ?? 200);
  const frontendId = options.frontendId;
  const releaseWaitMs = positiveOption("releaseWaitMs", options.releaseWaitMs ?? 10_000);
  if (router && frontendId === undefined)
    throw new TypeError("a session router needs a frontendId, got none");

  const stopping = new AbortController();
  let inFlight = 0;
  const idleWaiters: (() => void)[] = [];
  /** Chat requests delivered but not yet handed to the scheduler (a drain waits for them before it refuses). */
  let entering = 0;
  const enteredWaiters: (() => void)[] = [];
  // Reconnects seen, so a probe's "no responders" during one is not taken for a requester gone.
  let reconnects = 0;
  let disconnected = false;
  const connectedNow = () => !disconnected && !nc.isClosed();
  void (async () => {
    for await (const status of nc.status()) {
      if (status.type === Events.Disconnect) {
        disconnected = true;
        reconnects++;
      } else if (status.type === Events.Reconnect) {
        disconnected = false;
        reconnects++;
      }
    }
  })().catch(() => {});
  const refusalCounts: Record<string, number> = {};
  let eventsOn = options.publishEvents ?? true;

  const noteRefusal = (refusal: Refusal, decidedHere: boolean) => {
    refusalCounts[refusal.reason] = (refusalCounts[refusal.reason] ?? 0) + 1;
    if (decidedHere)
      options.onRefusal?.({ reason: refusal.reason, lane: refusal.lane, status: refusal.status });
  };

  /** Answers with a service error; `decidedHere` says the scheduler did not already count it. */
  const respondRefusal = (msg: ServiceMsg, err: unknown, requestId: string, decidedHere: boolean) => {
    const refusal = toRefusal(err);
    noteRefusal(refusal, decidedHere);
    const { hdrs, body, status } = refusalHeaders(refusal, requestId);
    try {
      msg.respondError(status, refusal.reason, body, { headers: hdrs });
    } catch {
      // The connection closed under us; the requester learns from its own timeout.
    }
  };

  const service = await nc.services.add({
    name,
    version: options.version ?? "0.1.0",
    description: "sluice admission scheduler: tool-call loop API (OpenAI chat over NATS) and sessions",
    queue,
    metadata: frontendId === undefined ? {} : { frontend: frontendId },
    statsHandler: async () => ({ in_flight: inFlight, refusals: { ...refusalCounts } }),
  });

  // --- chat --------------------------------------------------------------------------------------

  /** A chat or Responses API call (`sluice.v1.chat`, `sluice.v1.responses`). */
  const handleCall = async (
    msg: ServiceMsg,
    endpoint: NatsCallEndpoint,
    handedOver: boolean,
  ): Promise<void> => {
    const requestId = sanitizeRequestId(headerOf(msg, HEADERS.requestId));
    const reply = msg.reply;
    // A request nobody waits for would run a model call for nobody.
    if (!reply) return;
    inFlight++;
    let admitted: AdmittedCall | undefined;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let decidedHere = true;
    let streamMode = isTrue(headerOf(msg, HEADERS.stream));
    // Heartbeats while the call runs (queued, waiting for a window, or streaming): silence means a dead frontend.
    const heartbeat = startHeartbeat(reply, requestId, headerOf(msg, HEADERS.heartbeatMs));
    entering++;
    let entered = true;
    const passed = () => {
      if (!entered) return;
      entered = false;
      entering--;
      if (entering === 0) for (const wake of enteredWaiters.splice(0)) wake();
    };
    try {
      if (stopping.signal.aborted) {
        throw new Refusal("unavailable", "this sluice instance is shutting down", {
          retryAfterSeconds: 1,
          scope: "fleet",
        });
      }
      const declaredLane = declaredLaneOf(HEADERS.lane, headerOf(msg, HEADERS.lane));
      const deadlineMs = positiveMsOf(HEADERS.deadlineMs, headerOf(msg, HEADERS.deadlineMs));
      const expectedIdleMs = expectedIdleMsOf(HEADERS.expectedIdleMs, headerOf(msg, HEADERS.expectedIdleMs));
      const queueTtlMs = queueTtlMsOf(HEADERS.queueTtlMs, headerOf(msg, HEADERS.queueTtlMs));
      const statedTimeout = positiveMsOf(HEADERS.timeoutMs, headerOf(msg, HEADERS.timeoutMs));
      const caller = callerOf(msg, options.keys);
      const shape = callBodyOf(endpoint, parseJson(msg.data, bodyLimit));
      streamMode = streamMode || shape.stream;
      // `Sluice-Session` first, then the HTTP session headers by the same names, then the body, then a
      // Responses API `conversation`.
      const named = readSessionKey((name) => anyCaseHeader(msg, name), {
        body: shape.body,
        first: [HEADERS.session],
        ...(shape.conversation !== undefined
          ? { fallback: { from: "conversation", key: shape.conversation } }
          : {}),
      });
      const sessionId = named.key;

      if (sessionId !== undefined && router && frontendId !== undefined && !handedOver) {
        // The directory knows sessions by their tenant-scoped id.
        const scoped = scopedSessionId(sessionId, caller.tenant);
        const local = scheduler.getSession(scoped);
        if (!local || local.state === "closed") {
          const route = await router.route(scoped, { claim: true });
          if (route.owner === "other") {
            // The owner answers (and beats) from here on.
            heartbeat.stop();
            handOver(msg, route.frontendId, endpoint);
            return;
          }
        }
      }

      const timeoutMs = Math.min(statedTimeout ?? callTimeoutMs, callTimeoutMs);
      const gone = new AbortController();
      // One timer per call, cleared when the call ends (AbortSignal.timeout would linger for the whole timeout).
      timer = setTimeout(
        () => gone.abort(new DOMException(`the requester's ${timeoutMs} ms timeout passed`, "TimeoutError")),
        timeoutMs,
      );
      const signal = AbortSignal.any([stopping.signal, gone.signal]);
      const keyed = options.keys !== undefined && options.keys.size > 0;
      const req = buildCallRequest({
        requestId,
        endpoint,
        shape,
        signal,
        stream: streamMode,
        sessionId,
        named,
        options: { declaredLane, deadlineMs, expectedIdleMs, queueTtlMs },
        tenant: keyed ? caller.tenant : undefined,
        priority: keyed ? caller.priority : undefined,
      });

      try {
        // The scheduler decides at once whether it still takes calls; past this line a drain lets it run.
        const submitted = scheduler.submit(req);
        passed();
        admitted = await submitted;
      } catch (err) {
        // The scheduler counts its own refusals through its events.
        decidedHere = false;
        throw err;
      }
      const call = admitted;
      const onAbort = () => call.cancel();
      signal.addEventListener("abort", onAbort, { once: true });
      if (signal.aborted) onAbort();
      try {
        const ctx = responseContextOf(endpoint, requestId, shape.model ?? scheduler.models()[0] ?? "unknown");
        const meta = createHeaders();
        meta.set(HEADERS.requestId, requestId);
        meta.set(HEADERS.lane, call.lane);
        meta.set(HEADERS.replica, call.replica);
        meta.set(HEADERS.queueMs, String(Math.round(call.queueMs)));
        // The session the call was counted in: its key's, an inferred one, or the one the response it continues ran in.
        if (call.sessionId !== undefined) {
          meta.set(HEADERS.session, call.sessionId);
          meta.set(
            HEADERS.sessionSource,
            call.sessionInferred ? "inferred" : named.source === "none" ? "body" : named.source,
          );
        } else meta.set(HEADERS.sessionSource, "none");
        if (streamMode) {
          await streamCall(call, reply, ctx, meta, shape.includeUsage, gone, requestId);
        } else {
          let payload: Uint8Array;
          try {
            // The Responses API's body is the engine's own, byte for byte.
            payload =
              endpoint === "responses"
                ? await collectRaw(call)
                : encoder.encode(JSON.stringify(await collectCall({ call, ctx })));
          } catch (err) {
            throw toRefusal(err).with({ lane: call.lane });
          }
          msg.respond(payload, { headers: meta });
        }
      } finally {
        signal.removeEventListener("abort", onAbort);
      }
    } catch (err) {
      heartbeat.stop();
      respondRefusal(msg, err, requestId, decidedHere);
      if (streamMode) sendDone(reply, requestId);
    } finally {
      passed();
      heartbeat.stop();
      clearTimeout(timer);
      inFlight--;
      if (inFlight === 0) for (const wake of idleWaiters.splice(0)) wake();
    }
  };

  /** Beats on the reply subject every `Sluice-Heartbeat-Ms` (when asked) until stopped. */
  const startHeartbeat = (reply: string, requestId: string, asked: string | undefined) => {
    const ms = asked === undefined ? Number.NaN : Number(asked.trim());
    if (!(Number.isFinite(ms) && ms > 0)) return { stop() {} };
    const hdrs = createHeaders();
    hdrs.set(HEADERS.heartbeat, "true");
    hdrs.set(HEADERS.requestId, requestId);
    const beat = setInterval(
      () => {
        try {
          if (!nc.isClosed()) nc.publish(reply, Empty, { headers: hdrs });
        } catch {
          // Connection closed: the requester's own liveness check ends its wait.
        }
      },
      Math.max(MIN_HEARTBEAT_MS, ms),
    );
    beat.unref?.();
    return { stop: () => clearInterval(beat) };
  };

  const sendDone = (reply: string, requestId: string) => {
    const hdrs = createHeaders();
    hdrs.set(HEADERS.done, "true");
    hdrs.set(HEADERS.requestId, requestId);
    try {
      nc.publish(reply, Empty, { headers: hdrs });
    } catch {
      // Connection closed: nothing more can reach the requester.
    }
  };

  /**
   * Sends one message per chunk. Every `probeIntervalMs` a chunk goes out as
   * a request instead: when the requester's inbox is gone the server answers
   * "no responders" and the call is cancelled, releasing its permit; a live
   * requester simply does not answer.
   */
  const streamCall = async (
    call: AdmittedCall,
    reply: string,
    ctx: ResponseContext,
    meta: MsgHdrs,
    includeUsage: boolean,
    gone: AbortController,
    requestId: string,
  ): Promise<void> => {
    call.result.catch(() => {});
    let first = true;
    let sawRaw = false;
    let lastProbe = Number.NEGATIVE_INFINITY;
    let headersSent = false;
    // A "no responders" right after a reconnect can mean the requester's subscription is not back yet:
    // only two in a row, on a connection up the whole time, say its inbox is really gone.
    let missedProbes = 0;
    let reconnectsAtProbe = reconnects;
    const send = (payload: unknown) => {
      const data = encoder.encode(JSON.stringify(payload));
      const opts = headersSent ? {} : { headers: meta };
      headersSent = true;
      const now = performance.now();
      if (now - lastProbe >= probeIntervalMs) {
        lastProbe = now;
        const reconnectsBefore = reconnects;
        nc.request(reply, data, { timeout: Math.max(1000, probeIntervalMs * 5), ...opts }).catch(
          (err: NatsError) => {
            if (err?.code !== ErrorCode.NoResponders) return;
            if (reconnects !== reconnectsBefore || reconnects !== reconnectsAtProbe || !connectedNow()) {
              reconnectsAtProbe = reconnects;
              missedProbes = 0;
              return;
            }
            missedProbes++;
            if (missedProbes >= 2) gone.abort(new Error("the requester's inbox is gone"));
          },
        );
      } else {
        nc.publish(reply, data, opts);
      }
    };
    try {
      for await (const chunk of call) {
        if (gone.signal.aborted) break;
        if (chunk.raw) sawRaw = true;
        for (const object of chunkObjects(chunk, ctx, first)) {
          send(object);
          first = false;
        }
      }
      if (gone.signal.aborted) throw gone.signal.reason;
      const result: EngineResult = await call.result;
      if (!sawRaw && ctx.endpoint !== "responses") {
        send(finishChunk(ctx, result.finishReason));
        if (includeUsage) send(usageChunk(ctx, result));
      }
    } catch (err) {
      // Chunks went out already: the failure travels inside the stream, then the done marker. Even when
      // the requester seems gone it may not be (a reconnect): an error it never reads costs nothing.
      const refusal = (
        gone.signal.aborted || stopping.signal.aborted
          ? new Refusal("unavailable", cancelReason(gone.signal, stopping.signal), {
              retryAfterSeconds: 1,
              scope: "fleet",
            })
          : toRefusal(err)
      ).with({ lane: call.lane });
      noteRefusal(refusal, true);
      const { hdrs, body, status } = refusalHeaders(refusal, requestId);
      hdrs.set(HEADERS.serviceErrorCode, String(status));
      hdrs.set(HEADERS.serviceError, refusal.reason);
      try {
        nc.publish(reply, body, { headers: hdrs });
      } catch {
        // Connection closed.
      }
    }
    sendDone(reply, requestId);
  };

  /** Hands a request to the frontend holding its session; that frontend replies to the requester directly. */
  const handOver = (msg: ServiceMsg, owner: string, kind: FrontendRequestKind) => {
    const hdrs = createHeaders();
    for (const [key, values] of msg.headers ?? []) {
      // Only a frontend names a tenant; a client's own claim to one never travels on.
      if (key.toLowerCase() === HEADERS.tenant.toLowerCase()) continue;
      for (const value of values) hdrs.append(key, value);
    }
    hdrs.set(HEADERS.forwardedBy, frontendId ?? "");
    nc.publish(frontendSubject(owner, kind), msg.data, { reply: msg.reply, headers: hdrs });
  };

  // --- sessions ----------------------------------------------------------------------------------

  const unknownSession = (id: string) =>
    new Refusal("session_not_found", `no session ${JSON.stringify(id)}`, { param: "id" });

  const respondJson = (msg: ServiceMsg, value: unknown, requestId: string) => {
    const hdrs = createHeaders();
    hdrs.set(HEADERS.requestId, requestId);
    msg.respond(encoder.encode(JSON.stringify(value)), { headers: hdrs });
  };

  /** Runs a session request here, or hands it to the frontend holding the session. */
  const sessionRequest = async (
    msg: ServiceMsg,
    kind: "sessions.close" | "sessions.get",
    handedOver: boolean,
    local: (id: string, tenant: string) => unknown,
  ) => {
    const requestId = sanitizeRequestId(headerOf(msg, HEADERS.requestId));
    try {
      const asked = sessionIdBody(msg.data, bodyLimit);
      const id = asked.id;
      // A session is its tenant's: another tenant's key names a session the caller's tenant does not hold.
      // An admin key may name the tenant it means; a peer frontend forwarding an HTTP request names it.
      const peerTenant = handedOver ? anyCaseHeader(msg, HEADERS.tenant) : undefined;
      const caller = peerTenant === undefined ? callerOf(msg, options.keys) : undefined;
      const tenant =
        peerTenant ?? (caller?.admin && asked.tenant !== undefined ? asked.tenant : caller!.tenant);
      if (!isSessionId(id)) throw unknownSession(id);
      const here = scheduler.getSession(id, tenant);
      if ((!here || here.state === "closed") && router && !handedOver) {
        const route = await router.route(scopedSessionId(id, tenant), { claim: false });
        if (route.owner === "other") {
          handOver(msg, route.frontendId, kind);
          return;
        }
      }
      respondJson(msg, local(id, tenant), requestId);
    } catch (err) {
      respondRefusal(msg, err, requestId, true);
    }
  };

  /**
   * Another frontend received a step of a session held here (an HTTP step
   * behind a load balancer): hand it over once no step of it runs here.
   * Answers `{ status: "released", handover }`, `"busy"` or `"not-held"`.
   */
  const handleRelease = async (msg: ServiceMsg) => {
    const requestId = sanitizeRequestId(headerOf(msg, HEADERS.requestId));
    try {
      // Between frontends, sessions are named by their tenant-scoped id.
      const { id } = sessionIdBody(msg.data, bodyLimit);
      const deadline = performance.now() + releaseWaitMs;
      for (;;) {
        const view = scheduler.getSession(id);
        if (!scheduler.releaseSession || !view || view.state === "closed") {
          respondJson(msg, { status: "not-held" }, requestId);
          return;
        }
        if (view.phase !== "active") {
          await router?.prepareRelease?.(id);
          const released = scheduler.releaseSession(id);
          if (released === undefined) {
            respondJson(msg, { status: "not-held" }, requestId);
            return;
          }
          if (released !== "busy") {
            respondJson(msg, { status: "released", handover: released }, requestId);
            return;
          }
          const now = scheduler.getSession(id);
          if (now) router?.cancelRelease?.(id, now);
        }
        if (performance.now() >= deadline || stopping.signal.aborted) {
          respondJson(msg, { status: "busy" }, requestId);
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    } catch (err) {
      respondRefusal(msg, err, requestId, true);
    }
  };

  const closeLocal = (id: string, tenant: string) => {
    if (!scheduler.closeSession(id, tenant)) throw unknownSession(id);
    return { id, state: "closed" };
  };

  const getLocal = (id: string, tenant: string) => {
    const view = scheduler.getSession(id, tenant);
    if (!view) throw unknownSession(id);
    return view;
  };

  const handleOpen = async (msg: ServiceMsg, handedOver: boolean) => {
    const requestId = sanitizeRequestId(headerOf(msg, HEADERS.requestId));
    try {
      if (stopping.signal.aborted) {
        throw new Refusal("unavailable", "this sluice instance is shutting down", {
          retryAfterSeconds: 1,
          scope: "fleet",
        });
      }
      const caller = callerOf(msg, options.keys);
      const body = parseBody(openSessionBodySchema, parseJson(msg.data, bodyLimit, {}));
      const init: OpenSessionInit = { tenant: caller.tenant };
      if (body.id !== undefined) init.id = body.id;
      if (body.lane !== undefined) init.lane = body.lane;
      if (body.metadata !== undefined) init.metadata = body.metadata;
      if (body.id !== undefined && router && !handedOver) {
        const here = scheduler.getSession(body.id, caller.tenant);
        if (!here || here.state === "closed") {
          // Claimed before the reply, so the session's first step finds its frontend whichever instance it reaches.
          const route = await router.route(scopedSessionId(body.id, caller.tenant), { claim: true });
          if (route.owner === "other") {
            handOver(msg, route.frontendId, "sessions.open");
            return;
          }
        }
      }
      const view = scheduler.openSession(init);
      // A directory too slow to settle the claim now still gets this frontend's write behind (its session events).
      if (body.id === undefined && router)
        await router.route(scopedSessionId(view.id, caller.tenant), { claim: true }).catch(() => undefined);
      respondJson(msg, { id: view.id, state: view.state }, requestId);
    } catch (err) {
      respondRefusal(msg, err, requestId, true);
    }
  };

  const group = service.addGroup("sluice.v1");
  group.addEndpoint("chat", {
    subject: SUBJECTS.chat.slice("sluice.v1.".length),
    handler: (_err, msg) => void handleCall(msg, "chat", false),
    metadata: { request: "OpenAI chat completion body", stream: `header ${HEADERS.stream}: true` },
  });
  group.addEndpoint("responses", {
    subject: SUBJECTS.responses.slice("sluice.v1.".length),
    handler: (_err, msg) => void handleCall(msg, "responses", false),
    metadata: { request: "OpenAI Responses API body", stream: `header ${HEADERS.stream}: true` },
  });
  group.addEndpoint("sessions-open", {
    subject: "sessions.open",
    handler: (_err, msg) => void handleOpen(msg, false),
  });
  group.addEndpoint("sessions-close", {
    subject: "sessions.close",
    handler: (_err, msg) => void sessionRequest(msg, "sessions.close", false, closeLocal),
  });
  group.addEndpoint("sessions-get", {
    subject: "sessions.get",
    handler: (_err, msg) => void sessionRequest(msg, "sessions.get", false, getLocal),
  });
  if (frontendId !== undefined) {
    // Requests handed over by other frontends, for sessions this one holds. Its own queue group: only this frontend.
    const base = frontendSubjectBase(frontendId);
    service.addEndpoint("frontend", {
      subject: `${base}.>`,
      queue: `frontend-${frontendId}`,
      handler: (_err, msg) => {
        const kind = msg.subject.slice(base.length + 1);
        if (kind === "chat" || kind === "responses") void handleCall(msg, kind, true);
        else if (kind === "sessions.open") void handleOpen(msg, true);
        else if (kind === "sessions.close") void sessionRequest(msg, "sessions.close", true, closeLocal);
        else if (kind === "sessions.get") void sessionRequest(msg, "sessions.get", true, getLocal);
        else if (kind === "sessions.release") void handleRelease(msg);
        else if (kind === "ping") msg.respond(Empty);
        else
          respondRefusal(
            msg,
            new Refusal("invalid_request", `unknown frontend subject ${msg.subject}`),
            "",
            true,
          );
      },
    });
  }
  // The services framework subscribes when endpoints are added; a flush makes them live before we return.
  await nc.flush();

  if (eventsOn) {
    scheduler.addEvents({
      session(e) {
        if (!eventsOn || nc.isClosed()) return;
        const hdrs = createHeaders();
        hdrs.set(HEADERS.event, e.event);
        // Published under the client's key; the tenant it belongs to is in the payload.
        const { key, tenant } = unscopeSessionId(e.id);
        const payload = { id: key, tenant, event: e.event, replica: e.replica, at: new Date().toISOString() };
        try {
          nc.publish(sessionEventSubject(key), encoder.encode(JSON.stringify(payload)), { headers: hdrs });
        } catch {
          // Events are best effort: a closed connection must never reach the request path.
        }
      },
    });
  }

  let draining: Promise<void> | undefined;
  /** Resolves when no call is in flight, or when `ms` passed. */
  const idle = (ms: number) =>
    new Promise<void>((resolve) => {
      if (inFlight === 0) return resolve();
      const timer = setTimeout(resolve, ms);
      timer.unref?.();
      idleWaiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  let leaving: Promise<void> | undefined;
  /** Leaves the queue group; resolves once every request delivered here reached the scheduler (bounded). */
  const leave = (): Promise<void> => {
    leaving ??= (async () => {
      // Requests not yet delivered go to the other instances, while the subscriptions' drain still hands
      // over every request already delivered here.
      const stopped = service.isStopped ? Promise.resolve() : service.stop().catch(() => null);
      let timer: ReturnType<typeof setTimeout> | undefined;
      const bound = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, LEAVE_TIMEOUT_MS);
        timer.unref?.();
      });
      await Promise.race([
        (async () => {
          await stopped;
          if (entering > 0) await new Promise<void>((resolve) => enteredWaiters.push(resolve));
        })(),
        bound,
      ]);
      clearTimeout(timer);
    })();
    return leaving;
  };
  const drain = (timeoutMs: number): Promise<void> => {
    draining ??= (async () => {
      await Promise.all([leave(), idle(Math.max(0, timeoutMs))]);
      if (inFlight > 0) {
        stopping.abort(
          new Refusal("unavailable", "this sluice instance is shutting down", {
            retryAfterSeconds: 1,
            scope: "fleet",
          }),
        );
        await idle(CANCEL_GRACE_MS);
      } else {
        stopping.abort();
      }
      eventsOn = false;
      if (!nc.isClosed()) await nc.flush().catch(() => undefined);
    })();
    return draining;
  };

  return {
    service,
    get inFlight() {
      return inFlight;
    },
    drain,
    leave,
    stop: () => drain(0),
  };
}

/** Why a stream was cut short, for the error event that ends it. */
function cancelReason(gone: AbortSignal, stopping: AbortSignal): string {
  if (stopping.aborted) return "this sluice instance shut down before the call finished; retry it";
  const reason = gone.reason as Error | undefined;
  return reason?.message ?? "the call was cancelled";
}
