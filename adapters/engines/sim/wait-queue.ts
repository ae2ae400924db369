/** @module The waiting calls of one simulated rank: a FIFO that also takes preempted calls back at its front. */

import type { SimCall } from "./sim-call.js";

/** A FIFO of waiting calls that also takes preempted calls back at its front. Done calls are skipped lazily. */
export class WaitQueue {
  private items: SimCall[] = [];
  private head = 0;

  push(call: SimCall): void {
    this.items.push(call);
  }

  unshift(call: SimCall): void {
    if (this.head > 0) this.items[--this.head] = call;
    else this.items.unshift(call);
  }

  peek(): SimCall | undefined {
    while (this.head < this.items.length) {
      const call = this.items[this.head]!;
      if (call.state === "waiting") return call;
      this.head++;
    }
    this.compact();
    return undefined;
  }

  shift(): void {
    this.head++;
    if (this.head > 1024 && this.head * 2 > this.items.length) this.compact();
  }

  all(): SimCall[] {
    return this.items.slice(this.head).filter((c) => c.state === "waiting");
  }

  private compact(): void {
    this.items = this.items.slice(this.head);
    this.head = 0;
  }
}
