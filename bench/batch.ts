/**
 * @module A large batch beside interactive load: `sluice serve` on simulated replicas (real time), closed-loop
 * interactive clients measured alone and then while a 10,000-line batch runs in the bulk lane. It answers:
 * how fast does the batch go, and what does it cost interactive time to first token?
 * Run: `npx tsx bench/batch.ts [--lines 10000] [--clients 8] [--baseline-s 10] [--nats] [--json FILE]`;
 * `--nats` keeps the jobs in JetStream (a local nats-server) instead of the embedded store.
 */

import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { quantile, round } from "../adapters/bench/stats.js";
import { startServer } from "../adapters/cli/serve.js";
import { type NatsServerProcess, startNatsServer } from "../adapters/nats/nats-server-process.js";

const MODEL = "meta-llama/Llama-3.1-8B-Instruct";

/** Options of {@link runBatchBench}. */
export interface BatchBenchOptions {
  /** Lines of the batch. Default 10000. */
  lines?: number;
  /** Closed-loop interactive clients. Default 8. */
  clients?: number;
  /** Seconds of interactive load alone, before the batch. Default 10. */
  baselineS?: number;
  /** Longest the batch may take, s. Default 1800. */
  limitS?: number;
  /** Keep the jobs in JetStream (a local nats-server started for the run). Default false. */
  nats?: boolean;
}

interface InteractiveStats {
  calls: number;
  refused: number;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
  latency_p50_ms: number;
}

/** Interactive clients calling until `stop` aborts: streamed chat, time to first byte of an event and to the end. */
function interactiveLoad(url: string, clients: number, stop: AbortSignal) {
  const ttft: number[] = [];
  const latency: number[] = [];
  let refused = 0;
  const client = async (k: number) => {
    for (let i = 0; !stop.aborted; i++) {
      const started = performance.now();
      try {
        const response = await fetch(`${url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-session-id": `chat-${k}` },
          body: JSON.stringify({
            model: MODEL,
            messages: [
              { role: "user", content: `question ${i} from client ${k}: what is the weather like?` },
            ],
            max_tokens: 32,
            stream: true,
          }),
        });
        if (!response.ok || !response.body) {
          refused++;
          await response.text();
          await new Promise((resolve) => setTimeout(resolve, 100));
          continue;
        }
        const reader = response.body.getReader();
        let first = true;
        for (;;) {
          const { done } = await reader.read();
          if (first && !done) {
            ttft.push(performance.now() - started);
            first = false;
          }
          if (done) break;
        }
        latency.push(performance.now() - started);
      } catch {
        refused++;
      }
    }
  };
  const running = Promise.all(Array.from({ length: clients }, (_, k) => client(k)));
  return {
    done: running,
    stats(): InteractiveStats {
      return {
        calls: latency.length,
        refused,
        ttft_p50_ms: round(quantile(ttft, 0.5), 1),
        ttft_p99_ms: round(quantile(ttft, 0.99), 1),
        latency_p50_ms: round(quantile(latency, 0.5), 1),
      };
    },
  };
}

/** Runs the benchmark; every figure is measured, none tuned. */
export async function runBatchBench(options: BatchBenchOptions = {}): Promise<Record<string, unknown>> {
  const lines = options.lines ?? 10_000;
  const clients = options.clients ?? 8;
  const baselineS = options.baselineS ?? 10;
  const limitS = options.limitS ?? 1800;
  const dataDir = mkdtempSync(join(tmpdir(), "sluice-batch-bench-"));
  const nats: NatsServerProcess | undefined = options.nats ? await startNatsServer() : undefined;
  const server = await startServer({
    port: 0,
    host: "127.0.0.1",
    simReplicas: 2,
    dataDir,
    log: () => {},
    ...(nats ? { nats: nats.url } : {}),
  });
  try {
    const alone = new AbortController();
    const baseline = interactiveLoad(server.url, clients, alone.signal);
    await new Promise((resolve) => setTimeout(resolve, baselineS * 1000));
    alone.abort();
    await baseline.done;

    const jsonl = Array.from({ length: lines }, (_, i) =>
      JSON.stringify({
        custom_id: `doc-${i}`,
        method: "POST",
        url: "/v1/chat/completions",
        body: {
          model: MODEL,
          messages: [
            { role: "system", content: "Summarize the document in one sentence." },
            { role: "user", content: `Document ${i}: ${"lorem ipsum dolor sit amet ".repeat(40)}` },
          ],
          max_tokens: 64,
        },
      }),
    ).join("\n");
    const form = new FormData();
    form.set("purpose", "batch");
    form.set("file", new Blob([jsonl]), "bench.jsonl");
    const file = (await (await fetch(`${server.url}/v1/files`, { method: "POST", body: form })).json()) as {
      id: string;
    };
    const started = performance.now();
    const created = (await (
      await fetch(`${server.url}/v1/batches`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          input_file_id: file.id,
          endpoint: "/v1/chat/completions",
          completion_window: "24h",
        }),
      })
    ).json()) as { id: string };

    const beside = new AbortController();
    const withBatch = interactiveLoad(server.url, clients, beside.signal);
    let batch: { status: string; request_counts: { completed: number; failed: number } };
    for (;;) {
      batch = (await (await fetch(`${server.url}/v1/batches/${created.id}`)).json()) as typeof batch;
      if (["completed", "failed", "expired", "cancelled"].includes(batch.status)) break;
      if (performance.now() - started > limitS * 1000) break;
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
    const batchSeconds = (performance.now() - started) / 1000;
    beside.abort();
    await withBatch.done;
    return {
      store: nats ? "jetstream" : "lmdb",
      lines,
      clients,
      batch_status: batch.status,
      batch_completed: batch.request_counts.completed,
      batch_failed: batch.request_counts.failed,
      batch_seconds: round(batchSeconds, 1),
      batch_lines_per_s: round(batch.request_counts.completed / batchSeconds, 1),
      interactive_alone: baseline.stats(),
      interactive_beside_batch: withBatch.stats(),
    };
  } finally {
    await server.close();
    await nats?.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const { values } = parseArgs({
    options: {
      lines: { type: "string" },
      clients: { type: "string" },
      "baseline-s": { type: "string" },
      nats: { type: "boolean" },
      json: { type: "string" },
    },
  });
  const result = await runBatchBench({
    ...(values.lines ? { lines: Number(values.lines) } : {}),
    ...(values.clients ? { clients: Number(values.clients) } : {}),
    ...(values["baseline-s"] ? { baselineS: Number(values["baseline-s"]) } : {}),
    ...(values.nats ? { nats: true } : {}),
  });
  const text = JSON.stringify(result, null, 2);
  if (values.json) writeFileSync(values.json, `${text}\n`);
  console.log(text);
}
