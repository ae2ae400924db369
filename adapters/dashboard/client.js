// sluice dashboard, browser side: polls the admin state, keeps a short history, draws SVG line charts.
// Inlined into the page by page.ts; no external scripts, fonts or styles.
(() => {
  const config = JSON.parse(document.getElementById("sluice-config").textContent);
  const key = new URLSearchParams(location.search).get("key");
  const headers = key ? { authorization: `Bearer ${key}` } : {};
  const PALETTE = ["#58a6ff", "#f78166", "#3fb950", "#d2a8ff", "#e3b341", "#39c5cf", "#ff7b72", "#a5d6ff"];
  const REASON_COLORS = {};
  const SVG_NS = "http://www.w3.org/2000/svg";
  const W = 560;
  const H = 220;
  const PAD = { left: 48, right: 12, top: 10, bottom: 24 };

  /** @type {{ t: number; state: any }[]} */
  const samples = [];

  function colorFor(index) {
    return PALETTE[index % PALETTE.length];
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
    const d = new Date(t);
    return d.toTimeString().slice(0, 8);
  }

  function formatValue(v, unit) {
    if (unit === "%") return `${Math.round(v * 100)}%`;
    if (Math.abs(v) >= 1000) return `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k`;
    return Number.isInteger(v) ? String(v) : v.toFixed(2);
  }

  /**
   * Draws one chart into the panel's slot.
   * series: [{ name, color, points: [[t, v]], dash?, width? }]
   * options: { yMax?, unit?, thresholds?: [{ value, label, color }], step? }
   */
  function drawChart(panelId, series, options) {
    const panel = document.getElementById(panelId);
    const slot = panel.querySelector(".chart-slot");
    const now = samples.length ? samples[samples.length - 1].t : Date.now();
    // The x axis spans the history there is (at least 30 s), so a freshly opened page is not a sliver.
    const first = samples.length ? samples[0].t : now;
    const t0 = Math.min(now - 30_000, Math.max(now - config.historySeconds * 1000, first));
    let dataMax = 0;
    let points = 0;
    for (const s of series)
      for (const [, v] of s.points) if (Number.isFinite(v)) dataMax = Math.max(dataMax, v);
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
      [5_000, 10_000, 15_000, 30_000, 60_000, 120_000].find((step) => span / step <= 6) ?? 300_000;
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
      el(
        "line",
        {
          x1: PAD.left,
          x2: W - PAD.right,
          y1: y(th.value),
          y2: y(th.value),
          stroke: th.color,
          "stroke-dasharray": "6 4",
          "stroke-width": 1.5,
          class: "threshold",
        },
        svg,
      );
      const label = el("text", { x: W - PAD.right - 4, y: y(th.value) - 4, "text-anchor": "end" }, svg);
      label.textContent = `${th.label} ${formatValue(th.value, options.unit)}`;
    }
    for (const s of series) {
      const visible = s.points.filter(([t, v]) => t >= t0 && Number.isFinite(v));
      if (visible.length === 0) continue;
      let d = "";
      visible.forEach(([t, v], i) => {
        if (i === 0) d += `M${x(t).toFixed(1)},${y(v).toFixed(1)}`;
        else if (options.step) d += `H${x(t).toFixed(1)}V${y(v).toFixed(1)}`;
        else d += `L${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      });
      if (visible.length === 1) d += `h2`;
      points += visible.length;
      const attrs = { d, fill: "none", stroke: s.color, "stroke-width": s.width ?? 1.8, class: "series" };
      if (s.dash) attrs["stroke-dasharray"] = s.dash;
      el("path", attrs, svg).setAttribute("data-name", s.name);
    }
    svg.setAttribute("data-points", String(points));
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const s of series) {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = s.color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(s.legend ?? s.name));
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
    for (const { state } of samples) for (const r of state.replicas) if (!ids.includes(r.id)) ids.push(r.id);
    return ids;
  }

  function perReplicaSeries(read, extra) {
    return replicaIds().map((id, i) => ({
      name: id,
      color: colorFor(i),
      ...extra,
      points: samples
        .map(({ t, state }) => {
          const r = state.replicas.find((x) => x.id === id);
          return r ? [t, read(r)] : null;
        })
        .filter(Boolean),
    }));
  }

  function render() {
    const th = config.thresholds;
    drawChart(
      "panel-kv",
      perReplicaSeries((r) => r.signals.kvUsage),
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
      perReplicaSeries((r) => r.signals.hitRate),
      {
        yMax: 1,
        unit: "%",
        thresholds: [{ value: th.hitLow, label: "H_low", color: "#e6a23c" }],
      },
    );

    const windowSeries = [];
    replicaIds().forEach((id, i) => {
      const pick = (read) =>
        samples
          .map(({ t, state }) => {
            const r = state.replicas.find((x) => x.id === id);
            return r ? [t, read(r)] : null;
          })
          .filter((p) => p && p[1] !== null);
      const color = colorFor(i);
      windowSeries.push({ name: `${id} W`, color, width: 3, points: pick((r) => r.window.size) });
      windowSeries.push({ name: `${id} active`, color, points: pick((r) => r.window.active) });
      windowSeries.push({ name: `${id} paused`, color, dash: "6 4", points: pick((r) => r.window.paused) });
      windowSeries.push({ name: `${id} waiting`, color, dash: "2 3", points: pick((r) => r.window.waiting) });
    });
    drawChart("panel-window", windowSeries, {});

    const gateSeries = [];
    const limitLines = [];
    replicaIds().forEach((id, i) => {
      const last = samples[samples.length - 1].state.replicas.find((x) => x.id === id);
      const ranks = last ? last.gate.ranks.map((r) => r.rank) : [];
      const keys = ranks.length > 1 ? ranks : [null];
      keys.forEach((rank, j) => {
        const color = keys.length > 1 ? colorFor(i * 3 + j) : colorFor(i);
        const label = rank === null ? id : `${id} rank ${rank}`;
        const pick = (field) =>
          samples
            .map(({ t, state }) => {
              const r = state.replicas.find((x) => x.id === id);
              if (!r) return null;
              if (rank === null) return [t, r.gate[field]];
              const rr = r.gate.ranks.find((x) => x.rank === rank);
              return rr ? [t, rr[field]] : null;
            })
            .filter(Boolean);
        gateSeries.push({ name: `${label} requests`, color, points: pick("requests") });
        gateSeries.push({ name: `${label} waiting`, color, dash: "6 4", points: pick("waiting") });
        gateSeries.push({ name: `${label} queued`, color, dash: "2 3", points: pick("queued") });
      });
      if (last) {
        const perRank = keys.length > 1 ? 1 : Math.max(1, last.gate.ranks.length);
        limitLines.push({
          value: last.gate.limits.engineRequestLimit * perRank,
          label: `${id} request limit`,
          color: colorFor(i),
        });
      }
    });
    drawChart("panel-gate", gateSeries, { thresholds: limitLines });

    const lanes = ["interactive", "bulk"].map((lane, i) => {
      const last = samples[samples.length - 1].state;
      let oldest = 0;
      for (const r of last.replicas) oldest = Math.max(oldest, r.lanes?.[lane]?.oldestAgeMs ?? 0);
      return {
        name: lane,
        legend: `${lane} (oldest ${(oldest / 1000).toFixed(1)} s)`,
        color: colorFor(i + 4),
        points: samples.map(({ t, state }) => [
          t,
          state.replicas.reduce((sum, r) => sum + (r.lanes?.[lane]?.queued ?? 0), 0),
        ]),
      };
    });
    drawChart("panel-lanes", lanes, {});

    const reasons = new Set();
    for (const { state } of samples)
      for (const reason of Object.keys(state.rejections ?? {})) reasons.add(reason);
    const latest = samples[samples.length - 1].state.rejections ?? {};
    const refusalSeries = [...reasons].sort().map((reason) => {
      const points = [];
      for (let i = 1; i < samples.length; i++) {
        const a = samples[i - 1];
        const b = samples[i];
        const dt = (b.t - a.t) / 1000;
        const delta = (b.state.rejections?.[reason] ?? 0) - (a.state.rejections?.[reason] ?? 0);
        if (dt > 0) points.push([b.t, Math.max(0, delta) / dt]);
      }
      return {
        name: reason,
        legend: `${reason} (${latest[reason] ?? 0} total)`,
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
          points: samples.map(({ t, state }) => [t, stageNumber[state.stage] ?? 0]),
        },
      ],
      { yMax: 2, step: true },
    );

    renderHeader();
    renderTable();
  }

  function setChip(id, text, className) {
    const chip = document.getElementById(id);
    chip.textContent = text;
    if (className) chip.className = `chip ${className}`;
  }

  function renderHeader() {
    const { t, state } = samples[samples.length - 1];
    setChip("stage", `stage: ${state.stage.replace("_", " ")}`, `stage-${state.stage}`);
    setChip("policy", `policy: ${state.policy}`);
    const healthy = state.replicas.filter((r) => r.healthy).length;
    setChip("fleet", `replicas: ${healthy}/${state.replicas.length} healthy`);
    const s = state.sessions;
    setChip("sessions", `sessions: ${s.active} active · ${s.paused} paused · ${s.waiting} waiting`);
    setChip("updated", `updated ${clock(t)}`);
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
  }

  function renderTable() {
    const { state } = samples[samples.length - 1];
    const table = document.createElement("table");
    const head = document.createElement("tr");
    const columns = [
      "replica",
      "healthy",
      "KV",
      "hit rate",
      "window",
      "active",
      "paused",
      "waiting",
      "gate req",
      "gate wait",
      "gate queue",
      "reserved tok",
      "available tok",
      "signal age",
    ];
    for (const name of columns) {
      const th = document.createElement("th");
      th.textContent = name;
      head.appendChild(th);
    }
    table.appendChild(head);
    for (const r of state.replicas) {
      const row = document.createElement("tr");
      cell(row, r.id);
      cell(row, r.healthy ? (r.busy ? "busy" : "yes") : "NO");
      cell(row, `${(r.signals.kvUsage * 100).toFixed(1)}%`);
      cell(row, `${(r.signals.hitRate * 100).toFixed(1)}%`);
      cell(row, r.window.size === null ? "—" : String(r.window.size));
      cell(row, String(r.window.active));
      cell(row, String(r.window.paused));
      cell(row, String(r.window.waiting));
      cell(row, String(r.gate.requests));
      cell(row, String(r.gate.waiting));
      cell(row, String(r.gate.queued));
      cell(row, String(r.budget.reservedTokens));
      cell(row, String(r.budget.availableTokens));
      cell(row, r.signals.ageMs >= 0 ? `${(r.signals.ageMs / 1000).toFixed(1)} s` : "never");
      table.appendChild(row);
    }
    document.getElementById("replica-table").replaceChildren(table);
  }

  function showError(text) {
    const box = document.getElementById("error");
    box.textContent = text;
    box.style.display = text ? "block" : "none";
  }

  async function poll() {
    try {
      const response = await fetch(config.statePath, { headers, cache: "no-store" });
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
      const state = await response.json();
      const t = Date.now();
      samples.push({ t, state });
      const cutoff = t - config.historySeconds * 1000;
      while (samples.length > 1 && samples[0].t < cutoff) samples.shift();
      showError("");
      render();
      document.body.dataset.samples = String(Number(document.body.dataset.samples) + 1);
    } catch (err) {
      showError(`state unavailable: ${err.message}`);
    }
  }

  poll();
  setInterval(poll, config.pollMs);
})();
