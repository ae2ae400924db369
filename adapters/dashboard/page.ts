/** @module The live dashboard: one self-contained HTML page (inline CSS, inline script, SVG charts) that reads the server's history at `/v1/admin/history`. */

import { readFileSync } from "node:fs";

/** Options of `renderDashboard`. */
export interface DashboardOptions {
  /** Polling period of `/v1/admin/state`, ms. */
  pollMs: number;
  /** The window law's thresholds, drawn as lines on the KV and hit-rate charts (0–1). */
  thresholds: { kvLow: number; kvHigh: number; hitLow: number };
  /** History drawn, seconds (the server keeps 15 minutes). Default 900. */
  historySeconds?: number;
  /** Path of the history endpoint, relative to the page. Default `/v1/admin/history`. */
  historyPath?: string;
}

// The browser script lives in its own file so it can be linted as JavaScript; it is inlined, never linked.
const CLIENT_SCRIPT = readFileSync(new URL("./client.js", import.meta.url), "utf8");

const STYLE = `
:root { --bg:#0f1419; --panel:#171d24; --grid:#2a323c; --text:#d8dee6; --muted:#8a96a3; --warn:#e6a23c; --bad:#e5534b; --ok:#3fb950; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; background: var(--bg); color: var(--text); }
header { display: flex; flex-wrap: wrap; gap: 12px; align-items: baseline; padding: 12px 20px; border-bottom: 1px solid var(--grid); }
header h1 { font-size: 18px; margin: 0 12px 0 0; }
.chip { padding: 2px 10px; border-radius: 999px; background: var(--panel); border: 1px solid var(--grid); }
.chip.stage-normal { border-color: var(--ok); color: var(--ok); }
.chip.stage-bulk_paused { border-color: var(--warn); color: var(--warn); }
.chip.stage-shedding { border-color: var(--bad); color: var(--bad); }
#error { display: none; margin: 12px 20px; padding: 8px 12px; border: 1px solid var(--bad); color: var(--bad); border-radius: 6px; }
main { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 16px; padding: 16px 20px; }
section.panel { background: var(--panel); border: 1px solid var(--grid); border-radius: 8px; padding: 10px 12px; }
section.panel h2 { font-size: 14px; margin: 0 0 2px; }
section.panel p.note { margin: 0 0 6px; color: var(--muted); font-size: 12px; }
svg.chart { width: 100%; height: 220px; display: block; }
svg.chart text { fill: var(--muted); font-size: 11px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; color: var(--muted); margin-top: 4px; }
.legend svg { vertical-align: middle; }
#events { grid-column: 1 / -1; max-height: 360px; overflow-y: auto; }
#events td, #events th { text-align: left; white-space: normal; }
#events tr.level-warn td { color: var(--warn); }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { text-align: right; padding: 3px 8px; border-bottom: 1px solid var(--grid); white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
#replicas, #engines, #tenants { grid-column: 1 / -1; overflow-x: auto; }
.meter { display: inline-block; width: 120px; height: 8px; background: var(--grid); border-radius: 4px; position: relative; vertical-align: middle; }
.meter span { position: absolute; left: 0; top: 0; bottom: 0; border-radius: 4px; background: var(--ok); }
.meter span.over { background: var(--warn); }
tr.budget-off td { color: var(--warn); }
tr.engine-warning td { color: var(--warn); white-space: normal; font-size: 0.9em; }
`;

/** Renders the dashboard page with its configuration embedded. */
export function renderDashboard(options: DashboardOptions): string {
  const config = {
    pollMs: options.pollMs,
    thresholds: options.thresholds,
    historySeconds: options.historySeconds ?? 900,
    historyPath: options.historyPath ?? "/v1/admin/history",
  };
  // `<` is escaped so nothing in the embedded JSON can close the script element.
  const configJson = JSON.stringify(config).replace(/</g, "\\u003c");
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sluice — live</title>
<style>${STYLE}</style>
</head>
<body data-samples="0">
<header>
  <h1>sluice</h1>
  <span class="chip" id="stage">stage: …</span>
  <span class="chip" id="policy">policy: …</span>
  <span class="chip" id="fleet">replicas: …</span>
  <span class="chip" id="sessions">sessions: …</span>
  <span class="chip" id="updated">waiting for data</span>
</header>
<div id="error" role="alert"></div>
<main>
  <section class="panel" id="panel-window"><h2>Token window W vs footprints, per replica</h2>
    <p class="note">Yellow steps: W (tokens the window lets active sessions hold). Blue: what active sessions' footprints hold of W, a prompt prefix they share counted once (the table's footprints less its shared prefix). A session waits when its footprint does not fit what is left. Line style tells replicas apart.</p>
    <p class="note" id="window-note"></p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-sessions"><h2>Sessions by state, per replica</h2>
    <p class="note">Green active (running or idle), blue idle between steps, grey dormant (left the window, pinned), yellow paused, red waiting. Line style tells replicas apart.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-budget"><h2>Token budget: reserved vs reservable</h2>
    <p class="note">Tokens reserved by active and queued calls; dashed: what may be reserved (ceiling − guard band). Reserved at the line means calls are refused with token_budget_exhausted.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-kv"><h2>KV cache usage per replica</h2>
    <p class="note">Blocks held by running calls (0–100 %). Dashed lines: window law thresholds U_low and U_high.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-hit"><h2>Prefix cache hit rate per replica</h2>
    <p class="note">Engine-reported, token-weighted, over the last control interval. Dashed line: H_low (W is cut only when KV is above U_high and hit rate below H_low).</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-fleet-hit"><h2>Fleet hit rate: predicted vs delivered</h2>
    <p class="note">Dashed: prompt tokens the router expected cached ÷ prompt tokens routed. Solid: cached ÷ prompt tokens the engines reported for finished calls.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-latency"><h2>Latency</h2>
    <p class="note">Per sample interval: time to first token p50/p95, end-to-end p95, admission queue wait p95.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-throughput"><h2>Throughput: generated tokens per second</h2>
    <p class="note">Tokens generated by calls that finished in each interval.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-calls"><h2>Calls per second: completed and refused</h2>
    <p class="note">Completed calls and refusals the scheduler decided, per second.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-routes"><h2>Routing decisions per second by reason</h2>
    <p class="note">pinned (stayed with its replica), prefix (best cached prefix), load (least loaded), affinity_break (moved off a saturated replica).</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-gate"><h2>Gate occupancy per replica</h2>
    <p class="note">Thick: engine requests held; thin: waiting for first token; red: queued in the gate. Dashed: the request limit.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-lanes"><h2>Lane queues</h2>
    <p class="note">Calls queued per lane, summed over replicas; the legend shows the oldest queued call's age.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-refusals"><h2>Refusals per second by reason</h2>
    <p class="note">From the cumulative counts in the state; totals in the legend.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="panel-stage"><h2>Overload stage</h2>
    <p class="note">0 normal · 1 bulk paused · 2 shedding.</p>
    <div class="chart-slot"></div></section>
  <section class="panel" id="events"><h2>Why things changed</h2>
    <p class="note">Window law decisions, pauses and dormancies, overload stage and replica health changes, newest first, with their cause.</p>
    <div id="event-list"></div></section>
  <section class="panel" id="replicas"><h2>Replicas now</h2><div id="replica-table"></div></section>
  <section class="panel" id="tenants"><h2>Tenants now</h2>
    <p class="note">Each tenant's usage (what its active sessions hold, tokens of footprint) against its entitlement (its weighted share of the fleet's windows among tenants with demand), its sessions by state, and its sessions paused at a step boundary by why: fairness (over its share while another waited), priority (a higher band waited), window (the window shrank). <span id="tenant-fairness"></span></p>
    <div id="tenant-table"></div></section>
  <section class="panel" id="engines"><h2>Engines behind the replicas</h2>
    <p class="note">Role in a disaggregated fleet, the engine profile read from each upstream's metrics page, where its KV capacity comes from, and the signals it does not publish (read as unknown, never as zero; an unknown capacity leaves the token budget off).</p>
    <div id="engine-table"></div></section>
</main>
<script type="application/json" id="sluice-config">${configJson}</script>
<script>
${CLIENT_SCRIPT}
</script>
</body>
</html>
`;
}
