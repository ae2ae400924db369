/** @module The simulated replicas in SGLang's PD mode, over HTTP: the room both requests carry, the decode server joining the prefill server, and SGLang's refusals. */

import assert from "node:assert/strict";
import { afterEach, describe, it } from "node:test";
import { type SimServer, startSimServer } from "../../adapters/engines/sim/http-server.js";

const sims: SimServer[] = [];

afterEach(async () => {
  await Promise.all(sims.splice(0).map((s) => s.close()));
});

async function pair(): Promise<{ prefill: SimServer; decode: SimServer }> {
  const prefill = await startSimServer({ role: "prefill", id: "p0", pd: "sglang" });
  const decode = await startSimServer({ role: "decode", id: "d0", pd: "sglang" });
  sims.push(prefill, decode);
  return { prefill, decode };
}

function post(url: string, body: Record<string, unknown>): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "Explain the plan in detail." }], ...body }),
  });
}

describe("simulated replicas in SGLang's PD mode", { timeout: 30_000 }, () => {
  it("state their mode, and the prefill server its bootstrap port, in their server info", async () => {
    const { prefill, decode } = await pair();
    const p = (await (await fetch(`${prefill.url}/get_server_info`)).json()) as Record<string, unknown>;
    assert.equal(p.disaggregation_mode, "prefill");
    assert.equal(p.disaggregation_bootstrap_port, Number(new URL(prefill.url).port));
    const d = (await (await fetch(`${decode.url}/server_info`)).json()) as Record<string, unknown>;
    assert.equal(d.disaggregation_mode, "decode");
    assert.equal(d.disaggregation_bootstrap_port, undefined);
  });

  it("refuse a request without a bootstrap room, as SGLang's scheduler does", async () => {
    const { prefill, decode } = await pair();
    for (const server of [prefill, decode]) {
      const response = await post(server.url, { max_tokens: 4 });
      assert.equal(response.status, 400);
      const body = (await response.json()) as { error: { message: string } };
      assert.match(body.error.message, /Disaggregated request received without bootstrap room id/);
    }
    assert.equal(prefill.engine.stats().prefillTokens, 0);
  });

  it("pair the two requests of a room whichever arrives first; the prefill answers one token, the decode the rest", async () => {
    const { prefill, decode } = await pair();
    const port = Number(new URL(prefill.url).port);
    for (const [room, decodeFirst] of [
      [7, true],
      [2 ** 53 - 1, false],
    ] as const) {
      const fields = {
        bootstrap_host: "127.0.0.1",
        bootstrap_port: port,
        bootstrap_room: room,
        max_tokens: 6,
      };
      const computed = prefill.engine.stats().prefillTokens;
      const first = decodeFirst ? post(decode.url, fields) : post(prefill.url, { ...fields, max_tokens: 1 });
      // The first waits for the second: the prefill computes nothing until its decode server joined.
      await new Promise((resolve) => setTimeout(resolve, 20));
      assert.equal(prefill.engine.stats().prefillTokens, computed);
      const second = decodeFirst ? post(prefill.url, { ...fields, max_tokens: 1 }) : post(decode.url, fields);
      const [a, b] = await Promise.all([first, second]);
      const [prefillAnswer, decodeAnswer] = (decodeFirst ? [b, a] : [a, b]) as [Response, Response];
      assert.equal(prefillAnswer.status, 200);
      assert.equal(decodeAnswer.status, 200);
      const p = (await prefillAnswer.json()) as {
        usage: { completion_tokens: number };
        choices: { finish_reason: string }[];
      };
      assert.equal(p.usage.completion_tokens, 1);
      assert.equal(p.choices[0]!.finish_reason, "length");
      const d = (await decodeAnswer.json()) as { usage: { completion_tokens: number } };
      assert.equal(d.usage.completion_tokens, 6);
    }
    assert.equal(decode.engine.transfers.transfers, 2);
    assert.equal(prefill.openRooms(), 0);
  });

  it("a decode request whose prefill server cannot be reached fails 500 as SGLang's decode does", async () => {
    const { decode } = await pair();
    const response = await post(decode.url, {
      bootstrap_host: "127.0.0.1",
      bootstrap_port: 1,
      bootstrap_room: 3,
      max_tokens: 4,
    });
    assert.equal(response.status, 500);
    const body = (await response.json()) as { error: { message: string } };
    assert.match(body.error.message, /Decode transfer failed for request .*bootstrap_room=3/);
    assert.equal(decode.engine.stats().generationTokens, 0);
  });

  it("is for a prefill or a decode replica only", async () => {
    await assert.rejects(startSimServer({ pd: "sglang" }), RangeError);
  });
});
