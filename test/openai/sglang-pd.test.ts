/**
 * @module `sluice serve` in front of a prefill and a decode replica speaking
 * SGLang's PD mode over HTTP (`--upstream role=…,pd=sglang`): one request to
 * both at once with the same `bootstrap_host`, `bootstrap_port` and
 * `bootstrap_room`, the decode server joining the prefill server, the decode's
 * answer streamed back — and a failure on either side stopping the other and
 * releasing everything.
 */

import assert from "node:assert/strict";
import type { ServerResponse } from "node:http";
import { afterEach, describe, it } from "node:test";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { type SimServer, startSimServer } from "../../adapters/engines/sim/http-server.js";
import { type FakeUpstream, type SeenRequest, startFakeUpstream } from "./fake-upstream.js";

let running: RunningServer | undefined;
const sims: SimServer[] = [];
const fakes: FakeUpstream[] = [];

afterEach(async () => {
  await running?.close();
  running = undefined;
  await Promise.all(sims.splice(0).map((s) => s.close()));
  await Promise.all(fakes.splice(0).map((s) => s.close()));
});

async function sim(role: "prefill" | "decode", id: string): Promise<SimServer> {
  const server = await startSimServer({ role, id, pd: "sglang" });
  sims.push(server);
  return server;
}

async function serve(
  upstreams: string[],
  extra: Parameters<typeof startServer>[0] = {},
): Promise<RunningServer> {
  running = await startServer({ port: 0, host: "127.0.0.1", upstreams, log: () => {}, ...extra });
  return running;
}

function chat(
  url: string,
  content: string,
  maxTokens: number,
  stream: boolean,
  signal?: AbortSignal,
): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content }], max_tokens: maxTokens, stream }),
    ...(signal ? { signal } : {}),
  });
}

/** Polls `check` on the event loop until it holds (the test runner's timeout is the bound). */
async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((resolve) => setTimeout(resolve, 10));
}

/** Nothing held by sluice, and no room left open on any simulated prefill replica. */
function idle(server: RunningServer): boolean {
  const check = server.scheduler.idleCheck();
  return (
    check.permits === 0 &&
    check.reservations === 0 &&
    check.queued === 0 &&
    sims.every((s) => s.openRooms() === 0)
  );
}

/** A proxy in front of `target` that records what it is sent and, for completions, answers with `completions` instead when given. */
async function proxy(
  target: SimServer,
  completions?: (req: SeenRequest, res: ServerResponse) => void,
): Promise<FakeUpstream> {
  const forward = async (req: SeenRequest, res: ServerResponse): Promise<void> => {
    const controller = new AbortController();
    void req.aborted.then(() => controller.abort());
    try {
      const up = await fetch(`${target.url}${req.path}`, {
        method: req.method,
        headers: { "content-type": "application/json" },
        ...(req.method === "POST" ? { body: req.body } : {}),
        signal: controller.signal,
      });
      res.writeHead(up.status, { "content-type": up.headers.get("content-type") ?? "text/plain" });
      res.end(Buffer.from(await up.arrayBuffer()));
    } catch {
      res.destroy();
    }
  };
  const fake = await startFakeUpstream({
    "/metrics": forward,
    "/v1/models": forward,
    "/server_info": forward,
    "/get_server_info": forward,
    "/v1/chat/completions": completions ?? forward,
  });
  fakes.push(fake);
  return fake;
}

describe("sluice serve with a prefill and a decode upstream in SGLang's PD mode", { timeout: 60_000 }, () => {
  it("sends both requests at once with one bootstrap room and streams the decode replica's answer", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    const decodeSeen = await proxy(decode);
    const server = await serve([
      `role=prefill,name=p0,url=${prefill.url},pd=sglang`,
      `role=decode,name=d0,url=${decodeSeen.url},pd=sglang`,
    ]);
    const response = await chat(
      server.url,
      "Plan the migration of the billing service in three steps.",
      24,
      true,
    );
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("x-sluice-replica"), "d0");
    const text = await response.text();
    assert.match(text, /data: \[DONE\]/);
    const sent = JSON.parse(decodeSeen.requests.find((r) => r.path === "/v1/chat/completions")!.body);
    assert.equal(sent.bootstrap_host, "127.0.0.1");
    assert.equal(
      sent.bootstrap_port,
      Number(new URL(prefill.url).port),
      "the bootstrap port the prefill server states in its server info",
    );
    assert.ok(Number.isSafeInteger(sent.bootstrap_room) && sent.bootstrap_room >= 0);
    assert.equal(sent.max_tokens, 24, "the decode request keeps the client's max_tokens");
    assert.equal(sent.kv_transfer_params, undefined, "nothing of vLLM's flow");
    assert.equal(
      prefill.engine.stats().generationTokens,
      1,
      "the prefill server computed the prompt to one token",
    );
    assert.ok(prefill.engine.stats().prefillTokens > 10);
    assert.equal(decode.engine.transfers.transfers, 1, "the decode server received the KV once");
    assert.equal(decode.engine.stats().prefillTokens, 1, "and computed only the last prompt token");
    assert.equal(decode.engine.stats().generationTokens, 24);
    await until(() => idle(server));
    assert.equal(server.scheduler.state().disaggregation?.wastedPrefillTokens, 0);
  });

  it("answers a call that does not stream with the decode replica's JSON answer", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    const server = await serve([
      `role=prefill,name=p0,url=${prefill.url},pd=sglang`,
      `role=decode,name=d0,url=${decode.url},pd=sglang`,
    ]);
    const response = await chat(server.url, "Name three prime numbers.", 12, false);
    assert.equal(response.status, 200);
    const body = (await response.json()) as {
      choices: { finish_reason: string; message: { content: string } }[];
      usage: { completion_tokens: number };
    };
    assert.equal(body.choices[0]!.finish_reason, "length");
    assert.equal(body.usage.completion_tokens, 12);
    assert.ok(body.choices[0]!.message.content.length > 0);
    assert.equal(prefill.engine.stats().generationTokens, 1);
    assert.equal(decode.engine.transfers.transfers, 1);
    await until(() => idle(server));
  });

  it("a decode replica that fails: 503 before any byte, its prefill stopped before computing, nothing held", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    // The decode replica's connection drops before any answer.
    const failing = await proxy(decode, (_req, res) => res.socket?.destroy());
    const prefillSeen = await proxy(prefill);
    const server = await serve([
      `role=prefill,name=p0,url=${prefillSeen.url},pd=sglang`,
      `role=decode,name=d0,url=${failing.url},pd=sglang`,
    ]);
    const response = await chat(server.url, "Summarise the incident report.", 16, true);
    assert.equal(response.status, 503);
    const body = (await response.json()) as { error: { code: string } };
    assert.equal(body.error.code, "unavailable");
    await until(() => idle(server));
    const prefillCall = prefillSeen.requests.find((r) => r.path === "/v1/chat/completions");
    assert.ok(prefillCall, "the prefill request was sent");
    await prefillCall.aborted;
    assert.equal(
      prefill.engine.stats().prefillTokens,
      0,
      "it waited for its decode server, which never joined",
    );
    const pd = server.scheduler.state().disaggregation!;
    assert.equal(pd.refusedAfterPrefill, 0, "no prefill was wasted");
    assert.equal(pd.wastedPrefillTokens, 0);
  });

  it("a prefill replica that fails: 503 before any byte, the waiting decode request stopped, nothing held", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    // Its server info (and so its bootstrap port) is the real prefill server's; its completions fail as SGLang's do.
    const failing = await proxy(prefill, (_req, res) => {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          object: "error",
          message: "Prefill transfer failed for request rank=0",
          type: "InternalServerError",
          param: null,
          code: 500,
        }),
      );
    });
    const decodeSeen = await proxy(decode);
    const server = await serve([
      `role=prefill,name=p0,url=${failing.url},pd=sglang`,
      `role=decode,name=d0,url=${decodeSeen.url},pd=sglang`,
    ]);
    const response = await chat(server.url, "Draft the release notes.", 16, false);
    assert.equal(response.status, 503);
    const body = (await response.json()) as { error: { code: string; message: string } };
    assert.equal(body.error.code, "unavailable");
    assert.match(body.error.message, /p0/);
    await until(() => idle(server));
    const decodeCall = decodeSeen.requests.find((r) => r.path === "/v1/chat/completions");
    assert.ok(decodeCall, "the decode request was sent beside it");
    await decodeCall.aborted;
    assert.equal(decode.engine.transfers.transfers, 0, "no KV crossed");
    assert.equal(decode.engine.stats().generationTokens, 0);
  });

  it("a client that leaves while it waits at the decode gate sent no prefill request; nothing held", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    const prefillSeen = await proxy(prefill);
    const server = await serve(
      [
        `role=prefill,name=p0,url=${prefillSeen.url},pd=sglang`,
        `role=decode,name=d0,url=${decode.url},pd=sglang`,
      ],
      { config: { gate: { engineRequestLimit: 1 } } },
    );
    // The first call holds the decode replica's only gate slot while it generates.
    const first = new AbortController();
    const firstResponse = await chat(server.url, "Write a long design document.", 4000, true, first.signal);
    assert.equal(firstResponse.status, 200);
    const second = new AbortController();
    const pending = chat(server.url, "A short question.", 8, false, second.signal).catch(
      (error: Error) => error,
    );
    const decodeGate = () => server.scheduler.state().replicas.find((r) => r.id === "d0")!.gate;
    await until(() => decodeGate().queued === 1);
    // The decode side admits a call before its prefill starts: the prefill server has seen only the first call.
    const prefillRequests = () =>
      prefillSeen.requests.filter((r) => r.path === "/v1/chat/completions").length;
    assert.equal(prefillRequests(), 1, "no prefill request before the decode gate let the call in");
    assert.equal(prefill.engine.stats().generationTokens, 1, "only the first call's prompt was computed");
    second.abort();
    const outcome = await pending;
    assert.ok(outcome instanceof Error && outcome.name === "AbortError");
    await until(() => decodeGate().queued === 0);
    assert.equal(prefillRequests(), 1, "the call that left never reached the prefill server");
    first.abort();
    await firstResponse.body?.cancel().catch(() => undefined);
    await until(() => idle(server));
    assert.equal(prefill.engine.stats().generationTokens, 1, "the second call's prompt never was");
    assert.equal(decode.engine.transfers.transfers, 1);
    assert.equal(
      server.scheduler.state().disaggregation?.wastedPrefillTokens,
      0,
      "a cancel is not a refusal",
    );
  });
});

describe("sluice serve reading an SGLang upstream's server info", { timeout: 30_000 }, () => {
  it("warns at start-up when a replica states another disaggregation_mode than its configured role", async () => {
    const prefill = await sim("prefill", "p0");
    const decode = await sim("decode", "d0");
    const lines: string[] = [];
    running = await startServer({
      port: 0,
      host: "127.0.0.1",
      // Swapped by mistake.
      upstreams: [
        `role=prefill,name=p0,url=${decode.url},pd=sglang`,
        `role=decode,name=d0,url=${prefill.url},pd=sglang`,
      ],
      log: (line) => lines.push(line),
    });
    assert.ok(
      lines.some((l) =>
        /upstream p0 is configured role=prefill,pd=sglang but states disaggregation_mode decode/.test(l),
      ),
    );
    assert.ok(
      lines.some((l) =>
        /upstream d0 is configured role=decode,pd=sglang but states disaggregation_mode prefill/.test(l),
      ),
    );
  });
});

describe("the pairing an SGLang prefill upstream gives each call", { timeout: 30_000 }, () => {
  async function pairingFrom(info: Record<string, unknown> | null, options: { bootstrapPort?: number } = {}) {
    const fake = await startFakeUpstream({
      "/server_info": (_req, res) => {
        res.writeHead(info ? 200 : 404, { "content-type": "application/json" });
        res.end(JSON.stringify(info ?? { detail: "Not Found" }));
      },
    });
    fakes.push(fake);
    const engine = new OpenAIUpstreamEngine({ baseUrl: fake.url, role: "prefill", pd: "sglang", ...options });
    await engine.start();
    const pairing = engine.pairedKvTransfer();
    await engine.close();
    return pairing;
  }

  it("names the server's host and the bootstrap port it states, else the one given, else 8998; a fresh room each call", async () => {
    assert.equal((await pairingFrom({ disaggregation_bootstrap_port: 7001 }))?.bootstrap_port, 7001);
    assert.equal(
      (await pairingFrom({ disaggregation_bootstrap_port: 7001 }, { bootstrapPort: 9100 }))?.bootstrap_port,
      9100,
    );
    assert.equal((await pairingFrom({ disaggregation_mode: "prefill" }))?.bootstrap_port, 8998);
    const pairing = await pairingFrom(null);
    assert.equal(pairing?.bootstrap_host, "127.0.0.1");
    assert.equal(pairing?.bootstrap_port, 8998);
    const engine = new OpenAIUpstreamEngine({
      baseUrl: "http://[::1]:30000",
      role: "prefill",
      pd: "sglang",
      bootstrapPort: 8998,
    });
    const a = engine.pairedKvTransfer()!;
    const b = engine.pairedKvTransfer()!;
    assert.equal(a.bootstrap_host, "::1");
    assert.notEqual(a.bootstrap_room, b.bootstrap_room);
    assert.ok(Number.isSafeInteger(a.bootstrap_room) && a.bootstrap_room >= 0);
    await engine.close();
  });

  it("gives none in vLLM's flow or on a decode replica", () => {
    for (const options of [
      { role: "prefill" as const },
      { role: "prefill" as const, pd: "vllm" as const },
      { role: "decode" as const, pd: "sglang" as const },
    ]) {
      const engine = new OpenAIUpstreamEngine({ baseUrl: "http://127.0.0.1:1", ...options });
      assert.equal(engine.pairedKvTransfer(), undefined);
      void engine.close();
    }
  });
});
