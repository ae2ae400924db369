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
  /** The session `id` (a client's key) names for `tenant`; sessions are scoped by tenant. */
  getSession(id: string, tenant?: string): SessionView | undefined;
  closeSession(id: string, tenant?: string): boolean;
  /** The tenants holding a session under `key` (an admin key reads any tenant's). */
  tenantsOfSession(key: string): string[];
  models(): string[];
  contextWindow(model?: string): number;
  state(): AdminState;
  /** One replica's part of `state()`. */
  replicaState(id: string): ReplicaState | undefined;
  readyReplicas(): number;
}
