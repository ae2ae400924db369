/**
 * @module `sluice serve` in front of named upstreams serving genuine pages
 * (`fixtures/README.md`): replica ids, the start-up lines, the token budget
 * that follows the engine's capacity or the operator's, and `/v1/admin/state`.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { afterEach, describe, it } from "node:test";
import { type RunningServer, serveOptionsFromArgs, startServer } from "../../adapters/cli/serve.js";
import { ConfigError } from "../../src/config/config-error.js";
import { type FakeUpstream, type Handler, startFakeUpstream } from "./fake-upstream.js";

const fixture = (name: string) => readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8");

const page =
  (text: string): Handler =>
  (_req, res) => {
    res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
    res.end(text);
  };
const json =
  (text: string): Handler =>
  (_req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(text);
  };

const servers: FakeUpstream[] = [];
let running: RunningServer | undefined;

afterEach(async () => {
  await running?.close();
  running = undefined;
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

async function upstream(routes: Record<string, Handler>): Promise<FakeUpstream> {
  const up = await startFakeUpstream(routes);
  servers.push(up);
  return up;
}

describe("sluice serve with named upstreams", () => {
  it("names replicas as configured, says what each engine publishes, and keeps an unknown budget off with a warning", async () => {
    const sglang = await upstream({ "/metrics": page(fixture("sglang-docs-production-metrics.prom")) });
    const vllm = await upstream({
      "/metrics": page(fixture("vllm-v0-aibrix-runtime.prom")),
      "/v1/models": json(fixture("vllm-v0-aibrix-models.json")),
    });
    const lines: string[] = [];
    running = await startServer({
      port: 0,
      host: "127.0.0.1",
      upstreams: [`sg=${sglang.url}`, vllm.url],
      log: (line) => lines.push(line),
    });
    const state = running.scheduler.state();
    const vllmId = new URL(vllm.url).host;
    assert.deepEqual(
      state.replicas.map((r) => r.id),
      ["sg", vllmId],
    );

    const sg = state.replicas[0]!;
    assert.equal(sg.engine?.profile, "sglang");
    assert.equal(sg.engine?.kvCapacitySource, "unknown");
    assert.equal(sg.engine?.tokenBudget, false);
    assert.ok(sg.engine?.unknown.includes("prefixCache"));
    assert.equal(sg.budget.ceilingTokens, Number.MAX_SAFE_INTEGER, "off, and the state says why");

    const v0 = state.replicas[1]!;
    assert.equal(v0.engine?.profile, "vllm-v0");
    assert.equal(v0.engine?.kvCapacitySource, "derived");
    assert.equal(v0.engine?.tokenBudget, true);
    assert.equal(v0.signals.kvCapacityTokens, 81767 * 16);
    assert.equal(v0.budget.ceilingTokens, 81767 * 16);

    assert.ok(
      lines.some((l) => l.startsWith(`sluice: upstream sg (${sglang.url}): sglang; KV capacity unknown`)),
    );
    assert.ok(lines.some((l) => l.includes("upstream sg states no KV capacity, so its token budget is off")));
    assert.ok(
      lines.some((l) =>
        l.startsWith(
          `sluice: upstream ${vllmId} (${vllm.url}): vllm-v0; KV capacity 1308272 tokens (derived)`,
        ),
      ),
    );
    assert.ok(!lines.some((l) => l.includes(`upstream ${vllmId} states no KV capacity`)));

    // The admin API shows the same.
    const answer = await fetch(`${running.url}/v1/admin/state`);
    assert.equal(answer.status, 200);
    const body = (await answer.json()) as { replicas: { id: string; engine?: { profile: string } }[] };
    assert.equal(body.replicas.find((r) => r.id === "sg")?.engine?.profile, "sglang");
  });

  it("--kv-capacity-tokens NAME=N turns that upstream's budget on", async () => {
    const sglang = await upstream({ "/metrics": page(fixture("sglang-docs-production-metrics.prom")) });
    const lines: string[] = [];
    running = await startServer({
      port: 0,
      host: "127.0.0.1",
      upstreams: [`sg=${sglang.url}`],
      kvCapacityTokens: ["sg=300000"],
      log: (line) => lines.push(line),
    });
    const sg = running.scheduler.state().replicas[0]!;
    assert.equal(sg.engine?.kvCapacitySource, "configured");
    assert.equal(sg.engine?.tokenBudget, true);
    assert.equal(sg.budget.ceilingTokens, 300_000);
    assert.ok(lines.some((l) => l.includes("KV capacity 300000 tokens (configured)")));
    assert.ok(!lines.some((l) => l.includes("warning")));
  });
});

describe("sluice serve flags", () => {
  const quiet = () => undefined;

  it("reads --upstream NAME=URL and --kv-capacity-tokens, or their variables", async () => {
    const o = await serveOptionsFromArgs(
      [
        "--upstream",
        "a=http://10.0.0.1:8000",
        "--upstream",
        "http://10.0.0.2:8000",
        "--kv-capacity-tokens",
        "a=141994",
      ],
      {},
      quiet,
    );
    assert.deepEqual(o.upstreams, ["a=http://10.0.0.1:8000", "http://10.0.0.2:8000"]);
    assert.deepEqual(o.kvCapacityTokens, ["a=141994"]);
    const fromEnv = await serveOptionsFromArgs(
      [],
      {
        SLUICE_UPSTREAM: "a=http://10.0.0.1:8000, b=http://10.0.0.2:8000",
        SLUICE_KV_CAPACITY_TOKENS: "90000",
      },
      quiet,
    );
    assert.deepEqual(fromEnv.upstreams, ["a=http://10.0.0.1:8000", "b=http://10.0.0.2:8000"]);
    assert.deepEqual(fromEnv.kvCapacityTokens, ["90000"]);
  });

  it("names the flag and the value it cannot use", async () => {
    await assert.rejects(
      serveOptionsFromArgs(["--upstream", "a=ftp://h"], {}, quiet),
      (e: unknown) => e instanceof ConfigError && /--upstream/.test(e.message) && /ftp:\/\/h/.test(e.message),
    );
    await assert.rejects(
      serveOptionsFromArgs(["--upstream", "a=http://h:1", "--kv-capacity-tokens", "b=5"], {}, quiet),
      (e: unknown) => e instanceof ConfigError && /--kv-capacity-tokens/.test(e.message),
    );
    await assert.rejects(
      serveOptionsFromArgs(["--upstream", "http://h:1", "--upstream", "http://h:1"], {}, quiet),
      (e: unknown) => e instanceof ConfigError && /distinct names/.test(e.message),
    );
  });
});

describe("--engine-profile and --upstream's key form on the command line", () => {
  const quiet = () => undefined;

  it("keeps each key-form --upstream whole (its keys are comma-separated), and reads the variable's list the same way", async () => {
    const o = await serveOptionsFromArgs(
      [
        "--upstream",
        "role=prefill,name=p0,url=http://127.0.0.1:9000",
        "--upstream",
        "role=decode,name=d0,url=http://127.0.0.1:9001,profile=llamacpp",
      ],
      {},
      quiet,
    );
    assert.deepEqual(o.upstreams, [
      "role=prefill,name=p0,url=http://127.0.0.1:9000",
      "role=decode,name=d0,url=http://127.0.0.1:9001,profile=llamacpp",
    ]);
    const fromEnv = await serveOptionsFromArgs(
      [],
      {
        SLUICE_UPSTREAM:
          "a=http://10.0.0.1:8000,name=b,url=http://10.0.0.2:8000,profile=tgi,http://10.0.0.3:8000",
      },
      quiet,
    );
    assert.deepEqual(fromEnv.upstreams, [
      "a=http://10.0.0.1:8000",
      "name=b,url=http://10.0.0.2:8000,profile=tgi",
      "http://10.0.0.3:8000",
    ]);
  });

  it("reads --engine-profile PROFILE and NAME=PROFILE; profile= in the key form; a name or profile that does not exist fails start-up", async () => {
    const o = await serveOptionsFromArgs(
      ["--upstream", "a=http://h:1", "--upstream", "name=b,url=http://h:2", "--engine-profile", "a=tgi"],
      {},
      quiet,
    );
    assert.deepEqual(o.engineProfiles, ["a=tgi"]);
    await assert.rejects(
      serveOptionsFromArgs(["--upstream", "a=http://h:1", "--engine-profile", "a=ollama"], {}, quiet),
      (e: unknown) =>
        e instanceof ConfigError && /--engine-profile/.test(e.message) && /ollama/.test(e.message),
    );
    await assert.rejects(
      serveOptionsFromArgs(["--upstream", "a=http://h:1", "--engine-profile", "z=tgi"], {}, quiet),
      (e: unknown) => e instanceof ConfigError && /--engine-profile/.test(e.message) && /z/.test(e.message),
    );
    await assert.rejects(
      serveOptionsFromArgs(["--upstream", "name=a,url=http://h:1,profile=nope"], {}, quiet),
      (e: unknown) => e instanceof ConfigError && /profile=/.test(e.message),
    );
  });

  it("--engine-profile unknown reads no metrics: a vLLM page is not scraped, the engine is served on /health", async () => {
    const vllm = await upstream({
      "/metrics": page(fixture("vllm-v0-aibrix-runtime.prom")),
      "/health": (_req, res) => {
        res.writeHead(200);
        res.end();
      },
      "/v1/models": json(fixture("vllm-v0-aibrix-models.json")),
    });
    running = await startServer({
      port: 0,
      host: "127.0.0.1",
      upstreams: [`v=${vllm.url}`],
      engineProfiles: ["v=unknown"],
      log: () => undefined,
    });
    const replica = running.scheduler.state().replicas[0]!;
    assert.equal(replica.engine?.profile, "unknown");
    assert.equal(replica.healthy, true);
    assert.match(replica.engine?.warning ?? "", /--engine-profile unknown/);
    assert.ok(!vllm.requests.some((r) => r.path === "/metrics"), "the page was not read");
  });

  it("a forced profile reads the page as that engine's: --engine-profile tgi on a vLLM page finds none of TGI's series", async () => {
    const vllm = await upstream({ "/metrics": page(fixture("vllm-v0-aibrix-runtime.prom")) });
    running = await startServer({
      port: 0,
      host: "127.0.0.1",
      upstreams: [`name=v,url=${vllm.url},profile=tgi`],
      log: () => undefined,
    });
    const replica = running.scheduler.state().replicas[0]!;
    assert.equal(replica.engine?.profile, "tgi");
    assert.ok(replica.engine?.unknown.includes("running"));
    assert.ok(replica.engine?.unknown.includes("waiting"));
  });
});
