/**
 * @module The sluice client for agent frameworks: sessions and steps over
 * HTTP or NATS with `Retry-After`-aware retries.
 *
 * ```ts
 * const client = httpClient({ baseUrl: "http://127.0.0.1:8080" });
 * const { id } = await client.openSession();
 * const answer = await client.step(id, { messages }, { withinMs: 60_000 });
 * await client.closeSession(id);
 * ```
 */

import { SluiceClient, type SluiceClientOptions } from "./client.js";
import { HttpTransport, type HttpTransportOptions } from "./http-transport.js";
import { NatsTransport, type NatsTransportOptions } from "./nats-transport.js";

export {
  type CallOptions,
  type RetryOptions,
  SluiceClient,
  type SluiceClientOptions,
  type StepOptions,
  wallClock,
} from "./client.js";
export { HttpTransport, type HttpTransportOptions } from "./http-transport.js";
export { NatsTransport, type NatsTransportOptions } from "./nats-transport.js";
export * from "./types.js";

/** A client over sluice's HTTP API. */
export function httpClient(
  options: HttpTransportOptions & Omit<SluiceClientOptions, "transport">,
): SluiceClient {
  const { baseUrl, apiKey, fetch, ...rest } = options;
  return new SluiceClient({
    ...rest,
    transport: new HttpTransport({ baseUrl, ...(apiKey ? { apiKey } : {}), ...(fetch ? { fetch } : {}) }),
  });
}

/** A client over sluice's NATS API, on a connection the caller owns. */
export function natsClient(
  options: NatsTransportOptions & Omit<SluiceClientOptions, "transport">,
): SluiceClient {
  const { nc, heartbeatMs, deadAfterMs, ...rest } = options;
  return new SluiceClient({
    ...rest,
    transport: new NatsTransport({
      nc,
      ...(heartbeatMs !== undefined ? { heartbeatMs } : {}),
      ...(deadAfterMs !== undefined ? { deadAfterMs } : {}),
    }),
  });
}
