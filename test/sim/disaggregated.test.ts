/** @module The simulated prefill/decode pair: vLLM's KV-connector hand-over, the transfer over the link, the metrics each role publishes. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { createSimRegistry } from "../../adapters/engines/sim/metrics.js";
import { kvTransferMsPerToken, resolveSimParams } from "../../adapters/engines/sim/presets.js";
import { assertIdle, harness, tokens } from "./sim-helpers.js";

/** What vLLM's toy proxy sends a prefill (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py). */
const PREFILL_REQUEST = {
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
};

describe("disaggregated prefill and decode", () => {
  test("a prefill sent do_remote_decode answers kv_transfer_params a decode pulls by", async () => {
    const p = harness({ role: "prefill", id: "prefill-0" });
    const prompt = tokens(4000, 1);
    const call = await p.call("a", prompt, 1, { kvTransferParams: PREFILL_REQUEST });
    await p.drain();
    const params = call.result!.kvTransferParams!;
    assert.equal(params.do_remote_prefill, true);
    assert.equal(params.do_remote_decode, false);
    assert.equal(params.remote_engine_id, "prefill-0");
    assert.equal((params.remote_block_ids as number[]).length, Math.ceil(4000 / 16));
    assertIdle(p);
    // A plain call on a prefill replica is served whole and hands nothing over.
    const plain = await p.call("b", prompt, 4);
    await p.drain();
    assert.equal(plain.result!.kvTransferParams, undefined);
    assert.equal(plain.result!.completionTokens, 4);
  });

  test("a decode given those parameters waits for the transfer, then computes only the last prompt token", async () => {
    const d = harness({ role: "decode", id: "decode-0" });
    const prompt = tokens(8000, 2);
    const call = await d.call("a", prompt, 20, {
      kvTransferParams: { do_remote_prefill: true, remote_engine_id: "prefill-0" },
    });
    await d.drain();
    const transferMs = 7999 * kvTransferMsPerToken(resolveSimParams("h100-llama3-8b"));
    // Llama-3-8B: 128 KiB per token at 25 GB/s → ~5.2 µs a token, ~42 ms for 8k tokens.
    assert.ok(transferMs > 30 && transferMs < 60, `transfer ${transferMs} ms`);
    assert.ok(call.firstTokenMs! >= transferMs, `first token at ${call.firstTokenMs} before the KV arrived`);
    const stats = d.engine.stats();
    assert.equal(stats.prefillTokens, 1, "only the last prompt token is computed on the decode side");
    assert.equal(call.result!.completionTokens, 20);
    assert.equal(d.engine.transfers.transfers, 1);
    assert.equal(d.engine.transfers.bytes, 7999 * d.engine.params.kvBytesPerToken);
    const text = await createSimRegistry(d.engine).metrics();
    assert.match(text, /vllm:nixl_xfer_time_seconds_count\{model_name="[^"]+",engine="0"\} 1/);
    assert.match(text, /vllm:nixl_bytes_transferred_sum\{[^}]*\} 1048444928/);
    assert.ok(d.engine.signals().kvTransferTokensPerSecond! > 100_000);
    assertIdle(d);
  });

  test("transfers share the decode replica's link: the second waits for the first", async () => {
    const d = harness({ role: "decode" });
    const params = { kvTransferParams: { do_remote_prefill: true } };
    const a = await d.call("a", tokens(16_000, 3), 2, params);
    const b = await d.call("b", tokens(16_000, 4), 2, params);
    await d.drain();
    const one = 15_999 * kvTransferMsPerToken(d.engine.params);
    assert.ok(a.firstTokenMs! >= one);
    assert.ok(b.firstTokenMs! >= 2 * one, `b's KV could only arrive after a's, at ${2 * one} ms`);
    assertIdle(d);
  });

  test("a call cancelled while its KV is on the link ends at once and holds nothing", async () => {
    const d = harness({ role: "decode" });
    const abort = new AbortController();
    const call = await d.call("a", tokens(20_000, 5), 10, {
      kvTransferParams: { do_remote_prefill: true },
      signal: abort.signal,
    });
    await d.clock.advanceAsync(5);
    abort.abort();
    await d.drain();
    assert.equal(call.result!.finishReason, "abort");
    assert.equal(d.engine.transfers.transfers, 0);
    assertIdle(d);
  });
});
