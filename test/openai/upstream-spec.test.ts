/** @module Named upstreams and per-upstream KV capacities as `sluice serve` reads them. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  describeUpstream,
  parseUpstreamSpec,
  resolveUpstreams,
  UpstreamSpecError,
} from "../../adapters/engines/openai/upstream-spec.js";
import { unknownSignals } from "../../src/engine.js";

describe("parseUpstreamSpec", () => {
  it("names a plain URL after its host:port, and takes NAME=URL as given", () => {
    assert.deepEqual(parseUpstreamSpec("http://10.0.0.1:8000"), {
      name: "10.0.0.1:8000",
      url: "http://10.0.0.1:8000",
    });
    assert.deepEqual(parseUpstreamSpec(" gpu-a=http://10.0.0.1:8000/v1 "), {
      name: "gpu-a",
      url: "http://10.0.0.1:8000/v1",
    });
    // An `=` in the URL's query is not a name.
    assert.equal(parseUpstreamSpec("http://h:1/?a=b").name, "h:1");
  });

  it("refuses what is not an http(s) URL or a usable name", () => {
    for (const bad of ["ftp://h:1", "not a url", "a b=http://h:1", "=http://h:1", "gpu=", "gpu=ftp://h"]) {
      assert.throws(() => parseUpstreamSpec(bad), UpstreamSpecError, bad);
    }
  });
});

describe("resolveUpstreams", () => {
  it("names one upstream or many the same way, and matches capacities by name", () => {
    assert.deepEqual(
      resolveUpstreams(["http://10.0.0.1:8000"]).map((u) => u.name),
      ["10.0.0.1:8000"],
    );
    const specs = resolveUpstreams(
      ["a=http://10.0.0.1:8000", "http://10.0.0.2:8000", "c=http://10.0.0.3:8000"],
      ["100000", "a=141994"],
    );
    assert.deepEqual(
      specs.map((u) => [u.name, u.kvCapacityTokens]),
      [
        ["a", 141_994],
        ["10.0.0.2:8000", 100_000],
        ["c", 100_000],
      ],
    );
  });

  it("refuses duplicate names, capacities for unknown names and capacities that are not token counts", () => {
    assert.throws(() => resolveUpstreams(["http://h:1", "http://h:1/other"]), /distinct names/);
    assert.throws(() => resolveUpstreams(["a=http://h:1", "a=http://h:2"]), /distinct names/);
    assert.throws(
      () => resolveUpstreams(["a=http://h:1"], ["b=100"]),
      (e: unknown) =>
        e instanceof UpstreamSpecError && e.setting === "--kv-capacity-tokens" && e.value === "b",
    );
    for (const bad of ["0", "-5", "1.5", "a=", "lots"]) {
      assert.throws(() => resolveUpstreams(["a=http://h:1"], [bad]), /--kv-capacity-tokens/, bad);
    }
  });
});

describe("describeUpstream", () => {
  it("says the profile, where the capacity came from and what is not published", () => {
    const signals = {
      ...unknownSignals(),
      profile: "vllm-v1+hybrid",
      kvCapacityTokens: 141_994,
      kvCapacitySource: "engine" as const,
      unknown: ["maxNumSeqs"],
      dataParallelSize: 2,
    };
    const { line, warning } = describeUpstream("a", "http://h:1", signals);
    assert.equal(
      line,
      "sluice: upstream a (http://h:1): vllm-v1+hybrid; KV capacity 141994 tokens (engine); 2 data-parallel ranks; not published: maxNumSeqs",
    );
    assert.equal(warning, undefined);
  });

  it("warns when no capacity is known: the token budget of that upstream is off", () => {
    const signals = {
      ...unknownSignals(),
      profile: "sglang",
      kvCapacitySource: "unknown" as const,
      unknown: ["kvCapacityTokens"],
    };
    const { warning } = describeUpstream("b", "http://h:2", signals);
    assert.match(
      warning ?? "",
      /upstream b states no KV capacity, so its token budget is off; set --kv-capacity-tokens b=N/,
    );
    assert.match(
      describeUpstream("c", "http://h:3", unknownSignals()).warning ?? "",
      /answered neither its metrics nor \/health nor \/v1\/models at start-up/,
    );
  });
});

describe("--upstream with a role (disaggregated fleets)", () => {
  it("role=…,name=…,url=… in any order; the role is kept, the name and URL read as in NAME=URL", () => {
    assert.deepEqual(parseUpstreamSpec("role=prefill,name=p0,url=http://gpu-0:8000"), {
      name: "p0",
      url: "http://gpu-0:8000",
      role: "prefill",
    });
    assert.deepEqual(parseUpstreamSpec(" url=http://gpu-1:8000 , role=decode "), {
      name: "gpu-1:8000",
      url: "http://gpu-1:8000",
      role: "decode",
    });
    assert.deepEqual(parseUpstreamSpec("url=http://gpu-2:8000"), {
      name: "gpu-2:8000",
      url: "http://gpu-2:8000",
    });
  });

  it("in SLUICE_UPSTREAM, which separates upstreams with commas, the keys are separated by semicolons", () => {
    assert.deepEqual(parseUpstreamSpec("role=decode;name=d0;url=http://gpu-3:8000"), {
      name: "d0",
      url: "http://gpu-3:8000",
      role: "decode",
    });
  });

  it("an unknown role, an unknown key, a repeated key or a missing url is refused with the form expected", () => {
    for (const bad of [
      "role=router,url=http://x:1",
      "role=prefill,host=x,url=http://x:1",
      "role=prefill,role=decode,url=http://x:1",
      "role=prefill,name=p0",
    ]) {
      assert.throws(
        () => parseUpstreamSpec(bad),
        (error: Error) => {
          assert.ok(error instanceof UpstreamSpecError, bad);
          assert.match(error.message, /role=prefill\|decode\|both,name=NAME,url=URL/);
          return true;
        },
      );
    }
  });
});

describe("--upstream with a request flow (pd=vllm|sglang)", () => {
  it("pd=sglang and a bootstrap port on a prefill replica, pd on a decode replica", () => {
    assert.deepEqual(
      parseUpstreamSpec("role=prefill,name=p0,url=http://gpu-0:30000,pd=sglang,bootstrap_port=8998"),
      {
        name: "p0",
        url: "http://gpu-0:30000",
        role: "prefill",
        pd: "sglang",
        bootstrapPort: 8998,
      },
    );
    assert.deepEqual(parseUpstreamSpec("pd=sglang;role=decode;url=http://gpu-1:30000"), {
      name: "gpu-1:30000",
      url: "http://gpu-1:30000",
      role: "decode",
      pd: "sglang",
    });
  });

  it("refuses an unknown flow, a flow without a prefill or decode role, and a bootstrap port elsewhere", () => {
    for (const bad of [
      "role=prefill,url=http://x:1,pd=dynamo",
      "url=http://x:1,pd=sglang",
      "role=both,url=http://x:1,pd=vllm",
      "role=decode,url=http://x:1,pd=sglang,bootstrap_port=8998",
      "role=prefill,url=http://x:1,bootstrap_port=8998",
      "role=prefill,url=http://x:1,pd=sglang,bootstrap_port=0",
      "role=prefill,url=http://x:1,pd=sglang,bootstrap_port=port",
    ]) {
      assert.throws(
        () => parseUpstreamSpec(bad),
        (error: Error) => error instanceof UpstreamSpecError && /pd=|bootstrap_port=/.test(error.message),
        bad,
      );
    }
  });

  it("a fleet speaks one flow: a prefill and a decode replica of different flows are refused", () => {
    assert.throws(
      () =>
        resolveUpstreams([
          "role=prefill,name=p0,url=http://p:1,pd=sglang",
          "role=decode,name=d0,url=http://d:1",
        ]),
      (error: Error) => error instanceof UpstreamSpecError && /one pd=/.test(error.message),
    );
    const specs = resolveUpstreams([
      "role=prefill,name=p0,url=http://p:1,pd=vllm",
      "role=decode,name=d0,url=http://d:1",
    ]);
    assert.equal(specs.length, 2, "pd=vllm is the default");
  });
});
