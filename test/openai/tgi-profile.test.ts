/**
 * @module Text Generation Inference read by its profile: the `tgi_` series (as its metrics
 * reference declares them, and as a page that serves them carries them), `/info` for limits, and
 * its error bodies (`fixtures/README.md`).
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { afterEach, describe, it } from "node:test";
import { refusalFor } from "../../adapters/engines/openai/error-mapping.js";
import { parseEngineMetrics } from "../../adapters/engines/openai/metrics-parser.js";
import type { UpstreamResponse } from "../../adapters/engines/openai/transport.js";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { VirtualClock } from "../../src/clock.js";
import { type FakeUpstream, type Handler, startFakeUpstream } from "./fake-upstream.js";

const fixture = (name: string) => readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8");
const DECLARED = fixture("tgi-metrics-reference-declared.prom");
const PAGE = fixture("tgi-names-tgis-vllm-pr18.prom");
const INFO = fixture("tgi-info-openapi.json");
const ERRORS = JSON.parse(fixture("tgi-error-examples.json")) as Record<string, unknown>;

const servers: FakeUpstream[] = [];
const engines: OpenAIUpstreamEngine[] = [];

afterEach(async () => {
  for (const engine of engines.splice(0)) await engine.close();
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

const text =
  (body: string, code = 200, type = "application/json"): Handler =>
  (_req, res) => {
    res.writeHead(code, { "content-type": type });
    res.end(body);
  };

function response(status: number): UpstreamResponse {
  return { status, header: () => undefined } as unknown as UpstreamResponse;
}

describe("TGI's series", () => {
  it("a page declaring TGI's families (its metrics reference) is TGI's, every signal unknown: declared is not measured", () => {
    const signals = parseEngineMetrics(DECLARED);
    assert.equal(signals?.profile, "tgi");
    for (const field of ["running", "waiting", "kvUsage", "prefixCache", "kvCapacityTokens", "maxNumSeqs"]) {
      assert.ok(((signals?.unknown ?? []) as readonly string[]).includes(field), field);
    }
  });

  it("reads the queue as waiting and the current batch as running (0.0 and 0.0 on this page)", () => {
    const signals = parseEngineMetrics(PAGE);
    assert.equal(signals?.profile, "tgi");
    assert.equal(signals?.waiting, 0);
    assert.equal(signals?.running, 0);
    assert.ok(!((signals?.unknown ?? []) as readonly string[]).includes("running"));
    assert.ok(!((signals?.unknown ?? []) as readonly string[]).includes("waiting"));
  });

  it("/info's max_total_tokens (2048) is the context window; this build states no max_batch_total_tokens, so capacity stays unknown", async () => {
    const up = await startFakeUpstream({
      "/metrics": text(PAGE, 200, "text/plain; version=0.0.4"),
      "/info": text(INFO),
    });
    servers.push(up);
    const engine = new OpenAIUpstreamEngine({ baseUrl: up.url, id: "tgi", clock: new VirtualClock() });
    engines.push(engine);
    await engine.start();
    const signals = engine.signals();
    assert.equal(signals.profile, "tgi");
    assert.equal(signals.healthy, true);
    assert.equal(engine.contextWindow(), 2048);
    assert.equal(signals.kvCapacitySource, "unknown");
    assert.ok(signals.unknown?.includes("kvCapacityTokens"));
    await engine.scrape();
    assert.equal(up.requests.filter((r) => r.path === "/info").length, 1, "/info is read once it answered");
  });
});

describe("TGI's error bodies", () => {
  it("429 overloaded is a worker-wide, retryable refusal", () => {
    const refusal = refusalFor(response(429), JSON.stringify(ERRORS["429"]), "tgi");
    assert.equal(refusal.reason, "worker_overloaded");
    assert.match(refusal.message, /Model is overloaded/);
  });

  it("422 validation is invalid_request, unless it is the prompt plus max_new_tokens over max_total_tokens: then 413 context_limit", () => {
    const plain = refusalFor(response(422), JSON.stringify(ERRORS["422"]), "tgi");
    assert.equal(plain.reason, "invalid_request");
    assert.equal(plain.status, 400);
    // TGI's own wording, from its templates (`router/src/infer/mod.rs` "Input validation error: {0}",
    // `router/src/validation.rs` MaxTotalTokens), with /info's max_total_tokens and a prompt of 2000.
    const body = {
      error:
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. Given: 2000 `inputs` tokens and 100 `max_new_tokens`",
      error_type: "validation",
    };
    const refusal = refusalFor(response(422), JSON.stringify(body), "tgi");
    assert.equal(refusal.reason, "context_limit");
    assert.equal(refusal.status, 413);
  });

  it("424 generation and 500 incomplete generation are the replica failing: 503 unavailable", () => {
    for (const status of ["424", "500"]) {
      const refusal = refusalFor(response(Number(status)), JSON.stringify(ERRORS[status]), "tgi");
      assert.equal(refusal.reason, "unavailable", status);
      assert.equal(refusal.status, 503);
    }
  });
});
