#!/usr/bin/env node
/**
 * @module The `sluice` command. `npm run build` copies this file beside the compiled `main.js` in
 * dist/adapters/cli/, where it runs plain JavaScript (the package's `bin`). Run from the source tree,
 * there is no `main.js` beside it, so it registers tsx (a development dependency) and runs `main.ts`.
 */
import { existsSync } from "node:fs";

const compiled = new URL("./main.js", import.meta.url);
if (existsSync(compiled)) {
  await import(compiled.href);
} else {
  const { register } = await import("tsx/esm/api");
  register();
  await import(new URL("./main.ts", import.meta.url).href);
}
