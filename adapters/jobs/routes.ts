/** @module The HTTP routes of jobs: OpenAI's Files and Batch APIs, and `Prefer: respond-async` calls polled at /v1/jobs/:id. */

import type { Context, Hono, MiddlewareHandler } from "hono";
import { Refusal } from "../../src/errors.js";
import type { AppEnv, AppPluginContext } from "../http/plugin.js";
import { readJsonBody } from "../http/read-body.js";
import type { HttpScheduler } from "../http/scheduler-port.js";
import { declaredLaneOf, positiveMsOf } from "../openai-api/call-headers.js";
import { checkCallBody, sessionOfCall } from "./call-executor.js";
import { readBodyBytes } from "./idempotency.js";
import type { JobStore } from "./job-store.js";
import { prefersAsync } from "./prefer.js";
import type { JobRunner } from "./runner.js";
import { newId } from "./store.js";
import {
  type AsyncJobRecord,
  type BatchRecord,
  type FileObject,
  JOB_CALL_ENDPOINTS,
  JOB_ENDPOINTS,
  type JobEndpoint,
  type StoredCall,
} from "./types.js";

export interface JobsRouteOptions {
  store: JobStore;
  runner: JobRunner;
  scheduler: HttpScheduler;
  /** Largest uploaded file, bytes. */
  fileLimitBytes: number;
  /** Poll interval a pending job advertises in Retry-After, s. */
  pollSeconds: number;
  now: () => number;
}

/** The only completion window OpenAI's Batch API offers, and its length. */
const COMPLETION_WINDOWS: Record<string, number> = { "24h": 24 * 3600 };

const seconds = (ms: number) => Math.floor(ms / 1000);

const bounded = (id: string) => JSON.stringify(id.length > 128 ? `${id.slice(0, 128)}…` : id);

function tenantOf(c: Context<AppEnv>): { tenant: string; priority: number } {
  const identity = c.get("identity");
  return { tenant: identity?.tenant ?? "", priority: identity?.priority ?? 0 };
}

function metadataOf(value: unknown): Record<string, string> | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== "object" || Array.isArray(value)) {
    throw new Refusal("invalid_request", "metadata must be an object of strings", { param: "metadata" });
  }
  const entries = Object.entries(value as Record<string, unknown>);
  if (
    entries.length > 16 ||
    entries.some(([k, v]) => typeof v !== "string" || k.length > 64 || v.length > 512)
  ) {
    throw new Refusal(
      "invalid_request",
      "metadata holds at most 16 string values (keys ≤ 64, values ≤ 512 characters)",
      { param: "metadata" },
    );
  }
  return value as Record<string, string>;
}

function limitOf(raw: string | undefined, fallback: number, max: number): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 1 || value > max) {
    throw new Refusal(
      "invalid_request",
      `limit must be an integer from 1 to ${max}, got ${JSON.stringify(raw)}`,
      {
        param: "limit",
      },
    );
  }
  return value;
}

/** Mounts the routes on the app. Call before the app's own completion routes: `respond-async` is taken here first. */
export function mountJobRoutes(app: Hono<AppEnv>, ctx: AppPluginContext, options: JobsRouteOptions): void {
  const { store, runner, scheduler } = options;
  const { requireKey, rateLimit } = ctx;

  const fileOf = async (c: Context<AppEnv>, id: string): Promise<FileObject> => {
    const record = await store.getFile(id);
    if (!record || record.tenant !== tenantOf(c).tenant)
      throw new Refusal("file_not_found", `no file ${bounded(id)}`);
    return record.file;
  };
  const batchOf = async (c: Context<AppEnv>, id: string): Promise<BatchRecord> => {
    const record = await store.getBatch(id);
    if (!record || record.tenant !== tenantOf(c).tenant)
      throw new Refusal("batch_not_found", `no batch ${bounded(id)}`);
    return record;
  };
  const jobOf = async (c: Context<AppEnv>, id: string): Promise<AsyncJobRecord> => {
    const record = await store.getJob(id);
    if (!record || record.tenant !== tenantOf(c).tenant)
      throw new Refusal("job_not_found", `no job ${bounded(id)}`);
    return record;
  };

  // --- files -----------------------------------------------------------------------------------

  app.post("/v1/files", requireKey, rateLimit, async (c) => {
    const contentType = c.req.header("content-type") ?? "";
    if (!/^multipart\/form-data/i.test(contentType)) {
      throw new Refusal(
        "invalid_request",
        "upload a file as multipart/form-data with fields purpose and file",
      );
    }
    const bytes = await readBodyBytes(c.req.raw, options.fileLimitBytes);
    let form: FormData;
    try {
      form = await new Response(bytes, { headers: { "content-type": contentType } }).formData();
    } catch (err) {
      throw new Refusal("invalid_request", `the multipart body could not be read: ${(err as Error).message}`);
    }
    const purpose = form.get("purpose");
    if (purpose !== "batch") {
      throw new Refusal(
        "invalid_request",
        'purpose must be "batch" (the only purpose sluice stores files for)',
        {
          param: "purpose",
        },
      );
    }
    const file = form.get("file");
    if (file === null || typeof file === "string") {
      throw new Refusal("invalid_request", "the form has no file field", { param: "file" });
    }
    const content = new Uint8Array(await file.arrayBuffer());
    const now = options.now();
    const record: FileObject = {
      id: newId("file-", now),
      object: "file",
      bytes: content.byteLength,
      created_at: seconds(now),
      filename: (file.name || "upload.jsonl").slice(0, 256),
      purpose: "batch",
      status: "processed",
      status_details: null,
      expires_at: null,
    };
    await store.putFile({ file: record, tenant: tenantOf(c).tenant }, content);
    return c.json(record);
  });

  app.get("/v1/files", requireKey, async (c) => {
    const tenant = tenantOf(c).tenant;
    const limit = limitOf(c.req.query("limit"), 10_000, 10_000);
    const after = c.req.query("after");
    const purpose = c.req.query("purpose");
    return c.json(
      await listPage(store.listFiles(after), limit, after, ({ file, tenant: owner }) =>
        owner === tenant && (!purpose || file.purpose === purpose) ? file : undefined,
      ),
    );
  });

  app.get("/v1/files/:id", requireKey, async (c) => c.json(await fileOf(c, c.req.param("id"))));

  app.get("/v1/files/:id/content", requireKey, async (c) => {
    const file = await fileOf(c, c.req.param("id"));
    const body = await store.readFileBody(file.id);
    return new Response(new Uint8Array(body), {
      status: 200,
      headers: {
        "content-type": "application/jsonl",
        "content-disposition": `attachment; filename="${file.filename.replace(/["\\\r\n]/g, "_")}"`,
      },
    });
  });

  app.delete("/v1/files/:id", requireKey, async (c) => {
    const file = await fileOf(c, c.req.param("id"));
    await store.deleteFile(file.id);
    return c.json({ id: file.id, object: "file", deleted: true });
  });

  // --- batches ---------------------------------------------------------------------------------

  app.post("/v1/batches", requireKey, rateLimit, async (c) => {
    const json = await readJsonBody(c.req.raw, ctx.bodyLimitBytes);
    if (typeof json !== "object" || json === null || Array.isArray(json)) {
      throw new Refusal("invalid_request", "the body must be a JSON object");
    }
    const body = json as Record<string, unknown>;
    const { tenant, priority } = tenantOf(c);
    if (typeof body.input_file_id !== "string") {
      throw new Refusal("invalid_request", "input_file_id is required", { param: "input_file_id" });
    }
    const input = await fileOf(c, body.input_file_id);
    if (input.purpose !== "batch") {
      throw new Refusal("invalid_request", `file ${input.id} was not uploaded with purpose "batch"`, {
        param: "input_file_id",
      });
    }
    if (!JOB_ENDPOINTS.includes(body.endpoint as JobEndpoint)) {
      throw new Refusal("invalid_request", `endpoint must be one of ${JOB_ENDPOINTS.join(", ")}`, {
        param: "endpoint",
      });
    }
    const window =
      typeof body.completion_window === "string" ? COMPLETION_WINDOWS[body.completion_window] : undefined;
    if (window === undefined) {
      throw new Refusal("invalid_request", 'completion_window must be "24h"', { param: "completion_window" });
    }
    const now = options.now();
    const record: BatchRecord = {
      tenant,
      priority,
      batch: {
        id: newId("batch_", now),
        object: "batch",
        endpoint: body.endpoint as JobEndpoint,
        errors: null,
        input_file_id: input.id,
        completion_window: body.completion_window as string,
        status: "validating",
        output_file_id: null,
        error_file_id: null,
        created_at: seconds(now),
        in_progress_at: null,
        expires_at: seconds(now) + window,
        finalizing_at: null,
        completed_at: null,
        failed_at: null,
        expired_at: null,
        cancelling_at: null,
        cancelled_at: null,
        request_counts: { total: 0, completed: 0, failed: 0 },
        metadata: metadataOf(body.metadata),
      },
    };
    return c.json(await runner.createBatch(record));
  });

  app.get("/v1/batches", requireKey, async (c) => {
    const tenant = tenantOf(c).tenant;
    const limit = limitOf(c.req.query("limit"), 20, 100);
    const after = c.req.query("after");
    return c.json(
      await listPage(store.listBatches(after), limit, after, ({ batch, tenant: owner }) =>
        owner === tenant ? batch : undefined,
      ),
    );
  });

  app.get("/v1/batches/:id", requireKey, async (c) => c.json((await batchOf(c, c.req.param("id"))).batch));

  app.post("/v1/batches/:id/cancel", requireKey, async (c) => {
    const record = await batchOf(c, c.req.param("id"));
    return c.json((await runner.cancelBatch(record.batch.id)) ?? record.batch);
  });

  // --- single asynchronous calls ---------------------------------------------------------------

  const jobView = (job: AsyncJobRecord) => ({
    id: job.id,
    object: job.object,
    status: job.status,
    endpoint: job.endpoint,
    created_at: job.created_at,
    started_at: job.started_at,
    completed_at: job.completed_at,
  });

  const respondAsync = (endpoint: JobEndpoint): MiddlewareHandler<AppEnv> =>
    async function respondAsync(c, next) {
      if (c.req.method !== "POST" || !prefersAsync(c.req.header("prefer"))) return next();
      let response: Response | undefined;
      await requireKey(c, async () => {
        await rateLimit(c, async () => {
          response = await createAsyncJob(c, endpoint, next);
        });
      });
      return response;
    };

  const createAsyncJob = async (c: Context<AppEnv>, endpoint: JobEndpoint, next: () => Promise<void>) => {
    const declaredLane = declaredLaneOf("x-sluice-lane", c.req.header("x-sluice-lane"));
    const deadlineMs = positiveMsOf("x-sluice-deadline-ms", c.req.header("x-sluice-deadline-ms"));
    const text = new TextDecoder().decode(await readBodyBytes(c.req.raw, ctx.bodyLimitBytes));
    const json = await readJsonBody(
      new Request("http://body/", { method: "POST", body: text }),
      ctx.bodyLimitBytes,
    );
    const body = (typeof json === "object" && json !== null ? json : {}) as Record<string, unknown>;
    if (body.stream === true) {
      // A stream is answered as it runs: the preference is ignored (RFC 7240 lets a server do so).
      const raw = c.req.raw;
      c.req.raw = new Request(raw.url, {
        method: "POST",
        headers: raw.headers,
        body: text,
        signal: raw.signal,
      });
      const env = c.env as Record<string, unknown> | undefined;
      if (env && "incoming" in env) c.env = { ...env, incoming: undefined };
      await next();
      return c.res;
    }
    const call: StoredCall = { endpoint: JOB_CALL_ENDPOINTS[endpoint], body };
    const headers: Record<string, string> = {};
    c.req.raw.headers.forEach((value, name) => {
      headers[name] = value;
    });
    Object.assign(call, sessionOfCall(headers, body));
    if (declaredLane !== undefined) call.declaredLane = declaredLane;
    if (deadlineMs !== undefined) call.deadlineMs = deadlineMs;
    checkCallBody(scheduler, call);
    const now = options.now();
    const { tenant, priority } = tenantOf(c);
    const job = await runner.createAsyncJob({
      id: newId("job_", now),
      object: "sluice.job",
      status: "queued",
      endpoint,
      created_at: seconds(now),
      started_at: null,
      completed_at: null,
      tenant,
      priority,
      request: call,
      response: null,
    });
    return c.json(jobView(job), 202, {
      location: `/v1/jobs/${job.id}`,
      "retry-after": String(options.pollSeconds),
      "preference-applied": "respond-async",
    });
  };

  app.use("/v1/chat/completions", respondAsync("/v1/chat/completions"));
  app.use("/v1/completions", respondAsync("/v1/completions"));
  app.use("/v1/responses", respondAsync("/v1/responses"));

  app.get("/v1/jobs/:id", requireKey, async (c) => {
    const job = await jobOf(c, c.req.param("id"));
    if (job.response) {
      return new Response(JSON.stringify(job.response.body), {
        status: job.response.status,
        headers: {
          ...job.response.headers,
          "content-type": "application/json",
          "x-sluice-job-status": job.status,
        },
      });
    }
    if (job.status === "queued" || job.status === "in_progress") {
      return c.json(jobView(job), 202, {
        location: `/v1/jobs/${job.id}`,
        "retry-after": String(options.pollSeconds),
      });
    }
    return c.json(jobView(job));
  });

  app.delete("/v1/jobs/:id", requireKey, async (c) => {
    const job = await jobOf(c, c.req.param("id"));
    return c.json(jobView((await runner.cancelAsyncJob(job.id)) ?? job));
  });
}

/**
 * One page of an OpenAI list: `records` come newest first, from just after `after` (where the last
 * page ended). `pick` returns what a record shows, or undefined for a record this caller may not see.
 */
async function listPage<R, T extends { id: string }>(
  records: AsyncIterable<R>,
  limit: number,
  after: string | undefined,
  pick: (record: R) => T | undefined,
): Promise<{
  object: "list";
  data: T[];
  first_id: string | null;
  last_id: string | null;
  has_more: boolean;
}> {
  const data: T[] = [];
  let hasMore = false;
  for await (const value of records) {
    const item = pick(value);
    if (item === undefined || item.id === after) continue;
    if (data.length === limit) {
      hasMore = true;
      break;
    }
    data.push(item);
  }
  return {
    object: "list",
    data,
    first_id: data[0]?.id ?? null,
    last_id: data.at(-1)?.id ?? null,
    has_more: hasMore,
  };
}
