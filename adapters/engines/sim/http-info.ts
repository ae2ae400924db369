/** @module The simulated replica's read-only routes: health, version, models, server info, vLLM-named `/metrics`. */

import type { Context, Hono } from "hono";
import { createSimRegistry } from "./metrics.js";
import type { SimEngine } from "./sim-engine.js";

/**
 * Adds `GET /health`, `/version`, `/v1/models`, `/server_info` (and
 * `/get_server_info`) and `/metrics` to `app`. `bootstrapPort`, on a prefill
 * replica in SGLang's PD mode, is the port its decode servers join on.
 */
export function addInfoRoutes(app: Hono, engine: SimEngine, bootstrapPort?: () => number): void {
  const registry = createSimRegistry(engine);
  const startedAt = Math.floor(Date.now() / 1000);

  app.get("/health", (c) => c.body(null, 200));
  app.get("/version", (c) => c.json({ version: "sluice-sim" }));

  app.get("/v1/models", (c) =>
    c.json({
      object: "list",
      data: engine.models().map((id) => ({
        id,
        object: "model",
        created: startedAt,
        owned_by: "vllm",
        root: id,
        parent: null,
        max_model_len: engine.params.maxModelLen,
        permission: [],
      })),
    }),
  );

  // SGLang's server info carries its server_args; a router reads the mode and bootstrap port there.
  const serverInfo = (c: Context) =>
    c.json({
      model_path: engine.model,
      disaggregation_mode: engine.role === "both" ? "null" : engine.role,
      ...(bootstrapPort ? { disaggregation_bootstrap_port: bootstrapPort() } : {}),
    });
  app.get("/server_info", serverInfo);
  app.get("/get_server_info", serverInfo);

  app.get("/metrics", async (c) => {
    const text = await registry.metrics();
    return c.body(text, 200, { "content-type": registry.contentType });
  });
}
