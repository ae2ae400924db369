/** @module Dependency-free SVG charts (bars and lines) for the benchmark report and the README. */

/** Colours per series name; unknown names cycle through a fallback palette. */
const COLOURS: Record<string, string> = {
  rr: "#8c8c8c",
  gate: "#e08a1e",
  "gate-prefix": "#3b7dd8",
  concur: "#b04fb0",
  sluice: "#1f9d55",
  bound: "#222222",
};
const FALLBACK = ["#d84a4a", "#2aa3a3", "#7a5c3a", "#5560c8", "#b04fb0"];

/** Marker shapes, so lines that lie on top of each other stay told apart. */
export type MarkerShape = "circle" | "square" | "triangle" | "diamond" | "cross";

/** A line's stroke pattern and marker; policies have fixed ones, other series cycle. */
export interface LineStyle {
  /** SVG stroke-dasharray, or null for a solid line. */
  dash: string | null;
  marker: MarkerShape;
}

const STYLES: Record<string, LineStyle> = {
  rr: { dash: null, marker: "circle" },
  gate: { dash: "2 3", marker: "square" },
  "gate-prefix": { dash: "8 3", marker: "triangle" },
  concur: { dash: "8 3 2 3", marker: "diamond" },
  sluice: { dash: null, marker: "cross" },
};
const FALLBACK_STYLES: LineStyle[] = [
  { dash: null, marker: "circle" },
  { dash: "2 3", marker: "square" },
  { dash: "8 3", marker: "triangle" },
  { dash: "8 3 2 3", marker: "diamond" },
  { dash: "4 2", marker: "cross" },
];

/** The stroke pattern and marker of a series (policy names have fixed ones). */
export function styleOf(name: string, index = 0): LineStyle {
  return STYLES[name] ?? FALLBACK_STYLES[index % FALLBACK_STYLES.length]!;
}

/** A small marker centred on (x, y). */
export function markerSvg(shape: MarkerShape, x: number, y: number, colour: string, title = ""): string {
  const t = title ? `<title>${escapeXml(title)}</title>` : "";
  const X = x.toFixed(1);
  const Y = y.toFixed(1);
  switch (shape) {
    case "circle":
      return `<circle cx="${X}" cy="${Y}" r="3.5" fill="${colour}">${t}</circle>`;
    case "square":
      return `<rect x="${(x - 3.2).toFixed(1)}" y="${(y - 3.2).toFixed(1)}" width="6.4" height="6.4" fill="${colour}">${t}</rect>`;
    case "triangle":
      return `<path d="M${X} ${(y - 4.2).toFixed(1)}L${(x + 4).toFixed(1)} ${(y + 3).toFixed(1)}L${(x - 4).toFixed(1)} ${(y + 3).toFixed(1)}Z" fill="${colour}">${t}</path>`;
    case "diamond":
      return `<path d="M${X} ${(y - 4.5).toFixed(1)}L${(x + 4.5).toFixed(1)} ${Y}L${X} ${(y + 4.5).toFixed(1)}L${(x - 4.5).toFixed(1)} ${Y}Z" fill="${colour}">${t}</path>`;
    case "cross":
      return `<path d="M${(x - 4).toFixed(1)} ${(y - 4).toFixed(1)}L${(x + 4).toFixed(1)} ${(y + 4).toFixed(1)}M${(x - 4).toFixed(1)} ${(y + 4).toFixed(1)}L${(x + 4).toFixed(1)} ${(y - 4).toFixed(1)}" stroke="${colour}" stroke-width="2.2" fill="none">${t}</path>`;
  }
}

/** Whether any value is a finite number other than 0: a chart without one draws nothing worth showing. */
export function hasSignal(values: Iterable<number | null | undefined>): boolean {
  for (const v of values) if (typeof v === "number" && Number.isFinite(v) && v !== 0) return true;
  return false;
}

/** The colour of a series (policy names have fixed colours). */
export function colourOf(name: string, index = 0): string {
  return COLOURS[name] ?? FALLBACK[index % FALLBACK.length]!;
}

/** Escapes text for XML content and attributes. */
export function escapeXml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const FONT = `font-family="system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif"`;

/** About `count` round tick values covering [min, max]. */
export function niceTicks(min: number, max: number, count = 5): number[] {
  if (!(max > min)) return [min];
  const raw = (max - min) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw) ?? raw;
  const ticks: number[] = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step)
    ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

/** A short label for a number (1.2k, 0.35, 12). */
export function fmtNumber(value: number): string {
  const abs = Math.abs(value);
  if (abs >= 1e6) return `${Number((value / 1e6).toPrecision(3))}M`;
  if (abs >= 1e4) return `${Number((value / 1e3).toPrecision(3))}k`;
  if (abs >= 100) return `${Math.round(value)}`;
  if (abs === 0) return "0";
  return `${Number(value.toPrecision(3))}`;
}

interface Frame {
  width: number;
  height: number;
  left: number;
  right: number;
  top: number;
  bottom: number;
}

function frame(width: number, height: number): Frame {
  return { width, height, left: 64, right: width - 16, top: 40, bottom: height - 62 };
}

function header(f: Frame, title: string, body: string): string {
  return (
    `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${f.width} ${f.height}" width="${f.width}" height="${f.height}" role="img" ${FONT} font-size="12">` +
    `<title>${escapeXml(title)}</title>` +
    `<rect width="${f.width}" height="${f.height}" fill="#ffffff"/>` +
    `<text x="${f.width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="600">${escapeXml(title)}</text>` +
    body +
    "</svg>"
  );
}

function yAxis(f: Frame, ticks: number[], y: (v: number) => number, label: string): string {
  let out = "";
  for (const t of ticks) {
    const py = y(t).toFixed(1);
    out += `<line x1="${f.left}" x2="${f.right}" y1="${py}" y2="${py}" stroke="#e6e6e6"/>`;
    out += `<text x="${f.left - 6}" y="${py}" text-anchor="end" dominant-baseline="middle" fill="#444">${fmtNumber(t)}</text>`;
  }
  out += `<line x1="${f.left}" x2="${f.left}" y1="${f.top}" y2="${f.bottom}" stroke="#888"/>`;
  out += `<line x1="${f.left}" x2="${f.right}" y1="${f.bottom}" y2="${f.bottom}" stroke="#888"/>`;
  const cy = (f.top + f.bottom) / 2;
  out += `<text transform="translate(14 ${cy}) rotate(-90)" text-anchor="middle" fill="#444">${escapeXml(label)}</text>`;
  return out;
}

function legend(
  f: Frame,
  names: { name: string; colour: string; dash?: string | null; marker?: MarkerShape }[],
): string {
  let x = f.left;
  let out = "";
  const y = f.height - 6;
  for (const { name, colour, dash, marker } of names) {
    out += `<line x1="${x}" x2="${x + 24}" y1="${y - 4}" y2="${y - 4}" stroke="${colour}" stroke-width="2.5"${dash ? ` stroke-dasharray="${dash}"` : ""}/>`;
    if (marker) out += markerSvg(marker, x + 12, y - 4, colour);
    out += `<text x="${x + 28}" y="${y}" fill="#333">${escapeXml(name)}</text>`;
    x += 36 + name.length * 7;
  }
  return out;
}

/** Grouped bars: one group per category, one bar per series. */
export interface BarChartOptions {
  title: string;
  yLabel: string;
  categories: string[];
  series: { name: string; values: (number | null)[] }[];
  /** Bar colour by category instead of by series (one series, policy-coloured bars). */
  colourByCategory?: boolean;
  /** A horizontal reference line (e.g. the lower bound). */
  reference?: { value: number; label: string };
  width?: number;
  height?: number;
}

/** Renders grouped bars as a standalone SVG document. */
export function barChart(options: BarChartOptions): string {
  const f = frame(options.width ?? 640, options.height ?? 320);
  const all = options.series.flatMap((s) => s.values.filter((v): v is number => v !== null));
  if (options.reference) all.push(options.reference.value);
  const max = Math.max(1e-9, ...all) * 1.08;
  const ticks = niceTicks(0, max);
  const top = Math.max(max, ticks[ticks.length - 1] ?? max);
  const y = (v: number) => f.bottom - (v / top) * (f.bottom - f.top);
  let body = yAxis(f, ticks, y, options.yLabel);
  const groupWidth = (f.right - f.left) / Math.max(1, options.categories.length);
  const barWidth = (groupWidth * 0.75) / Math.max(1, options.series.length);
  options.categories.forEach((category, c) => {
    const gx = f.left + c * groupWidth + groupWidth * 0.125;
    options.series.forEach((s, i) => {
      const value = s.values[c];
      if (value === null || value === undefined) return;
      const x = gx + i * barWidth;
      const colour = options.colourByCategory ? colourOf(category, c) : colourOf(s.name, i);
      const opacity =
        options.colourByCategory && options.series.length > 1
          ? 0.45 + (0.55 * (i + 1)) / options.series.length
          : 1;
      body +=
        `<rect x="${x.toFixed(1)}" y="${y(value).toFixed(1)}" width="${(barWidth * 0.92).toFixed(1)}" ` +
        `height="${(f.bottom - y(value)).toFixed(1)}" fill="${colour}" fill-opacity="${opacity.toFixed(2)}">` +
        `<title>${escapeXml(`${category} ${s.name}: ${fmtNumber(value)}`)}</title></rect>`;
      body += `<text x="${(x + barWidth * 0.46).toFixed(1)}" y="${(y(value) - 4).toFixed(1)}" text-anchor="middle" font-size="10" fill="#333">${fmtNumber(value)}</text>`;
    });
    body += `<text x="${(f.left + (c + 0.5) * groupWidth).toFixed(1)}" y="${f.bottom + 16}" text-anchor="middle" fill="#222">${escapeXml(category)}</text>`;
  });
  if (options.reference) {
    const ry = y(options.reference.value).toFixed(1);
    body += `<line x1="${f.left}" x2="${f.right}" y1="${ry}" y2="${ry}" stroke="#222" stroke-dasharray="6 4"/>`;
    body += `<text x="${f.left + 6}" y="${Number(ry) - 4}" fill="#222">${escapeXml(options.reference.label)}</text>`;
  }
  if (options.series.length > 1) {
    body += legend(
      f,
      options.series.map((s, i) => ({
        name: s.name,
        colour: options.colourByCategory ? "#555" : colourOf(s.name, i),
        dash: null,
      })),
    );
  }
  return header(f, options.title, body);
}

/** Lines over a numeric x axis. */
export interface LineChartOptions {
  title: string;
  xLabel: string;
  yLabel: string;
  series: { name: string; points: [number, number][]; dashed?: boolean; colour?: string }[];
  /** Fixed y range; default from the data, starting at 0. */
  yMax?: number;
  /** Logarithmic x axis (values ≤ 0 are dropped). */
  logX?: boolean;
  /** Draw points as markers too (few points, e.g. goodput against load). */
  markers?: boolean;
  width?: number;
  height?: number;
}

/** Renders lines as a standalone SVG document. */
export function lineChart(options: LineChartOptions): string {
  const f = frame(options.width ?? 640, options.height ?? 320);
  const series = options.series.map((s) => ({
    ...s,
    points: options.logX ? s.points.filter(([x]) => x > 0) : s.points,
  }));
  const xs = series.flatMap((s) => s.points.map(([x]) => x));
  const ys = series.flatMap((s) => s.points.map(([, y]) => y));
  const tx = (x: number) => (options.logX ? Math.log10(x) : x);
  let xMin = xs.length > 0 ? Math.min(...xs.map(tx)) : 0;
  let xMax = xs.length > 0 ? Math.max(...xs.map(tx)) : 1;
  if (xMax <= xMin) {
    xMin -= 0.5;
    xMax += 0.5;
  }
  const yMaxData = options.yMax ?? Math.max(1e-9, ...ys) * 1.08;
  const yTicks = niceTicks(0, yMaxData);
  const yTop = options.yMax ?? Math.max(yMaxData, yTicks[yTicks.length - 1] ?? yMaxData);
  const x = (v: number) => f.left + ((tx(v) - xMin) / (xMax - xMin)) * (f.right - f.left);
  const y = (v: number) => f.bottom - (Math.min(v, yTop) / yTop) * (f.bottom - f.top);
  let body = yAxis(f, yTicks, y, options.yLabel);
  const xTicks = options.logX
    ? logTicks(xMin, xMax)
    : niceTicks(xMin, xMax, 6).filter((t) => t >= xMin - 1e-9 && t <= xMax + 1e-9);
  for (const t of xTicks) {
    const px = x(t).toFixed(1);
    body += `<line x1="${px}" x2="${px}" y1="${f.bottom}" y2="${f.bottom + 4}" stroke="#888"/>`;
    body += `<text x="${px}" y="${f.bottom + 16}" text-anchor="middle" fill="#444">${fmtNumber(t)}</text>`;
  }
  body += `<text x="${(f.left + f.right) / 2}" y="${f.bottom + 32}" text-anchor="middle" fill="#444">${escapeXml(options.xLabel)}</text>`;
  // Lines that coincide must all stay visible: earlier series are drawn wider, every series has its own
  // stroke pattern, and markers sit at staggered points so each line shows its own.
  const styles = series.map((s, i) => {
    const base = styleOf(s.name.split(" ")[0] ?? s.name, i);
    return { ...base, dash: s.dashed ? "6 4" : base.dash };
  });
  const widest = 2 + 0.9 * Math.max(0, series.length - 1);
  series.forEach((s, i) => {
    if (s.points.length === 0) return;
    const colour = s.colour ?? colourOf(s.name, i);
    const style = styles[i]!;
    const d = s.points
      .map(([px, py], k) => `${k === 0 ? "M" : "L"}${x(px).toFixed(1)} ${y(py).toFixed(1)}`)
      .join("");
    const width = Math.max(1.5, widest - 0.9 * i);
    body += `<path d="${d}" fill="none" stroke="${colour}" stroke-width="${width.toFixed(1)}" stroke-opacity="0.9"${style.dash ? ` stroke-dasharray="${style.dash}"` : ""}><title>${escapeXml(s.name)}</title></path>`;
    const every = options.markers ? 1 : Math.max(1, Math.ceil(s.points.length / 8));
    const offset = options.markers ? 0 : Math.floor((every * i) / Math.max(1, series.length));
    for (let k = offset; k < s.points.length; k += every) {
      const [px, py] = s.points[k]!;
      body += markerSvg(style.marker, x(px), y(py), colour, `${s.name}: ${fmtNumber(px)}, ${fmtNumber(py)}`);
    }
  });
  body += legend(
    f,
    series.map((s, i) => ({
      name: s.name,
      colour: s.colour ?? colourOf(s.name, i),
      dash: styles[i]!.dash,
      marker: styles[i]!.marker,
    })),
  );
  return header(f, options.title, body);
}

function logTicks(minLog: number, maxLog: number): number[] {
  const ticks: number[] = [];
  for (let e = Math.floor(minLog); e <= Math.ceil(maxLog); e++) {
    for (const m of [1, 2, 5]) {
      const v = m * 10 ** e;
      const lv = Math.log10(v);
      if (lv >= minLog - 1e-9 && lv <= maxLog + 1e-9) ticks.push(Number(v.toPrecision(6)));
    }
  }
  return ticks;
}

/** Keeps at most `max` points, evenly spaced, always including the last. */
export function downsample<T>(points: readonly T[], max: number): T[] {
  if (points.length <= max) return [...points];
  const out: T[] = [];
  const step = (points.length - 1) / (max - 1);
  for (let i = 0; i < max; i++) out.push(points[Math.round(i * step)]!);
  return out;
}
