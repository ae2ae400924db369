import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { inspect } from "../../adapters/engines/openai/event-interpretation.js";
import { chainEnd, digestPrompt, unitKey } from "../../src/sessions/message-digest.js";
import type { ChatMessage } from "../../src/types.js";

// A streamed tool call recorded from OpenAI's API (source in fixtures/README.md).
const chunks = readFileSync(new URL("./fixtures/openai-chat-stream-tool-call.jsonl", import.meta.url), "utf8")
  .split("\n")
  .filter((line) => line.trim() !== "")
  .map((line) => JSON.parse(line) as Record<string, unknown>);

describe("tool calls a stream returned", () => {
  it("read back as the assistant message a client sends in its next prompt", () => {
    const toolCalls = chunks.map((chunk) => inspect(chunk).toolCalls).join("");
    assert.equal(toolCalls, 'get_weather\u0001{"location": "Tokyo"}');
    const prompt: ChatMessage[] = [{ role: "user", content: "What is the weather in Tokyo?" }];
    const reached = chainEnd(digestPrompt({ kind: "chat", messages: prompt })!, { text: "", toolCalls });
    // The client sends the call back with its id, and its arguments as it re-serialised them.
    const next = digestPrompt({
      kind: "chat",
      messages: [
        ...prompt,
        {
          role: "assistant",
          content: null,
          tool_calls: [
            {
              id: "call_PieqNSej6kM9hgYbcQdbZSaC",
              type: "function",
              function: { name: "get_weather", arguments: '{"location":"Tokyo"}' },
            },
          ],
        },
        { role: "tool", tool_call_id: "call_PieqNSej6kM9hgYbcQdbZSaC", content: "18 °C, clear" },
      ],
    })!;
    assert.equal(unitKey(next, 2), reached?.key);
  });
});
