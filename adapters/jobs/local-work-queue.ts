/** @module The embedded work queue: one runner takes everything, in memory, filled at start from what the store holds unfinished. */

import type { JobStore, TakenWork, WorkItem, WorkQueue } from "./job-store.js";
import { TERMINAL_BATCH_STATUSES } from "./types.js";

/**
 * The queue of a single sluice over its own store. Nothing needs to be redelivered to another runner:
 * after a crash the store itself says what is unfinished, so `open` puts that up again.
 */
export class LocalWorkQueue implements WorkQueue {
  /** The one runner lets all batches take turns line by line. */
  readonly batchesPerRunner = Number.POSITIVE_INFINITY;
  private readonly items: Record<WorkItem["kind"], string[]> = { batch: [], call: [] };
  private readonly waiters: Record<WorkItem["kind"], (() => void)[]> = { batch: [], call: [] };

  /** A queue holding the store's unfinished batches and calls, oldest first. */
  static async open(store: JobStore): Promise<LocalWorkQueue> {
    const queue = new LocalWorkQueue();
    const batches: string[] = [];
    for await (const { batch } of store.listBatches()) {
      if (!TERMINAL_BATCH_STATUSES.has(batch.status)) batches.push(batch.id);
    }
    queue.items.batch.push(...batches.reverse());
    for await (const job of store.listJobs()) {
      if (job.status === "queued" || job.status === "in_progress") queue.items.call.push(job.id);
    }
    return queue;
  }

  async offer(item: WorkItem): Promise<void> {
    this.items[item.kind].push(item.id);
    this.waiters[item.kind].shift()?.();
  }

  async take(kind: WorkItem["kind"], signal: AbortSignal): Promise<TakenWork | undefined> {
    while (this.items[kind].length === 0) {
      if (signal.aborted) return undefined;
      await new Promise<void>((resolve) => {
        const wake = () => {
          signal.removeEventListener("abort", wake);
          const at = this.waiters[kind].indexOf(wake);
          if (at >= 0) this.waiters[kind].splice(at, 1);
          resolve();
        };
        this.waiters[kind].push(wake);
        signal.addEventListener("abort", wake, { once: true });
      });
    }
    const id = this.items[kind].shift()!;
    return {
      item: { kind, id },
      working: () => {},
      done: async () => {},
      // The store still says it is unfinished: the next start puts it up again.
      release: () => {},
    };
  }

  async close(): Promise<void> {
    for (const kind of ["batch", "call"] as const) {
      for (const wake of this.waiters[kind].splice(0)) wake();
    }
  }
}
