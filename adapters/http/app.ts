/** @module The HTTP API of docs/http-api.md on hono: OpenAI-compatible completions, sessions, admin state, metrics, dashboard. */

import { AsyncLocalStorage } from "node:async_hooks";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Readable } from "node:stream";
import type { Context } from "hono";
import { Hono } from "hono";
import { cors } from "hono/cors";
import { Registry } from "prom-client";
import { followAbort } from "../../src/abort.js";
import { type Clock, realClock } from "../../src/clock.js";
import type { CallEndpoint } from "../../src/engine.js";
import { Refusal, renderRefusal, toRefusal } from "../../src/errors.js";
import { isSessionId } from "../../src/sessions/session-id.js";
import { DEFAULT_TENANT } from "../../src/tenants/tenant-ledger.js";
import type { AdmittedCall, OpenSessionInit } from "../../src/types.js";
import { StateHistory } from "../dashboard/history.js";
import { renderDashboard } from "../dashboard/page.js";
import { type Logger, silentLogger } from "../log/logger.js";
import { AccessLog, operatorEventLog } from "../log/operations-log.js";
import { type CompletedCall, createMetrics, type SluiceMetrics } from "../metrics/metrics.js";
import { declaredLaneOf, expectedIdleMsOf, positiveMsOf, queueTtlMsOf } from "../openai-api/call-headers.js";
import { buildCallRequest, callBodyOf, responseContextOf } from "../openai-api/call-request.js";
import { collectCall, collectRaw, sseStream } from "../openai-api/call-response.js";
import { sanitizeRequestId } from "../openai-api/request-id.js";
import { openSessionBodySchema, parseBody } from "../openai-api/schemas.js";
import { readSessionKey, SESSION_REQUEST_HEADERS, type SessionKeySource } from "../openai-api/session-key.js";
import { type ApiKeys, secretsEqual } from "./api-keys.js";
import { CallTracker } from "./call-tracker.js";
import { lingerThenClose } from "./linger.js";
import type { AppPlugin, AppEnv as Env, RequestFacts } from "./plugin.js";
import { DEFAULT_BODY_LIMIT_BYTES, readJsonBody } from "./read-body.js";
import { adviseRefusal, rateLimitHeaders } from "./refusal-advice.js";
import type { HttpScheduler } from "./scheduler-port.js";

export type { HttpScheduler } from "./scheduler-port.js";

/** Options of `createApp`. */
export interface AppOptions {
  scheduler: HttpScheduler;
  /** Registry `/metrics` serves; a new one when omitted. Ignored when `metrics` is given. */
  registry?: Registry;
  /** Metrics already created with `createMetrics` on the caller's registry. */
  metrics?: SluiceMetrics;
  /** API keys; when set, every `/v1` route needs `authorization: Bearer KEY`. */
  keys?: ApiKeys;
  /** Key for the admin routes (`/v1/admin/*`, `/dashboard`, and `/metrics` when `protectMetrics`). */
  adminKey?: string;
  /** Largest request body, bytes. Default 4 MiB. */
  bodyLimitBytes?: number;
  /** CORS, off unless configured: allowed origins (`"*"` for any). */
  cors?: { origins: string[] | "*" };
  /** Require admin credentials for `/metrics` too. Default false (Prometheus scrapes without them). */
  protectMetrics?: boolean;
  /** Shared with the server for graceful shutdown; a private one when omitted. */
  tracker?: CallTracker;
  /** Dashboard polling period, ms. Default 1000. */
  dashboardPollMs?: number;
  /** A streaming client that reads nothing for this long loses its call, ms; 0 never. Default 60000. */
  streamStallTimeoutMs?: number;
  /**
   * Route sets mounted before the app's own, in order: e.g. batches, files, `Prefer: respond-async`
   * and Idempotency-Key (`adapters/jobs`).
   */
  plugins?: readonly AppPlugin[];
  /** The operator's log (access and refusal lines, operator events). Default: silent. */
  logger?: Logger;
  /** Time source of queue times, durations and log sampling. Default real time. */
  clock?: Clock;
  /** Server-side history the dashboard draws; one sampling every second is created when omitted. */
  history?: StateHistory;
  /**
   * A request header naming the caller's tenant, set by a trusted gateway in front (`--tenant-header`).
   * Without it no header ever sets a tenant: the API key's tenant, else `default` (docs/tenants.md).
   */
  tenantHeader?: string;
}

/** A tenant name as a header may give it: a short token, so it is safe in logs and metric labels. */
const TENANT_NAME = /^[A-Za-z0-9._:@/-]{1,128}$/;

/** Default of `streamStallTimeoutMs`. */
export const DEFAULT_STREAM_STALL_TIMEOUT_MS = 60_000;

function validateOptions(options: AppOptions): void {
  const limit = options.bodyLimitBytes;
  if (limit !== undefined && !(Number.isInteger(limit) && limit > 0)) {
    throw new RangeError(`bodyLimitBytes must be a positive integer, got ${limit}`);
  }
  const poll = options.dashboardPollMs;
  if (poll !== undefined && !(Number.isFinite(poll) && poll >= 100)) {
    throw new RangeError(`dashboardPollMs must be at least 100, got ${poll}`);
  }
  const stall = options.streamStallTimeoutMs;
  if (stall !== undefined && !(Number.isFinite(stall) && stall >= 0)) {
    throw new RangeError(`streamStallTimeoutMs must be ≥ 0, got ${stall}`);
  }
  if (options.tenantHeader !== undefined && !/^[A-Za-z0-9-]+$/.test(options.tenantHeader)) {
    throw new RangeError(`tenantHeader must be a header name, got ${JSON.stringify(options.tenantHeader)}`);
  }
  if (options.adminKey !== undefined && options.adminKey.length < 8) {
    throw new RangeError(`adminKey must have at least 8 characters, got ${options.adminKey.length}`);
  }
}

function bearerOf(header: string | undefined): string | undefined {
  if (!header) return undefined;
  const match = /^Bearer\s+(.+)$/i.exec(header.trim());
  return match?.[1]?.trim() || undefined;
}

/** The key a client presented: `authorization: Bearer KEY`, or `x-api-key: KEY` (Anthropic-style clients). */
function presentedKey(c: Context<Env>): string | undefined {
  return bearerOf(c.req.header("authorization")) ?? (c.req.header("x-api-key")?.trim() || undefined);
}

/** A hono route path (`/v1/sessions/:id`) as a pattern matching concrete paths. */
function routePattern(path: string): RegExp {
  const escaped = path
    .split("/")
    .map((part) => (part.startsWith(":") ? "[^/]+" : part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")))
    .join("/");
  return new RegExp(`^${escaped}/?$`);
}

/**
 * Builds the hono app. Every refusal is a `Refusal` thrown by a handler (or
 * the scheduler) and rendered in `onError`, the one place errors become
 * responses; the SSE error event of a stream that fails mid-way uses the same
 * renderer.
 */
/** The HTTP app, and `close()` to stop what it started itself (the dashboard history's sampling). */
export type SluiceApp = Hono<Env> & { close(): void };

export function createApp(options: AppOptions): SluiceApp {
  validateOptions(options);
  const { scheduler, keys } = options;
  const metrics = options.metrics ?? createMetrics(options.registry ?? new Registry(), scheduler);
  const registry = metrics.registry;
  const tracker = options.tracker ?? new CallTracker();
  const bodyLimit = options.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES;
  const adminKey = options.adminKey;
  const keysOn = keys !== undefined && keys.size > 0;
  const adminLocked = keysOn || adminKey !== undefined;
  const clock = options.clock ?? realClock;
  const tenantHeader = options.tenantHeader?.toLowerCase();
  /** The caller's tenant: the trusted gateway's header when configured and sent, else the key's, else `default`. */
  const tenantOf = (c: Context<Env>): string => {
    if (tenantHeader !== undefined) {
      const named = c.req.header(tenantHeader)?.trim();
      if (named) {
        if (!TENANT_NAME.test(named)) {
          throw new Refusal(
            "invalid_request",
            `${tenantHeader} must be 1–128 characters of letters, digits and . _ : @ / -`,
          );
        }
        return named;
      }
    }
    return c.get("identity")?.tenant ?? DEFAULT_TENANT;
  };
  const logger = options.logger ?? silentLogger();
  const accessLog = new AccessLog(logger, { clock });
  const history = options.history ?? new StateHistory({ scheduler, clock });
  history.onEvent(operatorEventLog(logger, clock));
  history.start();
  // A history the caller handed in is the caller's to stop; the app stops only the one it made.
  const stopOwnHistory = options.history ? () => undefined : () => history.stop();
  // The scheduler's `route` event runs inside the submitting request's async context: that is how a refusal
  // decided after routing (budget, deadline, gate) learns its replica without the scheduler knowing about HTTP.
  const requestContext = new AsyncLocalStorage<RequestFacts>();
  scheduler.addEvents({
    route(e) {
      const facts = requestContext.getStore();
      if (facts) facts.replica = e.replica;
    },
  });
  const recordCompletion = (e: CompletedCall) => {
    metrics.recordCompletion(e);
    history.recordCompletion(e);
  };
  const dashboardHtml = renderDashboard({
    pollMs: options.dashboardPollMs ?? 1000,
    historySeconds: 15 * 60,
    thresholds: {
      kvLow: scheduler.config.window.kvLow,
      kvHigh: scheduler.config.window.kvHigh,
      hitLow: scheduler.config.window.hitLow,
    },
  });

  const app = new Hono<Env>();

  const renderError = (err: unknown, requestId: string) => renderRefusal(toRefusal(err), requestId);

  app.onError(function refusalToResponse(err, c) {
    const requestId = c.get("requestId") ?? sanitizeRequestId(undefined);
    const refusal = toRefusal(err);
    // Refusals the scheduler decides reach the metrics through its events; the rest are the HTTP layer's own.
    if (!uncounted.has(err)) {
      metrics.recordRefusal({ reason: refusal.reason, lane: refusal.lane, status: refusal.status });
    }
    const rendered = renderRefusal(refusal, requestId);
    const facts = c.get("facts");
    // Routed calls know their replica; a session step refused while it waited for its window knows its pin.
    const replica =
      facts?.replica ??
      (facts?.session
        ? (scheduler.getSession(facts.session, facts.tenant)?.replica ?? undefined)
        : undefined);
    const advice = adviseRefusal(refusal, {
      replica,
      queueMs: facts?.submittedAt !== undefined ? clock.now() - facts.submittedAt : undefined,
      replicaState:
        replica && (refusal.reason === "token_budget_exhausted" || refusal.reason === "worker_overloaded")
          ? scheduler.replicaState(replica)
          : undefined,
      rate: facts?.rate,
    });
    rendered.body.error.message = advice.message;
    Object.assign(rendered.headers, advice.headers);
    if (c.req.path.startsWith("/v1/")) {
      accessLog.record({
        requestId,
        method: c.req.method,
        path: c.req.path,
        status: rendered.status,
        reason: refusal.reason,
        lane: refusal.lane ?? facts?.lane,
        replica,
        session: facts?.session,
        queueMs: facts?.submittedAt !== undefined ? clock.now() - facts.submittedAt : undefined,
        message: advice.message,
      });
    }
    if (refusal.reason === "body_too_large") {
      // The rest of an oversized body is not read: after a short linger (so the client sees the 413) the
      // connection closes. Kept alive, the server would read and discard the whole body to find the next request.
      const node = c.env as { incoming?: IncomingMessage; outgoing?: ServerResponse } | undefined;
      if (node?.incoming && node.outgoing) lingerThenClose(node.incoming, node.outgoing);
    }
    return new Response(JSON.stringify(rendered.body), {
      status: rendered.status,
      headers: rendered.headers,
    });
  });

  /** Failures the HTTP layer must not count: the scheduler's events did (its refusals, engine failures), or no call was refused. */
  const uncounted = new WeakSet<object>();
  const leaveUncounted = (err: unknown): unknown => {
    if (typeof err === "object" && err !== null) uncounted.add(err);
    return err;
  };

  // Methods each known path answers, from the routes registered (read when first needed, so later mounts count).
  let knownRoutes: { pattern: RegExp; method: string }[] | undefined;
  const allowedMethods = (path: string): string[] => {
    knownRoutes ??= app.routes
      .filter((route) => route.method !== "ALL" && !route.path.includes("*"))
      .map((route) => ({ pattern: routePattern(route.path), method: route.method }));
    const methods = new Set<string>();
    for (const route of knownRoutes) if (route.pattern.test(path)) methods.add(route.method);
    if (methods.has("GET")) methods.add("HEAD");
    return [...methods];
  };

  app.notFound((c) => {
    const allowed = allowedMethods(c.req.path);
    if (allowed.length > 0) {
      const rendered = renderRefusal(
        new Refusal(
          "invalid_request",
          `${c.req.method} is not allowed on ${c.req.path}; use ${allowed.join(" or ")}`,
          {
            status: 405,
          },
        ),
        c.get("requestId"),
      );
      return new Response(JSON.stringify(rendered.body), {
        status: 405,
        headers: { ...rendered.headers, allow: allowed.join(", ") },
      });
    }
    return c.json(
      {
        error: {
          message: `no route for ${c.req.method} ${c.req.path}`,
          type: "not_found_error",
          code: "route_not_found",
          param: null,
          request_id: c.get("requestId"),
        },
      },
      404,
    );
  });

  app.use("*", async function requestId(c, next) {
    const id = sanitizeRequestId(c.req.header("x-request-id"));
    c.set("requestId", id);
    c.set("identity", undefined);
    c.set("facts", { startedAt: clock.now() });
    await next();
    c.res.headers.set("x-request-id", id);
    // Every response names the session it was counted in (docs/routing.md), refusals included.
    if (!c.res.headers.has("x-sluice-session-source")) {
      const { session, sessionSource } = c.get("facts");
      if (session !== undefined) c.res.headers.set("x-sluice-session", session);
      c.res.headers.set(
        "x-sluice-session-source",
        session !== undefined ? (sessionSource ?? "header") : "none",
      );
    }
    const rate = c.get("facts").rate;
    if (rate)
      for (const [name, value] of Object.entries(rateLimitHeaders(rate))) c.res.headers.set(name, value);
  });

  if (options.cors) {
    const origins = options.cors.origins;
    app.use(
      "*",
      cors({
        origin: origins === "*" ? "*" : origins,
        allowHeaders: [
          "authorization",
          "content-type",
          "x-request-id",
          "x-sluice-lane",
          "x-sluice-deadline-ms",
          "x-sluice-expected-idle-ms",
          "x-sluice-queue-ttl-ms",
          "x-api-key",
          // RFC 7240 and the Idempotency-Key draft: asynchronous calls and safe retries from a browser too.
          "prefer",
          "idempotency-key",
          ...SESSION_REQUEST_HEADERS,
        ],
        exposeHeaders: [
          "x-request-id",
          "x-sluice-lane",
          "x-sluice-replica",
          "x-sluice-queue-ms",
          "x-sluice-tenant",
          "x-sluice-session",
          "x-sluice-session-source",
          "retry-after",
          "x-should-retry",
          "x-ratelimit-limit-requests",
          "x-ratelimit-remaining-requests",
          "x-ratelimit-reset-requests",
          "location",
          "preference-applied",
          "idempotent-replayed",
        ],
      }),
    );
  }

  const isAdminCredential = (presented: string | undefined): boolean => {
    if (presented === undefined) return false;
    if (adminKey !== undefined && secretsEqual(presented, adminKey)) return true;
    return keys?.lookup(presented)?.admin === true;
  };

  const requireAdmin = async function adminOnly(c: Context<Env>, next: () => Promise<void>) {
    if (adminLocked) {
      // Browsers cannot set headers when opening a page, so the dashboard also takes `?key=`.
      const presented = presentedKey(c) ?? c.req.query("key");
      if (!isAdminCredential(presented)) {
        if (presented !== undefined && keys?.lookup(presented)) {
          // Known but without the right: 403, with the documented reason, so clients that read reasons need nothing new.
          throw new Refusal(
            "unauthorized",
            "this API key may not read admin routes: use the admin key (--admin-key) or a key with admin: true",
            { status: 403 },
          );
        }
        throw new Refusal(
          "unauthorized",
          "admin routes need the admin key: authorization: Bearer KEY (or x-api-key: KEY)",
        );
      }
    }
    await next();
  };

  const requireKey = async function apiKey(c: Context<Env>, next: () => Promise<void>) {
    if (keysOn) {
      const presented = presentedKey(c);
      const identity = presented === undefined ? undefined : keys.lookup(presented);
      if (!identity)
        throw new Refusal(
          "unauthorized",
          "missing or unknown API key: send authorization: Bearer KEY (or x-api-key: KEY)",
        );
      c.set("identity", identity);
    }
    await next();
  };

  const rateLimit = async function perKeyRateLimit(c: Context<Env>, next: () => Promise<void>) {
    const identity = c.get("identity");
    if (identity && keys) {
      const decision = keys.take(identity);
      if (decision.standing) c.get("facts").rate = decision.standing;
      if (!decision.allowed) {
        throw new Refusal(
          "rate_limited",
          `rate limit of this API key exceeded; retry in ${decision.retryAfterSeconds} s`,
          {
            retryAfterSeconds: decision.retryAfterSeconds,
            scope: "request",
          },
        );
      }
    }
    await next();
  };

  for (const plugin of options.plugins ?? [])
    plugin.mount(app, { requireKey, rateLimit, bodyLimitBytes: bodyLimit, keys });

  // --- liveness, readiness, metrics, admin ---------------------------------------------------

  app.get("/healthz", (c) => c.json({ status: "ok" }));

  app.get("/readyz", (c) => {
    const ready = scheduler.readyReplicas();
    if (ready < 1) {
      // A failing readiness probe is not a refused call: it stays out of the rejection counters.
      throw leaveUncounted(
        new Refusal("unavailable", "no healthy replica", { retryAfterSeconds: 1, scope: "fleet" }),
      );
    }
    return c.json({ status: "ready", replicas: ready });
  });

  const metricsHandler = async (c: Context<Env>) => {
    const text = await registry.metrics();
    return c.body(text, 200, { "content-type": registry.contentType });
  };
  if (options.protectMetrics) app.get("/metrics", requireAdmin, metricsHandler);
  else app.get("/metrics", metricsHandler);

  app.get("/v1/admin/state", requireAdmin, (c) => c.json(scheduler.state()));
  app.get("/v1/admin/history", requireAdmin, (c) => {
    const since = Number(c.req.query("since"));
    const eventsAfter = Number(c.req.query("events_after"));
    return c.json({
      ...history.since(
        Number.isFinite(since) ? since : undefined,
        Number.isFinite(eventsAfter) ? eventsAfter : undefined,
      ),
      state: scheduler.state(),
      serverTime: Date.now(),
    });
  });
  app.get("/dashboard", requireAdmin, (c) => c.html(dashboardHtml));

  // --- models and sessions ---------------------------------------------------------------------

  app.get("/v1/models", requireKey, (c) => {
    const created = Math.floor(Date.now() / 1000);
    return c.json({
      object: "list",
      data: scheduler.models().map((id) => ({
        id,
        object: "model",
        created,
        owned_by: "sluice",
        max_model_len: scheduler.contextWindow(id),
      })),
    });
  });

  app.post("/v1/sessions", requireKey, async (c) => {
    const text = await readJsonBodyOrEmpty(c.req.raw, bodyLimit);
    const body = parseBody(openSessionBodySchema, text);
    const init: OpenSessionInit = { tenant: tenantOf(c) };
    if (body.id !== undefined) init.id = body.id;
    if (body.lane !== undefined) init.lane = body.lane;
    if (body.metadata !== undefined) init.metadata = body.metadata;
    const view = scheduler.openSession(init);
    return c.json({ id: view.id, state: view.state }, 201);
  });

  // The id comes from the path: echo a bounded prefix of it, never an arbitrarily long one.
  const unknownSession = (id: string) =>
    new Refusal(
      "session_not_found",
      `no session ${JSON.stringify(id.length > 256 ? `${id.slice(0, 256)}…` : id)}`,
    );

  /**
   * The tenant whose session `id` a `GET` or `DELETE` names: the caller's own. An admin key also
   * reaches another tenant's (`?tenant=NAME`, else the one tenant holding that key); anyone else
   * asking for another tenant's key gets the 404 of a key their own tenant does not hold.
   */
  const sessionTenantOf = (c: Context<Env>, id: string): string | undefined => {
    if (!isSessionId(id)) return undefined;
    const own = tenantOf(c);
    if (c.get("identity")?.admin !== true) return own;
    const asked = c.req.query("tenant");
    if (asked !== undefined) return asked;
    if (scheduler.getSession(id, own)) return own;
    const holders = scheduler.tenantsOfSession(id);
    return holders.length === 1 ? holders[0] : own;
  };

  app.get("/v1/sessions/:id", requireKey, (c) => {
    const id = c.req.param("id") ?? "";
    const tenant = sessionTenantOf(c, id);
    const view = tenant === undefined ? undefined : scheduler.getSession(id, tenant);
    if (!view) throw unknownSession(id);
    return c.json(view, 200, { "x-sluice-tenant": view.tenant ?? DEFAULT_TENANT });
  });

  app.delete("/v1/sessions/:id", requireKey, (c) => {
    const id = c.req.param("id") ?? "";
    const tenant = sessionTenantOf(c, id);
    if (tenant === undefined || !scheduler.closeSession(id, tenant)) throw unknownSession(id);
    return c.body(null, 204);
  });

  // --- completions -----------------------------------------------------------------------------

  const complete = async (c: Context<Env>, endpoint: CallEndpoint, pathSession: string | undefined) => {
    const requestId = c.get("requestId");
    if (tracker.isDraining) {
      throw new Refusal("unavailable", "sluice is shutting down; retry on another instance", {
        retryAfterSeconds: 1,
        scope: "fleet",
      });
    }
    // Header checks first: they cost nothing and need no body.
    const declaredLane = declaredLaneOf("x-sluice-lane", c.req.header("x-sluice-lane"));
    const deadlineMs = positiveMsOf("x-sluice-deadline-ms", c.req.header("x-sluice-deadline-ms"));
    const expectedIdleMs = expectedIdleMsOf(
      "x-sluice-expected-idle-ms",
      c.req.header("x-sluice-expected-idle-ms"),
    );
    const queueTtlMs = queueTtlMsOf("x-sluice-queue-ttl-ms", c.req.header("x-sluice-queue-ttl-ms"));
    const identity = c.get("identity");
    const tenant = tenantOf(c);
    if (pathSession !== undefined) {
      const view = isSessionId(pathSession) ? scheduler.getSession(pathSession, tenant) : undefined;
      if (!view || view.state === "closed") throw unknownSession(pathSession);
    }

    const json = await readJsonBody(c.req.raw, bodyLimit, incomingOf(c.env));
    const shape = callBodyOf(endpoint, json);
    const { body, stream } = shape;
    // Headers first, then the body's `metadata.session_id`, then a Responses API `conversation`.
    const named = readSessionKey((name) => c.req.header(name), {
      body,
      ...(shape.conversation !== undefined
        ? { fallback: { from: "conversation", key: shape.conversation } }
        : {}),
    });
    const sessionId = pathSession ?? named.key;
    // The key's own source until admission says otherwise (an inferred session, or the one a response continues).
    const sessionSource: SessionKeySource = pathSession !== undefined ? "header" : named.source;

    const end = tracker.begin();
    // Over a real socket a call ends for the tracker only when its response has left (a shutdown that
    // closes connections right after the last chunk was produced would cut the stream's tail).
    const outgoing = (c.env as { outgoing?: ServerResponse } | undefined)?.outgoing;
    if (outgoing?.closed || outgoing?.destroyed) end();
    else outgoing?.once("close", end);
    // One controller following both the client and a forced shutdown; both links are undone when the call ends.
    const callAbort = new AbortController();
    const unfollowClient = followAbort(c.req.raw.signal, callAbort);
    const unfollowShutdown = followAbort(tracker.signal, callAbort);
    const unfollow = () => {
      unfollowClient();
      unfollowShutdown();
    };
    const signal = callAbort.signal;
    const req = buildCallRequest({
      requestId,
      endpoint,
      shape,
      signal,
      stream,
      sessionId,
      named,
      options: { declaredLane, deadlineMs, expectedIdleMs, queueTtlMs },
      tenant,
      priority: identity?.priority,
    });

    const facts = c.get("facts");
    facts.tenant = tenant;
    if (sessionId !== undefined) facts.session = sessionId;
    if (sessionId !== undefined && sessionSource !== "none") facts.sessionSource = sessionSource;
    facts.submittedAt = clock.now();
    let call: AdmittedCall;
    try {
      call = await requestContext.run(facts, () => scheduler.submit(req));
    } catch (err) {
      unfollow();
      if (!outgoing) end();
      throw leaveUncounted(err);
    }
    // A client gone after admission (or a forced shutdown) cancels the call, whatever the scheduler does with it.
    const onAbort = () => call.cancel();
    signal.addEventListener("abort", onAbort, { once: true });
    const finish = () => {
      signal.removeEventListener("abort", onAbort);
      unfollow();
      if (!outgoing) end();
    };
    if (signal.aborted) onAbort();
    facts.replica = call.replica;
    facts.lane = call.lane;
    if (call.sessionId !== undefined) {
      facts.session = call.sessionId;
      // A session named by neither header nor body came from the prompt, or from the response it continues.
      facts.sessionSource = call.sessionInferred
        ? "inferred"
        : sessionSource === "none"
          ? "body"
          : sessionSource;
    } else {
      delete facts.session;
      delete facts.sessionSource;
    }
    const model = shape.model ?? scheduler.models()[0] ?? "unknown";
    call.result.then(
      (result) => {
        const durationMs = clock.now() - facts.startedAt;
        recordCompletion({
          lane: call.lane,
          replica: call.replica,
          model,
          durationMs,
          promptTokens: result.promptTokens,
          cachedTokens: result.cachedTokens,
          completionTokens: result.completionTokens,
        });
        accessLog.record({
          requestId,
          method: c.req.method,
          path: c.req.path,
          status: 200,
          lane: call.lane,
          replica: call.replica,
          session: facts.session,
          queueMs: call.queueMs,
          durationMs,
        });
      },
      () => {},
    );

    const ctx = responseContextOf(endpoint, requestId, model);
    const headers: Record<string, string> = {
      "x-request-id": requestId,
      "x-sluice-lane": call.lane,
      "x-sluice-replica": call.replica,
      "x-sluice-queue-ms": String(Math.round(call.queueMs)),
      "x-sluice-tenant": tenant,
      "x-sluice-session-source": facts.sessionSource ?? "none",
    };
    if (facts.session !== undefined) headers["x-sluice-session"] = facts.session;

    if (stream) {
      const sse = sseStream({
        call,
        ctx,
        includeUsage: shape.includeUsage,
        renderError: (err) => renderError(err, requestId).body,
        onEnd: finish,
        stallTimeoutMs: options.streamStallTimeoutMs ?? DEFAULT_STREAM_STALL_TIMEOUT_MS,
      });
      return new Response(sse, {
        status: 200,
        headers: {
          ...headers,
          "content-type": "text/event-stream; charset=utf-8",
          "cache-control": "no-cache",
          "x-accel-buffering": "no",
        },
      });
    }
    try {
      // The Responses API's body is the engine's own, byte for byte.
      const payload =
        endpoint === "responses"
          ? (await collectRaw(call)).slice().buffer
          : JSON.stringify(await collectCall({ call, ctx }));
      return new Response(payload, {
        status: 200,
        headers: { ...headers, "content-type": "application/json" },
      });
    } catch (err) {
      // Nothing was sent yet, so the failure can still be an ordinary error response.
      throw leaveUncounted(toRefusal(err).with({ lane: call.lane }));
    } finally {
      finish();
    }
  };

  app.post("/v1/chat/completions", requireKey, rateLimit, (c) => complete(c, "chat", undefined));
  app.post("/v1/completions", requireKey, rateLimit, (c) => complete(c, "completions", undefined));
  app.post("/v1/responses", requireKey, rateLimit, (c) => complete(c, "responses", undefined));
  app.post("/v1/sessions/:id/chat/completions", requireKey, rateLimit, (c) =>
    complete(c, "chat", c.req.param("id") ?? ""),
  );

  return Object.assign(app, { close: stopOwnHistory });
}

/** The Node request stream behind a request served by @hono/node-server (absent under `app.request()`). */
function incomingOf(env: unknown): Readable | undefined {
  const incoming = (env as { incoming?: Readable } | undefined)?.incoming;
  return incoming && typeof incoming.on === "function" && typeof incoming.pause === "function"
    ? incoming
    : undefined;
}

/** A JSON body that may be absent (`POST /v1/sessions` with no body opens a session with defaults). */
async function readJsonBodyOrEmpty(request: Request, limitBytes: number): Promise<unknown> {
  if (request.headers.get("content-length") === "0" || !request.body) return {};
  try {
    return await readJsonBody(request, limitBytes);
  } catch (err) {
    if (err instanceof Refusal && err.message.startsWith("request body is empty")) return {};
    throw err;
  }
}
