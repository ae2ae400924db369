/** @module Overload stages with hysteresis, driven by the p95 interactive queue age per window (docs/how-it-works.md#token-budget-and-feasibility). */

import type { Cancel, Clock } from "../clock.js";
import { DEFAULT_OVERLOAD } from "../config/defaults.js";
import type { OverloadStage } from "../types.js";

/** How one closed window compared with the objective. */
export type WindowVerdict = "above" | "between" | "below";

/** A closed window, as `evaluateWindow` saw it. */
export interface WindowReport {
  /** Clock time the window opened and closed, ms. */
  startedAtMs: number;
  endedAtMs: number;
  samples: number;
  /** p95 of the window's samples (nearest rank), ms; 0 for an empty window. */
  p95Ms: number;
  /** `above`: p95 > objective; `below`: p95 < recoverFraction × objective; `between` otherwise. */
  verdict: WindowVerdict;
  /** Stage after this window. */
  stage: OverloadStage;
}

/** Options of an `OverloadController`. */
export interface OverloadControllerOptions {
  clock: Clock;
  /** The interactive queue-age objective, ms (> 0). */
  objectiveMs: number;
  /** Window length, ms. Default 60,000. */
  windowMs?: number;
  /** Consecutive windows above the objective that pause bulk. Default 3. */
  bulkPauseAfter?: number;
  /** Further consecutive windows above the objective, once bulk is paused, that start shedding. Default 2. */
  shedAfter?: number;
  /** Consecutive windows below `recoverFraction × objective` that return to normal. Default 5. */
  recoverAfter?: number;
  /** Share of the objective a window must stay under to count toward recovery, (0, 1]. Default 0.7. */
  recoverFraction?: number;
  /** In `shedding`, interactive arrivals with priority at or below this are refused. Default 0. */
  shedPriorityAtOrBelow?: number;
  /** Arm the window timer on the clock. Default true; false when the caller drives `evaluateWindow()`. */
  autoEvaluate?: boolean;
  /** Called on every stage change, after the stage changed; must not throw. */
  onStage?: (stage: OverloadStage, previous: OverloadStage, report: WindowReport) => void;
}

/** Plain-JSON state of the controller. */
export type OverloadSnapshot =
  | { stage: "normal"; aboveWindows: number; windowStartedAtMs: number; pendingSamples: number }
  | {
      stage: "bulk_paused";
      aboveWindows: number;
      belowWindows: number;
      windowStartedAtMs: number;
      pendingSamples: number;
    }
  | { stage: "shedding"; belowWindows: number; windowStartedAtMs: number; pendingSamples: number };

const STAGE_NUMBER: Record<OverloadStage, 0 | 1 | 2> = { normal: 0, bulk_paused: 1, shedding: 2 };

function positiveInteger(name: string, value: number): number {
  if (!(Number.isSafeInteger(value) && value >= 1)) {
    throw new RangeError(`${name} should be a positive whole number, got ${value}`);
  }
  return value;
}

function positiveFinite(name: string, value: number): number {
  if (!(typeof value === "number" && Number.isFinite(value) && value > 0)) {
    throw new RangeError(`${name} should be a positive finite number, got ${value}`);
  }
  return value;
}

/** p95 by nearest rank; 0 when empty. Sorts its argument. */
function p95(samples: number[]): number {
  if (samples.length === 0) return 0;
  samples.sort((a, b) => a - b);
  return samples[Math.ceil(0.95 * samples.length) - 1]!;
}

/**
 * The overload stage machine. Each closed window is `above` (p95 > objective),
 * `below` (p95 < recoverFraction × objective; an empty window is `below`), or
 * `between`.
 *
 * - `normal` → `bulk_paused` after `bulkPauseAfter` consecutive `above` windows.
 * - `bulk_paused` → `shedding` after `shedAfter` further consecutive `above` windows.
 * - `bulk_paused` or `shedding` → `normal` after `recoverAfter` consecutive
 *   `below` windows, straight to `normal` (no step through `bulk_paused`).
 * - A `between` window holds the stage and resets the `below` count; an
 *   `above` window resets it too.
 * - From `shedding`, windows merely below the objective hold `shedding`: the
 *   shedding is what keeps the queue age down, and stepping back to
 *   `bulk_paused` on the first such window would oscillate with a period of
 *   three windows. Only sustained recovery (`recoverAfter` windows under
 *   `recoverFraction × objective`) ends it.
 *
 * Samples are the interactive queue age of each call at its admission, or at
 * its refusal after queueing (`queue_timeout`). Calls the stage itself refuses
 * at arrival never queued and should not be recorded: their zero age would
 * hide the backlog and end shedding early.
 */
export class OverloadController {
  private readonly clock: Clock;
  private readonly objectiveMs: number;
  private readonly windowMs: number;
  private readonly bulkPauseAfter: number;
  private readonly shedAfter: number;
  private readonly recoverAfter: number;
  private readonly recoverFraction: number;
  private readonly shedPriorityAtOrBelow: number;
  private readonly onStage: OverloadControllerOptions["onStage"];
  private current: OverloadStage = "normal";
  private aboveWindows = 0;
  private belowWindows = 0;
  private samples: number[] = [];
  private windowStartedAtMs: number;
  private cancelTimer: Cancel | undefined;
  private running: boolean;
  private last: WindowReport | undefined;

  constructor(options: OverloadControllerOptions) {
    if (
      !options ||
      typeof options.clock?.now !== "function" ||
      typeof options.clock.setTimeout !== "function"
    ) {
      throw new TypeError(`OverloadController needs options.clock, a Clock, got ${String(options?.clock)}`);
    }
    this.clock = options.clock;
    this.objectiveMs = positiveFinite("objectiveMs", options.objectiveMs);
    this.windowMs = positiveFinite("windowMs", options.windowMs ?? DEFAULT_OVERLOAD.windowMs);
    this.bulkPauseAfter = positiveInteger(
      "bulkPauseAfter",
      options.bulkPauseAfter ?? DEFAULT_OVERLOAD.bulkPauseAfter,
    );
    this.shedAfter = positiveInteger("shedAfter", options.shedAfter ?? DEFAULT_OVERLOAD.shedAfter);
    this.recoverAfter = positiveInteger(
      "recoverAfter",
      options.recoverAfter ?? DEFAULT_OVERLOAD.recoverAfter,
    );
    const fraction = options.recoverFraction ?? DEFAULT_OVERLOAD.recoverFraction;
    if (!(typeof fraction === "number" && fraction > 0 && fraction <= 1)) {
      throw new RangeError(`recoverFraction should be in (0, 1], got ${fraction}`);
    }
    this.recoverFraction = fraction;
    const shedAt = options.shedPriorityAtOrBelow ?? 0;
    if (typeof shedAt !== "number" || Number.isNaN(shedAt)) {
      throw new RangeError(`shedPriorityAtOrBelow should be a number, got ${shedAt}`);
    }
    this.shedPriorityAtOrBelow = shedAt;
    this.onStage = options.onStage;
    this.windowStartedAtMs = this.clock.now();
    this.running = options.autoEvaluate ?? true;
    if (this.running) this.arm();
  }

  /** The current stage. */
  get stage(): OverloadStage {
    return this.current;
  }

  /** The stage as the `sluice_overload_stage` gauge shows it: 0 normal, 1 bulk_paused, 2 shedding. */
  get stageNumber(): 0 | 1 | 2 {
    return STAGE_NUMBER[this.current];
  }

  /** The last closed window, or undefined before the first one closed. */
  get lastWindow(): WindowReport | undefined {
    return this.last;
  }

  /** Whether bulk calls may be admitted (to shared replicas): only in `normal`. */
  admitsBulk(): boolean {
    return this.current === "normal";
  }

  /** Whether an interactive arrival of this priority is admitted; in `shedding`, priorities ≤ `shedPriorityAtOrBelow` are not. */
  admitsInteractive(priority = 0): boolean {
    return this.current !== "shedding" || priority > this.shedPriorityAtOrBelow;
  }

  /** Records one interactive queue age, ms, into the open window. */
  recordQueueAge(ms: number): void {
    if (!(typeof ms === "number" && Number.isFinite(ms) && ms >= 0)) {
      throw new RangeError(`queue age should be a non-negative finite number of ms, got ${ms}`);
    }
    this.samples.push(ms);
  }

  /**
   * Closes the open window now, applies it to the stage and opens the next one.
   * With the timer running, the next window closes `windowMs` from now.
   */
  evaluateWindow(): WindowReport {
    const endedAtMs = this.clock.now();
    const samples = this.samples;
    this.samples = [];
    const value = p95(samples);
    const verdict: WindowVerdict =
      value > this.objectiveMs
        ? "above"
        : value < this.recoverFraction * this.objectiveMs
          ? "below"
          : "between";
    const previous = this.current;
    this.apply(verdict);
    const report: WindowReport = {
      startedAtMs: this.windowStartedAtMs,
      endedAtMs,
      samples: samples.length,
      p95Ms: value,
      verdict,
      stage: this.current,
    };
    this.last = report;
    this.windowStartedAtMs = endedAtMs;
    if (this.running) this.arm();
    if (this.current !== previous) this.onStage?.(this.current, previous, report);
    return report;
  }

  /** Cancels the window timer; `evaluateWindow()` still works. Idempotent. */
  stop(): void {
    this.running = false;
    this.cancelTimer?.();
    this.cancelTimer = undefined;
  }

  /** Plain-JSON state. */
  snapshot(): OverloadSnapshot {
    const common = { windowStartedAtMs: this.windowStartedAtMs, pendingSamples: this.samples.length };
    switch (this.current) {
      case "normal":
        return { stage: "normal", aboveWindows: this.aboveWindows, ...common };
      case "bulk_paused":
        return {
          stage: "bulk_paused",
          aboveWindows: this.aboveWindows,
          belowWindows: this.belowWindows,
          ...common,
        };
      case "shedding":
        return { stage: "shedding", belowWindows: this.belowWindows, ...common };
    }
  }

  toJSON(): OverloadSnapshot {
    return this.snapshot();
  }

  private apply(verdict: WindowVerdict): void {
    this.aboveWindows = verdict === "above" ? this.aboveWindows + 1 : 0;
    this.belowWindows = verdict === "below" ? this.belowWindows + 1 : 0;
    switch (this.current) {
      case "normal":
        if (this.aboveWindows >= this.bulkPauseAfter) this.enter("bulk_paused");
        return;
      case "bulk_paused":
        if (this.aboveWindows >= this.shedAfter) this.enter("shedding");
        else if (this.belowWindows >= this.recoverAfter) this.enter("normal");
        return;
      case "shedding":
        if (this.belowWindows >= this.recoverAfter) this.enter("normal");
        return;
    }
  }

  private enter(stage: OverloadStage): void {
    this.current = stage;
    // Each stage counts its own run of windows: "2 more" above windows start after bulk was paused.
    this.aboveWindows = 0;
    this.belowWindows = 0;
  }

  private arm(): void {
    this.cancelTimer?.();
    this.cancelTimer = this.clock.setTimeout(() => {
      this.cancelTimer = undefined;
      this.evaluateWindow();
    }, this.windowMs);
  }
}
