/**
 * @module An example tool-call loop on the sluice client: each agent opens a
 * session, then alternates model steps with a fake tool, and closes the
 * session. Runs against `npm start`:
 *
 *   tsx adapters/client/example-agent.ts --url http://127.0.0.1:8080
 *   tsx adapters/client/example-agent.ts --nats nats://127.0.0.1:4222 --agents 4 --stream
 */

import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { connect } from "nats";
import type { SluiceClient } from "./client.js";
import { httpClient, natsClient } from "./index.js";
import { type ChatCompletion, type ChatMessage, SluiceError } from "./types.js";

/** Options of {@link runAgent}. */
export interface AgentOptions {
  client: SluiceClient;
  /** Model steps per session. */
  steps: number;
  /** Model name; default the fleet's first. */
  model?: string;
  /** Output tokens per step. Default 64. */
  maxTokens?: number;
  /** Stream each step and print nothing until it ends (chunks are counted). */
  stream?: boolean;
  /** Session id; default one sluice makes. */
  sessionId?: string;
  /** Time the fake tool "runs" between steps, ms. Default 50. */
  toolMs?: number;
  /** Each step gives up (after retries) this long after it started, ms. Default 120000. */
  stepWithinMs?: number;
  signal?: AbortSignal;
  /** One line per step. */
  log?: (line: string) => void;
}

/** What one agent did. */
export interface AgentReport {
  sessionId: string;
  steps: number;
  completionTokens: number;
  /** Chunks received, when streaming. */
  chunks: number;
  /** Retries the client made across every step. */
  retries: number;
}

/** The fake tool: a deterministic "search" over the model's last words. */
export function fakeSearch(query: string): string {
  const words = query.split(/\s+/).filter(Boolean).slice(-6);
  return `search results for "${words.join(" ")}": ${words.map((w, i) => `[${i + 1}] ${w} is documented`).join("; ")}`;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Runs one agent's whole session: open, `steps` model steps with tool calls between them, close. */
export async function runAgent(options: AgentOptions): Promise<AgentReport> {
  const { client, steps } = options;
  const log = options.log ?? (() => {});
  const opened = await client.openSession(options.sessionId ? { id: options.sessionId } : {}, {
    withinMs: 30_000,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  const report: AgentReport = { sessionId: opened.id, steps: 0, completionTokens: 0, chunks: 0, retries: 0 };
  const messages: ChatMessage[] = [
    { role: "system", content: "You are a research agent. Use the search tool, then answer." },
    { role: "user", content: "Find out how admission control for LLM agent sessions works." },
  ];
  try {
    for (let step = 0; step < steps; step++) {
      const body = {
        messages,
        max_tokens: options.maxTokens ?? 64,
        ...(options.model ? { model: options.model } : {}),
        ...(options.stream ? { stream_options: { include_usage: true } } : {}),
      };
      const started = Date.now();
      const stepOptions = {
        withinMs: options.stepWithinMs ?? 120_000,
        requestId: `${opened.id}-step-${step}`,
        ...(options.signal ? { signal: options.signal } : {}),
      };
      let answer: ChatMessage;
      let tokens = 0;
      try {
        if (options.stream) {
          let content = "";
          for await (const chunk of client.stream(opened.id, body, stepOptions)) {
            report.chunks++;
            content += chunk.choices[0]?.delta.content ?? "";
            if (chunk.usage) tokens = chunk.usage.completion_tokens;
          }
          answer = { role: "assistant", content };
        } else {
          const completion: ChatCompletion = await client.step(opened.id, body, stepOptions);
          answer = completion.choices[0]?.message ?? { role: "assistant", content: "" };
          tokens = completion.usage?.completion_tokens ?? 0;
        }
      } catch (err) {
        if (err instanceof SluiceError) report.retries += err.attempts - 1;
        throw err;
      }
      report.steps++;
      report.completionTokens += tokens;
      messages.push({
        role: "assistant",
        content: answer.content ?? "",
        ...(answer.tool_calls ? { tool_calls: answer.tool_calls } : {}),
      });
      log(`${opened.id} step ${step + 1}/${steps}: ${tokens} tokens in ${Date.now() - started} ms`);
      if (step === steps - 1) break;
      // The tool runs between steps; the session stays active (its window slot held) while it does.
      await sleep(options.toolMs ?? 50, options.signal);
      const calls = (answer.tool_calls ?? []) as { id?: string; function?: { arguments?: string } }[];
      if (calls.length > 0) {
        for (const call of calls) {
          messages.push({
            role: "tool",
            tool_call_id: call.id ?? "call",
            content: fakeSearch(call.function?.arguments ?? ""),
          });
        }
      } else {
        // A model that answered in prose: the agent runs the tool on its words and reports back as the user.
        messages.push({ role: "user", content: `Tool result: ${fakeSearch(String(answer.content ?? ""))}` });
      }
    }
  } finally {
    await client.closeSession(opened.id, { withinMs: 10_000 }).catch(() => {});
  }
  return report;
}

const USAGE = `usage: tsx adapters/client/example-agent.ts (--url URL | --nats URL) [flags]

  --url URL         sluice's HTTP base URL (e.g. http://127.0.0.1:8080)
  --nats URL        a NATS server sluice serves (e.g. nats://127.0.0.1:4222)
  --agents N        agents running at once (default 1)
  --steps N         model steps per agent (default 6)
  --max-tokens N    output tokens per step (default 64)
  --tool-ms N       fake tool time between steps, ms (default 50)
  --model NAME      model (default: the fleet's first)
  --stream          stream each step
  --help`;

function intFlag(name: string, value: string | undefined, fallback: number, min: number): number {
  if (value === undefined) return fallback;
  const n = Number(value.trim());
  if (!Number.isInteger(n) || n < min)
    throw new RangeError(`--${name} must be an integer ≥ ${min}, got ${JSON.stringify(value)}`);
  return n;
}

/** The command line; returns the exit status. */
export async function run(argv: string[]): Promise<number> {
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({
      args: argv,
      options: {
        url: { type: "string" },
        nats: { type: "string" },
        agents: { type: "string" },
        steps: { type: "string" },
        "max-tokens": { type: "string" },
        "tool-ms": { type: "string" },
        model: { type: "string" },
        stream: { type: "boolean" },
        help: { type: "boolean" },
      },
      strict: true,
    }).values;
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  const url = values.url as string | undefined;
  const natsUrl = values.nats as string | undefined;
  if ((url === undefined) === (natsUrl === undefined)) {
    process.stderr.write(`give exactly one of --url and --nats\n${USAGE}\n`);
    return 2;
  }
  let agents: number;
  let steps: number;
  let maxTokens: number;
  let toolMs: number;
  try {
    agents = intFlag("agents", values.agents as string | undefined, 1, 1);
    steps = intFlag("steps", values.steps as string | undefined, 6, 1);
    maxTokens = intFlag("max-tokens", values["max-tokens"] as string | undefined, 64, 1);
    toolMs = intFlag("tool-ms", values["tool-ms"] as string | undefined, 50, 0);
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n`);
    return 2;
  }
  const nc = natsUrl
    ? await connect({ servers: natsUrl, maxReconnectAttempts: -1, reconnectTimeWait: 250 })
    : undefined;
  const client = nc ? natsClient({ nc }) : httpClient({ baseUrl: url! });
  const abort = new AbortController();
  const onSignal = () => abort.abort(new Error("interrupted"));
  process.once("SIGINT", onSignal);
  const started = Date.now();
  try {
    const reports = await Promise.all(
      Array.from({ length: agents }, () =>
        runAgent({
          client,
          steps,
          maxTokens,
          toolMs,
          stream: values.stream === true,
          signal: abort.signal,
          log: (line) => process.stdout.write(`${line}\n`),
          ...(values.model ? { model: values.model as string } : {}),
        }),
      ),
    );
    const seconds = (Date.now() - started) / 1000;
    const totalSteps = reports.reduce((sum, r) => sum + r.steps, 0);
    const tokens = reports.reduce((sum, r) => sum + r.completionTokens, 0);
    process.stdout.write(
      `${agents} agent(s), ${totalSteps} steps, ${tokens} completion tokens in ${seconds.toFixed(2)} s ` +
        `(${(totalSteps / seconds).toFixed(1)} steps/s) over ${nc ? "NATS" : "HTTP"}\n`,
    );
    return 0;
  } catch (err) {
    process.stderr.write(`agent failed: ${(err as Error).message}\n`);
    return 1;
  } finally {
    process.off("SIGINT", onSignal);
    await client.transport.close?.();
    await nc?.close();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = await run(process.argv.slice(2));
}
