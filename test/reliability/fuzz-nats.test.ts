/**
 * @module Hostile input over NATS, property-based, against a real `nats-server`: invalid UTF-8 and
 * JSON, wrong types, absurd numbers, deep and large payloads, prototype keys, hostile header values,
 * bogus session ids, on every endpoint and in streaming mode. Every request gets an answer — a reply
 * or a service error whose code and reason follow docs/http-api.md, never a 500 or silence — and afterwards
 * every permit, reservation, queue place and window slot is back at zero.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import fc from "fast-check";
import {
  connect,
  headers as createHeaders,
  createInbox,
  type Msg,
  type MsgHdrs,
  type NatsConnection,
} from "nats";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { type NatsServerProcess, startNatsServer } from "../../adapters/nats/nats-server-process.js";
import { HEADERS, SUBJECTS } from "../../adapters/nats/protocol.js";
import { type NatsService, startNatsService } from "../../adapters/nats/service.js";
import { createTokenizer } from "../../adapters/tokenizers/index.js";
import { realClock } from "../../src/clock.js";
import { Scheduler } from "../../src/scheduler.js";
import { assertQuiescent, recordFigures, SAFE_REQUEST_ID, SPEC8_REASONS, until } from "./helpers.js";
import {
  type BodySpec,
  bodyArb,
  CHAT_FIELDS,
  chatTemplate,
  described,
  FC_OPTIONS,
  headerValueArb,
  preview,
  runs,
  SEED,
  safeIdArb,
  sessionBodyArb,
} from "./hostile-input.js";

const figures = { cases: 0, outcomes: {} as Record<string, number>, classes: {} as Record<string, number> };
function count(outcome: string, klass: string): void {
  figures.outcomes[outcome] = (figures.outcomes[outcome] ?? 0) + 1;
  figures.classes[klass] = (figures.classes[klass] ?? 0) + 1;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Checks a service error: a docs/http-api.md status and reason in the headers, the same envelope as HTTP in the body. */
function checkServiceError(msg: Msg, context: string): string {
  const status = Number(msg.headers?.get(HEADERS.serviceErrorCode));
  const reason = msg.headers?.get(HEADERS.serviceError) ?? "";
  const allowed = SPEC8_REASONS[status];
  assert.ok(
    allowed,
    `service error code ${status} is not a docs/http-api.md status (${context}): ${decoder.decode(msg.data).slice(0, 300)}`,
  );
  assert.ok(allowed.includes(reason), `status ${status} with reason ${reason} (${context})`);
  const body = JSON.parse(decoder.decode(msg.data)) as { error: Record<string, unknown> };
  assert.equal(body.error.code, reason, "the envelope names the same reason");
  assert.ok(typeof body.error.request_id === "string" && SAFE_REQUEST_ID.test(body.error.request_id));
  if (status === 429 || status === 503 || status === 529) {
    assert.match(
      msg.headers?.get(HEADERS.retryAfter) ?? "",
      /^[1-9][0-9]*$/,
      `${status} ${reason} without Retry-After`,
    );
  }
  return `${status} ${reason}`;
}

function isServiceError(msg: Msg): boolean {
  return Boolean(msg.headers?.get(HEADERS.serviceErrorCode));
}

describe("hostile NATS input", () => {
  let server: NatsServerProcess;
  let serviceNc: NatsConnection;
  let clientNc: NatsConnection;
  let scheduler: Scheduler;
  let service: NatsService;

  before(async () => {
    server = await startNatsServer();
    serviceNc = await connect({ servers: server.url });
    clientNc = await connect({ servers: server.url });
    const engines = [0, 1].map(
      (i) => new SimEngine({ id: `sim-${i}`, clock: realClock, preset: { base: "instant" } }),
    );
    scheduler = new Scheduler({
      engines,
      clock: realClock,
      tokenizer: createTokenizer(),
      config: { sessions: { controlIntervalMs: 200, idleTimeoutMs: 1500 } },
    });
    scheduler.start();
    service = await startNatsService({ nc: serviceNc, scheduler });
  });

  after(async () => {
    await recordFigures("fuzzNats", { ...figures, seed: SEED });
    await service?.stop();
    await scheduler?.stop();
    await clientNc?.close();
    await serviceNc?.close();
    await server?.close();
  });

  test("every request gets a reply or a docs/http-api.md service error, never a 500 or silence; nothing stays held", async () => {
    const model = scheduler.models()[0]!;
    const chatBodies = bodyArb(chatTemplate(model), CHAT_FIELDS);
    const sessionBodies = sessionBodyArb().map((b) => described(b, `${b.klass} body, ${preview(b.bytes)}`));
    const idBodies = fc
      .oneof(
        fc.constantFrom("s-1", "s-2", "__proto__", "constructor", "", " ", "a.b", "a*", ">", "x".repeat(300)),
        safeIdArb,
        fc.string({ unit: "binary", maxLength: 20 }),
      )
      .chain((id) =>
        fc.oneof(
          fc.constant<BodySpec>({ klass: "session-id", bytes: JSON.stringify({ id }) }),
          fc.constant<BodySpec>({
            klass: "session-id",
            bytes: JSON.stringify({ id: [id], extra: { __proto__: 1 } }),
          }),
          fc.uint8Array({ maxLength: 60 }).map<BodySpec>((bytes) => ({ klass: "random-bytes", bytes })),
        ),
      );
    // Each header is usually absent, so most calls get past the header checks to the deeper paths.
    const rarely = <T>(arbitrary: fc.Arbitrary<T>) =>
      fc.oneof({ weight: 5, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary });
    const headerArb = fc.record({
      session: fc.oneof(
        { weight: 3, arbitrary: fc.constant(undefined) },
        { weight: 2, arbitrary: fc.constantFrom("s-1", "s-2", "s-3", "__proto__", "constructor") },
        {
          weight: 1,
          arbitrary: fc.oneof(fc.constantFrom("a b", "x".repeat(300), "a.b.>"), safeIdArb, headerValueArb),
        },
      ),
      lane: rarely(fc.oneof(fc.constantFrom("interactive", "bulk", "BULK", "overflow"), headerValueArb)),
      requestId: rarely(fc.oneof(safeIdArb, headerValueArb, fc.constant("r".repeat(200)))),
      deadline: rarely(fc.oneof(fc.constantFrom("0", "-1", "1", "1e400", "NaN", "100000"), headerValueArb)),
      timeout: rarely(fc.oneof(fc.constantFrom("0", "-1", "1", "5000", "1e400", "abc"), headerValueArb)),
      stream: fc.oneof(
        { weight: 3, arbitrary: fc.constant(undefined) },
        { weight: 2, arbitrary: fc.constantFrom("true", "TRUE", "1", "yes", "false") },
        { weight: 1, arbitrary: headerValueArb },
      ),
    });
    const caseArb = fc.oneof(
      {
        weight: 6,
        arbitrary: fc.record({ subject: fc.constant(SUBJECTS.chat), body: chatBodies, headers: headerArb }),
      },
      {
        weight: 2,
        arbitrary: fc.record({
          subject: fc.constant(SUBJECTS.sessionsOpen),
          body: sessionBodies,
          headers: headerArb,
        }),
      },
      {
        weight: 2,
        arbitrary: fc.record({
          subject: fc.constantFrom(SUBJECTS.sessionsGet, SUBJECTS.sessionsClose),
          body: idBodies,
          headers: headerArb,
        }),
      },
    );

    await fc.assert(
      fc.asyncProperty(caseArb, async ({ subject, body, headers: spec }) => {
        const hdrs: MsgHdrs = createHeaders();
        const set = (name: string, value: string | undefined) => {
          if (value === undefined) return;
          try {
            hdrs.set(name, value);
          } catch {
            // A value the client library refuses to send never reaches the service.
          }
        };
        set(HEADERS.session, spec.session);
        set(HEADERS.lane, spec.lane);
        set(HEADERS.requestId, spec.requestId);
        set(HEADERS.deadlineMs, spec.deadline);
        set(HEADERS.timeoutMs, spec.timeout);
        set(HEADERS.stream, spec.stream);
        const data =
          body.bytes === undefined
            ? new Uint8Array()
            : typeof body.bytes === "string"
              ? encoder.encode(body.bytes)
              : body.bytes;
        const context = `${subject} ${body.klass}`;
        figures.cases++;
        if (data.byteLength > clientNc.info!.max_payload) {
          // The NATS server's own limit: the client library refuses to publish it.
          assert.throws(() => clientNc.publish(subject, data, { headers: hdrs }));
          count("over the server's max_payload (refused by NATS)", body.klass);
          return;
        }
        const streaming =
          subject === SUBJECTS.chat && /^(true|1|yes)$/i.test((hdrs.get(HEADERS.stream) ?? "").trim());
        if (!streaming) {
          const reply = await clientNc.request(subject, data, { timeout: 15_000, headers: hdrs });
          if (isServiceError(reply)) count(checkServiceError(reply, context), body.klass);
          else {
            JSON.parse(decoder.decode(reply.data));
            count("reply", body.klass);
          }
          return;
        }
        // Streamed: chunks, perhaps a service error, then exactly one done marker.
        const inbox = createInbox();
        const sub = clientNc.subscribe(inbox, { timeout: 15_000 });
        clientNc.publish(subject, data, { reply: inbox, headers: hdrs });
        let outcome = "stream";
        for await (const msg of sub) {
          if (msg.headers?.get(HEADERS.done) === "true") break;
          if (isServiceError(msg)) outcome = `stream: ${checkServiceError(msg, context)}`;
          else JSON.parse(decoder.decode(msg.data));
        }
        sub.unsubscribe();
        count(outcome, body.klass);
      }),
      { ...FC_OPTIONS, numRuns: runs(3000) },
    );

    await until(() => {
      const check = scheduler.idleCheck();
      return check.permits === 0 && check.reservations === 0 && check.queued === 0;
    }, "every call ended");
    assertQuiescent(scheduler);
    // Sessions opened along the way expire when idle; then no window slot is held either.
    await until(() => scheduler.idleCheck().windowSlots === 0, "idle sessions expired", 10_000);
    assertQuiescent(scheduler, { sessionsClosed: true });
    assert.equal(service.inFlight, 0);
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
  });
});
