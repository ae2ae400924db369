/** @module Token budget, lane classification, feasibility and overload stages (re-exports only). */

export {
  classifyLane,
  createLaneClassifier,
  DEFAULT_LANE_LIMITS,
  type LaneLimits,
  type LaneRequest,
  resolveLaneLimits,
} from "./classify-lane.js";
export { checkDeadline, type DeadlineCheck, predictTtftMs, type TtftInput } from "./feasibility.js";
export {
  OverloadController,
  type OverloadControllerOptions,
  type OverloadSnapshot,
  type WindowReport,
  type WindowVerdict,
} from "./overload-stages.js";
export {
  type Reservation,
  type ReserveOptions,
  type ReserveOrRefuseOptions,
  reservationTokens,
  TokenBudget,
  type TokenBudgetOptions,
  type TokenBudgetSnapshot,
} from "./token-budget.js";
