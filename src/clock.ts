/** @module The injected time source: nothing in `src/` reads the wall clock or starts a timer by itself. */

/** Cancels a timer; calling it twice, or after the timer fired, does nothing. */
export type Cancel = () => void;

/** A time source with timers. Times are milliseconds. */
export interface Clock {
  /** Current time in ms (monotonic for `RealClock`, virtual for `VirtualClock`). */
  now(): number;
  /** Runs `fn` once after `ms` milliseconds; returns a function that cancels it. */
  setTimeout(fn: () => void, ms: number): Cancel;
}

/** Real time: `performance.now()` and Node timers that do not keep the process alive. */
export class RealClock implements Clock {
  now(): number {
    return performance.now();
  }

  setTimeout(fn: () => void, ms: number): Cancel {
    const handle = globalThis.setTimeout(fn, Math.max(0, ms));
    // A pending scheduler timer must never be the only thing keeping a process alive.
    (handle as { unref?: () => void }).unref?.();
    return () => globalThis.clearTimeout(handle);
  }
}

/** The process-wide real clock. */
export const realClock: Clock = new RealClock();

interface VirtualTimer {
  at: number;
  seq: number;
  fn: () => void;
  cancelled: boolean;
}

/**
 * Virtual time for tests and the simulator: time moves only when told to.
 * Timers fire in time order (ties in the order they were set); timers set by
 * timers fire too, within the same `advance` when they fall inside it.
 */
export class VirtualClock implements Clock {
  private current: number;
  private seq = 0;
  private readonly heap: VirtualTimer[] = [];

  constructor(startMs = 0) {
    this.current = startMs;
  }

  now(): number {
    return this.current;
  }

  setTimeout(fn: () => void, ms: number): Cancel {
    const timer: VirtualTimer = { at: this.current + Math.max(0, ms), seq: this.seq++, fn, cancelled: false };
    this.push(timer);
    return () => {
      timer.cancelled = true;
    };
  }

  /** Number of timers still pending (cancelled ones excluded). */
  pending(): number {
    let count = 0;
    for (const timer of this.heap) if (!timer.cancelled) count++;
    return count;
  }

  /** Time of the next pending timer, or undefined when none is pending. */
  nextTimerAt(): number | undefined {
    this.dropCancelledHead();
    return this.heap[0]?.at;
  }

  /** Moves time forward by `ms`, firing every timer due on the way, in order. */
  advance(ms: number): void {
    if (!(ms >= 0)) throw new RangeError(`advance takes a non-negative number of ms, got ${ms}`);
    const target = this.current + ms;
    for (;;) {
      const timer = this.popDue(target);
      if (!timer) break;
      this.current = timer.at;
      timer.fn();
    }
    this.current = target;
  }

  /**
   * Fires timers until none is pending, moving time to each. Throws after
   * `maxTimers` firings, which is how a periodic timer that never stops shows up.
   */
  runUntilIdle(maxTimers = 10_000_000): void {
    for (let fired = 0; ; fired++) {
      const timer = this.popDue(Number.POSITIVE_INFINITY);
      if (!timer) return;
      if (fired >= maxTimers)
        throw new Error(`runUntilIdle: more than ${maxTimers} timers fired; a timer re-arms itself forever`);
      this.current = Math.max(this.current, timer.at);
      timer.fn();
    }
  }

  /**
   * Like `advance`, but lets promise continuations run after each firing, so
   * async code driven by timers (a permit resolving, a stream chunk) keeps
   * pace with virtual time.
   */
  async advanceAsync(ms: number): Promise<void> {
    const target = this.current + ms;
    await flushMicrotasks();
    for (;;) {
      const timer = this.popDue(target);
      if (!timer) break;
      this.current = timer.at;
      timer.fn();
      await flushMicrotasks();
    }
    this.current = target;
    await flushMicrotasks();
  }

  /**
   * Fires timers (letting promise continuations run after each) until `done()`
   * is true or no timer is pending. Returns whether `done()` became true.
   */
  async runAsyncUntil(done: () => boolean, maxTimers = 100_000_000): Promise<boolean> {
    await flushMicrotasks();
    for (let fired = 0; !done(); fired++) {
      if (fired >= maxTimers) throw new Error(`runAsyncUntil: more than ${maxTimers} timers fired`);
      const timer = this.popDue(Number.POSITIVE_INFINITY);
      if (!timer) return done();
      this.current = Math.max(this.current, timer.at);
      timer.fn();
      await flushMicrotasks();
    }
    return true;
  }

  private popDue(limit: number): VirtualTimer | undefined {
    this.dropCancelledHead();
    const head = this.heap[0];
    if (!head || head.at > limit) return undefined;
    this.pop();
    return head;
  }

  private dropCancelledHead(): void {
    while (this.heap.length > 0 && this.heap[0]!.cancelled) this.pop();
  }

  private static before(a: VirtualTimer, b: VirtualTimer): boolean {
    return a.at < b.at || (a.at === b.at && a.seq < b.seq);
  }

  private push(timer: VirtualTimer): void {
    const heap = this.heap;
    heap.push(timer);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!VirtualClock.before(heap[i]!, heap[parent]!)) break;
      [heap[i], heap[parent]] = [heap[parent]!, heap[i]!];
      i = parent;
    }
  }

  private pop(): void {
    const heap = this.heap;
    const last = heap.pop()!;
    if (heap.length === 0) return;
    heap[0] = last;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      const right = left + 1;
      let smallest = i;
      if (left < heap.length && VirtualClock.before(heap[left]!, heap[smallest]!)) smallest = left;
      if (right < heap.length && VirtualClock.before(heap[right]!, heap[smallest]!)) smallest = right;
      if (smallest === i) return;
      [heap[i], heap[smallest]] = [heap[smallest]!, heap[i]!];
      i = smallest;
    }
  }
}

/** Resolves after every microtask queued so far (and those they queue) has run. */
export function flushMicrotasks(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
