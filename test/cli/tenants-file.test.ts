import assert from "node:assert/strict";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { serveOptionsFromArgs } from "../../adapters/cli/serve.js";
import { parseTenants } from "../../adapters/cli/tenants-file.js";
import { ConfigError } from "../../src/config/config-error.js";

const EXAMPLE = {
  "team-a": { weight: 2 },
  batch: { band: "sheddable" },
  ops: { band: "protected", weight: 1, max_share: 0.5 },
};

describe("--tenants FILE", () => {
  it("reads weights, bands and caps into the scheduler configuration", async () => {
    const dir = await mkdtemp(join(tmpdir(), "sluice-tenants-"));
    const file = join(dir, "tenants.json");
    await writeFile(file, JSON.stringify(EXAMPLE));
    const options = await serveOptionsFromArgs(
      [
        "--tenants",
        file,
        "--tenant-header",
        "x-gateway-tenant",
        "--fairness",
        "off",
        "--fair-reclaim-after-ms",
        "2500",
      ],
      {},
      () => {},
    );
    assert.deepEqual(options.config?.tenants, EXAMPLE);
    assert.equal(options.config?.fairness, "off");
    assert.equal(options.config?.fairReclaimAfterMs, 2500);
    assert.equal(options.tenantHeader, "x-gateway-tenant");
  });

  it("names the tenant, the field and the value it cannot take", async () => {
    assert.throws(() => parseTenants('{ "a": { "weight": 0 } }'), /a\.weight: .*got 0/);
    assert.throws(() => parseTenants('{ "a": { "band": "gold" } }'), /a\.band: .*got "gold"/);
    assert.throws(() => parseTenants('{ "a": { "max_share": 1.5 } }'), /a\.max_share: .*got 1\.5/);
    assert.throws(() => parseTenants('{ "a": { "wieght": 2 } }'), /wieght/);
    assert.throws(() => parseTenants("[1"), /not JSON/);
    const dir = await mkdtemp(join(tmpdir(), "sluice-tenants-"));
    const file = join(dir, "bad.json");
    await writeFile(file, '{ "batch": { "band": "cheap" } }');
    await assert.rejects(
      serveOptionsFromArgs(["--tenants", file], {}, () => {}),
      (err) =>
        err instanceof ConfigError &&
        err.exitStatus === 2 &&
        /--tenants .*batch\.band.*"cheap"/.test(err.message),
    );
  });
});
