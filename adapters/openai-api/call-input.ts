/** @module The prompt of an OpenAI chat or completions body as the scheduler takes it (`CallInput`), for HTTP and batch lines alike. */

import type { CallInput, ChatMessage } from "../../src/types.js";
import type { ChatBody, CompletionBody } from "./schemas.js";

export function chatInput(body: ChatBody): CallInput {
  return { kind: "chat", messages: body.messages as ChatMessage[] };
}

export function completionInput(body: CompletionBody): CallInput {
  const prompt = body.prompt;
  if (typeof prompt === "string") return { kind: "text", prompt };
  const first = prompt[0];
  if (typeof first === "string") return { kind: "text", prompt: first };
  if (Array.isArray(first)) return { kind: "tokens", tokens: first };
  return { kind: "tokens", tokens: prompt as number[] };
}
