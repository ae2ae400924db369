import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  contentText,
  digestPrompt,
  messageKey,
  toolCallsText,
  unitKey,
} from "../../src/sessions/message-digest.js";
import { SessionInference } from "../../src/sessions/session-inference.js";
import type { ChatMessage } from "../../src/types.js";

const SYSTEM: ChatMessage = { role: "system", content: "You are a coding agent. Use the tools." };
const TASK: ChatMessage = { role: "user", content: "Fix the failing test in src/app.ts" };

function chat(messages: ChatMessage[], tenant = "") {
  return digestPrompt({ kind: "chat", messages }, tenant);
}

/** Runs one call through the index: decides it, then records `reply` as what sluice returned. */
function step(inference: SessionInference, messages: ChatMessage[], reply: string | undefined, key?: string) {
  const decision = inference.decide(chat(messages), key);
  if (decision.pending) inference.settle(decision.pending, reply === undefined ? undefined : { text: reply });
  return decision;
}

describe("message digests", () => {
  it("compare messages without reasoning and without tool-call ids", () => {
    const returned: ChatMessage = {
      role: "assistant",
      content: "<think>the test imports a missing function</think>Let me look.",
      tool_calls: [
        { id: "call_abc", type: "function", function: { name: "read", arguments: '{"path": "a.ts"}' } },
      ],
    };
    const sentBack: ChatMessage = {
      role: "assistant",
      content: [{ type: "text", text: " Let me look. " }],
      tool_calls: [
        { id: "call_zzz", type: "function", function: { name: "read", arguments: '{"path":"a.ts"}' } },
      ],
    };
    assert.equal(messageKey(returned), messageKey(sentBack));
    assert.equal(
      contentText([
        { type: "reasoning", text: "hidden" },
        { type: "text", text: "shown" },
      ]),
      "shown",
    );
    assert.equal(toolCallsText([{ function: { name: "ls", arguments: "{}" } }]), "ls\u0001{}");
    assert.notEqual(messageKey(TASK), messageKey({ ...TASK, content: "Fix another test" }));
  });

  it("keep tenants' chains apart", () => {
    const a = chat([SYSTEM, TASK], "a")!;
    const b = chat([SYSTEM, TASK], "b")!;
    assert.equal(a.units, 2);
    assert.notEqual(unitKey(a, 1), unitKey(b, 1));
    assert.notEqual(unitKey(a, 2), unitKey(b, 2));
  });
});

describe("session inference", () => {
  it("continues a chain of prompt and returned output from its second call", () => {
    const inference = new SessionInference({ mode: "on" });
    const first = step(inference, [SYSTEM, TASK], "I will read the file.");
    assert.equal(first.outcome, "new");
    assert.equal(first.sessionId, undefined);
    const history = [SYSTEM, TASK, { role: "assistant", content: "I will read the file." }];
    const second = step(
      inference,
      [...history, { role: "tool", content: "export const x = 1;" }],
      "Found it.",
    );
    assert.equal(second.outcome, "continued");
    assert.ok(second.sessionId);
    const third = step(
      inference,
      [
        ...history,
        { role: "tool", content: "export const x = 1;" },
        { role: "assistant", content: "Found it." },
        { role: "user", content: "go on" },
      ],
      "Done.",
    );
    assert.equal(third.outcome, "continued");
    assert.equal(third.sessionId, second.sessionId);
  });

  it("never merges identical openers, even with identical answers", () => {
    const inference = new SessionInference({ mode: "on" });
    step(inference, [SYSTEM, TASK], "I will read the file.");
    step(inference, [SYSTEM, TASK], "I will read the file.");
    const history = [SYSTEM, TASK, { role: "assistant", content: "I will read the file." }];
    const a = step(inference, [...history, { role: "tool", content: "A's file" }], "A next");
    const b = step(inference, [...history, { role: "tool", content: "B's file" }], "B next");
    assert.equal(a.outcome, "ambiguous");
    assert.equal(b.outcome, "ambiguous");
    // From their third call each is a session of its own.
    const a3 = step(
      inference,
      [...history, { role: "tool", content: "A's file" }, { role: "assistant", content: "A next" }, TASK],
      "x",
    );
    const b3 = step(
      inference,
      [...history, { role: "tool", content: "B's file" }, { role: "assistant", content: "B next" }, TASK],
      "y",
    );
    assert.equal(a3.outcome, "continued");
    assert.equal(b3.outcome, "continued");
    assert.notEqual(a3.sessionId, b3.sessionId);
  });

  it("makes a second call continuing one point a child session", () => {
    const inference = new SessionInference({ mode: "on" });
    step(inference, [SYSTEM, TASK], "plan");
    const history = [SYSTEM, TASK, { role: "assistant", content: "plan" }];
    const main = step(inference, [...history, { role: "user", content: "do step 1" }], "ok 1");
    const fork = step(inference, [...history, { role: "user", content: "try another way" }], "ok 2");
    assert.equal(main.outcome, "continued");
    assert.equal(fork.outcome, "forked");
    assert.equal(fork.parentId, main.sessionId);
    assert.notEqual(fork.sessionId, main.sessionId);
  });

  it("lets a failed call's retry continue, not fork", () => {
    const inference = new SessionInference({ mode: "on" });
    step(inference, [SYSTEM, TASK], "plan");
    const next = [SYSTEM, TASK, { role: "assistant", content: "plan" }, { role: "user", content: "go" }];
    const failed = step(inference, next, undefined);
    const retry = step(inference, next, "went");
    assert.equal(failed.outcome, "continued");
    assert.equal(retry.outcome, "continued");
    assert.equal(retry.sessionId, failed.sessionId);
  });

  it("opens a new session for a compacted history instead of joining the old one", () => {
    const inference = new SessionInference({ mode: "on" });
    step(inference, [SYSTEM, TASK], "plan");
    const compacted = [SYSTEM, { role: "user", content: "Summary so far: plan made. Continue." }];
    assert.equal(step(inference, compacted, "continuing").outcome, "new");
  });

  it("continues token prompts whose output ends inside a block", () => {
    const inference = new SessionInference({ mode: "on" });
    const prompt = Array.from({ length: 100 }, (_, i) => i);
    const output = [7, 8, 9];
    const first = inference.decide(digestPrompt({ kind: "tokens", tokens: prompt }));
    inference.settle(first.pending!, { tokens: output });
    const next = prompt.concat(output, [500, 501, 502]);
    assert.equal(inference.decide(digestPrompt({ kind: "tokens", tokens: next })).outcome, "continued");
    const other = prompt.concat([7, 8, 10], [500, 501, 502]);
    assert.equal(inference.decide(digestPrompt({ kind: "tokens", tokens: other })).outcome, "new");
  });

  it("leaves keyed calls alone when on, and reports agreement in shadow", () => {
    const on = new SessionInference({ mode: "on" });
    assert.equal(on.decide(chat([SYSTEM, TASK]), "k").outcome, "keyed");
    const shadow = new SessionInference({ mode: "shadow" });
    step(shadow, [SYSTEM, TASK], "plan", "k1");
    const history = [SYSTEM, TASK, { role: "assistant", content: "plan" }, { role: "user", content: "go" }];
    const agreed = step(shadow, history, "went", "k1");
    assert.equal(agreed.outcome, "agreed");
    assert.equal(agreed.sessionId, undefined);
    assert.equal(step(shadow, history, "went", "k2").outcome, "disagreed");
    assert.equal(step(shadow, [SYSTEM, { role: "user", content: "new" }], "x", "k1").outcome, "missed");
    assert.equal(shadow.decide(chat([SYSTEM])).outcome, "unkeyed");
  });

  it("stays within its capacity, forgetting the least recently used points", () => {
    const inference = new SessionInference({ mode: "on", capacity: 3 });
    for (let i = 0; i < 10; i++)
      step(inference, [SYSTEM, { role: "user", content: `task ${i}` }], `answer ${i}`);
    assert.equal(inference.size, 3);
    const forgotten = [
      SYSTEM,
      { role: "user", content: "task 0" },
      { role: "assistant", content: "answer 0" },
    ];
    assert.equal(step(inference, forgotten, "z").outcome, "new");
    const kept = [SYSTEM, { role: "user", content: "task 9" }, { role: "assistant", content: "answer 9" }];
    assert.equal(step(inference, kept, "z").outcome, "continued");
    assert.throws(
      () => new SessionInference({ mode: "on", capacity: 0 }),
      /capacity must be a positive integer, got 0/,
    );
  });

  it("finds every remembered point and none it forgot, through a filter whose slots collide", () => {
    // Capacity 40 gives the presence filter 512 slots, so hundreds of chains share slots, and
    // eviction must leave a slot counting the entries still held there.
    const inference = new SessionInference({ mode: "on", capacity: 40 });
    const history = (i: number): ChatMessage[] => [SYSTEM, { role: "user", content: `chain ${i}` }];
    const answer = (i: number) => `answer ${i}`;
    for (let i = 0; i < 400; i++) step(inference, history(i), answer(i));
    assert.equal(inference.size, 40);
    for (let i = 0; i < 400; i++) {
      const next = [...history(i), { role: "assistant" as const, content: answer(i) }];
      const decision = inference.decide(chat(next));
      // The last 40 chains are remembered (each lookup moves one to the front, not evicting any).
      assert.equal(decision.outcome, i >= 360 ? "continued" : "new", `chain ${i}`);
      if (decision.pending) inference.settle(decision.pending, undefined);
    }
  });
});
