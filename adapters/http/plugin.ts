/**
 * @module What the HTTP app shares with the route sets mounted into it (docs/http.md): the
 * per-request variables its middleware sets, and the plugin contract. A plugin (the job routes
 * are one) mounts on the same app, so it sees the same variables and lends the app's own key
 * check, rate limit and body limit.
 */

import type { Hono, MiddlewareHandler } from "hono";
import type { ApiKeyIdentity, ApiKeys, RateStanding } from "./api-keys.js";

/** Where the session a call was counted in came from (`x-sluice-session-source`; `none` without one). */
export type SessionSource = "header" | "body" | "inferred";

/** What the HTTP layer learns about one request as it goes, for its refusal headers and its log line. */
export interface RequestFacts {
  startedAt: number;
  /** When the call was handed to the scheduler (queue time on a refusal counts from here). */
  submittedAt?: number;
  /** The replica the router chose (from the scheduler's `route` event, within this request's async context). */
  replica?: string;
  lane?: string;
  session?: string;
  /** The caller's tenant (its API key's; `default` without one): the session above is that tenant's. */
  tenant?: string;
  /** Where `session` came from (the `x-sluice-session-source` header); undefined with no session. */
  sessionSource?: SessionSource;
  rate?: RateStanding;
}

/** The app's per-request variables, set by its request-id, API-key and facts middleware. */
export type AppEnv = {
  Variables: { requestId: string; identity: ApiKeyIdentity | undefined; facts: RequestFacts };
};

/** What the app lends a plugin's routes. */
export interface AppPluginContext {
  /** Refuses a request without a known API key (a no-op when the app has no keys). */
  requireKey: MiddlewareHandler<AppEnv>;
  /** The caller's per-key rate limit. */
  rateLimit: MiddlewareHandler<AppEnv>;
  /** Largest request body, bytes. */
  bodyLimitBytes: number;
  /** The app's API keys, when it has any. */
  keys?: ApiKeys | undefined;
}

/** A set of routes mounted into the app before its own (so its middleware runs first on its paths). */
export interface AppPlugin {
  mount(app: Hono<AppEnv>, ctx: AppPluginContext): void;
}
