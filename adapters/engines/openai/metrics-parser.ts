/**
 * @module Reading an engine's metrics page: the exposition parsed (`exposition.ts`) and mapped by
 * the engine's profile (`engine-profiles.ts`). Kept as the one import for both.
 */

import { type EngineProfileName, type ScrapedSignals, signalsFromExposition } from "./engine-profiles.js";
import { parsePrometheusText } from "./exposition.js";

export {
  type EngineFlavor,
  type EngineProfileName,
  type ScrapedSignals,
  type SignalField,
  signalsFromExposition,
} from "./engine-profiles.js";
export { type MetricSample, type ParsedExposition, parsePrometheusText } from "./exposition.js";

/**
 * Parses a page and maps it in one go; undefined when the page is not an engine's (or not the
 * forced profile's engine).
 */
export function parseEngineMetrics(
  text: string,
  profile: EngineProfileName = "auto",
): ScrapedSignals | undefined {
  return signalsFromExposition(parsePrometheusText(text), profile);
}
