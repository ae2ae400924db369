/**
 * @module Gate overhead: acquire + firstToken + release cycles per second on the direct path and through the
 * queue, and heap bytes per queued waiter, each beside a bare counting semaphore measured in the same run.
 * Goals: the gate at ≥ 25 % of the semaphore's rate on both paths; a queued waiter ≤ 1 KiB.
 * Run: `npx tsx bench/gate.ts`.
 */

import { pathToFileURL } from "node:url";
import v8 from "node:v8";
import vm from "node:vm";
import { BackendGate } from "../src/gate/backend-gate.js";

/** The baseline: a counting semaphore with a FIFO of waiters and nothing else. */
class Semaphore {
  private waiters: Array<(() => void) | undefined> = [];
  private head = 0;

  constructor(private permits: number) {}

  acquire(): Promise<void> {
    if (this.permits > 0 && this.head === this.waiters.length) {
      this.permits--;
      return Promise.resolve();
    }
    return new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  release(): void {
    if (this.head === this.waiters.length) {
      this.permits++;
      return;
    }
    const next = this.waiters[this.head]!;
    this.waiters[this.head++] = undefined;
    if (this.head > 1024 && this.head * 2 > this.waiters.length) {
      this.waiters = this.waiters.slice(this.head);
      this.head = 0;
    }
    next();
  }
}

const DIRECT_CYCLES = 300_000;
const QUEUE_BATCH = 1_000;
const QUEUE_CYCLES = 200_000;
const WAITERS = 50_000;
const ROUNDS = 5;

function newGate(limit: number, queue: number, lanes = false): BackendGate {
  return new BackendGate({
    engineRequestLimit: limit,
    engineRequestWaitingLimit: limit,
    requestQueueLimit: queue,
    ...(lanes ? { lanes: {} } : {}),
  });
}

async function gateDirect(): Promise<number> {
  const gate = newGate(1_000, 0);
  const start = performance.now();
  for (let i = 0; i < DIRECT_CYCLES; i++) {
    const permit = await gate.acquire();
    permit.firstToken();
    permit.release();
  }
  return DIRECT_CYCLES / ((performance.now() - start) / 1000);
}

async function semaphoreDirect(): Promise<number> {
  const sem = new Semaphore(1_000);
  const start = performance.now();
  for (let i = 0; i < DIRECT_CYCLES; i++) {
    await sem.acquire();
    sem.release();
  }
  return DIRECT_CYCLES / ((performance.now() - start) / 1000);
}

/** One call holds the only slot; a batch queues behind it and each admitted call releases the next. */
async function gateQueue(lanes = false): Promise<number> {
  const gate = newGate(1, QUEUE_BATCH, lanes);
  const start = performance.now();
  for (let done = 0; done < QUEUE_CYCLES; done += QUEUE_BATCH) {
    const holder = await gate.acquire();
    const queued = Array.from({ length: QUEUE_BATCH }, () => gate.acquire());
    holder.release();
    for (const pending of queued) {
      const permit = await pending;
      permit.firstToken();
      permit.release();
    }
  }
  return QUEUE_CYCLES / ((performance.now() - start) / 1000);
}

async function semaphoreQueue(): Promise<number> {
  const sem = new Semaphore(1);
  const start = performance.now();
  for (let done = 0; done < QUEUE_CYCLES; done += QUEUE_BATCH) {
    await sem.acquire();
    const queued = Array.from({ length: QUEUE_BATCH }, () => sem.acquire());
    sem.release();
    for (const pending of queued) {
      await pending;
      sem.release();
    }
  }
  return QUEUE_CYCLES / ((performance.now() - start) / 1000);
}

function collector(): () => void {
  v8.setFlagsFromString("--expose-gc");
  return vm.runInNewContext("gc") as () => void;
}

/** Heap bytes per queued waiter: heap after queueing `WAITERS` calls minus before, with GC on both sides. */
async function bytesPerWaiter(kind: "gate" | "gate-signal" | "gate-lanes" | "semaphore"): Promise<number> {
  const gc = collector();
  const signals =
    kind === "gate-signal" ? Array.from({ length: WAITERS }, () => new AbortController().signal) : [];
  let keep: unknown[] = [];
  let owner: unknown;
  gc();
  const before = process.memoryUsage().heapUsed;
  if (kind === "semaphore") {
    const sem = new Semaphore(0);
    owner = sem;
    for (let i = 0; i < WAITERS; i++) keep.push(sem.acquire());
  } else {
    const gate = newGate(1, WAITERS, kind === "gate-lanes");
    owner = gate;
    keep.push(await gate.acquire());
    for (let i = 0; i < WAITERS; i++) {
      keep.push(kind === "gate-signal" ? gate.acquire({ signal: signals[i]! }) : gate.acquire());
    }
  }
  gc();
  const after = process.memoryUsage().heapUsed;
  const bytes = (after - before) / WAITERS;
  if (owner instanceof BackendGate) {
    owner.setLimits({ engineRequestLimit: WAITERS + 1, engineRequestWaitingLimit: WAITERS + 1 });
  } else if (owner instanceof Semaphore) {
    for (let i = 0; i < WAITERS; i++) owner.release();
  }
  await Promise.all(keep);
  keep = [];
  owner = undefined;
  return bytes;
}

async function best(fn: () => Promise<number>): Promise<number> {
  let top = 0;
  for (let round = 0; round < ROUNDS; round++) top = Math.max(top, await fn());
  return top;
}

/** Runs the gate benchmark and returns its numbers (rates in cycles/s, sizes in bytes). */
export async function runGateBench(): Promise<Record<string, number>> {
  // Warm both sides up before measuring, then interleave them so drift hits both alike.
  await gateDirect();
  await semaphoreDirect();
  await gateQueue();
  await semaphoreQueue();
  const directGate = await best(gateDirect);
  const directSemaphore = await best(semaphoreDirect);
  const queueGate = await best(() => gateQueue());
  const queueGateLanes = await best(() => gateQueue(true));
  const queueSemaphore = await best(semaphoreQueue);
  const waiterGate = await bytesPerWaiter("gate");
  const waiterGateSignal = await bytesPerWaiter("gate-signal");
  const waiterGateLanes = await bytesPerWaiter("gate-lanes");
  const waiterSemaphore = await bytesPerWaiter("semaphore");
  return {
    direct_gate_cycles_per_s: Math.round(directGate),
    direct_semaphore_cycles_per_s: Math.round(directSemaphore),
    direct_ratio: directGate / directSemaphore,
    queue_gate_cycles_per_s: Math.round(queueGate),
    queue_gate_lanes_cycles_per_s: Math.round(queueGateLanes),
    queue_semaphore_cycles_per_s: Math.round(queueSemaphore),
    queue_ratio: queueGate / queueSemaphore,
    queue_lanes_ratio: queueGateLanes / queueSemaphore,
    waiter_gate_bytes: Math.round(waiterGate),
    waiter_gate_signal_bytes: Math.round(waiterGateSignal),
    waiter_gate_lanes_bytes: Math.round(waiterGateLanes),
    waiter_semaphore_bytes: Math.round(waiterSemaphore),
  };
}

function printTable(r: Record<string, number>): void {
  const rate = (n: number) => `${(n / 1e6).toFixed(2)} M/s`;
  const pct = (n: number) => `${(n * 100).toFixed(0)} %`;
  const rows: Array<[string, string, string, string, string]> = [
    [
      "direct cycles",
      rate(r.direct_gate_cycles_per_s!),
      rate(r.direct_semaphore_cycles_per_s!),
      pct(r.direct_ratio!),
      "≥ 25 %",
    ],
    [
      "queued cycles",
      rate(r.queue_gate_cycles_per_s!),
      rate(r.queue_semaphore_cycles_per_s!),
      pct(r.queue_ratio!),
      "≥ 25 %",
    ],
    [
      "queued cycles, lanes",
      rate(r.queue_gate_lanes_cycles_per_s!),
      rate(r.queue_semaphore_cycles_per_s!),
      pct(r.queue_lanes_ratio!),
      "",
    ],
    ["bytes/waiter", `${r.waiter_gate_bytes}`, `${r.waiter_semaphore_bytes}`, "", "≤ 1024"],
    ["bytes/waiter, signal", `${r.waiter_gate_signal_bytes}`, "", "", "≤ 1024"],
    ["bytes/waiter, lanes", `${r.waiter_gate_lanes_bytes}`, "", "", "≤ 1024"],
  ];
  const header: [string, string, string, string, string] = ["", "gate", "semaphore", "gate/sem", "goal"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
  for (const row of [header, ...rows]) console.log(row.map((cell, i) => cell.padEnd(widths[i]!)).join("  "));
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const results = await runGateBench();
  printTable(results);
}
