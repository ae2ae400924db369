/** @module Helpers of the tests that drive `sluice serve` processes with the openai SDK through a batch and kill them. */

import OpenAI from "openai";
import { type SluiceChild, spawnSluice } from "../reliability/helpers.js";

export const MODEL = "meta-llama/Llama-3.1-8B-Instruct";

/** The openai SDK against a sluice, without its own retries (a test sees every answer). */
export function sdk(url: string): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: "not-checked", maxRetries: 0, timeout: 30_000 });
}

/** Reads until `done` holds (bounded; never a timed assertion); the last value read is in the error. */
export async function pollUntil<T>(
  read: () => Promise<T>,
  done: (value: T) => boolean,
  limitMs: number,
  what: string,
): Promise<T> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(value)}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/**
 * Batch input lines with long answers (hundreds of engine steps each): with more lines than run at
 * once, the batch is still running when its first answers are recorded, however slow the machine.
 */
export function longBatchLines(count: number): string[] {
  return Array.from({ length: count }, (_, i) =>
    JSON.stringify({
      custom_id: `line-${i}`,
      method: "POST",
      url: "/v1/chat/completions",
      body: { model: MODEL, messages: [{ role: "user", content: `item ${i}` }], max_tokens: 300 },
    }),
  );
}

/** The lines of an output or error file. */
export function parseJsonl<T = { id: string; custom_id: string; response: { status_code: number } }>(
  text: string,
): T[] {
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as T);
}

/** Kills what is still running of the children (after a failed test). */
export async function killAll(children: SluiceChild[]): Promise<void> {
  for (const child of children) {
    if (child.child.exitCode === null && child.child.signalCode === null) {
      child.child.kill("SIGKILL");
      await child.exited;
    }
  }
}

/** Starts `sluice serve` on a free loopback port over 2 simulated replicas, with `args` besides; kept in `children`. */
export async function serveChild(
  args: string[],
  children: SluiceChild[],
): Promise<{ child: SluiceChild; url: string }> {
  const child = spawnSluice(["serve", "--port", "0", "--host", "127.0.0.1", "--sim-replicas", "2", ...args]);
  children.push(child);
  const match = await child.waitFor(/listening on (http:\/\/[0-9.]+:\d+)/, 60_000);
  return { child, url: match[1]! };
}
