/**
 * @module One session, one holder, whichever frontend an HTTP request
 * reaches. Wraps the HTTP app's `fetch` of a frontend in a fleet: a step of a
 * session another frontend holds takes the session over (the holder hands it
 * over once its running step ends: history, replica and window place move
 * together, never a second copy); `GET` and `DELETE /v1/sessions/:id` for a
 * session held elsewhere are answered by its holder over NATS. The session
 * directory (JetStream KV `sluice-sessions`) says who holds what.
 */

import type { NatsConnection } from "nats";
import { headers as natsHeaders } from "nats";
import { Refusal, renderRefusal } from "../../src/errors.js";
import { isSessionId } from "../../src/sessions/session-id.js";
import { scopedSessionId } from "../../src/sessions/session-scope.js";
import { DEFAULT_TENANT } from "../../src/tenants/tenant-ledger.js";
import { DEFAULT_BODY_LIMIT_BYTES, readBodyText } from "../http/read-body.js";
import { conversationKeyOf } from "../openai-api/responses-input.js";
import { readSessionKey } from "../openai-api/session-key.js";
import { frontendSubject, HEADERS } from "./protocol.js";
import type { Handover, KvSessionDirectory, TakeoverAnswer } from "./session-directory.js";

const SESSION_PATH = /^\/v1\/sessions\/([^/]+)$/;
const SESSION_STEP_PATH = /^\/v1\/sessions\/([^/]+)\/chat\/completions$/;
const STEP_PATHS = new Set(["/v1/chat/completions", "/v1/completions", "/v1/responses"]);

/** What the wrapper needs from the scheduler. */
export interface FleetSessionScheduler {
  getSession(id: string): { state: string } | undefined;
  adoptSession(id: string, from: Handover): unknown;
}

/** Options of {@link fleetSessionsFetch}. */
export interface FleetSessionsOptions {
  scheduler: FleetSessionScheduler;
  directory: KvSessionDirectory;
  nc: NatsConnection;
  /** Longest a hand-over request waits for the holder (which waits for a running step first), ms. Default 12000. */
  releaseTimeoutMs?: number;
  /** Largest body read to find a session key the headers do not give (the app's own limit). Default the app's default. */
  bodyLimitBytes?: number;
  /** Longest a `GET`/`DELETE` forwarded to the holder waits, ms. Default 2000. */
  forwardTimeoutMs?: number;
  /** A session was taken over and its step is about to wait for a window place here. */
  onAdopted?: () => void;
  /**
   * The tenant of a request (its API key's; undefined for none or an unknown key, which the app
   * refuses). Sessions are their tenant's: the directory knows them by their tenant-scoped id.
   */
  tenantOf?: (request: Request) => string | undefined;
}

type Fetch = (request: Request, ...rest: never[]) => Response | Promise<Response>;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function decodeSegment(segment: string): string | undefined {
  try {
    return decodeURIComponent(segment);
  } catch {
    return undefined;
  }
}

/**
 * What a request's path and headers say about the session a step belongs to: its key, or
 * `undefined` (not a step, or no key there), or `body` when only the body can tell (a step
 * path whose headers name no session).
 */
function stepSessionOf(request: Request, path: string): string | "body" | undefined {
  if (request.method !== "POST") return undefined;
  const inPath = SESSION_STEP_PATH.exec(path);
  if (inPath) return decodeSegment(inPath[1]!);
  if (!STEP_PATHS.has(path)) return undefined;
  // An invalid key is left to the app, which refuses it naming the header.
  try {
    return readSessionKey((name) => request.headers.get(name) ?? undefined).key ?? "body";
  } catch {
    return undefined;
  }
}

/** The session key a step's body names (`metadata.session_id`, a Responses API `conversation`), if any. */
function bodySessionOf(request: Request, path: string, text: string): string | undefined {
  try {
    const body = JSON.parse(text) as unknown;
    if (body === null || typeof body !== "object") return undefined;
    const conversation = path === "/v1/responses" ? conversationKeyOf(body) : undefined;
    return readSessionKey((name) => request.headers.get(name) ?? undefined, {
      body,
      ...(conversation !== undefined ? { fallback: { from: "conversation", key: conversation } } : {}),
    }).key;
  } catch {
    // Not JSON, or an odd key: the app refuses it with the error that names it.
    return undefined;
  }
}

/** The `id` a `POST /v1/sessions` body asks for (small bodies only; the app validates it). */
async function requestedSessionId(request: Request): Promise<string | undefined> {
  const length = Number(request.headers.get("content-length") ?? "0");
  if (!(length > 0 && length <= 65_536)) return undefined;
  try {
    const id = (JSON.parse(await request.clone().text()) as { id?: unknown } | null)?.id;
    return isSessionId(id) ? id : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The server's per-request environment without the Node request stream, so the app reads the
 * body from the request it is handed (the stream was read already).
 */
function withoutIncoming(env: unknown): unknown {
  if (env === null || typeof env !== "object" || !("incoming" in env)) return env;
  const { incoming: _spent, ...rest } = env as Record<string, unknown>;
  return rest;
}

function refusalResponse(refusal: Refusal, requestId: string): Response {
  const rendered = renderRefusal(refusal, requestId);
  return new Response(JSON.stringify(rendered.body), {
    status: rendered.status,
    headers: { "content-type": "application/json", ...rendered.headers },
  });
}

/**
 * Wraps a frontend's HTTP `fetch` so sessions behave as one fleet-wide:
 * behind a plain (non-sticky) load balancer, any frontend serves any step.
 */
export function fleetSessionsFetch<F extends Fetch>(fetch: F, options: FleetSessionsOptions): F {
  const { scheduler, directory, nc } = options;
  const releaseTimeoutMs = options.releaseTimeoutMs ?? 12_000;
  const bodyLimitBytes = options.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES;
  const forwardTimeoutMs = options.forwardTimeoutMs ?? 2000;
  // One take-over per session at a time: concurrent steps of it wait for the first.
  const takingOver = new Map<string, Promise<Handover | "busy" | undefined>>();

  // A request that fails throws: the directory's one rule tells a gone holder from a slow one.
  const release = async (owner: string, id: string): Promise<TakeoverAnswer> => {
    const reply = await nc.request(
      frontendSubject(owner, "sessions.release"),
      encoder.encode(JSON.stringify({ id })),
      { timeout: releaseTimeoutMs },
    );
    if (reply.headers?.get(HEADERS.serviceErrorCode)) return { kind: "not-held" };
    const body = JSON.parse(decoder.decode(reply.data)) as {
      status?: string;
      handover?: Handover;
    };
    if (body.status === "released" && body.handover) return { kind: "released", handover: body.handover };
    if (body.status === "busy") return { kind: "busy" };
    return { kind: "not-held" };
  };

  const takeOver = (id: string) => {
    let running = takingOver.get(id);
    if (!running) {
      running = directory.takeOver(id, release).finally(() => takingOver.delete(id));
      takingOver.set(id, running);
    }
    return running;
  };

  /** Makes this frontend the session's holder; false while a step of it still runs at its holder. */
  const ensureHeld = async (id: string): Promise<boolean> => {
    const local = scheduler.getSession(id);
    if (local && local.state !== "closed") return true;
    const moved = await takeOver(id);
    if (moved === "busy") return false;
    const again = scheduler.getSession(id);
    if (moved && (!again || again.state === "closed")) {
      scheduler.adoptSession(id, moved);
      options.onAdopted?.();
    }
    return true;
  };

  /** `GET`/`DELETE` a session held by another frontend: its holder answers; a holder gone leaves the record. */
  const forward = async (
    method: "GET" | "DELETE",
    id: string,
    tenant: string | undefined,
  ): Promise<Response | undefined> => {
    const scoped = scopedSessionId(id, tenant);
    const record = await directory.read(scoped);
    if (!record || record.frontend === directory.frontendId) return undefined;
    const kind = method === "GET" ? "sessions.get" : "sessions.close";
    try {
      const hdrs = natsHeaders();
      hdrs.set(HEADERS.tenant, tenant ?? DEFAULT_TENANT);
      const reply = await nc.request(
        frontendSubject(record.frontend, kind),
        encoder.encode(JSON.stringify({ id })),
        {
          timeout: forwardTimeoutMs,
          headers: hdrs,
        },
      );
      const status = reply.headers?.get(HEADERS.serviceErrorCode);
      if (status) {
        const headers: Record<string, string> = { "content-type": "application/json" };
        const retryAfter = reply.headers?.get(HEADERS.retryAfter);
        if (retryAfter) headers["retry-after"] = retryAfter;
        return new Response(decoder.decode(reply.data), { status: Number(status), headers });
      }
      if (method === "DELETE") return new Response(null, { status: 204 });
      return new Response(decoder.decode(reply.data), {
        status: 200,
        headers: { "content-type": "application/json" },
      });
    } catch {
      // The holder is gone: the record is all that is left of the session.
      if (record.state === "closed" && method === "DELETE") return undefined;
      if (method === "DELETE") {
        directory.record(scoped, "closed", record.replica, {
          steps: record.steps ?? 0,
          tokens: record.tokens ?? 0,
        });
        await directory.flush();
        return new Response(null, { status: 204 });
      }
      return Response.json({
        id,
        state: record.state,
        replica: record.replica,
        steps: record.steps ?? 0,
        tokens: record.tokens ?? 0,
      });
    }
  };

  const wrapped = async (received: Request, ...receivedRest: never[]): Promise<Response> => {
    let request = received;
    let rest = receivedRest;
    const path = new URL(request.url).pathname;
    const requestId = request.headers.get("x-request-id") ?? "";
    const tenant = options.tenantOf?.(request);
    let stepKey = stepSessionOf(request, path);
    if (stepKey === "body") {
      // Only the body names this step's session: read it here (within the app's limit), and hand the
      // app the text read, since the request's own stream is spent.
      let text: string;
      try {
        text = await readBodyText(request, bodyLimitBytes);
      } catch (err) {
        if (err instanceof Refusal) return refusalResponse(err, requestId);
        throw err;
      }
      stepKey = bodySessionOf(request, path, text);
      request = new Request(request, { body: text });
      rest = rest.map((env) => withoutIncoming(env)) as never[];
    }
    const stepSession = stepKey === undefined ? undefined : scopedSessionId(stepKey, tenant);
    if (stepSession !== undefined) {
      let held: boolean;
      try {
        held = await ensureHeld(stepSession);
      } catch (err) {
        if (err instanceof Refusal) return refusalResponse(err, requestId);
        throw err;
      }
      if (!held) {
        return refusalResponse(
          new Refusal("unavailable", "a step of this session is still running on another sluice frontend", {
            retryAfterSeconds: 1,
            scope: "fleet",
          }),
          requestId,
        );
      }
      return fetch(request, ...rest);
    }
    if (request.method === "POST" && path === "/v1/sessions") {
      // Opened with an id another frontend holds: take it over first, so this is its one copy.
      const askedKey = await requestedSessionId(request);
      const asked = askedKey === undefined ? undefined : scopedSessionId(askedKey, tenant);
      if (asked !== undefined) {
        try {
          await ensureHeld(asked);
        } catch (err) {
          if (err instanceof Refusal) return refusalResponse(err, requestId);
          throw err;
        }
      }
      const response = await fetch(request, ...rest);
      if (response.status !== 201 || asked !== undefined) return response;
      // A new id: the directory says where it lives at once, so its first step finds it from any frontend.
      const text = await response.text();
      const id = (JSON.parse(text) as { id?: unknown }).id;
      // A directory too slow to settle the claim now still gets this frontend's write behind (its session events).
      if (typeof id === "string") await takeOver(scopedSessionId(id, tenant)).catch(() => undefined);
      return new Response(text, response);
    }
    const sessionPath = SESSION_PATH.exec(path);
    if (sessionPath && (request.method === "GET" || request.method === "DELETE")) {
      const id = decodeSegment(sessionPath[1]!);
      const response = await fetch(request, ...rest);
      if (id === undefined) return response;
      // Only what this frontend does not hold goes further (authentication and validation passed here):
      // an unknown session, or one closed here because it was handed to another frontend.
      const closedHere =
        response.status === 200 && scheduler.getSession(scopedSessionId(id, tenant))?.state === "closed";
      if (response.status !== 404 && !closedHere) return response;
      const text = await response.text();
      if (response.status === 404 && !text.includes("session_not_found")) return new Response(text, response);
      const answered = await forward(request.method, id, tenant);
      return answered ?? new Response(text, response);
    }
    return fetch(request, ...rest);
  };
  return wrapped as unknown as F;
}
