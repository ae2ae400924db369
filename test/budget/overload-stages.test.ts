/** @module Overload stages: every transition, hysteresis, timer-driven windows on the virtual clock. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  OverloadController,
  type OverloadControllerOptions,
  type WindowReport,
} from "../../src/budget/index.js";
import { VirtualClock } from "../../src/clock.js";
import type { OverloadStage } from "../../src/types.js";

const OBJECTIVE_MS = 1000;
const WINDOW_MS = 60_000;

function setup(extra: Partial<OverloadControllerOptions> = {}) {
  const clock = new VirtualClock();
  const changes: [OverloadStage, OverloadStage][] = [];
  const ctl = new OverloadController({
    clock,
    objectiveMs: OBJECTIVE_MS,
    onStage: (stage, previous) => changes.push([previous, stage]),
    ...extra,
  });
  /** Records one window whose every sample is `ageMs` (or none), then lets the window timer close it. */
  const window = (ageMs: number | undefined) => {
    if (ageMs !== undefined) for (let i = 0; i < 20; i++) ctl.recordQueueAge(ageMs);
    clock.advance(WINDOW_MS);
    return ctl.stage;
  };
  return { clock, ctl, changes, window };
}

const HIGH = 1500; // above the objective
const MID = 800; // between 70 % and 100 %
const LOW = 500; // below 70 %

describe("OverloadController", () => {
  it("starts normal, admitting everything", () => {
    const { ctl } = setup();
    assert.equal(ctl.stage, "normal");
    assert.equal(ctl.stageNumber, 0);
    assert.equal(ctl.admitsBulk(), true);
    assert.equal(ctl.admitsInteractive(0), true);
    ctl.stop();
  });

  it("pauses bulk after 3 windows above, sheds after 2 more, recovers after 5 below 70 %", () => {
    const { ctl, changes, window } = setup();
    assert.equal(window(HIGH), "normal");
    assert.equal(window(HIGH), "normal");
    assert.equal(window(HIGH), "bulk_paused");
    assert.equal(ctl.stageNumber, 1);
    assert.equal(ctl.admitsBulk(), false);
    assert.equal(ctl.admitsInteractive(0), true);

    assert.equal(window(HIGH), "bulk_paused");
    assert.equal(window(HIGH), "shedding");
    assert.equal(ctl.stageNumber, 2);
    assert.equal(ctl.admitsBulk(), false);
    assert.equal(ctl.admitsInteractive(0), false, "lowest priority is shed");
    assert.equal(ctl.admitsInteractive(-3), false);
    assert.equal(ctl.admitsInteractive(1), true, "higher priorities still get in");

    for (let i = 1; i <= 4; i++) assert.equal(window(LOW), "shedding", `no recovery after ${i} good windows`);
    assert.equal(window(LOW), "normal");
    assert.equal(ctl.admitsBulk(), true);
    assert.equal(ctl.admitsInteractive(0), true);
    assert.deepEqual(changes, [
      ["normal", "bulk_paused"],
      ["bulk_paused", "shedding"],
      ["shedding", "normal"],
    ]);
    ctl.stop();
  });

  it("needs the windows above to be consecutive", () => {
    const { ctl, window } = setup();
    window(HIGH);
    window(HIGH);
    window(MID); // at or below the objective: the run breaks
    window(HIGH);
    assert.equal(window(HIGH), "normal");
    assert.equal(window(HIGH), "bulk_paused");
    window(HIGH);
    window(LOW);
    assert.equal(window(HIGH), "bulk_paused", "the 2 more above windows must be consecutive too");
    assert.equal(window(HIGH), "shedding");
    ctl.stop();
  });

  it("recovers from bulk_paused straight to normal after 5 windows below 70 %, not after 4", () => {
    const { ctl, window } = setup();
    for (let i = 0; i < 3; i++) window(HIGH);
    assert.equal(ctl.stage, "bulk_paused");
    for (let i = 0; i < 4; i++) assert.equal(window(LOW), "bulk_paused");
    assert.equal(window(LOW), "normal");
    ctl.stop();
  });

  it("a window between 70 % and 100 % holds the stage and restarts the good-window count", () => {
    const { ctl, window } = setup();
    for (let i = 0; i < 5; i++) window(HIGH);
    assert.equal(ctl.stage, "shedding");
    for (let i = 0; i < 4; i++) window(LOW);
    assert.equal(window(MID), "shedding", "merely below the objective holds shedding");
    for (let i = 0; i < 4; i++) assert.equal(window(LOW), "shedding");
    assert.equal(window(LOW), "normal");
    ctl.stop();
  });

  it("holds shedding while windows stay above the objective, and a window above restarts recovery", () => {
    const { ctl, window } = setup();
    for (let i = 0; i < 5; i++) window(HIGH);
    for (let i = 0; i < 10; i++) assert.equal(window(HIGH), "shedding");
    for (let i = 0; i < 4; i++) window(LOW);
    assert.equal(window(HIGH), "shedding");
    for (let i = 0; i < 4; i++) assert.equal(window(LOW), "shedding");
    assert.equal(window(LOW), "normal");
    ctl.stop();
  });

  it("counts an empty window as below the objective", () => {
    const { ctl, window } = setup();
    for (let i = 0; i < 3; i++) window(HIGH);
    assert.equal(ctl.stage, "bulk_paused");
    for (let i = 0; i < 4; i++) window(undefined);
    assert.equal(ctl.lastWindow?.samples, 0);
    assert.equal(ctl.lastWindow?.p95Ms, 0);
    assert.equal(ctl.lastWindow?.verdict, "below");
    assert.equal(window(undefined), "normal");
    ctl.stop();
  });

  it("judges a window by its p95, not its mean or max", () => {
    const { clock, ctl } = setup();
    // 100 samples: 95 at 900 ms (between), 5 at 60 s. p95 by nearest rank is the 95th value: 900.
    for (let i = 0; i < 95; i++) ctl.recordQueueAge(900);
    for (let i = 0; i < 5; i++) ctl.recordQueueAge(60_000);
    clock.advance(WINDOW_MS);
    assert.equal(ctl.lastWindow?.p95Ms, 900);
    assert.equal(ctl.lastWindow?.verdict, "between");
    // One more slow sample pushes the 95th percentile over the objective.
    for (let i = 0; i < 94; i++) ctl.recordQueueAge(900);
    for (let i = 0; i < 6; i++) ctl.recordQueueAge(60_000);
    clock.advance(WINDOW_MS);
    assert.equal(ctl.lastWindow?.p95Ms, 60_000);
    assert.equal(ctl.lastWindow?.verdict, "above");
    ctl.stop();
  });

  it("treats exactly the objective as not above, and exactly 70 % as not below", () => {
    const { ctl, window } = setup();
    window(OBJECTIVE_MS);
    assert.equal(ctl.lastWindow?.verdict, "between");
    window(0.7 * OBJECTIVE_MS);
    assert.equal(ctl.lastWindow?.verdict, "between");
    window(0.7 * OBJECTIVE_MS - 1);
    assert.equal(ctl.lastWindow?.verdict, "below");
    window(OBJECTIVE_MS + 1);
    assert.equal(ctl.lastWindow?.verdict, "above");
    ctl.stop();
  });

  it("closes windows on the clock every windowMs, and stop() cancels the timer", () => {
    const { clock, ctl } = setup({ windowMs: 10_000 });
    assert.equal(clock.pending(), 1);
    ctl.recordQueueAge(HIGH);
    clock.advance(9999);
    assert.equal(ctl.lastWindow, undefined, "the window has not closed yet");
    clock.advance(1);
    assert.deepEqual(ctl.lastWindow, {
      startedAtMs: 0,
      endedAtMs: 10_000,
      samples: 1,
      p95Ms: HIGH,
      verdict: "above",
      stage: "normal",
    });
    ctl.stop();
    ctl.stop();
    assert.equal(clock.pending(), 0);
    clock.runUntilIdle();
    // Read through a function: the deepEqual above narrowed `ctl.lastWindow` for the type checker.
    const last = (): WindowReport | undefined => ctl.lastWindow;
    assert.equal(last()?.endedAtMs, 10_000, "no window closes after stop()");
  });

  it("lets a caller drive windows with evaluateWindow(), re-arming the timer from then", () => {
    const { clock, ctl } = setup({ windowMs: 10_000 });
    clock.advance(4000);
    ctl.recordQueueAge(HIGH);
    const report = ctl.evaluateWindow();
    assert.equal(report.startedAtMs, 0);
    assert.equal(report.endedAtMs, 4000);
    assert.equal(clock.pending(), 1, "exactly one timer stays armed");
    clock.advance(9999);
    assert.equal(ctl.lastWindow?.endedAtMs, 4000);
    clock.advance(1);
    assert.equal(ctl.lastWindow?.endedAtMs, 14_000);
    assert.equal(ctl.lastWindow?.startedAtMs, 4000);
    ctl.stop();
  });

  it("arms no timer with autoEvaluate false", () => {
    const clock = new VirtualClock();
    const ctl = new OverloadController({ clock, objectiveMs: 100, autoEvaluate: false, bulkPauseAfter: 1 });
    assert.equal(clock.pending(), 0);
    ctl.recordQueueAge(101);
    assert.equal(ctl.evaluateWindow().stage, "bulk_paused");
    assert.equal(clock.pending(), 0);
  });

  it("honours configured counts, fraction and shed priority", () => {
    const { ctl, window } = setup({
      bulkPauseAfter: 1,
      shedAfter: 1,
      recoverAfter: 2,
      recoverFraction: 0.5,
      shedPriorityAtOrBelow: 5,
    });
    assert.equal(window(HIGH), "bulk_paused");
    assert.equal(window(HIGH), "shedding");
    assert.equal(ctl.admitsInteractive(5), false);
    assert.equal(ctl.admitsInteractive(6), true);
    window(600); // below 70 % but not below 50 %: between
    assert.equal(ctl.lastWindow?.verdict, "between");
    assert.equal(window(LOW - 1), "shedding");
    assert.equal(window(LOW - 1), "normal");
    ctl.stop();
  });

  it("exposes its state as plain JSON", () => {
    const { ctl, window } = setup();
    window(HIGH);
    ctl.recordQueueAge(3);
    assert.deepEqual(ctl.toJSON(), {
      stage: "normal",
      aboveWindows: 1,
      windowStartedAtMs: 60_000,
      pendingSamples: 1,
    });
    window(HIGH);
    window(HIGH);
    window(LOW);
    assert.deepEqual(ctl.snapshot(), {
      stage: "bulk_paused",
      aboveWindows: 0,
      belowWindows: 1,
      windowStartedAtMs: 240_000,
      pendingSamples: 0,
    });
    ctl.stop();
  });

  it("validates options and samples, naming the value", () => {
    const clock = new VirtualClock();
    assert.throws(() => new OverloadController({ clock, objectiveMs: 0 }), /objectiveMs.*0/);
    assert.throws(() => new OverloadController({ clock, objectiveMs: 1, windowMs: -1 }), /windowMs.*-1/);
    assert.throws(
      () => new OverloadController({ clock, objectiveMs: 1, bulkPauseAfter: 1.5 }),
      /bulkPauseAfter.*1.5/,
    );
    assert.throws(
      () => new OverloadController({ clock, objectiveMs: 1, recoverFraction: 0 }),
      /recoverFraction.*0/,
    );
    assert.throws(
      () => new OverloadController({ clock: undefined as unknown as VirtualClock, objectiveMs: 1 }),
      /clock/,
    );
    const ctl = new OverloadController({ clock, objectiveMs: 1, autoEvaluate: false });
    assert.throws(() => ctl.recordQueueAge(-1), /-1/);
    assert.throws(() => ctl.recordQueueAge(Number.NaN), /NaN/);
    assert.equal(clock.pending(), 0, "failed constructions armed no timer");
  });
});
