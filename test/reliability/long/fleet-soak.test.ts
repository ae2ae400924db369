/**
 * @module The long variant of `test/reliability/long/fleet.test.ts`, part of `npm run test:reliability` (not
 * `npm test`): three `sluice serve --nats` frontends over two `sluice sim` replicas and one
 * nats-server, all real processes; agents step round robin over the frontends (HTTP) while NATS
 * callers stream, for `FLEET_SOAK_ROUNDS` rounds (default 6) in each of which one frontend is
 * stopped (SIGTERM, then SIGKILL in alternate rounds) and started again. Client-side accounting:
 * every call accepted ends completed or with an error (HTTP 503 with Retry-After, NATS 503
 * `unavailable`), none is left unanswered, and afterwards no frontend holds a session or a place.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { connect, type NatsConnection } from "nats";
import { NatsTransport } from "../../../adapters/client/nats-transport.js";
import { SluiceError } from "../../../adapters/client/types.js";
import { type NatsServerProcess, startNatsServer } from "../../../adapters/nats/nats-server-process.js";
import type { AdminState } from "../../../src/types.js";
import {
  freePort,
  recordFigures,
  type SluiceChild,
  spawnSluice,
  startSimChild,
  stopChild,
  until,
} from "../helpers.js";

const ROUNDS = Number(process.env.FLEET_SOAK_ROUNDS ?? "6");
const AGENTS = 12;

let nats: NatsServerProcess | undefined;
const sims: SluiceChild[] = [];
const frontends: ({ child: SluiceChild; url: string } | undefined)[] = [];
let clientNc: NatsConnection | undefined;

after(async () => {
  await clientNc?.close().catch(() => {});
  await Promise.all(frontends.map((f) => stopChild(f?.child)));
  await Promise.all(sims.map((sim) => stopChild(sim)));
  await nats?.close();
});

async function startFrontend(simUrls: string[]): Promise<{ child: SluiceChild; url: string }> {
  const child = spawnSluice([
    "serve",
    "--port",
    "0",
    "--host",
    "127.0.0.1",
    ...simUrls.flatMap((url, i) => ["--upstream", `sim-${i}=${url}`]),
    "--nats",
    nats!.url,
    "--policy",
    "concur",
    "--window-initial",
    "3",
    "--window-min",
    "3",
    "--window-max",
    "3",
    "--control-interval-ms",
    "200",
    "--drain-timeout-ms",
    "30000",
  ]);
  const match = await child.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/, 60_000);
  const url = `http://127.0.0.1:${match[1]}`;
  await until(
    async () => {
      const state = (await fetch(`${url}/v1/admin/state`)
        .then((r) => r.json())
        .catch(() => undefined)) as AdminState | undefined;
      return state?.replicas.filter((r) => r.healthy && !r.signals.stale).length === 2;
    },
    "both replicas healthy",
    60_000,
  );
  return { child, url };
}

test(`${ROUNDS} rounds of frontend restarts under HTTP agents and NATS streams: every call answered, nothing held`, async () => {
  nats = await startNatsServer();
  const ports = [await freePort(), await freePort()];
  sims.push(...(await Promise.all(ports.map((port) => startSimChild(port)))));
  const simUrls = ports.map((port) => `http://127.0.0.1:${port}`);
  frontends.push(...(await Promise.all([0, 1, 2].map(() => startFrontend(simUrls)))));
  clientNc = await connect({ servers: nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
  const transport = new NatsTransport({ nc: clientNc, heartbeatMs: 250, deadAfterMs: 2500 });

  const http = { steps: 0, refused: 0, connectionErrors: 0 };
  const natsCalls = { started: 0, completed: 0, errors: 0, unanswered: 0 };
  let turn = 0;
  let running = true;

  const agent = async (i: number) => {
    let session = 0;
    while (running) {
      const id = `soak-${i}-${session++}`;
      const messages: { role: string; content: string }[] = [];
      for (let step = 0; step < 4; step++) {
        messages.push({ role: "user", content: `${id} step ${step} ${"w ".repeat(12)}` });
        for (;;) {
          const front = frontends[turn++ % frontends.length];
          if (!front) continue;
          let response: Response;
          let text: string;
          try {
            response = await fetch(`${front.url}/v1/chat/completions`, {
              method: "POST",
              headers: { "content-type": "application/json", "x-session-id": id },
              body: JSON.stringify({ messages, max_tokens: 6 }),
              signal: AbortSignal.timeout(120_000),
            });
            text = await response.text();
          } catch {
            // A frontend stopping or stopped: the balancer tries the next one.
            http.connectionErrors++;
            await new Promise((resolve) => setTimeout(resolve, 50));
            continue;
          }
          if (response.status === 503) {
            http.refused++;
            assert.ok(Number(response.headers.get("retry-after")) >= 1, text);
            await new Promise((resolve) => setTimeout(resolve, 200));
            continue;
          }
          assert.equal(response.status, 200, text);
          http.steps++;
          messages.push({ role: "assistant", content: "ok" });
          break;
        }
      }
      for (let attempt = 0; attempt < 50; attempt++) {
        const front = frontends[turn++ % frontends.length];
        if (!front) continue;
        const closed = await fetch(`${front.url}/v1/sessions/${id}`, { method: "DELETE" }).catch(
          () => undefined,
        );
        if (closed?.status === 204) break;
      }
    }
  };

  const caller = async (i: number) => {
    for (let n = 0; running; n++) {
      natsCalls.started++;
      natsCalls.unanswered++;
      const call = {
        body: { messages: [{ role: "user", content: `stream ${i} ${n}` }], max_tokens: 60 },
        requestId: `soak-nats-${i}-${n}`,
        timeoutMs: 120_000,
      };
      try {
        for await (const _ of transport.chatStream(call)) {
          // read it all
        }
        natsCalls.completed++;
      } catch (err) {
        assert.ok(err instanceof SluiceError, String(err));
        assert.equal(err.status, 503, err.message);
        natsCalls.errors++;
        await new Promise((resolve) => setTimeout(resolve, 100));
      } finally {
        natsCalls.unanswered--;
      }
    }
  };

  const load = [
    ...Array.from({ length: AGENTS }, (_, i) => agent(i)),
    ...Array.from({ length: 4 }, (_, i) => caller(i)),
  ];
  for (let round = 0; round < ROUNDS; round++) {
    await new Promise((resolve) => setTimeout(resolve, 2000));
    const index = round % frontends.length;
    const victim = frontends[index]!;
    frontends[index] = undefined;
    victim.child.child.kill(round % 2 === 0 ? "SIGTERM" : "SIGKILL");
    const exit = await victim.child.exited;
    if (round % 2 === 0) assert.equal(exit.code, 0, victim.child.output());
    frontends[index] = await startFrontend(simUrls);
  }
  running = false;
  await Promise.all(load);
  assert.equal(natsCalls.unanswered, 0);
  assert.ok(http.steps > 0 && natsCalls.completed > 0);
  // Nothing held anywhere once every session is closed (a second copy of a session would be).
  for (const front of frontends) {
    await until(async () => {
      const state = (await fetch(`${front!.url}/v1/admin/state`)
        .then((r) => r.json())
        .catch(() => undefined)) as AdminState | undefined;
      return (
        state !== undefined &&
        state.sessions.active + state.sessions.waiting + state.sessions.paused === 0 &&
        state.replicas.every((r) => r.gate.requests === 0)
      );
    }, "every frontend idle");
  }
  await recordFigures("fleetSoak", { rounds: ROUNDS, http, nats: natsCalls });
});
