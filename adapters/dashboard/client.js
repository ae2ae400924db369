// sluice dashboard, browser side: reads the server's history (the last 15 minutes, sampled every second),
// then polls for what is new and draws SVG line charts, an event list and a table. Inlined into the page by
// page.ts; no external scripts, fonts or styles.
(() => {
  const config = JSON.parse(document.getElementById("sluice-config").textContent);
  const key = new URLSearchParams(location.search).get("key");
  const headers = key ? { authorization: `Bearer ${key}` } : {};
  const PALETTE = ["#58a6ff", "#f78166", "#3fb950", "#d2a8ff", "#e3b341", "#39c5cf", "#ff7b72", "#a5d6ff"];
  // One dash pattern per replica, so replicas stay apart where colours already name something else.
  const REPLICA_DASHES = ["", "7 4", "2 3", "10 3 2 3", "1 5"];
  const STATE_COLORS = {
    active: "#3fb950",
    idle: "#58a6ff",
    dormant: "#8a96a3",
    paused: "#e3b341",
    waiting: "#e5534b",
  };
  const REASON_COLORS = {};
  const SVG_NS = "http://www.w3.org/2000/svg";
  const W = 560;
  const H = 220;
  const PAD = { left: 52, right: 12, top: 10, bottom: 24 };

  /** Samples from the server, oldest first; each `{ t, stage, sessions, replicas, lanes, rejections, interval }`. */
  const samples = [];
  /** Operator events from the server, oldest first. */
  const events = [];
  /** The latest full admin state (header and table). */
  let latest = null;

  function colorFor(index) {
    return PALETTE[index % PALETTE.length];
  }

  function dashFor(index) {
    return REPLICA_DASHES[index % REPLICA_DASHES.length];
  }

  function reasonColor(reason) {
    if (!REASON_COLORS[reason]) REASON_COLORS[reason] = colorFor(Object.keys(REASON_COLORS).length + 2);
    return REASON_COLORS[reason];
  }

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function niceMax(value) {
    if (!(value > 0)) return 1;
    const exp = 10 ** Math.floor(Math.log10(value));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * exp >= value) return m * exp;
    return 10 * exp;
  }

  function clock(t) {
    return new Date(t).toTimeString().slice(0, 8);
  }

  function formatValue(v, unit) {
    if (unit === "%") return `${Math.round(v * 100)}%`;
    const suffix = unit === "s" ? " s" : "";
    if (Math.abs(v) >= 1_000_000) return `${(v / 1_000_000).toFixed(1)}M${suffix}`;
    if (Math.abs(v) >= 1000) return `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k${suffix}`;
    return `${Number.isInteger(v) ? String(v) : v.toFixed(2)}${suffix}`;
  }

  /**
   * Draws one chart into the panel's slot.
   * series: [{ name, color, points: [[t, v]], dash?, width?, legend? }]
   * options: { yMax?, unit?, thresholds?: [{ value, label, color }], step? }
   */
  function drawChart(panelId, series, options) {
    const panel = document.getElementById(panelId);
    const slot = panel.querySelector(".chart-slot");
    const now = samples.length ? samples[samples.length - 1].t : Date.now();
    const first = samples.length ? samples[0].t : now;
    // The x axis spans the history there is (at least 60 s), so a young history is not a sliver.
    const t0 = Math.min(now - 60_000, Math.max(now - config.historySeconds * 1000, first));
    let dataMax = 0;
    let points = 0;
    for (const s of series)
      for (const [, v] of s.points) if (Number.isFinite(v)) dataMax = Math.max(dataMax, v);
    for (const th of options.thresholds ?? [])
      if (options.fitThresholds) dataMax = Math.max(dataMax, th.value);
    const yMax = options.yMax ?? niceMax(dataMax * 1.1);
    const x = (t) => PAD.left + ((t - t0) / (now - t0)) * (W - PAD.left - PAD.right);
    const y = (v) => H - PAD.bottom - (Math.min(v, yMax) / yMax) * (H - PAD.top - PAD.bottom);

    const svg = el("svg", {
      class: "chart",
      viewBox: `0 0 ${W} ${H}`,
      preserveAspectRatio: "none",
      role: "img",
    });
    el("title", {}, svg).textContent = panel.querySelector("h2").textContent;
    for (let i = 0; i <= 4; i++) {
      const v = (yMax * i) / 4;
      el("line", { x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v), stroke: "#2a323c" }, svg);
      const label = el("text", { x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end" }, svg);
      label.textContent = formatValue(v, options.unit);
    }
    const span = now - t0;
    const tickEvery =
      [5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000].find((step) => span / step <= 6) ?? 600_000;
    for (let t = Math.ceil(t0 / tickEvery) * tickEvery; t <= now; t += tickEvery) {
      el("line", { x1: x(t), x2: x(t), y1: PAD.top, y2: H - PAD.bottom, stroke: "#20262e" }, svg);
      const label = el("text", { x: x(t), y: H - 6, "text-anchor": "middle" }, svg);
      label.textContent = clock(t);
    }
    const offScale = [];
    for (const th of options.thresholds ?? []) {
      if (th.value > yMax) {
        offScale.push(`${th.label} ${formatValue(th.value, options.unit)} (off scale)`);
        continue;
      }
      const attrs = {
        x1: PAD.left,
        x2: W - PAD.right,
        y1: y(th.value),
        y2: y(th.value),
        stroke: th.color,
        "stroke-dasharray": th.dash ?? "6 4",
        "stroke-width": 1.5,
        class: "threshold",
      };
      el("line", attrs, svg).setAttribute("data-name", th.label);
      const label = el("text", { x: W - PAD.right - 4, y: y(th.value) - 4, "text-anchor": "end" }, svg);
      label.textContent = `${th.label} ${formatValue(th.value, options.unit)}`;
    }
    for (const s of series) {
      const visible = s.points.filter(([t, v]) => t >= t0 && Number.isFinite(v));
      if (visible.length === 0) continue;
      let d = "";
      visible.forEach(([t, v], i) => {
        if (i === 0) d += `M${x(t).toFixed(1)},${y(v).toFixed(1)}`;
        else if (options.step || s.step) d += `H${x(t).toFixed(1)}V${y(v).toFixed(1)}`;
        else d += `L${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      });
      if (visible.length === 1) d += `h2`;
      points += visible.length;
      const attrs = { d, fill: "none", stroke: s.color, "stroke-width": s.width ?? 1.8, class: "series" };
      if (s.dash) attrs["stroke-dasharray"] = s.dash;
      const path = el("path", attrs, svg);
      path.setAttribute("data-name", s.name);
    }
    svg.setAttribute("data-points", String(points));
    svg.setAttribute("data-ymax", String(yMax));
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const s of series) {
      const item = document.createElement("span");
      const swatch = el("svg", { width: 18, height: 6 });
      el(
        "line",
        {
          x1: 0,
          x2: 18,
          y1: 3,
          y2: 3,
          stroke: s.color,
          "stroke-width": 2.5,
          ...(s.dash ? { "stroke-dasharray": s.dash } : {}),
        },
        swatch,
      );
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(` ${s.legend ?? s.name}`));
      legend.appendChild(item);
    }
    for (const note of offScale) {
      const item = document.createElement("span");
      item.textContent = note;
      legend.appendChild(item);
    }
    slot.replaceChildren(svg, legend);
  }

  function replicaIds() {
    const ids = [];
    for (const s of samples) for (const r of s.replicas) if (!ids.includes(r.id)) ids.push(r.id);
    return ids;
  }

  function pick(id, read) {
    const points = [];
    for (const s of samples) {
      const r = s.replicas.find((x) => x.id === id);
      const v = r ? read(r) : null;
      if (v !== null && v !== undefined) points.push([s.t, v]);
    }
    return points;
  }

  /** One line per replica: its own colour and dash. */
  function perReplica(read, extra) {
    return replicaIds().map((id, i) => ({
      name: id,
      color: colorFor(i),
      dash: dashFor(i),
      ...extra,
      points: pick(id, read),
    }));
  }

  /** A per-interval value as a rate per second. */
  function rate(read) {
    return samples.filter((s) => s.interval.ms > 0).map((s) => [s.t, read(s) / (s.interval.ms / 1000)]);
  }

  function ratio(numerator, denominator) {
    return samples.filter((s) => denominator(s) > 0).map((s) => [s.t, numerator(s) / denominator(s)]);
  }

  function render() {
    const th = config.thresholds;
    const ids = replicaIds();
    drawChart(
      "panel-kv",
      perReplica((r) => r.kvUsage),
      {
        yMax: 1,
        unit: "%",
        thresholds: [
          { value: th.kvLow, label: "U_low", color: "#3fb950" },
          { value: th.kvHigh, label: "U_high", color: "#e5534b" },
        ],
      },
    );
    drawChart(
      "panel-hit",
      perReplica((r) => r.hitRate),
      { yMax: 1, unit: "%", thresholds: [{ value: th.hitLow, label: "H_low", color: "#e6a23c" }] },
    );
    drawChart(
      "panel-fleet-hit",
      [
        {
          name: "predicted",
          legend: "predicted by the router (route events)",
          color: "#d2a8ff",
          dash: "6 4",
          points: ratio(
            (s) => s.interval.predictedHitTokens,
            (s) => s.interval.routedPromptTokens,
          ),
        },
        {
          name: "delivered",
          legend: "delivered by the engines (cached / prompt tokens)",
          color: "#3fb950",
          points: ratio(
            (s) => s.interval.cachedTokens,
            (s) => s.interval.promptTokens,
          ),
        },
      ],
      { yMax: 1, unit: "%" },
    );

    // Tokens on their own axis: W is thousands of tokens, session counts are a handful.
    const windowSeries = [];
    ids.forEach((id, i) => {
      windowSeries.push({
        name: `${id} W`,
        color: "#e3b341",
        dash: dashFor(i),
        width: 2.5,
        step: true,
        points: pick(id, (r) => r.windowTokens),
      });
      windowSeries.push({
        name: `${id} footprints`,
        color: "#58a6ff",
        dash: dashFor(i),
        // What the window compares with W: a prompt prefix its sessions share counts once.
        points: pick(id, (r) => r.heldTokens),
      });
    });
    const hasTokenWindow = windowSeries.some((series) => series.points.length > 0);
    if (!hasTokenWindow) {
      windowSeries.length = 0;
      // The session-count law: W is a number of sessions, drawn on this panel's own axis with the
      // sessions its window holds, never on the session-state chart whose counts it would flatten.
      ids.forEach((id, i) => {
        windowSeries.push({
          name: `${id} W (sessions)`,
          color: "#e3b341",
          dash: dashFor(i),
          width: 2.5,
          step: true,
          points: pick(id, (r) => r.windowSessions),
        });
        windowSeries.push({
          name: `${id} active sessions`,
          color: "#58a6ff",
          dash: dashFor(i),
          points: pick(id, (r) => (r.windowSessions === null ? null : r.active)),
        });
      });
    }
    drawChart("panel-window", windowSeries, {});
    document.getElementById("window-note").textContent = hasTokenWindow
      ? ""
      : "This policy counts its window in sessions: W and active sessions are drawn instead of tokens.";

    const sessionSeries = [];
    ids.forEach((id, i) => {
      for (const state of ["active", "idle", "dormant", "paused", "waiting"]) {
        sessionSeries.push({
          name: `${id} ${state}`,
          color: STATE_COLORS[state],
          dash: dashFor(i),
          step: true,
          points: pick(id, (r) => r[state]),
        });
      }
    });
    drawChart("panel-sessions", sessionSeries, {});

    const budgetSeries = [];
    const budgetLimits = [];
    ids.forEach((id, i) => {
      budgetSeries.push({
        name: `${id} reserved`,
        color: colorFor(i),
        dash: dashFor(i),
        points: pick(id, (r) => r.reservedTokens),
      });
      const last = samples[samples.length - 1].replicas.find((r) => r.id === id);
      if (last && last.ceilingTokens > 0) {
        budgetLimits.push({
          value: last.ceilingTokens - last.guardTokens,
          label: `${id} reservable (ceiling − guard)`,
          color: colorFor(i),
          dash: "3 3",
        });
      }
    });
    drawChart("panel-budget", budgetSeries, { thresholds: budgetLimits, fitThresholds: true });

    const gateSeries = [];
    const limitLines = [];
    ids.forEach((id, i) => {
      const color = colorFor(i);
      gateSeries.push({
        name: `${id} requests`,
        color,
        dash: dashFor(i),
        width: 2.5,
        points: pick(id, (r) => r.gateRequests),
      });
      gateSeries.push({
        name: `${id} waiting`,
        color,
        dash: dashFor(i),
        width: 1,
        points: pick(id, (r) => r.gateWaiting),
      });
      gateSeries.push({
        name: `${id} queued`,
        color: "#e5534b",
        dash: dashFor(i),
        points: pick(id, (r) => r.gateQueued),
      });
      const last = samples[samples.length - 1].replicas.find((r) => r.id === id);
      if (last) limitLines.push({ value: last.requestLimit, label: `${id} request limit`, color });
    });
    drawChart("panel-gate", gateSeries, { thresholds: limitLines });

    const quantile = (read) => samples.filter((s) => read(s) !== null).map((s) => [s.t, read(s)]);
    drawChart(
      "panel-latency",
      [
        { name: "TTFT p50", color: "#58a6ff", points: quantile((s) => s.interval.ttft.p50) },
        { name: "TTFT p95", color: "#58a6ff", dash: "6 4", points: quantile((s) => s.interval.ttft.p95) },
        { name: "end-to-end p95", color: "#d2a8ff", points: quantile((s) => s.interval.e2e.p95) },
        { name: "queue wait p95", color: "#e5534b", points: quantile((s) => s.interval.queueWait.p95) },
      ],
      { unit: "s" },
    );
    drawChart(
      "panel-throughput",
      [
        {
          name: "generated tokens/s",
          color: "#3fb950",
          points: rate((s) => s.interval.generatedTokens),
        },
      ],
      {},
    );
    drawChart(
      "panel-calls",
      [
        { name: "completed calls/s", color: "#58a6ff", points: rate((s) => s.interval.completed) },
        {
          name: "refused calls/s",
          color: "#e5534b",
          dash: "6 4",
          points: rate((s) => Object.values(s.interval.refusals).reduce((a, b) => a + b, 0)),
        },
      ],
      {},
    );
    drawChart(
      "panel-routes",
      ["pinned", "prefix", "load", "affinity_break"].map((reason, i) => ({
        name: reason,
        color: colorFor(i + 3),
        points: rate((s) => s.interval.routes[reason] ?? 0),
      })),
      {},
    );

    const lanes = ["interactive", "bulk"].map((lane, i) => {
      const last = samples[samples.length - 1];
      return {
        name: lane,
        legend: `${lane} (oldest ${(last.lanes[lane].oldestAgeMs / 1000).toFixed(1)} s)`,
        color: colorFor(i + 4),
        points: samples.map((s) => [s.t, s.lanes[lane].queued]),
      };
    });
    drawChart("panel-lanes", lanes, {});

    const reasons = new Set();
    for (const s of samples) for (const reason of Object.keys(s.rejections)) reasons.add(reason);
    const totals = samples[samples.length - 1].rejections;
    const refusalSeries = [...reasons].sort().map((reason) => {
      const points = [];
      for (let i = 1; i < samples.length; i++) {
        const a = samples[i - 1];
        const b = samples[i];
        const dt = (b.t - a.t) / 1000;
        const delta = (b.rejections[reason] ?? 0) - (a.rejections[reason] ?? 0);
        if (dt > 0) points.push([b.t, Math.max(0, delta) / dt]);
      }
      return {
        name: reason,
        legend: `${reason} (${totals[reason] ?? 0} total)`,
        color: reasonColor(reason),
        points,
      };
    });
    drawChart("panel-refusals", refusalSeries, {});

    const stageNumber = { normal: 0, bulk_paused: 1, shedding: 2 };
    drawChart(
      "panel-stage",
      [
        {
          name: "stage",
          color: "#e6a23c",
          width: 2.5,
          points: samples.map((s) => [s.t, stageNumber[s.stage] ?? 0]),
        },
      ],
      { yMax: 2, step: true },
    );

    renderEvents();
    renderHeader();
    renderTable();
    renderEngineTable();
    renderTenantTable();
  }

  function setChip(id, text, className) {
    const chip = document.getElementById(id);
    chip.textContent = text;
    if (className) chip.className = `chip ${className}`;
  }

  /** Fleet totals by session state: the header and the table's total row both show exactly these. */
  function sessionTotals(state) {
    const s = state.sessions;
    return {
      active: s.active,
      idle: s.idle ?? 0,
      dormant: s.dormant ?? 0,
      paused: s.paused,
      waiting: s.waiting,
    };
  }

  function renderHeader() {
    const state = latest;
    setChip("stage", `stage: ${state.stage.replace("_", " ")}`, `stage-${state.stage}`);
    setChip("policy", `policy: ${state.policy}`);
    const healthy = state.replicas.filter((r) => r.healthy).length;
    setChip("fleet", `replicas: ${healthy}/${state.replicas.length} healthy`);
    const t = sessionTotals(state);
    setChip(
      "sessions",
      `sessions: ${t.active} active (${t.idle} idle) · ${t.dormant} dormant · ${t.paused} paused · ${t.waiting} waiting`,
    );
    document.getElementById("sessions").dataset.waiting = String(t.waiting);
    setChip("updated", `updated ${clock(samples[samples.length - 1].t)}`);
  }

  function renderEvents() {
    const list = document.getElementById("event-list");
    const rows = events.slice(-200).reverse();
    const table = document.createElement("table");
    const head = document.createElement("tr");
    for (const name of ["time", "what", "replica", "why"]) {
      const th = document.createElement("th");
      th.textContent = name;
      head.appendChild(th);
    }
    table.appendChild(head);
    for (const e of rows) {
      const row = document.createElement("tr");
      row.className = `event event-${e.kind} level-${e.level}`;
      cell(row, clock(e.t));
      cell(row, e.text);
      cell(row, e.replica ?? "fleet");
      cell(row, e.cause);
      table.appendChild(row);
    }
    if (rows.length === 0) {
      const row = document.createElement("tr");
      const td = document.createElement("td");
      td.colSpan = 4;
      td.textContent = "no window changes, pauses, dormancies, stage or health changes yet";
      row.appendChild(td);
      table.appendChild(row);
    }
    list.replaceChildren(table);
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
  }

  function renderTable() {
    const state = latest;
    const table = document.createElement("table");
    const head = document.createElement("tr");
    const columns = [
      "replica",
      "healthy",
      "KV",
      "hit rate",
      "W tokens",
      "footprints",
      "shared prefix",
      "in window",
      "active",
      "idle",
      "dormant",
      "paused",
      "waiting",
      "gate req",
      "gate wait",
      "gate queue",
      "reserved tok",
      "reservable tok",
      "signal age",
    ];
    for (const name of columns) {
      const th = document.createElement("th");
      th.textContent = name;
      head.appendChild(th);
    }
    table.appendChild(head);
    const sums = { active: 0, idle: 0, dormant: 0, paused: 0, waiting: 0 };
    for (const r of state.replicas) {
      const row = document.createElement("tr");
      row.className = "replica";
      const w = r.window;
      cell(row, r.id);
      cell(row, r.healthy ? (r.busy ? "busy" : "yes") : "NO");
      // A signal the engine does not publish reads "unknown": a 0 here would claim an idle cache.
      const unread = r.engine ? r.engine.unknown : [];
      cell(row, unread.includes("kvUsage") ? "unknown" : `${(r.signals.kvUsage * 100).toFixed(1)}%`);
      cell(row, unread.includes("prefixCache") ? "unknown" : `${(r.signals.hitRate * 100).toFixed(1)}%`);
      cell(row, w.sizeTokens === null ? "—" : String(w.sizeTokens));
      cell(row, w.footprintTokens === null ? "—" : String(w.footprintTokens));
      cell(row, w.sharedPrefixTokens === null ? "—" : String(w.sharedPrefixTokens));
      cell(row, w.size === null ? "—" : String(w.size));
      for (const k of Object.keys(sums)) {
        sums[k] += w[k] ?? 0;
        cell(row, String(w[k] ?? 0));
      }
      cell(row, String(r.gate.requests));
      cell(row, String(r.gate.waiting));
      cell(row, String(r.gate.queued));
      cell(row, String(r.budget.reservedTokens));
      cell(row, String(Math.max(0, r.budget.ceilingTokens - r.budget.guardTokens)));
      cell(row, r.signals.ageMs >= 0 ? `${(r.signals.ageMs / 1000).toFixed(1)} s` : "never");
      table.appendChild(row);
    }
    // Sessions not yet placed on a replica wait too: shown in their own row so the total matches the header.
    const totals = sessionTotals(state);
    const unplaced = {};
    let anyUnplaced = false;
    for (const k of Object.keys(sums)) {
      unplaced[k] = Math.max(0, totals[k] - sums[k]);
      if (unplaced[k] > 0) anyUnplaced = true;
    }
    const addCountsRow = (label, counts, className) => {
      const row = document.createElement("tr");
      row.className = className;
      cell(row, label);
      for (let i = 0; i < 7; i++) cell(row, "");
      for (const k of Object.keys(sums)) cell(row, String(counts[k]));
      for (let i = 0; i < 6; i++) cell(row, "");
      table.appendChild(row);
    };
    if (anyUnplaced) addCountsRow("not on a replica yet", unplaced, "unplaced");
    addCountsRow("total", totals, "total");
    document.getElementById("replica-table").replaceChildren(table);
  }

  /** What stands behind each replica: its role, the engine profile read from its metrics, and what it does not publish. */
  function renderEngineTable() {
    const state = latest;
    const table = document.createElement("table");
    const head = document.createElement("tr");
    for (const name of [
      "replica",
      "role",
      "engine",
      "KV capacity",
      "token budget",
      "not published",
      "host tier",
    ]) {
      const th = document.createElement("th");
      th.textContent = name;
      head.appendChild(th);
    }
    table.appendChild(head);
    for (const r of state.replicas) {
      const row = document.createElement("tr");
      row.className = "engine";
      row.dataset.replica = r.id;
      cell(row, r.id);
      cell(row, r.role ?? "both");
      const engine = r.engine;
      // Simulated replicas report their state directly, so they carry no profile read from a page.
      cell(row, engine ? engine.profile : "simulated");
      const capacity = r.signals.kvCapacityTokens;
      const source = engine ? engine.kvCapacitySource : "engine";
      cell(row, source === "unknown" ? "unknown" : `${capacity} tok (${source})`);
      const budgetOn = engine ? engine.tokenBudget : true;
      cell(row, budgetOn ? "on" : "OFF: capacity unknown");
      if (!budgetOn) row.classList.add("budget-off");
      cell(row, engine && engine.unknown.length > 0 ? engine.unknown.join(", ") : "—");
      const tier = r.hostTier;
      cell(
        row,
        tier
          ? `${tier.capacityTokens > 0 ? `${tier.capacityTokens} tok` : "size unknown"}` +
              (tier.usage === undefined ? "" : ` · ${(tier.usage * 100).toFixed(1)}% used`) +
              ` · ${tier.retainedTokens} tok retained`
          : "—",
      );
      table.appendChild(row);
      if (engine?.warning) {
        // An engine served without readable metrics: say so under its row, in the server's words.
        const note = document.createElement("tr");
        note.className = "engine-warning";
        note.dataset.replica = r.id;
        const td = document.createElement("td");
        td.colSpan = 7;
        td.textContent = `⚠ ${engine.warning}`;
        note.appendChild(td);
        table.appendChild(note);
      }
    }
    document.getElementById("engine-table").replaceChildren(table);
  }

  /** One row per tenant: usage against entitlement, sessions by state, pauses by reason. */
  function renderTenantTable() {
    const tenants = latest.tenants;
    const note = document.getElementById("tenant-fairness");
    if (!tenants) {
      note.textContent = "";
      document.getElementById("tenant-table").replaceChildren();
      return;
    }
    note.textContent =
      tenants.fairness === "off"
        ? "Fairness is off: sessions are admitted in arrival order."
        : `Jain's index of usage ÷ entitlement: ${tenants.jainIndex.toFixed(3)}.`;
    note.dataset.jain = String(tenants.jainIndex);
    const table = document.createElement("table");
    const head = document.createElement("tr");
    for (const name of [
      "tenant",
      "band",
      "weight",
      "usage tok",
      "entitlement tok",
      "usage ÷ entitlement",
      "active",
      "idle",
      "waiting",
      "paused",
      "dormant",
      "paused: fairness",
      "paused: priority",
      "paused: window",
    ]) {
      const th = document.createElement("th");
      th.textContent = name;
      head.appendChild(th);
    }
    table.appendChild(head);
    for (const t of tenants.list) {
      const row = document.createElement("tr");
      row.className = "tenant";
      row.dataset.tenant = t.tenant;
      cell(row, t.tenant);
      cell(row, t.band);
      cell(row, String(t.weight));
      cell(row, String(Math.round(t.usageTokens)));
      cell(row, String(Math.round(t.entitlementTokens)));
      const share = t.entitlementTokens > 0 ? t.usageTokens / t.entitlementTokens : 0;
      const td = document.createElement("td");
      const meter = document.createElement("span");
      meter.className = "meter";
      const fill = document.createElement("span");
      fill.style.width = `${Math.min(100, share * 100).toFixed(1)}%`;
      if (share > 1) fill.className = "over";
      meter.appendChild(fill);
      td.append(meter, ` ${t.entitlementTokens > 0 ? share.toFixed(2) : "—"}`);
      row.appendChild(td);
      for (const k of ["active", "idle", "waiting", "paused", "dormant"]) cell(row, String(t.sessions[k]));
      for (const k of ["fairness", "priority", "window"]) cell(row, String(t.pauses[k]));
      table.appendChild(row);
    }
    document.getElementById("tenant-table").replaceChildren(table);
  }

  function showError(text) {
    const box = document.getElementById("error");
    box.textContent = text;
    box.style.display = text ? "block" : "none";
  }

  let lastT = null;
  let polling = false;

  async function poll() {
    if (polling) return;
    polling = true;
    try {
      const lastSeq = events.length ? events[events.length - 1].seq : 0;
      const url =
        lastT === null ? config.historyPath : `${config.historyPath}?since=${lastT}&events_after=${lastSeq}`;
      const response = await fetch(url, { headers, cache: "no-store" });
      if (!response.ok) {
        let detail = "";
        try {
          detail = (await response.json()).error.message;
        } catch {
          // a body that is not the error envelope adds nothing
        }
        showError(`state unavailable: HTTP ${response.status} ${detail}`);
        return;
      }
      const body = await response.json();
      for (const s of body.samples) if (lastT === null || s.t > lastT) samples.push(s);
      for (const e of body.events) events.push(e);
      if (events.length > 500) events.splice(0, events.length - 500);
      if (samples.length > 0) lastT = samples[samples.length - 1].t;
      latest = body.state;
      const cutoff = (samples.length ? samples[samples.length - 1].t : 0) - config.historySeconds * 1000;
      while (samples.length > 1 && samples[0].t < cutoff) samples.shift();
      showError("");
      if (samples.length > 0) {
        render();
        document.body.dataset.samples = String(samples.length);
        document.body.dataset.firstSample = String(samples[0].t);
        document.body.dataset.polls = String(Number(document.body.dataset.polls ?? 0) + 1);
      }
    } catch (err) {
      showError(`state unavailable: ${err.message}`);
    } finally {
      polling = false;
    }
  }

  poll();
  setInterval(poll, config.pollMs);
})();
