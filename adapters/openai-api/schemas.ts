/** @module Request bodies of the HTTP API, checked with zod and turned into readable `invalid_request` refusals. */

import { z } from "zod";
import { Refusal } from "../../src/errors.js";
import { isSessionId } from "../../src/sessions/session-id.js";

const tokenCount = z.number().int().positive();

const contentPart = z.looseObject({ type: z.string() });

/** The chat roles OpenAI's API accepts (`developer` replaces `system` for reasoning models; `function` is the legacy tool role). */
export const CHAT_ROLES = ["system", "user", "assistant", "tool", "developer", "function"] as const;

const chatMessage = z.looseObject({
  role: z.enum(CHAT_ROLES, { error: `role must be one of ${CHAT_ROLES.join(", ")}` }),
  content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
  name: z.string().optional(),
  tool_call_id: z.string().optional(),
  tool_calls: z.array(z.unknown()).optional(),
});

// Fields sluice itself reads; everything else passes through to the engine untouched.
const common = {
  model: z.string().min(1).optional(),
  max_tokens: tokenCount.nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.looseObject({ include_usage: z.boolean().nullish() }).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  // Several choices per call would make a reservation of `max_tokens` a lie.
  n: z.literal(1, "only n = 1 is supported").nullish(),
};

/** `POST /v1/chat/completions` body (OpenAI-compatible; unknown fields are forwarded). */
export const chatBodySchema = z.looseObject({
  ...common,
  messages: z.array(chatMessage).min(1, "messages must not be empty"),
  max_completion_tokens: tokenCount.nullish(),
});

/** `POST /v1/completions` body; one prompt per call (text, or token ids). */
export const completionBodySchema = z.looseObject({
  ...common,
  prompt: z.union([
    z.string(),
    z.array(z.string()).length(1, "batched prompts are not supported; send one prompt per call"),
    z.array(z.number().int().nonnegative()).min(1),
    z.array(z.array(z.number().int().nonnegative()).min(1)).length(1, "batched prompts are not supported"),
  ]),
});

const inputItem = z.looseObject({ type: z.string().optional(), role: z.string().optional() });

/**
 * `POST /v1/responses` body (OpenAI's Responses API; unknown fields are forwarded). `input` is a
 * string or a list of items; `previous_response_id` continues a response on the replica that holds
 * it; `conversation` names a session.
 */
export const responsesBodySchema = z.looseObject({
  model: z.string().min(1).optional(),
  input: z.union([z.string(), z.array(inputItem).min(1, "input must not be empty")]),
  instructions: z.string().nullish(),
  max_output_tokens: tokenCount.nullish(),
  stream: z.boolean().nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  previous_response_id: z
    .string()
    .refine(isSessionId, "a response id is 1–256 printable ASCII characters without spaces")
    .nullish(),
  conversation: z
    .union([
      z.string().refine(isSessionId, "a conversation id is 1–256 printable ASCII characters without spaces"),
      z.looseObject({
        id: z
          .string()
          .refine(isSessionId, "a conversation id is 1–256 printable ASCII characters without spaces"),
      }),
    ])
    .nullish(),
  // A background response is fetched later from the replica that ran it (GET /v1/responses/{id}), which sluice does not route.
  background: z.literal(false, "background responses are not supported through sluice").nullish(),
});

/** `POST /v1/sessions` body. */
export const openSessionBodySchema = z.strictObject({
  id: z
    .string()
    .refine(isSessionId, "a session id is 1–256 printable ASCII characters without spaces")
    .optional(),
  lane: z.enum(["interactive", "bulk"]).optional(),
  metadata: z.record(z.string(), z.unknown()).optional(),
});

export type ChatBody = z.output<typeof chatBodySchema>;
export type CompletionBody = z.output<typeof completionBodySchema>;
export type ResponsesBody = z.output<typeof responsesBodySchema>;
export type OpenSessionBody = z.output<typeof openSessionBodySchema>;

/** Renders a zod path as `messages[0].role`. */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`;
    else out += out ? `.${String(key)}` : String(key);
  }
  return out;
}

/**
 * Checks a parsed JSON body against a schema. Throws `invalid_request` (400)
 * whose `param` is the first offending field's path and whose message lists
 * every issue as `path: message` — never zod's raw dump.
 */
export function parseBody<S extends z.ZodType>(schema: S, body: unknown): z.output<S> {
  const result = schema.safeParse(body);
  if (result.success) return result.data;
  const issues = result.error.issues;
  const lines = issues.slice(0, 8).map((issue) => {
    const path = formatPath(issue.path);
    return path ? `${path}: ${issue.message}` : issue.message;
  });
  if (issues.length > lines.length) lines.push(`and ${issues.length - lines.length} more`);
  const first = issues[0];
  const param = first && first.path.length > 0 ? formatPath(first.path) : null;
  throw new Refusal("invalid_request", `invalid request body: ${lines.join("; ")}`, { param });
}

/**
 * A model the fleet serves, checked where no call is submitted yet (a batch
 * line at creation); a submitted call is checked by the scheduler itself.
 * An empty list (no replica has reported) checks nothing.
 */
export function checkServedModel(models: readonly string[], model: string | undefined): void {
  if (model === undefined || models.length === 0 || models.includes(model)) return;
  throw new Refusal(
    "model_not_found",
    `model ${JSON.stringify(model)} is not served here; see GET /v1/models`,
    {
      param: "model",
    },
  );
}
