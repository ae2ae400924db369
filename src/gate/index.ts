/** @module The per-rank backend gate and its lanes (docs/library.md and docs/how-it-works.md#per-rank-gate and docs/how-it-works.md#token-budget-and-feasibility): re-exports only. */

export {
  type AcquireRequest,
  BackendGate,
  type BackendGateOptions,
  type GateCounters,
  type GateLimitValues,
  type GateOccupancy,
  type GateSnapshot,
  type LaneOptions,
  type LaneQueueOptions,
  type LaneQueueSnapshot,
  type Permit,
  type RankCounters,
} from "./backend-gate.js";
export { DrainEstimator, type DrainEstimatorOptions } from "./drain-estimator.js";
export {
  GateCancelled,
  GateRejection,
  type GateRejectionInit,
  type GateRejectionScope,
} from "./gate-errors.js";
