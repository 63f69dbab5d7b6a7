// Gradients view: the loss per step (live, NaN/Inf marked), the total gradient norm per step
// (and clip_grad_norm_'s, before clipping, when the loop clips), a module x step heat map of gradient norms (per-parameter norms from
// /grads combined per module as sqrt(sum of squares)) or of what optimizer.step() did (the
// update-to-weight ratio), NaN/Inf markers, lines of one statistic for chosen parameters, and
// the parameters that got no gradient.
import { h, clear, fmtNum, fmtShort, coalesce, moduleTyped } from "./dom.js";
import { api, sessionPath, rankQuery } from "./api.js";
import { LineChart } from "./chart.js";
import { logScale, ZERO, rampLegend } from "./colors.js";
import { THEME_EVENT } from "./theme.js";
import { fit } from "./graph/render.js";
import { ActivationGradsPanel } from "./activations.js";
import { MetricsPanel } from "./metrics.js";
import { findingNote } from "./diagnostics.js";

const NO_PARAMS = "The watched model has no parameters: tensors an optimizer trains outside the model are not watched.";
const NO_GRADS = "No parameter had a gradient (.grad) at optimizer.step() on any step: the Doctor tab says why.";

// What the "Chosen parameters" chart can draw, a /grads column each (a list per step aligned
// with the parameters): the L2 norm of each parameter's gradient is read every step; max |g|
// and the share of zeros on the steps with full statistics (null elsewhere); the update
// statistics (what optimizer.step() did) on those steps in default and full, and not in light
// (null rows elsewhere). ``every``: read on every step (its gaps are real); ``log``: a log axis.
const STATS = {
  norm: { label: "‖grad‖", every: true },
  max_abs: { label: "max |grad|", log: true, clipped: true },
  zero_frac: { label: "share of zeros in grad" },
  update_ratio: { label: "update ÷ weight", log: true, update: true },
  weight_norm: { label: "‖weight‖", log: true, update: true },
};
// Whether the lines' positive values, their bulk (the 5th to the 95th percentile: one corrupted
// batch's spike is the outlier fit's, not a reason for a log axis), span two decades -- as a
// deep transformer's first-layer gradient shrinking 1000x in three steps does (QA 50b: drawn on the
// 0.00 line, read as a gradient that stopped).  A zero keeps the axis linear (a log axis has none).
function spansDecades(series) {
  const v = [];
  for (const s of series) for (const y of s.y) if (typeof y === "number" && Number.isFinite(y)) v.push(y);
  if (v.length < 3 || v.some((y) => y <= 0)) return false;
  v.sort((a, b) => a - b);
  const at = (q) => v[Math.min(v.length - 1, Math.floor(q * (v.length - 1)))];
  return at(0.95) / at(0.05) >= 100;
}

const RATIO_AID = "~1e-3 typical; 1e-1 and up: the learning rate is too high for that parameter; under 1e-5 it barely moves";
const TICKS = "red ticks at the top: NaN/Inf";
// The heat map's statistics: a module's gradient norm, or its update-to-weight ratio.
const HEAT_STATS = { norm: "‖grad‖", update_ratio: "update ÷ weight" };
// The statistics the URL asked for (``stat``: the chart's, ``heat``: the heat map's), read when
// this module loads: the app keeps only the keys it knows in the URL, and rewrites it before
// this view exists.
const ASKED = (() => {
  try { const q = new URLSearchParams(location.search); return { stat: q.get("stat"), heat: q.get("heat") }; } catch { return {}; }
})();

export class GradientsView {
  constructor(root, app) {
    this.app = app;
    this.root = root;
    // a keyboard walks it as the pointer does (QA 50b: mouse only): arrows move a cell cursor
    // read out below, Enter is a click on it
    this.heat = h("canvas", { class: "heat", "data-testid": "heatmap", tabindex: 0 });
    // module names in a column of their own beside the scrolling cells, like a spreadsheet's
    // frozen column: a run of hundreds of steps scrolls sideways and the rows stay named
    this.heatLabels = h("div", { class: "heat-labels", "data-testid": "heat-labels" });
    this.heatScroll = h("div", { class: "heat-scroll", "data-testid": "heat-scroll" }, this.heat);
    this.heatInfo = h("div", { class: "muted" });
    // what the cell under the pointer holds: a heat map of hundreds of steps has no room to print it
    this.heatHover = h("div", { class: "muted", "data-testid": "heat-hover", role: "status", "aria-live": "polite" }, "\u00a0");
    this.pick = h("select", { multiple: true, size: 6, "aria-label": "parameters to plot", "data-testid": "param-pick", onchange: () => this.drawLines() });
    this.noGrad = h("div", { class: "nograd", "data-testid": "no-grad" });
    // the statistic the chosen parameters' chart draws, and the heat map's; kept in the URL
    // (``stat``, ``heat``) and across live reloads
    const known = (table, k) => (typeof k === "string" && Object.hasOwn(table, k) ? k : null);
    this.stat = known(STATS, app.state.stat) ?? known(STATS, ASKED.stat) ?? "norm";
    this.heatStat = known(HEAT_STATS, app.state.heat) ?? known(HEAT_STATS, ASKED.heat) ?? "norm";
    this.statPick = h("select", { "aria-label": "statistic to plot", "data-testid": "param-stat", onchange: () => this.setStat(this.statPick.value) },
      Object.entries(STATS).map(([k, s]) => h("option", { value: k, selected: k === this.stat }, s.label)));
    this.heatPick = h("select", { "aria-label": "statistic of the heat map", "data-testid": "heat-stat", onchange: () => this.setHeatStat(this.heatPick.value) },
      Object.entries(HEAT_STATS).map(([k, label]) => h("option", { value: k, selected: k === this.heatStat }, label)));
    this.heatTitle = h("h2", {}, this.heatStat === "norm" ? "Gradient norm per module and step" : "Update ÷ weight per module and step");
    const mark = () => (this.focus !== undefined ? [{ x: this.focus, label: `step ${this.focus}` }] : []);
    // the loss first, the curve a PyTorch user looks for, beside the total gradient norm (side
    // by side on a wide window, so the heat map below stays in the first screenful)
    const lossCol = h("div", {}, h("h2", {}, "Loss")), totalCol = h("div", {}, h("h2", {}, "Total gradient norm"));
    // the Doctor's finding followed here, as into the memory view (QA 45c: P5's link showed a step line alone)
    this.findingBox = h("div", { class: "notice", "data-testid": "gradients-finding", hidden: true });
    root.append(this.findingBox, h("div", { class: "chart-pair" }, lossCol, totalCol));
    this.lossSeries = new LossSeries(app);
    this.loss = new LineChart(lossCol, { title: "loss", vlines: mark, onClick: (i) => this.onLossClick(i) });
    this.loss.root.dataset.testid = "loss";
    this.total = new LineChart(totalCol, { title: `‖grad‖₂ of all parameters together, per step (log scale; ${TICKS})`, vlines: mark, log: true });
    this.total.root.dataset.testid = "total-norm";
    this.clipNote = h("p", { "data-testid": "clip-note", hidden: true });
    // a long run's gradients come one step of every few (the server's /grads stride): said
    this.sampleNote = h("p", { class: "muted small", "data-testid": "grads-sampled", hidden: true });
    root.append(this.clipNote, this.sampleNote);
    // the script's own numbers (torchscope.log), beside the loss, on its steps
    this.metrics = new MetricsPanel(root, app, { vlines: mark, onMark: (step) => { this.app.setState({ step }); this.focusOn(); },
      range: () => (this.lossSeries.steps.length ? [this.lossSeries.steps[0], this.lossSeries.steps.at(-1)] : null) });
    root.append(this.heatTitle, h("p", { class: "muted small" }, h("label", {}, "per module: ", this.heatPick)),
      h("div", { class: "heat-wrap" }, this.heatLabels, this.heatScroll), this.heatHover, this.heatInfo);
    // one step's gradient w.r.t. each module's output, as it flows back through the layers
    this.acts = new ActivationGradsPanel(root, app, (step) => { this.app.setState({ step }); this.focusOn(); });
    root.append(h("h2", {}, "Chosen parameters"),
      h("p", { class: "muted small", "data-testid": "param-pick-hint" }, "Ctrl-click (⌘-click on a Mac) to pick several parameters; Shift-click picks a range."),
      this.pick, h("p", { class: "muted small" }, h("label", {}, "statistic: ", this.statPick)));
    this.lines = new LineChart(root, { title: `‖grad‖ per step (${TICKS})`, vlines: mark, log: !!STATS[this.stat].log });
    this.lines.root.dataset.testid = "param-lines";
    // the schedule the optimizer followed (warmup, decay, restarts), a line per param group:
    // a loss that stalls or explodes is read against it
    root.append(h("h2", {}, "Learning rate"));
    this.lr = new LineChart(root, { title: "lr per step", vlines: mark, height: 160 });
    this.lr.root.dataset.testid = "lr";
    root.append(h("h2", {}, "Parameters without a gradient"), this.noGrad);
    this.heat.addEventListener("click", (e) => this.onHeatClick(e));
    this.heat.addEventListener("mousemove", (e) => this.onHeatHover(e));
    this.heat.addEventListener("keydown", (e) => this.onHeatKey(e));
    this.heat.addEventListener("blur", () => { if (this.heatCursor) this.drawHeat(); }); // (its cursor off)
    window.addEventListener(THEME_EVENT, () => { if (this.g) this.drawHeat(); });
    // a choice the URL made stays in it as the view's other state does
    if (this.stat !== "norm" || this.heatStat !== "norm") {
      app.setState({ stat: this.stat === "norm" ? undefined : this.stat, heat: this.heatStat === "norm" ? undefined : this.heatStat });
    }
  }

  // The loss (/loss, a few bytes a step) and the gradient statistics (/grads) side by side,
  // each drawn as it arrives.
  async load() {
    this.focus = this.app.state.step;
    await Promise.all([this.loadGrads(), this.lossSeries.update().then(() => { this.drawLoss(); this.drawLr(); this.metrics.render(); }),
      this.metrics.update(), this.acts.load(this.focus)]);
  }

  async loadGrads() {
    const g = await api(`${sessionPath(this.app.id)}/grads?${rankQuery(this.app.rank)}`);
    this.g = g;
    const modOf = new Map((this.app.meta?.params || []).map((p) => [p.name, p.module ?? p.name.split(".").slice(0, -1).join(".")]));
    this.modules = [...new Set(g.params.map((p) => modOf.get(p) ?? p.split(".").slice(0, -1).join(".")))];
    const mIndex = new Map(this.modules.map((m, i) => [m, i]));
    this.paramModule = g.params.map((p) => mIndex.get(modOf.get(p) ?? p.split(".").slice(0, -1).join(".")));
    // keep what the user chose across live reloads; at first, three parameters that have a
    // gradient norm to draw (one that never got a gradient would be picked with no line)
    const kept = new Set([...this.pick.selectedOptions].map((o) => o.textContent));
    this.focus = this.app.state.step;
    const asked = this.askedParams();
    if (asked) { kept.clear(); asked.forEach((p) => kept.add(p)); }
    const drawn = new Set();
    for (const row of g.norm || []) (row || []).forEach((v, p) => { if (v !== null && v !== undefined) drawn.add(p); });
    const first = new Set(g.params.map((_, i) => i).filter((i) => drawn.has(i)).slice(0, 3));
    clear(this.pick).append(...g.params.map((p, i) => h("option", { value: i, selected: kept.size ? kept.has(p) : first.has(i) }, p)));
    // a model without parameters (its optimizer trains tensors outside it): say so, not "no data yet"
    this.lines.opts.empty = this.total.opts.empty = g.params.length ? null : NO_PARAMS;
    // steps and not one gradient (no backward reached the model: a GAN's generator loss from
    // D(fake.detach())): say so, not "no data yet" of a finished run (QA 44c)
    if (g.params.length && g.steps.length && !drawn.size) this.lines.opts.empty = this.total.opts.empty = NO_GRADS;
    this.sampleNote.hidden = !(g.stride > 1);
    this.sampleNote.textContent = g.stride > 1 ? `${g.total_steps.toLocaleString("en-US")} steps: the gradient charts and the heat map show ` +
      `${g.steps.length.toLocaleString("en-US")}, of every ${g.stride} steps in a row the one with the largest total ‖grad‖ (a NaN or Inf ` +
      "first: a spike is never left out), and the first and last steps; the loss chart shows every step." : "";
    this.drawTotal();
    this.updateMenus();
    this.drawHeat();
    this.drawLines();
    this.drawNoGrad();
  }

  // Whether the run has any value of /grads column ``key`` (a statistic no step read: the
  // update statistics of a light run, or of a file from before they were recorded).
  hasStat(key) {
    return (this.g?.[key] || []).some((row) => (row || []).some((v) => v !== null && v !== undefined));
  }

  // Why a statistic the run lacks is not there: said on its menu item, which is disabled.
  missingWhy(key) {
    const light = this.app.meta?.mode === "light";
    if (STATS[key]?.update) {
      return light ? "Not recorded: mode light reads no update statistics (default and full read what optimizer.step() did on step 0, every 10th step and the captured steps)."
        : this.app.running ? "Not read yet: default and full read what optimizer.step() did on step 0, every 10th step and the captured steps."
          : "Not recorded in this run: no step read what optimizer.step() did (mode light reads none; a recording from a torchscope before format 1.7 has none).";
    }
    return "Not recorded in this run: no step read the full gradient statistics.";
  }

  // Whether the menus offer statistic ``key``: the run has it, or may still read it (a running
  // session, not in light mode, which reads no update statistics).
  offers(key) {
    const light = this.app.meta?.mode === "light";
    return key === "norm" || this.hasStat(key) || (this.app.running && !(light && STATS[key]?.update));
  }

  // The menus' items for statistics the run lacks: disabled, saying why; a choice of one of
  // them (from the URL) falls back to ‖grad‖.
  updateMenus() {
    const light = this.app.meta?.mode === "light";
    for (const [sel, labels] of [[this.statPick, Object.fromEntries(Object.entries(STATS).map(([k, s]) => [k, s.label]))], [this.heatPick, HEAT_STATS]]) {
      for (const o of sel.options) {
        const have = this.offers(o.value);
        o.disabled = !have;
        o.title = have ? "" : this.missingWhy(o.value);
        o.textContent = have ? labels[o.value] : `${labels[o.value]} — not recorded${light && STATS[o.value]?.update ? " in light mode" : ""}`;
      }
    }
    if (!this.offers(this.stat)) { this.stat = "norm"; this.app.setState({ stat: undefined }); }
    if (!this.offers(this.heatStat)) { this.heatStat = "norm"; this.app.setState({ heat: undefined }); }
    this.statPick.value = this.stat;
    this.heatPick.value = this.heatStat;
    this.heatTitle.textContent = this.heatStat === "norm" ? "Gradient norm per module and step" : "Update ÷ weight per module and step";
  }

  setStat(key) {
    if (!Object.hasOwn(STATS, key)) return;
    this.stat = key;
    this.app.setState({ stat: key === "norm" ? undefined : key });
    this.drawLines();
  }

  setHeatStat(key) {
    if (!Object.hasOwn(HEAT_STATS, key)) return;
    this.heatStat = key;
    this.app.setState({ heat: key === "norm" ? undefined : key });
    this.heatTitle.textContent = key === "norm" ? "Gradient norm per module and step" : "Update ÷ weight per module and step";
    this.drawHeat();
  }

  // The loss on a log axis once it spans two decades (a run from 10 down to 0.01 is flat on a
  // linear one after its first steps); a loss at or below zero (an ELBO, a GAN's) stays linear.
  drawLoss() {
    const { x, y, marks } = this.lossSeries.series();
    let lo = Infinity, hi = -Infinity;
    for (const v of y) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const log = lo > 0 && hi / lo >= 100;
    this.loss.opts.log = log;
    this.loss.opts.empty = this.app.running ? "No loss recorded yet." : "No step recorded a loss (the tensor backward() was called on).";
    this.loss.root.querySelector(".chart-title").textContent =
      `backward()'s loss per step (${log ? "log scale; " : ""}red ticks at the top: a NaN/Inf loss, of any micro-batch; click a point: mark its step)`;
    this.loss.setData(x, [{ name: "loss", y }], marks);
  }

  // Each param group's learning rate per step (StepEvent.lr, read at the step's end as in
  // force during it), on a log axis once it spans two decades (a warmup from 1e-7).
  drawLr() {
    const { x, groups } = this.lossSeries.lrSeries();
    let lo = Infinity, hi = -Infinity;
    for (const y of groups) for (const v of y) if (typeof v === "number") { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const log = lo > 0 && hi / lo >= 100; // (a warmup from 0 stays linear)
    this.lr.opts.log = log;
    this.lr.opts.empty = this.app.running ? "No learning rate recorded yet." : "No step recorded a learning rate (no optimizer was watched or found).";
    this.lr.setTitle(`each param group's lr per step, as in force during the step${log ? " (log scale)" : ""}`);
    this.lr.setData(x, groups.map((y, k) => ({ name: groups.length > 1 ? `param group ${k}` : "lr", y, steps: true })));
  }

  // A point of the loss chart marks its step across the view, as a finding's link does (the
  // heat map's column then opens that step's graph).
  onLossClick(i) {
    const step = this.loss.x[i];
    if (!this.lossSeries.has(step)) return; // the gap between two recorded steps
    this.app.setState({ step });
    this.focusOn();
  }

  // The statistics are read after the loop's clip_grad_norm_, so where it ran, total_norm is
  // the clipped norm: what clip_grad_norm_ returned (the norm before clipping) is drawn beside
  // it, with max_norm, else a run that explodes and is clipped every step looks calm.
  drawTotal() {
    const { g } = this;
    const clip = g.clip || [];
    const clipped = clip.some(Boolean);
    const series = [{ name: clipped ? "after clip_grad_norm_" : "total ‖grad‖", y: g.total_norm || [] }];
    if (clipped) {
      series.push({ name: "before clip_grad_norm_", y: g.steps.map((_, s) => clip[s]?.norm ?? null) },
        { name: "max_norm", y: g.steps.map((_, s) => clip[s]?.max_norm ?? null), dash: true });
    }
    this.total.setData(g.steps, series, this.nonFiniteSteps(g.params.map((_, p) => p)));
    this.clipNote.textContent = clipped ? clipSentence(g.steps, clip) : "";
    this.clipped = clipped; // (the chosen parameters' norms are after clipping too: their chart says so)
    this.clipNote.hidden = !clipped;
  }

  // The heat map's cells: per module and step, the gradient norm (the root of the sum of its
  // parameters' squared norms), or the update-to-weight ratio of what optimizer.step() did to
  // the module, sqrt(Σ‖Δw‖² / Σ‖w‖²) over its parameters, ‖w‖ before the step (moved()); a
  // step that did not read the ratio is "not read", apart from a module with no gradient.
  // The heat map's text for a screen reader (it is a picture): its size, the three modules with
  // the largest values at the last step, and the modules never drawn or with a NaN or Inf.
  describeHeat(val, has, bad, S, M, ratio) {
    const what = ratio ? "update / weight ratio" : "gradient norm";
    const last = S - 1, top = [];
    // named as the rows are, with their type: an nn.Sequential's "0, 2" read as numbers (QA 50c)
    const named = (p) => moduleTyped(p, this.app.moduleType?.get(p));
    for (let m = 0; m < M; m++) if (S && has[last * M + m] && !bad[last * M + m]) top.push([val[last * M + m], named(this.modules[m])]);
    top.sort((a, b) => b[0] - a[0]);
    const never = this.modules.filter((_, m) => { for (let s = 0; s < S; s++) if (has[s * M + m]) return false; return true; });
    const nonfinite = this.modules.filter((_, m) => { for (let s = 0; s < S; s++) if (bad[s * M + m]) return true; return false; });
    const list = (xs) => xs.slice(0, 5).map(named).join(", ") + (xs.length > 5 ? ` and ${xs.length - 5} more` : "");
    const parts = [`${what} per module (rows) and step (columns): ${M} modules, ${S ? `steps ${this.g.steps[0]} to ${this.g.steps[last]}` : "no steps yet"}`];
    if (top.length) parts.push(`largest at step ${this.g.steps[last]}: ${top.slice(0, 3).map(([v, n]) => `${n} ${fmtNum(v)}`).join(", ")}`);
    if (never.length) parts.push(`no value at any step: ${list(never)}`);
    if (nonfinite.length) parts.push(`NaN or Inf in: ${list(nonfinite)}`);
    this.heat.setAttribute("role", "img");
    // (the pointer's sentence stays last: the browser tests read the label's end)
    const open = this.noGraphs() ? "marks its step" : "opens its step's graph";
    this.heat.setAttribute("aria-label", parts.join(". ") + `. Keyboard: arrow keys move over the cells, Enter ${open}. Pointer: Hover a cell to read it.`);
  }

  drawHeat() {
    const { g } = this;
    const S = g.steps.length, M = this.modules.length, ratio = this.heatStat === "update_ratio";
    const val = new Float64Array(S * M), bad = new Uint8Array(S * M), has = new Uint8Array(S * M), unread = new Uint8Array(S * M);
    const den = ratio ? new Float64Array(S * M) : null, fromZero = new Uint8Array(S * M);
    for (let s = 0; s < S; s++) {
      const row = g.norm[s] || [];
      for (let p = 0; p < row.length; p++) {
        if (!Number.isFinite(row[p] ?? 0) || (g.nan?.[s]?.[p] || 0) > 0 || (g.inf?.[s]?.[p] || 0) > 0) bad[s * M + this.paramModule[p]] = 1;
      }
      if (ratio) {
        const r = g.update_ratio?.[s], w = g.weight_norm?.[s], u = g.update_norm?.[s];
        if (!r) { unread.fill(1, s * M, (s + 1) * M); continue; }
        for (let p = 0; p < r.length; p++) {
          const i = s * M + this.paramModule[p], [du, before] = moved(r[p], w?.[p], u?.[p]);
          if (du === null) continue;
          val[i] += du * du; den[i] += before * before; has[i] = 1;
        }
      } else {
        for (let p = 0; p < row.length; p++) {
          const i = s * M + this.paramModule[p], v = row[p];
          if (v === null || v === undefined) continue;
          has[i] = 1;
          if (Number.isFinite(v)) val[i] += v * v;
        }
      }
    }
    // (a module whose weights were all zero before the step, a LoRA B matrix: no ratio)
    for (let i = 0; i < S * M; i++) if (has[i] && ratio && !(den[i] > 0)) { has[i] = 0; fromZero[i] = 1; }
    for (let i = 0; i < S * M; i++) if (has[i]) val[i] = Math.sqrt(ratio ? val[i] / den[i] : val[i]);
    const vals = [];
    for (let i = 0; i < S * M; i++) if (has[i] && !bad[i]) vals.push(val[i]);
    // the ratio's ramp spans 1e-6 to 1 at least, so its colours read the same in every run (a
    // healthy 1e-3 in the middle, a too-fast 1e-1 red); the norm's spans the run's values
    const scale = logScale(ratio ? [...vals, 1e-6, 1] : vals, ZERO);
    this.describeHeat(val, has, bad, S, M, ratio);
    // the names sit beside the canvas (drawLabels); L leaves room for the focused column's outline
    const cellW = Math.max(2, Math.min(24, Math.floor(900 / Math.max(S, 1)))), cellH = 16, L = 2, AXIS = 24;
    const W = L + cellW * S + 10, H = cellH * M + AXIS;
    const dpr = window.devicePixelRatio || 1;
    const c = this.heat;
    c.width = W * dpr; c.height = H * dpr; c.style.width = W + "px"; c.style.height = H + "px";
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const css = getComputedStyle(document.documentElement);
    ctx.fillStyle = css.getPropertyValue("--panel").trim(); ctx.fillRect(0, 0, W, H);
    ctx.font = "11px system-ui";
    this.drawLabels(cellH, AXIS, W);
    for (let s = 0; s < S; s++) {
      for (let m = 0; m < M; m++) {
        const i = s * M + m;
        // not read (the update statistics: some steps only): the panel's own colour with a
        // dot, apart from the grey of "no gradient"
        if (unread[i] && !bad[i]) {
          ctx.fillStyle = css.getPropertyValue("--muted").trim();
          ctx.fillRect(L + s * cellW + Math.floor((cellW - 1) / 2) - (cellW > 3 ? 1 : 0), m * cellH + 7, Math.min(2, cellW - 1) || 1, 2);
          continue;
        }
        ctx.fillStyle = bad[i] ? "#7f1d1d" : has[i] ? scale.color(val[i]) : css.getPropertyValue("--node-none").trim();
        ctx.fillRect(L + s * cellW, m * cellH, cellW - (cellW > 3 ? 1 : 0), cellH - 1);
        if (bad[i]) { ctx.fillStyle = "#fff"; ctx.fillText("!", L + s * cellW + cellW / 2 - 2, m * cellH + 12); }
      }
    }
    // the step axis is drawn with the cells, so it scrolls with them and stays aligned; at
    // most ten labels on a short run, and on a long one a label every 60 px, so that any
    // stretch scrolled into view is labelled
    ctx.fillStyle = css.getPropertyValue("--muted").trim();
    const axisEvery = Math.min(Math.ceil(S / 10), Math.ceil(60 / cellW));
    for (let s = 0; s < S; s += axisEvery) ctx.fillText(String(g.steps[s]), L + s * cellW, H - 6);
    this.heatGeom = { L, cellW, cellH, S, M, axisEvery };
    this.cells = { val, bad, has, unread, ratio, fromZero };
    const at = this.focus !== undefined ? g.steps.indexOf(this.focus) : -1;
    if (at >= 0) { // the step a finding (or the URL) asked for: its column outlined
      ctx.strokeStyle = css.getPropertyValue("--text").trim(); ctx.lineWidth = 2;
      ctx.strokeRect(L + at * cellW - 1, 0, cellW + 1, cellH * M);
      // once per focus: a live reload must not undo the user's own scrolling
      if (this.scrolledTo !== this.focus) { this.scrolledTo = this.focus; this.scrollToColumn(L + at * cellW, cellW); }
    }
    const cur = this.heatCursor;
    if (cur && document.activeElement === c && cur[0] < S && cur[1] < M) { // the keyboard's cell
      ctx.strokeStyle = css.getPropertyValue("--accent").trim(); ctx.lineWidth = 2;
      ctx.strokeRect(L + cur[0] * cellW - 1, cur[1] * cellH - 1, cellW + 1, cellH + 1);
    }
    this.zeroCells = vals.filter((v) => v === 0).length;
    clear(this.heatInfo);
    // a long run's steps are wider than the view: said, or its later steps are easy to miss
    // under charts that show all of them (QA 46c: 5,000 steps, 2,900 in view)
    if (this.heatScroll.clientWidth && W > this.heatScroll.clientWidth + 1) {
      this.heatInfo.append(h("span", { "data-testid": "heat-more" }, `${S} steps at ${cellW} px each, wider than the view: scroll it sideways (or Shift + wheel) for the rest`), " · ");
    }
    const click = this.noGraphs() ? "click a cell to mark its step (a light run captures no graph)" : "click a cell to open that step's graph";
    if (!ratio) {
      if (scale.positive) this.heatInfo.append(...rampLegend("‖grad‖", scale.lo, scale.hi, fmtShort), " · ");
      this.heatInfo.append(h("span", { class: "swatch", style: `background:${ZERO}` }), " = exactly zero (nothing flowed) · ",
        `dark red "!" = NaN/Inf · grey = no gradient · ${click}`);
      return;
    }
    if (scale.positive) this.heatInfo.append(...rampLegend("update ÷ weight", scale.lo, scale.hi, fmtShort), " · ");
    this.heatInfo.append(
      "a module's: sqrt(Σ‖Δw‖² / Σ‖w‖²) over its parameters, ‖w‖ before the step (a bias that was zero moves the module, adds no weight) · ",
      `${RATIO_AID} · `,
      h("span", { class: "swatch", style: `background:${ZERO}` }), " = exactly zero (the step did not move it) · ",
      `dark red "!" = NaN/Inf gradient · grey = no gradient (no ratio) · `,
      h("span", { class: "swatch heat-unread", style: `background:${css.getPropertyValue("--panel").trim()};border:1px dotted ${css.getPropertyValue("--muted").trim()}` }),
      ` = not read that step (${this.readWhen().replace("on the steps that read it: ", "read on ")}) · ${click}`);
  }

  // One name per row, as text, then the step axis's name in the axis row. A long module path
  // is cut in its middle as the graph cuts it (its end tells sibling blocks apart; CSS can
  // only cut the end) and shown whole on hover.
  // The column is as wide as the longest name where the cells leave the room (``cellsW``: the
  // heat map's width), at least its CSS width (QA 42b: a transformer's 20 steps took 480 of
  // 1060 px and its names were cut to "….0.self_attn (MultiheadAtt…").
  drawLabels(cellH, axisH, cellsW) {
    const col = this.heatLabels, cs = getComputedStyle(col);
    const ctx = (this.measure ||= document.createElement("canvas").getContext("2d"));
    ctx.font = cs.font;
    const names = this.modules.map((m) => moduleTyped(m, this.app.moduleType?.get(m)));
    col.style.width = "";
    const least = col.clientWidth, spare = (col.parentElement?.clientWidth || 0) - cellsW - 24;
    const need = Math.ceil(Math.max(0, ...names.map((n) => ctx.measureText(n).width))) + 14;
    if (need > least && spare > least) col.style.width = `${Math.min(need, spare)}px`;
    const room = col.clientWidth - 12;  // .heat-label's padding, and a pixel to spare
    const labels = room > 0 ? distinctLabels(names, (t, head) => fit(ctx, t, room, head)) : names;
    const row = (name, label) => h("div", { class: "heat-label", title: name, style: `height:${cellH}px;line-height:${cellH}px` }, label);
    clear(this.heatLabels).append(...names.map((m, i) => row(m, labels[i])),
      h("div", { class: "heat-label muted", style: `height:${axisH}px;line-height:${axisH}px` }, "step →"));
  }

  // A finding's step beyond the visible columns of a long run: scroll it into view.
  scrollToColumn(x, w) {
    const sc = this.heatScroll;
    if (x < sc.scrollLeft || x + w > sc.scrollLeft + sc.clientWidth) sc.scrollLeft = Math.max(0, x - sc.clientWidth / 2);
  }

  // (step index, module index) of the cell at a pointer event, or null
  cellAt(e) {
    const { L, cellW, cellH, S, M } = this.heatGeom || {};
    const s = Math.floor((e.offsetX - L) / cellW), m = Math.floor(e.offsetY / cellH);
    return s >= 0 && s < S && m >= 0 && m < M ? [s, m] : null;
  }

  // A light run has no graph to open: a cell marks its step across the view, as a point of
  // the loss chart does (opening the Graph tab only said it had nothing).
  noGraphs() { return this.app.meta?.mode === "light"; }

  onHeatClick(e) {
    const at = this.cellAt(e);
    if (at) this.openCell(at);
  }

  // A cell's click: its step's graph, its module highlighted (a light run: its step marked).
  openCell([s, m]) {
    if (this.noGraphs()) { this.app.setState({ step: this.g.steps[s] }); this.focusOn(); return; }
    this.app.openModule(this.g.steps[s], this.modules[m]);
  }

  onHeatHover(e) {
    const at = this.cellAt(e);
    this.heatHover.textContent = at ? this.cellText(at) : "\u00a0";
  }

  // ← → a step, ↑ ↓ a module, Home / End the first and last step; Enter opens the cell. The
  // cursor starts at the marked step's column (else the last), on the first module.
  onHeatKey(e) {
    const { S, M } = this.heatGeom || {};
    if (!S || !M) return;
    if (e.key === "Enter" && this.heatCursor) { e.preventDefault(); this.openCell(this.heatCursor); return; }
    const moves = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1], Home: [-S, 0], End: [S, 0] };
    if (!(e.key in moves)) return;
    e.preventDefault();
    const at = this.g.steps.indexOf(this.focus);
    const [s, m] = this.heatCursor || [at >= 0 ? at : S - 1, 0];
    const [ds, dm] = this.heatCursor ? moves[e.key] : [0, 0]; // (the first key shows where it starts)
    this.heatCursor = [Math.min(S - 1, Math.max(0, s + ds)), Math.min(M - 1, Math.max(0, m + dm))];
    this.drawHeat();
    const { L, cellW } = this.heatGeom;
    this.scrollToColumn(L + this.heatCursor[0] * cellW, cellW);
    this.heatHover.textContent = this.cellText(this.heatCursor);
  }

  // What a cell holds, in the read-out under the heat map (the pointer's and the keyboard's).
  cellText([s, m]) {
    const i = s * this.modules.length + m, { val, bad, has, unread, ratio, fromZero } = this.cells;
    const v = val[i];
    const what = bad[i] ? "NaN/Inf" : unread[i] ? "not read that step" : fromZero[i] ? "none (its weights were all zero before the step)"
      : !has[i] ? (ratio ? "none (no gradient)" : "no gradient")
      : v === 0 ? "exactly zero" : fmtNum(v);
    return `${moduleTyped(this.modules[m], this.app.moduleType?.get(this.modules[m]))} · step ${this.g.steps[s]} · ` +
      `${ratio ? "update ÷ weight" : "‖grad‖"} ${what} — click (or Enter) to ${this.noGraphs() ? "mark its step" : "open its graph"}`;
  }

  // The chosen parameters' lines of the chosen statistic.  One read on some steps only is drawn
  // through the steps that read it (the others left out, not gaps: a line every 10th step, not
  // dots), the run's first and last steps the x range (the NaN/Inf ticks fall in it).
  drawLines() {
    const { g } = this;
    if (!g) return;
    const key = this.stat, st = STATS[key];
    const chosen = [...this.pick.selectedOptions].map((o) => +o.value);
    const col = g[key] || [];
    const read = (s) => { const row = col[s]; return !!row && row.some((v) => v !== null && v !== undefined); };
    // (the steps that read it, the x axis still the run's: QA 53c, a point at the last step
    // read "–" for every line and was counted as a point)
    const at = st.every ? g.steps.map((_, s) => s) : g.steps.map((_, s) => s).filter(read);
    this.lines.opts.xRange = st.every || !g.steps.length ? null : [g.steps[0], g.steps[g.steps.length - 1]];
    const series = chosen.map((p) => ({ name: g.params[p], y: at.map((s) => (col[s] || [])[p] ?? null) }));
    this.lines.opts.log = !!st.log || (key === "norm" && spansDecades(series));
    this.lines.opts.empty = !g.params.length ? NO_PARAMS : st.every ? null
      : chosen.length ? `No step read ${st.label} of the chosen parameters${this.app.running ? " yet" : ""}.` : null;
    this.setLinesTitle();
    this.lines.setData(at.map((s) => g.steps[s]), series, this.nonFiniteSteps(chosen));
  }

  // What the chosen parameters' chart draws, in PyTorch's words; the update-to-weight ratio
  // with how to read it.
  setLinesTitle() {
    const clip = this.clipped && (this.stat === "norm" || STATS[this.stat].clipped) ? ", after clip_grad_norm_" : "";
    const some = this.readWhen();
    const text = {
      norm: `‖grad‖ per step${clip} (${this.lines.opts.log ? "log scale; " : ""}${TICKS})`,
      max_abs: `max |grad| per step: param.grad.abs().max()${clip} (log scale; ${some}; ${TICKS})`,
      zero_frac: `share of zeros in grad per step: (param.grad == 0).float().mean() (${some}; ${TICKS})`,
      update_ratio: `update ÷ weight per step: ‖param after optimizer.step() − before‖ / ‖param before‖ (log scale; ${some}; ${TICKS})`,
      weight_norm: `‖weight‖ per step: param.norm() after optimizer.step() (log scale; ${some}; ${TICKS})`,
    }[this.stat];
    const title = this.lines.title;
    clear(title).append(text);
    if (this.stat === "update_ratio") title.append(h("br"), h("span", { "data-testid": "ratio-aid" }, RATIO_AID));
  }

  // Which steps read the statistics that are not read every step, as the session's settings say.
  readWhen() {
    const meta = this.app.meta || {}, every = meta.settings?.grad_stats_every || 10;
    return meta.mode === "full" ? "read every step" : `on the steps that read it: step 0, every ${every === 10 ? "10th" : `${every} steps`}, the captured ones`;
  }

  // A red tick at each step where one of the parameters ``params`` had a NaN or Inf in its gradient.
  nonFiniteSteps(params) {
    const { g } = this;
    return g.steps.flatMap((st, s) => (params.some((p) => (g.nan?.[s]?.[p] || 0) + (g.inf?.[s]?.[p] || 0) > 0) ? [{ x: st }] : []));
  }

  drawNoGrad() {
    const { g } = this;
    const name = (p) => (typeof p === "number" ? g.params[p] : p);
    const count = new Map(), notTrained = new Map();
    // a parameter no optimizer trains that step (a frozen backbone left out of the param
    // groups) has no gradient by design: listed apart, not as a missing gradient
    (g.none || []).forEach((list, s) => {
      const skip = new Set((g.not_trained?.[s] || []).map(name));
      (list || []).forEach((p) => { const n = name(p); const m = skip.has(n) ? notTrained : count; m.set(n, (m.get(n) || 0) + 1); });
    });
    clear(this.noGrad);
    const item = ([p, n]) => h("li", {}, h("code", {}, p), ` — .grad is None at ${n} of ${g.steps.length} steps`);
    if (!g.params.length) this.noGrad.append(h("p", { class: "muted" }, NO_PARAMS));
    else if (!count.size) this.noGrad.append(h("p", { class: "muted" }, "Every trained parameter received a gradient at every step."));
    else this.noGrad.append(h("ul", {}, [...count.entries()].map(item)));
    if (notTrained.size) {
      this.noGrad.append(h("p", { class: "muted", "data-testid": "not-trained" },
        `Not trained — in no optimizer param group (or left out of backward(inputs=...)), so no gradient by design: ${notTrained.size} parameter(s)`),
        h("ul", { class: "muted" }, [...notTrained.entries()].map(item)));
    }
  }

  // The parameters the URL names (a finding's ``params``), once per new list: afterwards the
  // user's own choice is kept.
  askedParams() {
    const asked = this.app.state.params;
    if (!asked || asked === this.applied || !this.g) return null;
    this.applied = asked;
    const known = new Set(this.g.params);
    const names = asked.split(",").filter((p) => known.has(p));
    return names.length ? names : null;
  }

  // The finding's note on top, with where its parameters are drawn: the chart is two screens down
  showFinding(f, plotted) {
    const n = (f?.params || []).length;
    const drawn = n > plotted ? `its first ${plotted} of ${n} parameters are` : n === 1 ? "its parameter is" : `its ${n} parameters are`;
    findingNote(this.findingBox, f, "gradients", () => this.showFinding(null, plotted),
      f && n ? h("div", { class: "muted" }, `${drawn} drawn under "Chosen parameters" below, the finding's step marked: `,
        h("button", { "data-testid": "gradients-finding-chart", onclick: () => this.lines.root.scrollIntoView({ block: "center" }) },
          "show the chart")) : null);
  }

  focusOn() {
    if (!this.g) return;
    this.focus = this.app.state.step;
    const asked = this.askedParams();
    if (asked) for (const o of this.pick.options) o.selected = asked.includes(o.textContent);
    this.total.draw();
    this.loss.draw();
    this.lr.draw();
    this.metrics.redraw();
    this.drawHeat();
    this.drawLines();
    this.acts.load(this.focus).catch(() => {}); // (the server gone: the page's banner says so)
  }

  onStep() { (this.reload ||= coalesce(() => this.load(), 800))(); }

  // The run's end (or silence): the metrics logged after its last step's event, which no step
  // event announces, are fetched once more.
  onStatus() {
    const status = this.app.summary?.status;
    if (status === this.lastStatus) return;
    this.lastStatus = status;
    if (this.metrics.loaded) this.metrics.update().catch(() => {});
  }
  debug() {
    const notTrained = this.noGrad.querySelector("[data-testid=not-trained]");
    return { modules: this.modules || [], steps: this.g?.steps?.length || 0, noGrad: this.noGrad.textContent,
      chosen: [...this.pick.selectedOptions].map((o) => o.textContent), focus: this.focus, zeroCells: this.zeroCells,
      legend: this.heatInfo.textContent, geom: this.heatGeom, acts: this.acts.debug(),
      stat: this.stat, heatStat: this.heatStat, metrics: this.metrics.debug(),
      lines: { x: this.lines.x || [], series: (this.lines.series || []).map((s) => ({ name: s.name, y: s.y.map(wire) })),
        log: !!this.lines.opts.log, axis: this.lines.axis, title: this.lines.title.textContent },
      heat: this.cells ? heatCells(this.cells, this.modules, this.g.steps) : null,
      total: this.total.series?.map((s) => s.name) || [], totalEmpty: this.total.opts.empty || "", totalAxis: this.total.axis, totalMarks: this.total.markers.map((m) => m.x), clipNote: this.clipNote.hidden ? "" : this.clipNote.textContent,
      notTrained: notTrained ? notTrained.nextElementSibling.textContent : "",
      loss: { x: this.loss.x || [], y: (this.loss.series?.[0]?.y || []).map(wire), marks: this.loss.markers.map((m) => m.x),
        axis: this.loss.axis, title: this.loss.root.querySelector(".chart-title").textContent },
      lr: { x: this.lr.x || [], series: (this.lr.series || []).map((s) => ({ name: s.name, y: s.y })), log: !!this.lr.opts.log,
        title: this.lr.title.textContent } };
  }
}

// What optimizer.step() did to one parameter, from its recorded ratio (‖Δw‖ / ‖w‖ before),
// ‖w‖ after and ‖Δw‖ (format 1.15): [‖Δw‖, ‖w‖ before], or [null] when the step did not read
// it.  QA 53c: ‖Δw‖ was taken as ratio × ‖w‖ after the step -- a bias growing fast weighed
// wrong -- and a parameter zero before (every norm layer's bias at step 0) has no ratio and was
// left out, though it moved by its whole ‖w‖ after.  A file from before 1.15 has no ‖Δw‖: the
// ratio times ‖w‖ after, as then, a parameter without a ratio moved from zero.
function moved(r, wn, u) {
  const num = (x) => typeof x === "number" && Number.isFinite(x);
  if (!num(wn)) return [null];
  if (num(u)) return [u, num(r) && r > 0 ? u / r : u === 0 ? wn : 0];
  if (num(r)) return wn > 0 ? [r * wn, wn] : [null];
  return r === null ? [wn, 0] : [null];
}

// The heat map's cells for the tests: per module, per step, a number, "NaN/Inf", "not read"
// or null (no gradient / no ratio).
function heatCells({ val, bad, has, unread, ratio }, modules, steps) {
  const M = modules.length;
  return { stat: ratio ? "update_ratio" : "norm", cells: Object.fromEntries(modules.map((m, k) => [m, steps.map((_, s) => {
    const i = s * M + k;
    return bad[i] ? "NaN/Inf" : unread[i] ? "not read" : has[i] ? val[i] : null;
  })])) };
}

// A number as the server's JSON writes it: NaN and Infinity as strings (for the tests' equality).
const wire = (v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v);

// The loss of every step, from /loss: columns of step numbers and losses, and the steps whose
// loss was NaN/Inf (a few bytes a step, not the step events), so a 100,000-step run is plotted
// whole, not sampled (sampling could skip the one NaN step). The chart draws a long series as
// one min/max pair per pixel column, and a dot for every NaN/Inf step. A live run's reload asks
// only for the steps after the last one it has.
class LossSeries {
  constructor(app) {
    this.app = app;
    this.steps = []; // step numbers, increasing
    this.losses = []; // each one's loss (a number, NaN/Inf included; null: the step has none)
    this.lrs = []; // each one's learning rates, one per param group (null: none recorded)
    this.bad = []; // steps whose loss was NaN/Inf
    this.next = 0; // the first step not fetched yet
    this.queue = Promise.resolve();
  }

  // What the run added since the last call; one fetch at a time (live reloads overlap).
  update() {
    this.queue = this.queue.catch(() => {}).then(() => this.fetch());
    return this.queue;
  }

  async fetch() {
    const got = await api(`${sessionPath(this.app.id)}/loss?${rankQuery(this.app.rank)}&start=${this.next}`);
    // the server's JSON writes a non-finite float as the string "NaN" / "Infinity" / "-Infinity"
    const num = (v) => (typeof v === "string" ? Number(v) : v);
    got.step.forEach((s, i) => { this.steps.push(s); this.losses.push(num(got.loss[i])); this.lrs.push(got.lr?.[i] ?? null); });
    for (const s of got.nonfinite) this.bad.push(s); // (not push(...): a diverged run has 100,000s)
    if (got.step.length) this.next = got.step.at(-1) + 1;
  }

  // whether the run recorded this step (binary search: steps are increasing)
  has(step) {
    let lo = 0, hi = this.steps.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.steps[mid] === step) return true;
      if (this.steps[mid] < step) lo = mid + 1; else hi = mid - 1;
    }
    return false;
  }

  // x (steps), y (losses) and NaN/Inf markers; a step the run lacks between two it has is a
  // gap (a null), not a line across it.
  series() {
    const x = [], y = [];
    const { steps, losses } = this;
    for (let i = 0; i < steps.length; i++) {
      if (i && steps[i] - steps[i - 1] > 1) { x.push(steps[i - 1] + 1); y.push(null); }
      x.push(steps[i]); y.push(losses[i]);
    }
    return { x, y, marks: this.bad.map((s) => ({ x: s })) };
  }

  // x (steps) and one y column per param group (the most any step has; a group added later by
  // add_param_group starts there), with the same gaps as the loss
  lrSeries() {
    const x = [], groups = [];
    const { steps, lrs } = this;
    const n = lrs.reduce((m, g) => Math.max(m, g ? g.length : 0), 0);
    for (let k = 0; k < n; k++) groups.push([]);
    const add = (step, g) => { x.push(step); groups.forEach((y, k) => y.push(g && k < g.length ? g[k] : null)); };
    for (let i = 0; i < steps.length; i++) {
      if (i && steps[i] - steps[i - 1] > 1) add(steps[i - 1] + 1, null);
      add(steps[i], lrs[i]);
    }
    return { x, groups };
  }
}

// What clip_grad_norm_ did over the run, in one sentence: on how many steps it ran, on how many
// it scaled the gradients down (its norm over max_norm), and the largest norm it saw.
function clipSentence(steps, clip) {
  const ran = clip.map((c, s) => (c ? s : -1)).filter((s) => s >= 0);
  const scaled = ran.filter((s) => clip[s].norm > clip[s].max_norm).length;
  const finite = ran.filter((s) => Number.isFinite(clip[s].norm)); // a NaN/Inf norm is no peak
  const peak = finite.reduce((best, s) => (clip[s].norm > clip[best].norm ? s : best), finite[0]);
  const maxNorms = [...new Set(ran.map((s) => clip[s].max_norm))].sort((a, b) => a - b);
  const maxNorm = maxNorms.length === 1 ? `max_norm=${maxNorms[0]}` : `max_norm from ${maxNorms[0]} to ${maxNorms.at(-1)}`;
  const types = [...new Set(ran.map((s) => clip[s].norm_type))].filter((t) => t !== undefined && t !== 2);
  const call = `clip_grad_norm_(${maxNorm}${types.length ? `, norm_type=${types.join("/")}` : ""})`;
  const peakAt = finite.length ? `${fmtNum(clip[peak].norm)} (step ${steps[peak]})` : "NaN/Inf (every step)";
  return `${call} ran on ${ran.length} of ${steps.length} steps and scaled the gradients down on ${scaled} of them: ` +
    (scaled ? `the norms in this view are after clipping; before it, the total norm peaked at ${peakAt}.`
      : `the total norm peaked at ${peakAt}, within max_norm.`);
}

// Row labels cut to fit, keeping each module's own (last) name and told apart.  A name is a
// dotted path, maybe with its type ("blocks.layers.0.self_attn (MultiheadAttention)").  Too
// long, it gives up the start of its path first, a whole dotted part at a time
// ("….layers.0.self_attn (MultiheadAttention)"), its own name last; then its type, cut at its
// end, or left out.  Rows whose labels came out the same (blocks 0 and 1: "….self_attn (…)")
// show what differs between them and their own name, and give up the parts they share: at
// the start, and between the part that differs and the own name ("….0.….out_proj").  Cut by characters
// from the middle, the first row of a layer read "blocks.layers.0.…", as if it were the layer.
export function distinctLabels(names, cut) {
  const split = (n) => {
    const sp = n.indexOf(" ("); // a path has no spaces; the type follows it
    return sp > 0 ? [n.slice(0, sp).split("."), n.slice(sp)] : [n.split("."), ""];
  };
  const fits = (t) => cut(t, 1 / 2) === t;
  // the best label of rows (their [parts, type]) that share ``pre`` leading and ``suf``
  // trailing parts: the same parts given up in every row, every row's label fitting
  const best = (rows, pre, suf) => {
    const mid = Math.max(0, suf - 1); // shared parts between what differs and the own name
    const text = (p, a, b) => {
      const e = p.length - suf; // end of the parts that differ
      const front = p.slice(a, suf ? e + mid - b : p.length).join(".");
      return `${a ? "…." : ""}${front}${suf ? `${b ? ".…" : ""}${front ? "." : ""}${p[p.length - 1]}` : ""}`;
    };
    // a row's label at (a, b): with its type whole (mode 0), its type cut at its end with its
    // first few letters left (1), without its type (2); null where that does not fit
    const at = (a, b, mode) => rows.map(([p, type]) => {
      const path = text(p, a, b), whole = path + type;
      if (fits(whole)) return whole;
      if (mode === 1) { const t = cut(whole, 1); return t.startsWith(path + type.slice(0, 10)) ? t : null; }
      return mode === 2 && fits(path) ? path : null;
    });
    const ok = (ls) => ls.every((l) => l !== null);
    for (const mode of [0, 1, 2]) {
      if (!ok(at(pre, mid, mode))) continue;
      let a = pre, b = mid;
      while (a > 0 || b > 0) { // give back the parts nearest the own name first
        if (b > 0 && ok(at(a, b - 1, mode))) b--;
        else if (a > 0 && ok(at(a - 1, b, mode))) a--;
        else break;
      }
      // a type cut short is worth less than the parts between what differs and the own name:
      // "….0.self_attn.out_proj" over "….0.….out_proj (NonDynami…"
      if (mode !== 1 || b === 0) return at(a, b, mode);
    }
    // not even the own name fits: cut in the middle
    return rows.map(([p]) => { const t = text(p, pre, mid); return fits(t) ? t : cut(t, 1 / 2); });
  };
  const split1 = names.map(split);
  const labels = split1.map((r, i) => (fits(names[i]) ? names[i] : best([r], r[0].length - 1, 0)[0]));
  const groups = new Map();
  labels.forEach((l, i) => { const g = groups.get(l); if (g) g.push(i); else groups.set(l, [i]); });
  for (const rows of groups.values()) {
    if (rows.length < 2) continue;
    const parts = rows.map((i) => split1[i][0]);
    const shortest = Math.min(...parts.map((p) => p.length));
    let pre = 0, suf = 0;
    while (pre < shortest - 1 && parts.every((p) => p[pre] === parts[0][pre])) pre++;
    while (suf < shortest - pre - 1 && parts.every((p) => p[p.length - 1 - suf] === parts[0][parts[0].length - 1 - suf])) suf++;
    const shown = best(rows.map((i) => split1[i]), pre, suf);
    rows.forEach((i, k) => { labels[i] = shown[k]; });
  }
  return labels;
}
