/** @module What the HTTP layer (and the jobs routes it mounts) needs from the scheduler; `src/scheduler.ts` provides it. */

import type {
  AdminState,
  AdmittedCall,
  CallRequest,
  OpenSessionInit,
  ReplicaState,
  SessionView,
} from "../../src/types.js";
import type { MetricsScheduler } from "../metrics/metrics.js";

/** What the HTTP layer needs from the scheduler (`src/scheduler.ts` provides it). */
export interface HttpScheduler extends MetricsScheduler {
  readonly config: { window: { kvLow: number; kvHigh: number; hitLow: number } };
  submit(req: CallRequest): Promise<AdmittedCall>;
  openSession(init: OpenSessionInit): SessionView;
  getSession(id: string): SessionView | undefined;
  closeSession(id: string): boolean;
  models(): string[];
  contextWindow(model?: string): number;
  state(): AdminState;
  /** One replica's part of `state()`. */
  replicaState(id: string): ReplicaState | undefined;
  readyReplicas(): number;
}
