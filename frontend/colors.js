// Colour scales and the overlay legend shared by the graph and the charts.
import { h } from "./dom.js";

const RAMP = ["#313695", "#4575b4", "#74add1", "#abd9e9", "#fee090", "#fdae61", "#f46d43", "#d73027", "#a50026"];
export const SERIES = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563"];
// One colour per run of the Compare page (up to 8), the same on every chart, so a colour must
// name a run on its own: SERIES fails that for colour-blind readers (orange and amber, ΔE 3 for
// a deuteranope).  The first four are Okabe & Ito's (blue, vermillion, bluish green, reddish
// purple), the other four picked by a search for the largest smallest difference: every pair is
// at least ΔE*76 16.8 apart in normal vision and simulated protanopia, deuteranopia and tritanopia
// (Machado et al. 2009, full severity), and each is a mid tone, at least 3:1 (WCAG 1.4.11,
// graphics) against the chart panel of both themes (#ffffff light, #171a21 dark), so one list
// serves both and a theme switch recolours nothing.
export const RUNS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#921dfc", "#ed0650", "#9172fa", "#925675"];
const CATS = ["#60a5fa", "#f59e0b", "#34d399", "#f472b6", "#a78bfa", "#f87171", "#22d3ee", "#facc15"];

// NaN or ±Inf (P4): outside the ramp, named in the legends
export const NONFINITE = "#7f1d1d";
// ... hatched where a bar's length means size: plain, it read as the ramp's top, the largest
// finite gradient's dark red (QA 50b)
export const NONFINITE_FILL = `repeating-linear-gradient(135deg, rgba(255, 255, 255, 0.6) 0 2px, transparent 2px 6px) ${NONFINITE}`;

export function ramp(t) {
  if (!Number.isFinite(t)) return NONFINITE;
  const x = Math.min(1, Math.max(0, t)) * (RAMP.length - 1);
  return RAMP[Math.round(x)];
}

// An exactly-zero gradient: nothing flowed (a dead branch, P2), which must not read as merely
// the smallest norm of the log ramp -- a colour outside the ramp, named in the legends.
export const ZERO = "#c026d3";

// Zero bytes or time (a view allocates nothing, a grad_fn that saved nothing): no amount at
// all, which must not read as the smallest of the ramp (a 4-byte scalar loss) -- a neutral
// grey outside the ramp, named in the legend.
export const NOTHING = "#9ca3af";

// A log scale over the positive values; returns colour(v), legend stops and whether any value
// is zero.  With ``zero``, zero gets that colour (and ``zeros`` says whether there is one);
// else the ramp's lowest.
export function logScale(values, zero = null) {
  let lo = Infinity, hi = -Infinity, zeros = false, nonfinite = false;
  for (const v of values) {
    if (v > 0 && Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; } else if (v === 0) zeros = true;
    else if (typeof v === "number" && !Number.isFinite(v)) nonfinite = true;
  }
  const positive = lo !== Infinity;
  if (!positive) { lo = 1; hi = 1; }
  const a = Math.log10(lo), b = Math.log10(hi), low = zero || RAMP[0];
  const color = (v) => (v === undefined || v === null ? null : !Number.isFinite(v) ? ramp(NaN) : v <= 0 ? low : ramp(b > a ? (Math.log10(v) - a) / (b - a) : 0.5));
  return { color, lo, hi, zeros: zeros && !!zero, positive, nonfinite };
}

export function categorical(keys) {
  const m = new Map();
  for (const k of keys) if (k !== undefined && k !== null && !m.has(k)) m.set(k, CATS[m.size % CATS.length]);
  return m;
}

// A colour swatch and its name as one unit (`.legend-item` does not wrap), so a wrapping
// legend never parts a swatch from its name.
export function legendItem(color, text) {
  return h("span", { class: "legend-item" }, h("span", { class: "swatch", style: `background:${color}` }), text);
}

// The legend of a log ramp from lo to hi: "name lo ▬ hi (log)", one unit whose parts keep a
// gap between them (a bare number ran into the bar: "2.12036.57"); one value (every cell or
// node the same) is one swatch and the value, not "1.000 ▬ 1.000".
export function rampLegend(name, lo, hi, fmt) {
  if (lo === hi) return [legendItem(RAMP[Math.floor(RAMP.length / 2)], `${name} ${fmt(lo)}`)];
  return [h("span", { class: "ramp-legend", "data-testid": "ramp-legend" }, h("span", {}, name), h("span", { class: "ramp-end" }, fmt(lo)),
    h("span", { class: "ramp", style: `background:linear-gradient(90deg,${RAMP.join(",")})` }), h("span", { class: "ramp-end" }, fmt(hi)),
    h("span", { class: "muted" }, "(log)"))];
}
