/** @module Tests of the gate limit configuration: precedence of every source, and every invalid value. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ConfigError } from "../../src/config/config-error.js";
import { resolveGateLimits, resolveGateLimitsWithSources } from "../../src/config/gate-limits.js";

const SETTINGS = [
  {
    key: "engineRequestLimit",
    flag: "--engine-request-limit",
    env: "SLUICE_ENGINE_REQUEST_LIMIT",
    alias: "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT",
    fallback: 10_000,
    engine: (n: number) => n,
    min: 1,
  },
  {
    key: "engineRequestWaitingLimit",
    flag: "--engine-request-waiting-limit",
    env: "SLUICE_ENGINE_REQUEST_WAITING_LIMIT",
    alias: "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT",
    fallback: 10_000,
    engine: (n: number) => n,
    min: 1,
  },
  {
    key: "requestQueueLimit",
    flag: "--request-queue-limit",
    env: "SLUICE_REQUEST_QUEUE_LIMIT",
    alias: "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT",
    fallback: 20_000,
    engine: (n: number) => 2 * n,
    min: 0,
  },
] as const;

const INVALID = ["abc", "-1", "1.5", "1e3", "0x10", "", "   ", "+3", "12abc", "99999999999999999999"];

describe("resolveGateLimits", () => {
  test("defaults to 10000 / 10000 / 20000 until the engine reports capacity", () => {
    assert.deepEqual(resolveGateLimits({}), {
      engineRequestLimit: 10_000,
      engineRequestWaitingLimit: 10_000,
      requestQueueLimit: 20_000,
    });
    assert.deepEqual(resolveGateLimits(), resolveGateLimits({ engine: {} }));
  });

  test("defaults follow the engine's max_num_seqs: limits = n, queue = 2n", () => {
    assert.deepEqual(resolveGateLimits({ engine: { maxNumSeqs: 256 } }), {
      engineRequestLimit: 256,
      engineRequestWaitingLimit: 256,
      requestQueueLimit: 512,
    });
    // An engine that reports nothing usable leaves the static defaults.
    assert.equal(resolveGateLimits({ engine: { maxNumSeqs: 0 } }).engineRequestLimit, 10_000);
    assert.equal(resolveGateLimits({ engine: { maxNumSeqs: Number.NaN } }).requestQueueLimit, 20_000);
  });

  for (const s of SETTINGS) {
    describe(s.flag, () => {
      const read = (input: Parameters<typeof resolveGateLimitsWithSources>[0]) => {
        const { limits, sources } = resolveGateLimitsWithSources(input);
        return [limits[s.key], sources[s.key]];
      };

      test("flag > canonical env > Dynamo alias > engine > default", () => {
        const engine = { maxNumSeqs: 8 };
        const env = { [s.env]: "7", [s.alias]: "6" };
        assert.deepEqual(read({ flags: { [s.key]: "9" }, env, engine }), [9, "flag"]);
        assert.deepEqual(read({ env, engine }), [7, "env"]);
        assert.deepEqual(read({ env: { [s.alias]: "6" }, engine }), [6, "alias"]);
        assert.deepEqual(read({ engine }), [s.engine(8), "engine"]);
        assert.deepEqual(read({}), [s.fallback, "default"]);
      });

      test("values with surrounding spaces are accepted", () => {
        assert.deepEqual(read({ flags: { [s.key]: " 12 " } }), [12, "flag"]);
        assert.deepEqual(read({ env: { [s.env]: "\t13 \n" } }), [13, "env"]);
        assert.deepEqual(read({ env: { [s.alias]: " 14" } }), [14, "alias"]);
      });

      test(`the smallest accepted value is ${s.min}`, () => {
        assert.deepEqual(read({ flags: { [s.key]: String(s.min) } }), [s.min, "flag"]);
        if (s.min === 1) {
          assert.throws(() => read({ flags: { [s.key]: "0" } }), ConfigError);
        }
      });

      for (const bad of [...INVALID, ...(s.min === 1 ? ["0"] : [])]) {
        test(`an invalid flag ${JSON.stringify(bad)} throws a ConfigError naming the flag and value`, () => {
          assert.throws(
            () => resolveGateLimits({ flags: { [s.key]: bad }, env: { [s.env]: "5" } }),
            (error: unknown) =>
              error instanceof ConfigError &&
              error.message.includes(s.flag) &&
              error.message.includes(JSON.stringify(bad)) &&
              error.flag === s.flag &&
              error.value === bad &&
              error.exitStatus === 2,
          );
        });

        test(`an invalid env value ${JSON.stringify(bad)} warns naming the variable and falls back`, () => {
          const warnings: string[] = [];
          const warn = (m: string) => warnings.push(m);
          // Canonical invalid: the alias is used.
          assert.deepEqual(read({ env: { [s.env]: bad, [s.alias]: "4" }, warn }), [4, "alias"]);
          assert.equal(warnings.length, 1);
          assert.ok(warnings[0]!.includes(s.env), warnings[0]);
          assert.ok(warnings[0]!.includes(JSON.stringify(bad)), warnings[0]);
          // Both invalid: the engine default, then the static default; one warning per variable.
          warnings.length = 0;
          assert.deepEqual(read({ env: { [s.env]: bad, [s.alias]: bad }, engine: { maxNumSeqs: 3 }, warn }), [
            s.engine(3),
            "engine",
          ]);
          assert.deepEqual(
            warnings.map((w) => w.split("=")[0]),
            [`ignoring ${s.env}`, `ignoring ${s.alias}`],
          );
          assert.deepEqual(read({ env: { [s.alias]: bad }, warn }), [s.fallback, "default"]);
        });
      }

      test("an invalid env value is not consulted when a flag is given", () => {
        const warnings: string[] = [];
        assert.deepEqual(
          read({ flags: { [s.key]: "3" }, env: { [s.env]: "x" }, warn: (m) => warnings.push(m) }),
          [3, "flag"],
        );
        assert.deepEqual(warnings, []);
      });
    });
  }

  test("each setting is independent: overriding an engine limit keeps the queue default", () => {
    assert.deepEqual(
      resolveGateLimits({
        flags: { engineRequestLimit: "4" },
        env: { DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT: "2" },
        engine: { maxNumSeqs: 100 },
      }),
      { engineRequestLimit: 4, engineRequestWaitingLimit: 2, requestQueueLimit: 200 },
    );
    assert.deepEqual(resolveGateLimits({ env: { SLUICE_REQUEST_QUEUE_LIMIT: "0" } }), {
      engineRequestLimit: 10_000,
      engineRequestWaitingLimit: 10_000,
      requestQueueLimit: 0,
    });
  });

  test("unset variables are skipped silently", () => {
    const warnings: string[] = [];
    resolveGateLimits({ env: { SLUICE_ENGINE_REQUEST_LIMIT: undefined }, warn: (m) => warnings.push(m) });
    assert.deepEqual(warnings, []);
  });
});
