// The gradient reaching each module's output on one captured step (StepEvent.activation_grads:
// the statistics of grad_output, what a module's full backward hook receives): one row per
// module in forward order, its norm as a bar on a log scale, its largest magnitude and its
// fraction of exact zeros, so how the gradient changes on its way back through the layers
// (vanishing, exploding, cut by a dead ReLU) reads from top to bottom.
import { h, clear, moduleLabel, decadeFormat, columnFormat, fmtShort } from "./dom.js";
import { api, sessionPath, rankQuery } from "./api.js";
import { logScale, ZERO, NONFINITE_FILL, legendItem } from "./colors.js";

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

// Both directions of one captured step: the module's output as the forward made it
// (StepEvent.activations, what register_forward_hook receives) beside the gradient reaching it.
const NOTE_BOTH = "Each module's output on one captured step (forward, left: its values, what register_forward_hook receives) " +
  "beside the gradient w.r.t. that output (backward, right: grad_output, what register_full_backward_hook receives). " +
  "Rows in forward order: the forward runs down the rows, backward() carries the gradient up them, so a ‖g‖₂ that shrinks " +
  "decade by decade towards the top is vanishing and one that grows is exploding. rms = ‖output‖₂ / √numel, the typical size " +
  `of its elements; min … max, its extremes. Zeros: the share of elements exactly zero — ${DEAD_ZERO_FRAC * 100} % or more is ` +
  '"dead" (red): an output that is all zeros is a ReLU that never fires; a gradient all zeros, nothing flowing back into the module. ' +
  '"saturated": a Tanh or Sigmoid whose outputs sit at its bounds, the mean slope backward() multiplies by under a tenth of its ' +
  "largest (Tanh: 1 − rms², exact; Sigmoid: at most rms·(1 − rms)). ×n: the row gathers n calls. " +
  "–: not recorded (an output that needs no gradient, as a frozen layer's before any trained one, has none).";

// A Tanh / Sigmoid is "saturated" when the mean slope backward() multiplies its gradient by is at
// most this share of the function's largest slope (tanh: 1 at 0; sigmoid: 1/4 at 0).
export const SATURATED_SLOPE = 0.1;

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
    this.stepSel = h("select", { "aria-label": "captured step for each module's output and the gradient reaching it", "data-testid": "act-step",
      onchange: () => onPick(+this.stepSel.value) });
    this.note = h("p", { class: "muted small", "data-testid": "act-note" }, NOTE_BOTH);
    this.stepNote = h("p", { class: "act-step-note", "data-testid": "act-step-note", hidden: true });
    // a file recorded before the capture recorded module outputs (format 1.7): said, not hidden
    this.outNote = h("p", { class: "act-step-note", "data-testid": "act-out-absent", hidden: true });
    this.body = h("div", { class: "act-grads", "data-testid": "act-grads" });
    this.hover = h("div", { class: "muted", "data-testid": "act-hover" }, "\u00a0");
    this.legend = h("div", { class: "muted small act-legend", "data-testid": "act-legend" });
    this.title = h("h2", { "data-testid": "act-title" }, "Each module's output and the gradient reaching it ", this.stepSel);
    this.root = h("section", { class: "act-panel", "data-testid": "act-panel" },
      this.title, this.note, this.stepNote, this.outNote, this.body, this.hover, this.legend);
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
    let compiled = false;
    for (const step of tries) {
      const got = await api(`${sessionPath(this.app.id)}/steps?start=${step}&end=${step}&${rankQuery(this.app.rank)}`).catch(() => []);
      if (mine !== this.loads) return;
      const ev = (got || []).find((e) => e.step === step);
      if (ev?.activation_grads?.length || ev?.activations?.length) return this.show(ev, focus);
      compiled ||= Boolean(ev?.forwards?.some((f) => f.compiled));
    }
    const shown = tries.slice().sort((a, b) => a - b);
    // a compiled forward runs none of the module hooks that record them (QA 44c: "no module
    // returned a floating-point tensor", of a model that did)
    this.empty(`The captured step${shown.length > 1 ? "s" : ""} ${shown.join(", ")} recorded no module output and no gradient w.r.t. one ` +
      (compiled ? "(a torch.compile'd forward runs none of the module hooks that record them)."
        : "(no module returned a floating-point tensor in a forward that builds a graph)."));
  }

  // Why a run has none: a light run records none; a captured step of another run had none yet.
  noneText() {
    const meta = this.app.meta || {};
    if (meta.mode === "light") {
      return 'No module outputs or gradients w.r.t. them: this run was watched with mode="light", which records none. ' +
        `Watch with mode="default" (it captures ${defaultCaptures("sample_every")}) or mode="full" ` +
        "(every step) to see them.";
    }
    return this.app.running ? "No captured step yet: each module's output and the gradient reaching it are recorded on captured steps, " +
      "and appear here when the first one ends."
      : "This run captured no step, so it recorded no module output and no gradient w.r.t. one (captured steps only).";
  }

  empty(text) {
    this.step = undefined;
    this.rows = [];
    this.both = false;
    this.stepNote.hidden = true;
    this.outNote.hidden = true;
    clear(this.legend);
    this.hover.textContent = "\u00a0";
    this.body.style.cssText = "";
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
    const grads = (ev.activation_grads || []).map((r) => ({ ...r, norm: num(r.norm), max_abs: num(r.max_abs), zero_frac: num(r.zero_frac) }));
    // a file recorded before 1.7 has no ``activations`` at all: the gradient columns alone, as before
    this.both = Array.isArray(ev.activations);
    this.outNote.hidden = this.both;
    this.outNote.textContent = this.both ? "" : "The module outputs' values are not in this file: it was recorded before torchscope " +
      "recorded them (session format 1.7). The gradient reaching each module's output is shown alone; record the run again to see both.";
    this.note.textContent = this.both ? NOTE_BOTH : NOTE;
    if (!this.both) {
      this.rows = forwardOrder(grads.map((g) => ({ module: g.module, grad: g })));
      return this.drawGrads();
    }
    const outs = ev.activations.map((r) => ({ ...r, norm: num(r.norm), rms: num(r.rms), min: num(r.min), max: num(r.max), zero_frac: num(r.zero_frac) }));
    this.rows = forwardOrder(unionRows(outs, grads));
    this.drawBoth();
  }

  // The indentation of a row: the rows that contain it (a ModuleList, never called, has no row of its own).
  indenter() {
    const paths = new Set(this.rows.map((r) => r.module));
    return (path) => { let n = 0; for (let p = path; p; p = p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "") if (p !== path && paths.has(p)) n++; return n + (path && paths.has("") ? 1 : 0); };
  }

  // A row's handlers: hover shows its exact numbers, a click (or Enter) opens the module in the graph.
  rowAttrs(r, label, text, bad, style) {
    return { class: `act-row${bad ? " act-bad" : ""}${r.module ? " act-link" : ""}`, "data-testid": "act-row", style,
      "data-module": r.module, role: r.module ? "button" : null, tabindex: r.module ? 0 : null, title: text,
      onmouseenter: () => { this.hover.textContent = text + (r.module ? " — click to open this module in the graph" : ""); },
      onclick: () => this.open(r.module),
      onkeydown: (e) => { if (e.key === "Enter") this.open(r.module); } };
  }

  // The gradient's scale and its cells (the table as it was before module outputs were recorded).
  gradScale() {
    const grads = this.rows.map((r) => r.grad).filter(Boolean);
    const scale = logScale(grads.filter((g) => !badGrad(g)).map((g) => g.norm), ZERO);
    return { ...decades(scale), color: scale.color,
      fmtNorm: columnFormat(grads.map((g) => g.norm)), fmtMax: columnFormat(grads.map((g) => g.max_abs)) };
  }

  gradCells(g, sc) {
    if (!g) { // an output no gradient reached (it needed none: frozen layers before any trained one)
      const none = (id) => h("span", { class: "num muted", "data-testid": id }, "–");
      return [h("span", { class: "act-track", style: sc.grid }), none("act-norm"), none("act-max"),
        h("span", { class: "act-zeros muted", "data-testid": "act-zeros" }, h("span", { class: "act-zbar", style: "display:var(--act-zbar,block)" }), "–"),
        h("span", { class: "act-flags" })];
    }
    const nonfinite = badGrad(g), dead = !nonfinite && g.zero_frac >= DEAD_ZERO_FRAC;
    const bar = nonfinite ? h("span", { class: "act-bar", style: `width:100%;background:${NONFINITE_FILL}` })
      : g.norm > 0 ? h("span", { class: "act-bar", style: `width:${Math.max(1, sc.at(g.norm))}%;background:${sc.color(g.norm)}` })
        : h("span", { class: "act-bar act-bar-zero", style: `background:${ZERO}` });
    const flags = [];
    if (nonfinite) flags.push(h("span", { class: "act-flag act-red", "data-testid": "act-nonfinite" }, nonfiniteText(g)));
    else if (dead) flags.push(h("span", { class: "act-flag act-red", "data-testid": "act-dead", title: "the gradient reaching this output is (almost) all zeros: nothing flows back into the module" }, "dead"));
    if (g.calls > 1) flags.push(h("span", { class: "act-flag", "data-testid": "act-calls", title: `gathers ${g.calls} calls of this module` }, `×${g.calls}`));
    return [h("span", { class: "act-track", style: sc.grid }, bar),
      h("span", { class: `num${nonfinite ? " act-red" : ""}`, "data-testid": "act-norm" }, sc.fmtNorm(g.norm)),
      h("span", { class: "num", "data-testid": "act-max" }, sc.fmtMax(g.max_abs)),
      h("span", { class: `act-zeros${dead ? " act-red" : ""}`, "data-testid": "act-zeros" },
        h("span", { class: "act-zbar", style: "display:var(--act-zbar,block)" }, h("span", { style: `width:${100 * (g.zero_frac || 0)}%` })), pct(g.zero_frac)),
      h("span", { class: "act-flags", style: this.both ? "overflow:hidden" : null }, flags)];
  }

  drawGrads() {
    const sc = this.gradScale();
    const axis = h("span", { class: "act-axis", "data-testid": "act-axis" });
    this.axes = [{ el: axis, lo: sc.lo, hi: sc.hi }];
    const head = h("div", { class: "act-row act-head" }, h("span", {}, "module (forward order)"), axis,
      h("span", { class: "num" }, "‖grad_output‖₂"), h("span", { class: "num" }, "max |g|"), h("span", {}, "zeros"), h("span", {}, ""));
    const indent = this.indenter();
    const lines = this.rows.map((r) => {
      const g = r.grad, label = moduleLabel(r.module, this.app.moduleType?.get(r.module));
      const bad = badGrad(g) || g.zero_frac >= DEAD_ZERO_FRAC;
      return h("div", this.rowAttrs(r, label, exact(label, g), bad),
        h("span", { class: "act-name", style: `padding-left:${4 + 12 * indent(r.module)}px` }, label), ...this.gradCells(g, sc));
    });
    this.body.onmouseleave = () => { this.hover.textContent = "\u00a0"; };
    this.body.style.cssText = "";
    clear(this.body).append(head, ...lines);
    this.watchWidth();
    clear(this.legend).append(legendItem(ZERO, "‖grad_output‖₂ exactly zero (nothing flowed back)"), " · ",
      legendItem(NONFINITE_FILL, "NaN/Inf"), " · bar colours as the heat map's log scale · hover a row for exact numbers, click it to open the module in the graph at this step");
  }

  // One table, both directions: module | output rms (bar), rms, min … max, zeros, marks | the
  // gradient reaching it (bar), ‖grad_output‖₂, max |g|, zeros, marks.  Its columns follow the
  // table's width (layout()): at 1000 px the zeros' small bars go and the names get less room.
  drawBoth() {
    const rows = this.rows, sc = this.gradScale();
    const outs = rows.map((r) => r.out).filter(Boolean);
    const oscale = decades(logScale(outs.filter((o) => !badOut(o)).map((o) => o.rms), ZERO));
    const fmtRms = columnFormat(outs.map((o) => o.rms));
    const oaxis = h("span", { class: "act-axis", "data-testid": "act-out-axis" });
    const gaxis = h("span", { class: "act-axis", "data-testid": "act-axis" });
    this.axes = [{ el: oaxis, lo: oscale.lo, hi: oscale.hi }, { el: gaxis, lo: sc.lo, hi: sc.hi }];
    const cols = "grid-template-columns:var(--act-cols);gap:0 var(--act-gap,8px)";
    const sep = () => h("span", { "aria-hidden": "true", style: "align-self:stretch;background:var(--border)" });
    const group = h("div", { class: "act-row act-head", "data-testid": "act-sides", style: `${cols};border-bottom:none;margin-bottom:0` },
      h("span", { title: "rows in the order the modules' forwards start: a module before those inside it" }, "in forward order"),
      h("span", { style: "grid-column:span 5", title: "the module's output, as its forward returned it (register_forward_hook)" }, "output (forward)"), sep(),
      h("span", { style: "grid-column:span 5", title: "the gradient w.r.t. that output (grad_output, register_full_backward_hook)" }, "gradient reaching the output (backward)"));
    const head = h("div", { class: "act-row act-head", style: `${cols};position:sticky;top:0;z-index:1;background:var(--panel)` },
      h("span", {}, "module"), oaxis,
      h("span", { class: "num", title: "root mean square of the output's elements: ‖output‖₂ / √numel" }, "rms"),
      h("span", { class: "num", title: "the output's smallest and largest element" }, "min\u2009…\u2009max"),
      h("span", { title: "share of the output's elements that are exactly zero" }, "zeros"), h("span", {}, ""), sep(),
      gaxis, h("span", { class: "num", title: "‖grad_output‖₂: the norm of the gradient w.r.t. the module's output" }, "‖g‖₂"),
      h("span", { class: "num", title: "the largest magnitude of an element of grad_output" }, "max |g|"),
      h("span", { title: "share of the gradient's elements that are exactly zero" }, "zeros"), h("span", {}, ""));
    const indent = this.indenter();
    const types = this.app.moduleType;
    const lines = rows.map((r) => {
      const o = r.out, g = r.grad, type = types?.get(r.module), label = moduleLabel(r.module, type);
      const sat = o && saturation(o, type);
      const oDead = o && !badOut(o) && o.zero_frac >= DEAD_ZERO_FRAC;
      const gBad = g && (badGrad(g) || g.zero_frac >= DEAD_ZERO_FRAC);
      const bad = gBad || oDead || (o && badOut(o)) || !!sat;
      const text = `${label} · ${exactOut(o, sat)} | ${g ? exactGrad(g) : "no gradient reached this output (it needed none)"}${callsText(o, g)}`;
      return h("div", this.rowAttrs(r, label, text, bad, cols),
        h("span", { class: "act-name", "data-label": label, style: `padding-left:${4 + 10 * indent(r.module)}px` }, label),
        ...this.outCells(o, oscale, fmtRms, sat), sep(), ...this.gradCells(g, sc));
    });
    this.body.onmouseleave = () => { this.hover.textContent = "\u00a0"; };
    clear(this.body).append(group, head, ...lines);
    this.width = undefined;
    this.watchWidth();
    clear(this.legend).append(legendItem(OUT_BAR, "output rms (log scale, its own axis)"), " · ",
      legendItem(ZERO, "exactly zero (an all-zero output; nothing flowed back)"), " · ", legendItem(NONFINITE_FILL, "NaN/Inf"),
      " · gradient bars in the heat map's colours (log scale) · dead: ≥ 99 % zeros · saturated: a Tanh/Sigmoid at its bounds",
      " · – : not recorded (an output no gradient reached) · hover a row for exact numbers, click it to open the module in the graph at this step");
  }

  outCells(o, sc, fmtRms, sat) {
    // (its own classes: .act-bar / .act-track / .act-flags are the gradient's, first in a row before)
    const track = `position:relative;height:12px;background-image:linear-gradient(to right, var(--border) 1px, transparent 1px);${sc.grid}`;
    const bar = "position:absolute;left:0;top:1px;bottom:1px;border-radius:2px;";
    if (!o) {
      const none = (id, cls = "num muted") => h("span", { class: cls, "data-testid": id }, "–");
      return [h("span", { class: "act-otrack", style: track }), none("act-out-rms"), none("act-out-range"), none("act-out-zeros", "muted"), h("span", {})];
    }
    const nonfinite = badOut(o), dead = !nonfinite && o.zero_frac >= DEAD_ZERO_FRAC;
    const obar = nonfinite ? h("span", { class: "act-obar", "data-testid": "act-out-bar", style: `${bar}width:100%;background:${NONFINITE_FILL}` })
      : o.rms > 0 ? h("span", { class: "act-obar", "data-testid": "act-out-bar", style: `${bar}width:${Math.max(1, sc.at(o.rms))}%;background:${OUT_BAR}` })
        : h("span", { class: "act-obar", "data-testid": "act-out-bar", style: `${bar}width:6px;background:${ZERO}` });
    const flags = [];
    if (nonfinite) flags.push(h("span", { class: "act-flag act-red", "data-testid": "act-out-nonfinite" }, nonfiniteText(o)));
    else if (dead) flags.push(h("span", { class: "act-flag act-red", "data-testid": "act-out-dead", title: "its output is (almost) all zeros: a ReLU that never fires passes nothing forward and no gradient back" }, "dead"));
    if (sat) flags.push(h("span", { class: "act-flag act-red", "data-testid": "act-out-saturated", title: sat.text }, "saturated"));
    const range = o.min === undefined || o.max === undefined ? "–" : `${fmtEnd(o.min)}\u2009…\u2009${fmtEnd(o.max)}`;
    return [h("span", { class: "act-otrack", style: track }, obar),
      h("span", { class: `num${nonfinite ? " act-red" : ""}`, "data-testid": "act-out-rms" }, fmtRms(o.rms)),
      h("span", { class: `num${sat ? " act-red" : ""}`, "data-testid": "act-out-range", style: "white-space:nowrap;overflow:hidden;text-overflow:ellipsis" }, range),
      h("span", { class: `act-zeros${dead ? " act-red" : ""}`, "data-testid": "act-out-zeros" },
        h("span", { class: "act-zbar", style: "display:var(--act-zbar,block)" }, h("span", { style: `width:${100 * (o.zero_frac || 0)}%` })), pct(o.zero_frac)),
      h("span", { class: "act-oflags", style: "display:flex;gap:6px;white-space:nowrap;overflow:hidden" }, flags)];
  }

  // The columns for the table's width, the axes' labels and the names cut to their cells; again
  // whenever the table changes width (the window, the view shown after being hidden).
  watchWidth() {
    if (!this.observer) this.observer = new ResizeObserver(() => this.layout());
    this.observer.disconnect();
    this.observer.observe(this.body);
    this.width = undefined;
    this.layout();
  }

  layout() {
    const width = this.body.clientWidth;
    if (!width || width === this.width) return;
    this.width = width;
    if (this.both) {
      // roomy (1920 px): the zeros' small bars, wide names; narrow (1000 px): names and bars share
      // what is left -- the names no wider than the longest needs, so short ones leave it to the bars
      const roomy = width >= 1400;
      const cap = Math.round(Math.min(roomy ? 320 : 260, Math.max(roomy ? 160 : 110, width * (roomy ? 0.18 : 0.16))));
      const name = Math.max(90, Math.min(cap, this.namesWidth()));
      const [bar, rms, range, zeros, oflags, num, flags] = roomy ? [100, 72, 140, 100, 80, 80, 80] : [60, 60, 124, 48, 56, 64, 56];
      // each row is a grid of its own, so every column is a width in pixels (max-content would
      // differ row by row); the marks' columns as wide as their widest marks ("NaN ×1024")
      const template = (of, gf) => [`minmax(${Math.min(roomy ? 140 : 100, name)}px, ${name}px)`, `minmax(${bar}px, 1fr)`, `${rms}px`,
        `${range}px`, `${zeros}px`, `${of}px`, "1px", `minmax(${bar}px, 1fr)`, `${num}px`, `${num}px`, `${zeros}px`, `${gf}px`].join(" ");
      this.body.style.setProperty("--act-cols", template(oflags, flags));
      const widest = (sel) => Math.max(0, ...[...this.body.querySelectorAll(sel)].map((el) => el.scrollWidth));
      const cols = template(Math.max(oflags, widest(".act-oflags")), Math.max(flags, widest(".act-flags")));
      this.body.style.setProperty("--act-cols", cols);
      this.body.style.setProperty("--act-gap", roomy ? "10px" : "5px");
      this.body.style.setProperty("--act-zbar", roomy ? "block" : "none");
      this.fitNames();
    }
    for (const axis of this.axes || []) this.placeTicks(axis);
  }

  // The width the names need whole: the widest label and its indentation (the column's headers too).
  namesWidth() {
    const ctx = (this.measure ||= document.createElement("canvas").getContext("2d"));
    let widest = 0, font = "";
    for (const el of this.body.querySelectorAll(".act-name[data-label], .act-head > :first-child")) {
      if (!font) { const cs = getComputedStyle(el); font = `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`; }
      ctx.font = font;
      widest = Math.max(widest, ctx.measureText(el.dataset.label ?? el.textContent).width + parseFloat(el.style.paddingLeft || 0));
    }
    return Math.ceil(widest) + 6;
  }

  // A name too long for its cell gives up the start of its path, a dotted part at a time, and
  // keeps its own name ("….0.self_attn.out_proj"), then its type; the row's hover has it whole.
  // Every cell's width is read first, then every text written: a write between two reads made
  // the browser lay the page out again for each row (1,444 rows froze the tab 3-8 s, and again
  // at each resize: QA 46c).
  fitNames() {
    const ctx = (this.measure ||= document.createElement("canvas").getContext("2d"));
    const els = [...this.body.querySelectorAll(".act-name[data-label]")];
    const cells = els.map((el) => {
      const cs = getComputedStyle(el);
      const room = el.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - 1;
      return { el, room, font: `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}` };
    });
    for (const { el, room, font } of cells) {
      ctx.font = font;
      const text = fitLabel(el.dataset.label, (t) => ctx.measureText(t).width <= room);
      if (el.textContent !== text) el.textContent = text;
    }
  }

  // The axis's decade labels, as many as its width holds: one a decade at 1920 px, every
  // few at 1024 px, where a label a decade ran together ("1e101e111e12").
  placeTicks(axis) {
    const { el, lo, hi } = axis;
    const width = el.clientWidth;
    if (width === axis.width) return;
    axis.width = width;
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
      empty: this.body.querySelector("[data-testid=act-empty]")?.textContent || "", modules: this.rows.map((r) => r.module),
      outputs: !!this.both, outModules: this.rows.filter((r) => r.out).map((r) => r.module),
      gradModules: this.rows.filter((r) => r.grad).map((r) => r.module) };
  }
}

// the forward side's bars: one colour (their length is the scale), apart from the gradient's ramp
const OUT_BAR = "#64748b";

// whole decades of a log scale, so the grid lines fall on 1e-3, 1e-2, ...; ``at(v)``: v's place in %
function decades(scale) {
  const lo = Math.floor(Math.log10(scale.lo)), hi = Math.max(Math.ceil(Math.log10(scale.hi)), lo + 1);
  return { lo, hi, at: (v) => (100 * (Math.log10(v) - lo)) / (hi - lo), grid: `background-size:${100 / (hi - lo)}% 100%` };
}

// an end of a min … max range: 3 significant digits, an exponent below 0.01 or from 1e4 ("-7.64e-3",
// where fmtShort's "-0.00764" made a range too wide for its column at 1000 px)
function fmtEnd(x) {
  if (typeof x !== "number" || !Number.isFinite(x) || x === 0) return String(x);
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-2 ? x.toExponential(2).replace("e+", "e") : String(+x.toPrecision(3));
}

const badGrad = (r) => !Number.isFinite(r.norm) || (r.nan || 0) > 0 || (r.inf || 0) > 0;
const badOut = (r) => !Number.isFinite(r.norm) || !Number.isFinite(r.rms) || (r.nan || 0) > 0 || (r.inf || 0) > 0;

// A Tanh or Sigmoid whose outputs sit at its bounds, told from rms alone and honestly: tanh's
// slope at output y is 1 - y², so its mean over the elements is exactly 1 - rms²; sigmoid's
// is y(1 - y), whose mean is mean(y) - rms², at most rms - rms² (mean(y) <= rms).  Saturated
// when that mean slope is at most SATURATED_SLOPE of the function's largest (1; 1/4).
export function saturation(o, type) {
  if (badOut(o) || !(o.rms >= 0)) return null;
  if (type === "Tanh") {
    const slope = 1 - o.rms * o.rms;
    return slope <= SATURATED_SLOPE ? { slope, text: `saturated: tanh's mean slope 1 − rms² = ${fmtShort(Math.max(0, slope))} ` +
      "(at most 1, at 0): backward() multiplies the gradient through it by that on average" } : null;
  }
  if (type === "Sigmoid") {
    const slope = o.rms * (1 - o.rms);
    return slope <= SATURATED_SLOPE / 4 ? { slope, text: `saturated: sigmoid's mean slope is at most rms·(1 − rms) = ${fmtShort(Math.max(0, slope))} ` +
      "(at most 0.25, at 0): backward() multiplies the gradient through it by no more than that on average" } : null;
  }
  return null;
}

// The rows of both lists, each module once, in the order the capture lists them (as their
// forwards end): the outputs' list, with a module that has a gradient only placed after the
// one before it in the gradients' list.
export function unionRows(outs, grads) {
  const rows = outs.map((o, i) => ({ module: o.module, out: o, key: i }));
  const byModule = new Map(rows.map((r) => [r.module, r]));
  let last = -1, sub = 0;
  for (const g of grads) {
    const r = byModule.get(g.module);
    if (r) { r.grad = g; last = r.key; sub = 0; continue; }
    const row = { module: g.module, grad: g, key: last + ++sub / (grads.length + 1) };
    rows.push(row);
    byModule.set(g.module, row);
  }
  return rows.sort((a, b) => a.key - b.key);
}

// A label that fits (``fits(text)``): whole; else without the start of its path, a dotted part
// at a time ("….self_attn.out_proj (Linear)"); else its own name without its type; else that
// name, cut by the cell's ellipsis.
export function fitLabel(label, fits) {
  if (fits(label)) return label;
  const sp = label.indexOf(" (");
  const path = sp > 0 ? label.slice(0, sp) : label, type = sp > 0 ? label.slice(sp) : "";
  const parts = path.split(".");
  for (const t of [type, ""]) {
    for (let k = 1; k < parts.length; k++) {
      const text = `….${parts.slice(k).join(".")}${t}`;
      if (fits(text)) return text;
    }
    if (t && fits(path)) return path;
  }
  return parts.length > 1 ? `….${parts[parts.length - 1]}` : path;
}

function callsText(o, g) {
  const n = Math.max(o?.calls || 1, g?.calls || 1);
  return n > 1 ? ` · ${n} calls gathered` : "";
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
  return `${label} · ${exactGrad(r)}${calls}`;
}

function exactGrad(r) {
  const nf = (r.nan || 0) + (r.inf || 0) > 0 ? ` · NaN ${r.nan || 0} · Inf ${r.inf || 0}` : "";
  return `‖grad_output‖₂ ${String(r.norm)} · max |g| ${String(r.max_abs)} · zero fraction ${String(r.zero_frac)}${nf}`;
}

function exactOut(o, sat) {
  if (!o) return "output not recorded";
  const nf = (o.nan || 0) + (o.inf || 0) > 0 ? ` · NaN ${o.nan || 0} · Inf ${o.inf || 0}` : "";
  return `output rms ${String(o.rms)} · min ${String(o.min)} · max ${String(o.max)} · ‖output‖₂ ${String(o.norm)} · ` +
    `zeros ${String(o.zero_frac)} · numel ${String(o.numel)}${nf}${sat ? ` · ${sat.text}` : ""}`;
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
