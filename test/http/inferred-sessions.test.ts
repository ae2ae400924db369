import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type Harness, MODEL, makeHarness, parseSse } from "./harness.js";

const SYSTEM = {
  role: "system",
  content: "You are a careful coding agent. Answer briefly and call tools when needed.",
};
const TASK = { role: "user", content: "Run the tests and fix what fails." };

interface Step {
  session: string | null;
  source: string | null;
  replica: string | null;
  reply: string;
}

/** One chat call as a headerless agent loop sends it; the reply is read back from the body (streamed or not). */
async function send(h: Harness, messages: unknown[], stream: boolean): Promise<Step> {
  const { response, text } = await h.call("/v1/chat/completions", {
    method: "POST",
    json: { model: MODEL, messages, max_tokens: 12, stream },
  });
  assert.equal(response.status, 200, text);
  let reply: string;
  if (stream) {
    reply = "";
    for (const event of parseSse(text)) {
      if (event.data === "[DONE]") continue;
      const chunk = JSON.parse(event.data) as { choices?: { delta?: { content?: string } }[] };
      reply += chunk.choices?.[0]?.delta?.content ?? "";
    }
  } else {
    reply = (JSON.parse(text) as { choices: { message: { content: string } }[] }).choices[0]!.message.content;
  }
  return {
    session: response.headers.get("x-sluice-session"),
    source: response.headers.get("x-sluice-session-source"),
    replica: response.headers.get("x-sluice-replica"),
    reply,
  };
}

describe("inferred sessions over HTTP", () => {
  it("gives each headerless loop one inferred session from its second step, on one replica", async () => {
    const h = makeHarness({ replicas: 2 });
    try {
      const loops = 6;
      // Loops 0–3 share their opener; 4 and 5 have tasks of their own.
      const opener = (i: number) =>
        i < 4 ? TASK : { role: "user", content: `Run the tests of package ${i}.` };
      const histories = Array.from({ length: loops }, (_, i) => [SYSTEM, opener(i)] as unknown[]);
      const steps: Step[][] = Array.from({ length: loops }, () => []);
      for (let round = 0; round < 4; round++) {
        // Each round every loop sends its next step at once; identical openers in round 0.
        const answers = await Promise.all(
          histories.map((history, i) => send(h, history, (i + round) % 2 === 0)),
        );
        answers.forEach((answer, i) => {
          steps[i]!.push(answer);
          histories[i]!.push(
            { role: "assistant", content: answer.reply },
            { role: "tool", content: `loop ${i} round ${round}: 3 passed, ${i} failed` },
          );
        });
      }
      const sessions = new Set<string>();
      for (const [i, loop] of steps.entries()) {
        assert.equal(loop[0]!.source, "none", `loop ${i}'s first step is a one-off call`);
        assert.equal(loop[0]!.session, null);
        // A loop of its own is one session from its second step. Identical openers got identical
        // answers from the simulator: that shared point decides nothing, so those loops are told
        // apart from the step after their first own output (their third).
        const recognised = loop.slice(i < 4 ? 2 : 1);
        if (i < 4) assert.equal(loop[1]!.source, "none", `loop ${i}'s second step continues a shared point`);
        for (const step of recognised)
          assert.equal(step.source, "inferred", `loop ${i}: ${JSON.stringify(loop)}`);
        const ids = new Set(recognised.map((s) => s.session));
        assert.equal(ids.size, 1, `loop ${i} carries one session: ${[...ids].join(", ")}`);
        assert.equal(new Set(recognised.map((s) => s.replica)).size, 1, `loop ${i} stays on one replica`);
        sessions.add([...ids][0]!);
      }
      assert.equal(sessions.size, loops, "no two loops merged");
      const metrics = await (await h.call("/metrics")).text;
      assert.match(metrics, /sluice_session_inference_total\{outcome="continued"\} \d+/);
      for (const id of sessions) h.scheduler.closeSession(id);
      assert.deepEqual(h.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    } finally {
      await h.close();
    }
  });

  it("names a keyed call's session from its header, and refusals too", async () => {
    const h = makeHarness({ replicas: 1 });
    try {
      const keyed = await h.call("/v1/chat/completions", {
        method: "POST",
        headers: { "x-session-id": "agent-7" },
        json: { model: MODEL, messages: [TASK], max_tokens: 4 },
      });
      assert.equal(keyed.response.headers.get("x-sluice-session"), "agent-7");
      assert.equal(keyed.response.headers.get("x-sluice-session-source"), "header");
      const refused = await h.call("/v1/chat/completions", {
        method: "POST",
        headers: { "x-session-id": "agent-8" },
        json: { model: "no-such-model", messages: [TASK] },
      });
      assert.equal(refused.response.status, 404);
      assert.equal(refused.response.headers.get("x-sluice-session-source"), "header");
      const bad = await h.call("/v1/chat/completions", { method: "POST", json: { messages: "nope" } });
      assert.equal(bad.response.status, 400);
      assert.equal(bad.response.headers.get("x-sluice-session-source"), "none");
      h.scheduler.closeSession("agent-7");
      assert.deepEqual(h.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    } finally {
      await h.close();
    }
  });

  it("infers nothing with --infer-sessions off", async () => {
    const h = makeHarness({ replicas: 1, config: { sessions: { infer: "off" } } });
    try {
      const first = await send(h, [SYSTEM, TASK], false);
      const second = await send(h, [SYSTEM, TASK, { role: "assistant", content: first.reply }, TASK], false);
      assert.equal(second.source, "none");
      assert.deepEqual(h.scheduler.idleCheck(), { permits: 0, reservations: 0, windowSlots: 0, queued: 0 });
    } finally {
      await h.close();
    }
  });
});
