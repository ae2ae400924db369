/**
 * @module A Responses API request's `instructions` and `input` (a string or a list of items) as the chat
 * messages sluice tokenizes, so the call is counted, classified and placed like any chat call. Item
 * shapes as OpenAI's API reference gives them (`message`, `function_call`, `function_call_output`,
 * `reasoning`, `custom_tool_call`, …).
 */

import type { ChatMessage } from "../../src/types.js";

type Item = Record<string, unknown>;

function isRecord(value: unknown): value is Item {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The text of a content list: its text parts (`input_text`, `output_text`, `refusal`, `summary_text`) in order. */
function partsText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content))
    return content === undefined || content === null ? "" : JSON.stringify(content);
  const pieces: string[] = [];
  for (const part of content) {
    if (typeof part === "string") pieces.push(part);
    else if (isRecord(part)) {
      const text = part.text ?? part.refusal;
      // Images, files and audio cost what the engine's encoder makes of them, unknown here: counted by their reference.
      pieces.push(typeof text === "string" ? text : JSON.stringify(part));
    }
  }
  return pieces.join("\n");
}

function stringOf(value: unknown): string {
  if (value === undefined || value === null) return "";
  return typeof value === "string" ? value : JSON.stringify(value);
}

/** One input item as a chat message (approximate for tool items: their text is what takes tokens). */
function itemMessage(item: Item): ChatMessage {
  const type = typeof item.type === "string" ? item.type : "message";
  if (type === "message" || (item.type === undefined && typeof item.role === "string")) {
    return { role: typeof item.role === "string" ? item.role : "user", content: partsText(item.content) };
  }
  if (type === "reasoning") {
    return { role: "assistant", content: partsText(item.summary) || partsText(item.content) };
  }
  if (type.endsWith("_output")) {
    return { role: "tool", content: partsText(item.output) };
  }
  if (type === "function_call" || type === "custom_tool_call") {
    return {
      role: "assistant",
      content: `${stringOf(item.name)}(${stringOf(item.arguments ?? item.input)})`,
    };
  }
  // Other items (shell calls, references to stored items, …): their JSON is the best count there is.
  return { role: "user", content: JSON.stringify(item) };
}

/** `instructions` as a system message, then every input item in order. */
export function responsesMessages(body: { input?: unknown; instructions?: unknown }): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (typeof body.instructions === "string" && body.instructions !== "") {
    messages.push({ role: "system", content: body.instructions });
  }
  const input = body.input;
  if (typeof input === "string") messages.push({ role: "user", content: input });
  else if (Array.isArray(input)) {
    for (const item of input) if (isRecord(item)) messages.push(itemMessage(item));
  }
  return messages;
}

/** The session key a Responses API request names: `conversation` (its id, or `{ id }`). */
export function conversationKeyOf(body: { conversation?: unknown }): string | undefined {
  const conversation = body.conversation;
  if (typeof conversation === "string") return conversation;
  if (isRecord(conversation) && typeof conversation.id === "string") return conversation.id;
  return undefined;
}
