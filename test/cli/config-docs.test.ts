/** @module docs/configuration.md is generated from the settings; this fails when it is stale. */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  CONFIGURATION_DOC,
  DOCUMENTED_COMMANDS,
  renderConfigurationDoc,
} from "../../adapters/cli/config-docs.js";

test("docs/configuration.md matches the settings (run `npm run docs:config` after changing a flag)", () => {
  const written = readFileSync(CONFIGURATION_DOC, "utf8");
  assert.equal(written, renderConfigurationDoc(), "docs/configuration.md is stale: run npm run docs:config");
});

test("the reference lists every flag of every command, with its variable", () => {
  const doc = renderConfigurationDoc();
  for (const command of DOCUMENTED_COMMANDS) {
    assert.ok(doc.includes(`## sluice ${command.name}`), command.name);
    for (const setting of command.settings) {
      assert.ok(doc.includes(`\`--${setting.flag}`), `--${setting.flag}`);
      if (setting.env) assert.ok(doc.includes(`\`${setting.env}\``), setting.env);
      if (setting.alias) assert.ok(doc.includes(`\`${setting.alias}\``), setting.alias);
    }
  }
});
