/** @module Settings: text coercion, docs/configuration.md order of sources, and ranges that agree with the constructors. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ConfigError } from "../../src/config/config-error.js";
import { resolveSchedulerConfig, schedulerConfigSchema } from "../../src/config/scheduler-config.js";
import { SCHEDULER_SETTINGS } from "../../src/config/scheduler-settings.js";
import {
  defaultShown,
  fieldSchema,
  parseSettingText,
  resolveSettings,
  type Setting,
  schemaDefault,
} from "../../src/config/settings.js";
import { BackendGate } from "../../src/gate/backend-gate.js";
import { type AimdOptions, AimdWindow } from "../../src/sessions/aimd-window.js";
import { TokenWindow } from "../../src/sessions/token-window.js";

const byFlag = (flag: string): Setting => {
  const setting = SCHEDULER_SETTINGS.find((s) => s.flag === flag);
  assert.ok(setting, flag);
  return setting;
};

const accepts = (flag: string, text: string) => parseSettingText(byFlag(flag), text) !== undefined;

describe("text coercion", () => {
  test("integers take decimal digits only, spaces around allowed", () => {
    assert.deepEqual(parseSettingText(byFlag("block-size"), " 32 "), { value: 32 });
    for (const bad of ["1.5", "1e3", "+3", "-1", "0x10", "", "  ", "12abc", "99999999999999999999", "0"]) {
      assert.equal(accepts("block-size", bad), false, JSON.stringify(bad));
    }
  });

  test("numbers take decimals and exponents within the schema's range", () => {
    assert.deepEqual(parseSettingText(byFlag("window-kv-low"), " 0.25 "), { value: 0.25 });
    assert.deepEqual(parseSettingText(byFlag("affinity-break-ms"), "2.5e3"), { value: 2500 });
    for (const bad of ["1.01", "-0.1", "NaN", "Infinity", "0x1", "half", ""]) {
      assert.equal(accepts("window-kv-low", bad), false, JSON.stringify(bad));
    }
  });

  test("choices are trimmed; the policy takes concur and the window unit tokens or sessions", () => {
    assert.deepEqual(parseSettingText(byFlag("policy"), " concur "), { value: "concur" });
    assert.deepEqual(parseSettingText(byFlag("window-unit"), "tokens"), { value: "tokens" });
    assert.equal(accepts("window-unit", "bytes"), false);
  });
});

describe("docs/configuration.md order of sources", () => {
  const settings = SCHEDULER_SETTINGS;

  test("flag over canonical variable over Dynamo alias; defaults stay unset", () => {
    const env = {
      SLUICE_ENGINE_REQUEST_LIMIT: "7",
      DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT: "9",
      DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT: " 3 ",
      SLUICE_WINDOW_UNIT: "tokens",
    };
    const both = resolveSettings(settings, { flags: { "engine-request-limit": "5" }, env });
    assert.equal((both.values.config as { gate: { engineRequestLimit: number } }).gate.engineRequestLimit, 5);
    assert.equal(both.sources["engine-request-limit"], "flag");
    const fromEnv = resolveSettings(settings, { env });
    assert.deepEqual(fromEnv.values, {
      config: { gate: { engineRequestLimit: 7, requestQueueLimit: 3 }, window: { unit: "tokens" } },
    });
    assert.deepEqual(fromEnv.sources, {
      "engine-request-limit": "env",
      "request-queue-limit": "alias",
      "window-unit": "env",
    });
    assert.deepEqual(resolveSettings(settings, {}).values, {});
  });

  test("an invalid variable warns, naming it, and the next source is used", () => {
    const warnings: string[] = [];
    const resolved = resolveSettings(settings, {
      env: {
        SLUICE_REQUEST_QUEUE_LIMIT: "lots",
        DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT: "4",
        SLUICE_WINDOW_DECREASE: "1",
        SLUICE_RETENTION_QUANTILE: "0",
      },
      warn: (message) => warnings.push(message),
    });
    assert.deepEqual(resolved.values, { config: { gate: { requestQueueLimit: 4 } } });
    assert.equal(warnings.length, 3);
    assert.match(
      warnings[0]!,
      /SLUICE_REQUEST_QUEUE_LIMIT="lots".*falling back to DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT/,
    );
    assert.match(warnings[1]!, /SLUICE_WINDOW_DECREASE="1": expected a number between 0 and 1 \(exclusive\)/);
    assert.match(warnings[2]!, /SLUICE_RETENTION_QUANTILE/);
  });

  test("an invalid flag is a ConfigError naming the flag, the value and what it takes", () => {
    assert.throws(
      () => resolveSettings(settings, { flags: { "overload-status": "200" } }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.flag === "--overload-status" &&
        err.message === '--overload-status takes an integer from 400 to 599, got "200"',
    );
    assert.throws(
      () => resolveSettings(settings, { flags: { "window-increase": "1.5" } }),
      /--window-increase takes a positive integer, got "1\.5"/,
    );
  });
});

describe("one schema", () => {
  test("every scheduler setting points at a schema field and shows its default", () => {
    for (const setting of SCHEDULER_SETTINGS) {
      const field = setting.path.replace(/^config\./, "");
      assert.equal(setting.schema, fieldSchema(schedulerConfigSchema, field), setting.flag);
      assert.equal(setting.env, `SLUICE_${setting.flag.toUpperCase().replace(/-/g, "_")}`);
      const fallback = schemaDefault(setting.schema);
      // A switch that is off unless given shows no default.
      if (fallback === false) assert.equal(defaultShown(setting), setting.defaultText);
      else if (fallback !== undefined) assert.equal(defaultShown(setting), String(fallback));
      else assert.ok(setting.defaultText, `${setting.flag} says what happens when unset`);
    }
  });

  test("the token-window and session flags map to their configuration fields", () => {
    const paths = Object.fromEntries(SCHEDULER_SETTINGS.map((s) => [s.flag, s.path]));
    assert.deepEqual(
      {
        unit: paths["window-unit"],
        initial: paths["window-initial-tokens"],
        min: paths["window-min-tokens"],
        max: paths["window-max-tokens"],
        increase: paths["window-increase-tokens"],
        decrease: paths["window-decrease"],
        kvLow: paths["window-kv-low"],
        kvHigh: paths["window-kv-high"],
        hitLow: paths["window-hit-low"],
        quantile: paths["retention-quantile"],
        idle: paths["idle-timeout-ms"],
      },
      {
        unit: "config.window.unit",
        initial: "config.window.initialTokens",
        min: "config.window.minTokens",
        max: "config.window.maxTokens",
        increase: "config.window.increaseTokens",
        decrease: "config.window.decrease",
        kvLow: "config.window.kvLow",
        kvHigh: "config.window.kvHigh",
        hitLow: "config.window.hitLow",
        quantile: "config.sessions.retentionQuantile",
        idle: "config.sessions.idleTimeoutMs",
      },
    );
  });

  test("what the flags accept, the schema and the constructors accept, and the reverse", () => {
    // The session-count law's parameters, at and beyond each boundary.
    // The other options are chosen so that only the one under test can be refused.
    const windowCases: [string, keyof AimdOptions, string[], Partial<AimdOptions>][] = [
      ["window-decrease", "decrease", ["0", "0.01", "0.99", "1"], {}],
      ["window-kv-low", "kvLow", ["0", "1", "1.01"], { kvHigh: 1 }],
      ["window-kv-high", "kvHigh", ["0", "1", "1.5"], { kvLow: 0 }],
      ["window-hit-low", "hitLow", ["0", "1", "1.5"], {}],
      ["window-increase", "increase", ["0", "1", "1.5"], {}],
      ["window-max", "max", ["0", "1", "1024"], { initial: 1, min: 1 }],
    ];
    for (const [flag, option, texts, others] of windowCases) {
      for (const text of texts) {
        const flagOk = accepts(flag, text);
        let constructorOk = true;
        try {
          new AimdWindow({ ...others, [option]: Number(text) });
        } catch {
          constructorOk = false;
        }
        assert.equal(flagOk, constructorOk, `--${flag} ${text}: flag ${flagOk}, AimdWindow ${constructorOk}`);
      }
    }
    // The token law's bounds.
    for (const [flag, option] of [
      ["window-min-tokens", "min"],
      ["window-increase-tokens", "increase"],
    ] as const) {
      for (const text of ["0", "1", "4096"]) {
        let constructorOk = true;
        try {
          new TokenWindow({ capacityTokens: 100_000, [option]: Number(text) });
        } catch {
          constructorOk = false;
        }
        assert.equal(accepts(flag, text), constructorOk, `--${flag} ${text}`);
      }
    }
    for (const status of [100, 399, 400, 529, 599, 600]) {
      const flagOk = accepts("overload-status", String(status));
      let constructorOk = true;
      try {
        new BackendGate({
          engineRequestLimit: 1,
          engineRequestWaitingLimit: 1,
          requestQueueLimit: 0,
          overloadStatus: status,
        });
      } catch {
        constructorOk = false;
      }
      const schemaOk = schedulerConfigSchema.safeParse({ gate: { overloadStatus: status } }).success;
      assert.equal(flagOk, constructorOk, `overload status ${status}`);
      assert.equal(schemaOk, constructorOk, `overload status ${status}`);
    }
    assert.throws(() => resolveSchedulerConfig({ window: { increase: 1.5 } }), RangeError);
  });
});
