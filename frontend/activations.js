// The gradient reaching each module's output on one captured step (StepEvent.activation_grads:
// the statistics of grad_output, what a module's full backward hook receives): one row per
// module in forward order, its norm as a bar on a log scale, its largest magnitude and its
// fraction of exact zeros, so how the gradient changes on its way back through the layers
// (vanishing, exploding, cut by a dead ReLU) reads from top to bottom.
import { h, clear, moduleLabel, decadeFormat, columnFormat } from "./dom.js";
import { api, sessionPath, rankQuery } from "./api.js";
import { logScale, ZERO, NONFINITE, legendItem } from "./colors.js";

// a module whose grad_output is (almost) all zeros passes (almost) nothing back to its
// parameters and inputs: "dead", as a ReLU that never fires makes the layer before it
export const DEAD_ZERO_FRAC = 0.99;
// earlier captured steps tried when the one asked for recorded none (each is one small fetch)
const TRIES = 5;

const NOTE = "The gradient w.r.t. each module's output (grad_output, what register_full_backward_hook receives), " +
  "on one captured step. Rows in forward order: backward() carries the gradient from the bottom row up, so a norm " +
  "that shrinks decade by decade towards the top is vanishing and one that grows is exploding. Zeros: the fraction " +
  `of its elements that are exactly zero — ${DEAD_ZERO_FRAC * 100} % or more (red) and nothing flows back into the ` +
  "module (a ReLU after it that never fires). ×n: the row gathers the module's n calls (a block used twice, an RNN cell).";

// The steps mode="default" captures (docs/capture.md, "Modes"), in words.  "Step 0, every
// 50th step and steps whose graph changed" left a step captured after a NaN unexplained.
export function defaultCaptures(every) {
  const sampled = every === 1 ? "every step" : `every ${every || "sample_every"} steps`;
  return `step 0, ${sampled}, and the step after a new graph structure, a NaN/Inf or a failed backward`;
}

export class ActivationGradsPanel {
  // ``onPick(step)``: the user chose another step in the panel's menu
  constructor(parent, app, onPick) {
    this.app = app;
    this.stepSel = h("select", { "aria-label": "captured step for the gradient reaching each module's output", "data-testid": "act-step",
      onchange: () => onPick(+this.stepSel.value) });
    this.note = h("p", { class: "muted small", "data-testid": "act-note" }, NOTE);
    this.stepNote = h("p", { class: "act-step-note", "data-testid": "act-step-note", hidden: true });
    this.body = h("div", { class: "act-grads", "data-testid": "act-grads" });
    this.hover = h("div", { class: "muted", "data-testid": "act-hover" }, "\u00a0");
    this.legend = h("div", { class: "muted small act-legend", "data-testid": "act-legend" });
    this.root = h("section", { class: "act-panel", "data-testid": "act-panel" },
      h("h2", {}, "Gradient reaching each module's output ", this.stepSel), this.note, this.stepNote, this.body, this.hover, this.legend);
    parent.append(this.root);
    this.rows = [];
    this.loads = 0;
  }

  // ``focus``: the step the view marks (undefined: none picked, the latest captured is shown).
  async load(focus) {
    const mine = ++this.loads; // a later load (a live step, another pick) wins
    const graphs = await api(`${sessionPath(this.app.id)}/graphs?${rankQuery(this.app.rank)}`);
    if (mine !== this.loads) return;
    const captured = [...new Set(graphs.map((g) => g.step))].sort((a, b) => a - b);
    this.captured = captured;
    clear(this.stepSel).append(...captured.map((s) => h("option", { value: s }, `step ${s}`)));
    this.stepSel.hidden = !captured.length;
    if (!captured.length) return this.empty(this.noneText());
    // the step asked for, else the nearest captured one before it (after it, if it precedes them all)
    const before = focus === undefined ? captured.slice().reverse() : captured.filter((s) => s <= focus).reverse();
    const tries = (before.length ? before : captured).slice(0, TRIES);
    for (const step of tries) {
      const got = await api(`${sessionPath(this.app.id)}/steps?start=${step}&end=${step}&${rankQuery(this.app.rank)}`).catch(() => []);
      if (mine !== this.loads) return;
      const ev = (got || []).find((e) => e.step === step);
      if (ev?.activation_grads?.length) return this.show(ev, focus);
    }
    this.empty(`The captured step${tries.length > 1 ? "s" : ""} ${tries.join(", ")} recorded no gradient w.r.t. a module's output ` +
      "(no module returned a floating-point tensor that requires grad).");
  }

  // Why a run has none: a light run records none; a captured step of another run had none yet.
  noneText() {
    const meta = this.app.meta || {};
    if (meta.mode === "light") {
      return 'No gradients w.r.t. module outputs: this run was watched with mode="light", which records none. ' +
        `Watch with mode="default" (it captures ${defaultCaptures("sample_every")}) or mode="full" ` +
        "(every step) to see them.";
    }
    return this.app.running ? "No captured step yet: the gradient reaching each module's output is recorded on captured steps, " +
      "and appears here when the first one ends."
      : "This run captured no step, so it recorded no gradient w.r.t. a module's output (captured steps only).";
  }

  empty(text) {
    this.step = undefined;
    this.rows = [];
    this.stepNote.hidden = true;
    clear(this.legend);
    this.hover.textContent = "\u00a0";
    clear(this.body).append(h("p", { class: "muted act-empty", "data-testid": "act-empty" }, text));
  }

  // Which step is shown, when it is not the one asked for, and why.
  explain(step, focus) {
    const every = this.app.meta?.settings?.sample_every;
    const which = this.app.meta?.mode === "full" ? "every step in full mode" : defaultCaptures(every);
    if (focus === undefined) {
      return `Step ${step}, the latest captured step (captured steps only: ${which}). Pick another above, or click a point of the loss chart.`;
    }
    if (focus === step) return "";
    return step < focus
      ? `Step ${focus} recorded no gradients w.r.t. module outputs (captured steps only: ${which}): showing step ${step}, the nearest captured step before it.`
      : `Step ${focus} comes before the first captured step: showing step ${step} (captured steps only: ${which}).`;
  }

  show(ev, focus) {
    this.step = ev.step;
    this.stepSel.value = ev.step;
    const text = this.explain(ev.step, focus);
    this.stepNote.hidden = !text;
    this.stepNote.textContent = text;
    // the server's JSON writes a NaN or infinite float as the string "NaN" / "Infinity"
    const num = (v) => (typeof v === "string" ? Number(v) : v);
    this.rows = forwardOrder(ev.activation_grads.map((r) => ({ ...r, norm: num(r.norm), max_abs: num(r.max_abs), zero_frac: num(r.zero_frac) })));
    this.draw();
  }

  draw() {
    const rows = this.rows;
    const bad = (r) => !Number.isFinite(r.norm) || (r.nan || 0) > 0 || (r.inf || 0) > 0;
    const scale = logScale(rows.filter((r) => !bad(r)).map((r) => r.norm), ZERO);
    // whole decades, so the grid lines fall on 1e-3, 1e-2, ...
    const lo = Math.floor(Math.log10(scale.lo)), hi = Math.max(Math.ceil(Math.log10(scale.hi)), lo + 1);
    const at = (v) => (100 * (Math.log10(v) - lo)) / (hi - lo);
    const axis = h("span", { class: "act-axis", "data-testid": "act-axis" });
    this.axis = { el: axis, lo, hi };
    const grid = `background-size:${100 / (hi - lo)}% 100%`;
    const head = h("div", { class: "act-row act-head" }, h("span", {}, "module (forward order)"), axis,
      h("span", { class: "num" }, "‖grad_output‖₂"), h("span", { class: "num" }, "max |g|"), h("span", {}, "zeros"), h("span", {}, ""));
    // indented by the rows that contain it (a ModuleList, never called, has no row of its own)
    const paths = new Set(rows.map((r) => r.module));
    const indent = (path) => { let n = 0; for (let p = path; p; p = p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "") if (p !== path && paths.has(p)) n++; return n + (path && paths.has("") ? 1 : 0); };
    // one number format a column (fmtNum chose per value: "6.67e-4" above "0.001159")
    const fmtNorm = columnFormat(rows.map((r) => r.norm)), fmtMax = columnFormat(rows.map((r) => r.max_abs));
    const lines = rows.map((r) => {
      const label = moduleLabel(r.module, this.app.moduleType?.get(r.module));
      const nonfinite = bad(r), dead = !nonfinite && r.zero_frac >= DEAD_ZERO_FRAC;
      const bar = nonfinite ? h("span", { class: "act-bar", style: `width:100%;background:${NONFINITE}` })
        : r.norm > 0 ? h("span", { class: "act-bar", style: `width:${Math.max(1, at(r.norm))}%;background:${scale.color(r.norm)}` })
          : h("span", { class: "act-bar act-bar-zero", style: `background:${ZERO}` });
      const flags = [];
      if (nonfinite) flags.push(h("span", { class: "act-flag act-red", "data-testid": "act-nonfinite" }, nonfiniteText(r)));
      else if (dead) flags.push(h("span", { class: "act-flag act-red", "data-testid": "act-dead" }, "dead"));
      if (r.calls > 1) flags.push(h("span", { class: "act-flag", "data-testid": "act-calls", title: `gathers ${r.calls} calls of this module` }, `×${r.calls}`));
      const row = h("div", { class: `act-row${dead || nonfinite ? " act-bad" : ""}${r.module ? " act-link" : ""}`, "data-testid": "act-row",
        "data-module": r.module, role: r.module ? "button" : null, tabindex: r.module ? 0 : null, title: exact(label, r),
        onmouseenter: () => { this.hover.textContent = exact(label, r) + (r.module ? " — click to open this module in the graph" : ""); },
        onclick: () => this.open(r.module),
        onkeydown: (e) => { if (e.key === "Enter") this.open(r.module); } },
        h("span", { class: "act-name", style: `padding-left:${4 + 12 * indent(r.module)}px` }, label),
        h("span", { class: "act-track", style: grid }, bar),
        h("span", { class: `num${nonfinite ? " act-red" : ""}`, "data-testid": "act-norm" }, fmtNorm(r.norm)),
        h("span", { class: "num", "data-testid": "act-max" }, fmtMax(r.max_abs)),
        h("span", { class: `act-zeros${dead ? " act-red" : ""}`, "data-testid": "act-zeros" },
          h("span", { class: "act-zbar" }, h("span", { style: `width:${100 * (r.zero_frac || 0)}%` })), pct(r.zero_frac)),
        h("span", { class: "act-flags" }, flags));
      return row;
    });
    this.body.onmouseleave = () => { this.hover.textContent = "\u00a0"; };
    clear(this.body).append(head, ...lines);
    this.placeTicks();
    clear(this.legend).append(legendItem(ZERO, "‖grad_output‖₂ exactly zero (nothing flowed back)"), " · ",
      legendItem(NONFINITE, "NaN/Inf"), " · bar colours as the heat map's log scale · hover a row for exact numbers, click it to open the module in the graph at this step");
  }

  // The axis's decade labels, as many as its width holds: one a decade at 1920 px, every
  // few at 1024 px, where a label a decade ran together ("1e101e111e12").  Placed again when
  // the axis changes width (the window, the view shown after being hidden).
  placeTicks() {
    const { el, lo, hi } = this.axis || {};
    if (!el) return;
    if (!this.axisObserver) this.axisObserver = new ResizeObserver(() => this.placeTicks());
    this.axisObserver.disconnect();
    this.axisObserver.observe(el);
    const width = el.clientWidth;
    if (width === this.axis.width) return;
    this.axis.width = width;
    const fmt = decadeFormat(lo, hi, -2, 3);
    // the widest label's text, measured in the axis's font, and a gap of two spaces
    const ctx = (this.measure ||= document.createElement("canvas").getContext("2d"));
    ctx.font = `11px ${getComputedStyle(el).fontFamily || "system-ui"}`;
    let widest = 0;
    for (let k = lo; k <= hi; k++) widest = Math.max(widest, ctx.measureText(fmt(k)).width);
    // labels a decade apart are centred on their tick, the end ones inside the axis: apart
    // by half a label each side, one more at an end, and a gap
    const room = width ? (hi - lo) * (1.5 * widest + 8) / width : 0;
    const every = Math.max(1, Math.ceil(room), Math.ceil((hi - lo) / 8));
    const ticks = [];
    for (let k = hi; k >= lo; k -= every) ticks.unshift(h("span", { class: "act-tick", style: `left:${(100 * (k - lo)) / (hi - lo)}%` }, fmt(k)));
    clear(el).append(...ticks);
  }

  open(module) {
    if (module && this.step !== undefined) this.app.openModule(this.step, module);
  }

  debug() {
    return { step: this.step, captured: this.captured || [], note: this.stepNote.hidden ? "" : this.stepNote.textContent,
      empty: this.body.querySelector("[data-testid=act-empty]")?.textContent || "", modules: this.rows.map((r) => r.module) };
  }
}

const depth = (path) => (path ? path.split(".").length : 0);
const pct = (f) => (f === undefined || f === null ? "–" : `${f > 0 && f < 0.001 ? "<0.1" : f < 1 && f > 0.999 ? ">99.9" : +(100 * f).toFixed(1)} %`);

function nonfiniteText(r) {
  const parts = [];
  if (r.nan > 0) parts.push(`NaN ×${r.nan}`);
  if (r.inf > 0) parts.push(`Inf ×${r.inf}`);
  return parts.length ? parts.join(" ") : Number.isNaN(r.norm) ? "NaN" : "Inf";
}

// Every number of a row as recorded (full precision), for the hover line and the tooltip.
function exact(label, r) {
  const calls = r.calls > 1 ? ` · ${r.calls} calls gathered` : "";
  const nf = (r.nan || 0) + (r.inf || 0) > 0 ? ` · NaN ${r.nan || 0} · Inf ${r.inf || 0}` : "";
  return `${label} · ‖grad_output‖₂ ${String(r.norm)} · max |g| ${String(r.max_abs)} · zero fraction ${String(r.zero_frac)}${nf}${calls}`;
}

// The capture lists the modules as their forward calls end (a parent after its children, the
// root last); rows read better as the calls start: a module before what it contains, siblings
// in the order they ran.  A module's place is the earliest end among itself and the modules
// inside it (its first child ended first), its parent before it at a tie.
export function forwardOrder(list) {
  const end = new Map(list.map((r, i) => [r.module, i]));
  const first = new Map();
  for (const [path, i] of end) {
    for (let p = path; ; p = p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "") {
      if (end.has(p) && !(first.get(p) <= i)) first.set(p, i);
      if (p === "") break;
    }
  }
  return list.slice().sort((a, b) => first.get(a.module) - first.get(b.module) || depth(a.module) - depth(b.module));
}
