/**
 * @module `sluice gate` as a sidecar in front of a simulated engine over real
 * HTTP, with a frontend routing to it: the merged /metrics, the frontend
 * reading the engine's signals through the sidecar, and the sidecar's 529
 * marking the replica busy at the frontend.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  type GateServer,
  gateOptionsFromArgs,
  mergeExpositions,
  startGateServer,
} from "../../adapters/cli/gate.js";
import { OpenAIUpstreamEngine } from "../../adapters/engines/openai/upstream-engine.js";
import { type SimServer, startSimServer } from "../../adapters/engines/sim/http-server.js";
import { createTokenizer } from "../../adapters/tokenizers/index.js";
import { ConfigError } from "../../src/config/config-error.js";
import { Refusal } from "../../src/errors.js";
import { Scheduler } from "../../src/scheduler.js";
import { eventually, MODEL } from "./nats-harness.js";

describe("sluice gate in front of one engine", () => {
  let sim: SimServer;
  let gate: GateServer;
  let upstream: OpenAIUpstreamEngine;
  let frontend: Scheduler;

  before(async () => {
    sim = await startSimServer({ preset: { base: "h100-llama3-8b", c0: 2, cPrefill: 0.0005, cDec: 0.001 } });
    gate = await startGateServer({
      upstream: sim.url,
      port: 0,
      host: "127.0.0.1",
      id: "gated",
      scrapeIntervalMs: 100,
      config: { gate: { engineRequestLimit: 1, engineRequestWaitingLimit: 1, requestQueueLimit: 0 } },
      log: () => {},
    });
    upstream = new OpenAIUpstreamEngine({ baseUrl: gate.url, id: "via-gate", scrapeIntervalMs: 100 });
    await upstream.start();
    frontend = new Scheduler({
      engines: [upstream],
      tokenizer: createTokenizer(),
      config: { sessions: { controlIntervalMs: 100 } },
    });
    frontend.start();
  });

  after(async () => {
    await frontend?.stop();
    await upstream?.close();
    await gate?.close();
    await sim?.close();
  });

  test("serves one /metrics page with the gate's metrics and the engine's", async () => {
    const text = await (await fetch(`${gate.url}/metrics`)).text();
    assert.match(text, /^sluice_gate_engine_request_count\{/m);
    assert.match(text, /^sluice_gate_limit\{/m);
    assert.match(text, /^vllm:kv_cache_usage_perc/m);
    assert.match(text, /^vllm:cache_config_info/m);
    const types = text.split("\n").filter((l) => l.startsWith("# TYPE "));
    assert.equal(new Set(types).size, types.length, "no metric family appears twice");
  });

  test("lets the frontend read the engine's signals and context window through it", async () => {
    await eventually(
      () => upstream.signals().healthy && upstream.signals().kvCapacityTokens > 0,
      "signals via the sidecar",
    );
    assert.ok(upstream.models().includes(MODEL));
    assert.ok((upstream.contextWindow?.(MODEL) ?? 0) > 0);
  });

  test("answers the frontend's calls, and its 529 marks the replica busy there", async () => {
    const req = (id: string, maxTokens: number, stream = false) => ({
      requestId: id,
      endpoint: "chat" as const,
      stream,
      input: { kind: "chat" as const, messages: [{ role: "user", content: id }] },
      body: { model: MODEL, messages: [{ role: "user", content: id }], max_tokens: maxTokens, stream },
      maxTokens,
    });
    const ok = await frontend.submit(req("fine", 3));
    for await (const _ of ok) {
      // drain
    }
    assert.equal((await ok.result).completionTokens, 3);

    // A streamed call holds the sidecar's only permit until its stream ends.
    const holder = await frontend.submit(req("holder", 300, true));
    const refused = await frontend.submit(req("refused", 3)).catch((e: unknown) => e);
    assert.ok(refused instanceof Refusal, String(refused));
    assert.equal(refused.reason, "worker_overloaded");
    assert.equal(refused.status, 529);
    assert.ok((refused.retryAfterSeconds ?? 0) >= 1);
    assert.equal(frontend.state().replicas[0]!.busy, true, "a worker-wide 529 marks the replica busy");
    holder.cancel();
    await holder.result.catch(() => undefined);
    await eventually(() => gate.scheduler.idleCheck().permits === 0, "the sidecar released the permit");
    assert.deepEqual(frontend.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
  });

  test("takes its limits from flags and docs/configuration.md variables, and names a bad value", () => {
    const options = gateOptionsFromArgs(
      ["--upstream", "http://127.0.0.1:8000", "--engine-request-limit", " 4 "],
      {
        DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT: "0",
      },
    );
    assert.deepEqual(options.config?.gate, { engineRequestLimit: 4, requestQueueLimit: 0 });
    assert.throws(() => gateOptionsFromArgs([]), ConfigError);
    assert.throws(
      () => gateOptionsFromArgs(["--upstream", "http://x", "--engine-request-limit", "zero"]),
      (err: unknown) =>
        err instanceof ConfigError && /--engine-request-limit/.test(err.message) && /zero/.test(err.message),
    );
    assert.throws(() => gateOptionsFromArgs(["--upstream", "ftp://x"]), /http\(s\) URL/);
  });
});

test("merged expositions drop the engine's families the gate already has", () => {
  const own =
    "# HELP process_cpu_seconds_total cpu\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n";
  const engine =
    "# HELP process_cpu_seconds_total cpu\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 9\n" +
    '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2\n';
  const merged = mergeExpositions(own, engine);
  assert.equal(merged.match(/process_cpu_seconds_total 9/), null);
  assert.match(merged, /process_cpu_seconds_total 1/);
  assert.match(merged, /vllm:num_requests_running\{model_name="m"\} 2/);
});
