// Memory view: per-step bytes by category over the run (from /memory, columnar), and the
// in-step timeline of live bytes op by op (GraphEvent.memory_timeline), as one line or stacked
// by the module that made each tensor (memory_viz's stacked allocations); click -> the op.
import { h, clear, fmtBytes, shape, coalesce, opWhere } from "./dom.js";
import { api, sessionPath, rankQuery } from "./api.js";
import { LineChart } from "./chart.js";
import { nearest } from "./graph/view.js";
import { hasLifetimes, lifetimes, aliveAfter, aliveBy, highestBy, baseline, baselineAfter } from "./lifetimes.js";
import { SERIES } from "./colors.js";
import { findingNote, stepsText } from "./diagnostics.js";

const MAX_ALIVE = 15; // rows of the "alive at the peak" table
const MAX_BANDS = 8; // modules drawn as their own band in "by module"; the rest summed as one
const MAX_FINDING_STEPS = 8; // of a finding's steps, the ones whose step events are read for its evidence (as many as its steps text names)
// a finding's steps marked on the per-step charts, in its severity's colour (style.css's badges)
const SEVERITY_COLOR = { error: "#dc2626", warning: "#d97706", info: "#2563eb" };
const BASE_COLOR = "#9ca3af", OTHER_COLOR = SERIES[8];
// the in-step timeline drawn "by module" (?timeline=module), and the finding followed here
// (?finding=P6: a reload, Back or Forward shows its note again), read once as the page loads
const ASKED = (() => {
  try {
    const q = new URLSearchParams(location.search);
    return { timeline: q.get("timeline"), finding: q.get("view") === "memory" ? q.get("finding") : null };
  } catch { return {}; }
})();
const TOTAL_TITLE = "live bytes after each recorded op (the forward's; in full mode backward's and optimizer.step()'s too) — click a point to open the op in the graph";
const BANDS_TITLE = "live bytes after each recorded op, stacked by the module whose op made each tensor (bottom: what the step " +
  `held before its first op; the ${MAX_BANDS} largest modules by their own highest point, the rest as "other modules") — click a point to open the op in the graph`;

// "live" is the state every step keeps (parameters, gradients, optimizer state): activations
// saved for backward come and go inside the step, so they may exceed it
const CATEGORIES = [["live", "live state (params + grads + optimizer)"], ["peak", "peak"], ["allocated", "allocated"], ["reserved", "reserved"], ["params", "parameters"],
  ["grads", "gradients"], ["optimizer", "optimizer state"], ["saved", "saved activations"],
  ["temporaries", "temporaries (captured steps)"], ["kept", "saved by earlier steps' graphs still alive (P7)"], ["other", "other (CUDA allocator)"]];

// The two peaks this view shows, and why they differ, in PyTorch's words.
const STEP_PEAK = "peak: the most bytes a step held at once — the state kept between steps (parameters, their .grad, " +
  "the optimizer state) plus the activations autograd saved for backward, or, on a captured step, the op ledger's highest " +
  "point when that is higher (in full mode, whose ledger runs through the whole step, that point itself).";
const STEP_PEAK_LIGHT = "peak: the most bytes a step held at once — the state kept between steps (parameters, their " +
  ".grad, the optimizer state) plus the activations autograd saved for backward (mode=\"light\" records no op, so no " +
  "in-step ledger: temporaries are not in it).";
const OP_PEAK = "The in-step peak below is one captured step's op ledger alone: the live bytes after each recorded op. In " +
  "default mode those are the forward's ops only (full mode records backward() and optimizer.step() too): the .grad " +
  "tensors backward() writes and what optimizer.step() allocates come after them. So it is at most the per-step peak above.";

export class MemoryView {
  constructor(root, app) {
    this.app = app;
    this.root = root;
    this.info = h("p", { class: "muted" });
    this.stepSel = h("select", { "aria-label": "step for the in-step timeline", "data-testid": "memory-step", onchange: () => this.loadTimeline(+this.stepSel.value) });
    // the Doctor's finding the user followed here: what it found, where, and its steps marked
    // on the per-step charts (QA 43: P6's evidence was nowhere in this view)
    this.findingBox = h("div", { class: "notice", "data-testid": "memory-finding", hidden: true });
    root.append(this.findingBox, h("h2", {}, "Memory per step"), this.info);
    this.perStep = new LineChart(root, { title: "bytes at each step boundary", fmt: fmtBytes,
      vlines: () => (this.focus !== undefined ? [{ x: this.focus, label: `step ${this.focus}` }] : []),
      onClick: (i) => { const s = this.series.step[i]; if (this.captured.includes(s)) { this.stepSel.value = s; this.loadTimeline(s); } } });
    // a graph kept across steps (P7): its node count, shown once there is any (the bytes it
    // holds saved for backward are the "kept" category above; a backward without
    // retain_graph freed them, and what is left, its nodes, only this chart shows)
    this.aliveBox = h("div", { "data-testid": "graphs-alive", hidden: true });
    // tensors user forward hooks keep (P13: a hook appending activations to a list): its bytes
    this.hooksBox = h("div", { "data-testid": "hook-bytes", hidden: true });
    this.perStepNote = h("p", { class: "muted", "data-testid": "step-peak-note" }, STEP_PEAK);
    root.append(this.perStepNote, this.aliveBox, this.hooksBox);
    const mark = () => (this.focus !== undefined ? [{ x: this.focus, label: `step ${this.focus}` }] : []);
    // (what the capture counts, _watch.py _graphs_alive: at step N's optimizer.step(), the graphs
    // built before step N-1's; a forward after step N's optimizer.step() is step N+1's, so an
    // evaluation there shows from step N+2 on, where the Doctor's P6 tells it as step N's)
    this.alive = new LineChart(this.aliveBox, { title: "autograd nodes still alive at each step boundary of graphs built before the previous " +
      "step's optimizer.step() (P7: a graph kept across steps; a graph built after step N's optimizer.step(), such as an " +
      "evaluation's, shows from step N+2 on, while something still holds it)", height: 140, vlines: mark });
    this.hooks = new LineChart(this.hooksBox, { title: "bytes of tensors kept by forward hooks at each step boundary (P13: a hook storing activations)",
      height: 140, fmt: fmtBytes, vlines: mark });
    // one line, or stacked by module (only a file with the frees, format 1.9, knows what is alive)
    this.by = (app.state.timeline ?? ASKED.timeline) === "module" ? "module" : "total";
    if (ASKED.finding && app.state.finding === undefined) app.setState({ finding: ASKED.finding }); // (kept in the URL until its note is closed)
    this.bySel = h("select", { "aria-label": "what the in-step timeline draws", "data-testid": "timeline-by", onchange: () => this.setBy(this.bySel.value) },
      h("option", { value: "total" }, "total"), h("option", { value: "module" }, "by module"));
    this.bySel.value = this.by;
    this.bySel.hidden = !hasLifetimes(app.meta);
    if (this.by === "module") app.setState({ timeline: "module" }); // (kept in the URL as the view's other state)
    root.append(h("h2", {}, "Inside a step: live bytes op by op ", this.stepSel, " ", this.bySel));
    this.timelineNote = h("p", { class: "muted", "data-testid": "timeline-note", hidden: true });
    // a step asked for (a finding's, a chart click's) that has no graph: which one is shown instead
    this.stepNote = h("p", { class: "notice", "data-testid": "memory-step-note", hidden: true });
    this.peakNote = h("p", { class: "muted", "data-testid": "peak-note" }, OP_PEAK);
    root.append(this.timelineNote, this.stepNote, this.peakNote);
    this.timeline = new LineChart(root, { title: TOTAL_TITLE, fmt: fmtBytes, xLabel: "op", xTitle: "op # (recorded order) →",
      onClick: (i) => this.openOp(i), tipLabel: (i) => this.opLabel(i), vlines: () => this.phaseLines() });
    this.timeline.root.dataset.testid = "in-step-timeline";
    this.top = h("div", { class: "top-allocs" });
    root.append(this.top);
  }

  async load() {
    // a light run captures no step: its peak is the state plus the saved activations, no ledger (QA 45c)
    if (this.app.meta?.mode === "light") this.perStepNote.textContent = STEP_PEAK_LIGHT;
    await this.fetchSteps();
    if (ASKED.finding && !this.finding) await this.findAsked(ASKED.finding);
    const asked = this.app.state.step, want = asked ?? this.captured[0];
    if (want !== undefined) await this.loadTimeline(want, asked === undefined);
  }

  // The per-step series, its step count and the captured steps the timeline can show: at
  // load, and again as a live run adds steps (the selected step stays selected).
  async fetchSteps() {
    const [series, graphs] = await Promise.all([api(`${sessionPath(this.app.id)}/memory?${rankQuery(this.app.rank)}`),
      api(`${sessionPath(this.app.id)}/graphs?${rankQuery(this.app.rank)}`)]);
    this.series = series;
    this.info.textContent = series.step && series.step.length ? `${series.step.length} step${series.step.length === 1 ? "" : "s"}` : "No steps recorded yet.";
    this.drawPerStep();
    const captured = [...new Set(graphs.map((g) => g.step))].sort((a, b) => a - b);
    if (this.captured && captured.length === this.captured.length && captured.every((st, i) => st === this.captured[i])) return;
    this.captured = captured;
    this.onStatus();
    const chosen = this.stepSel.value;
    clear(this.stepSel).append(...captured.map((st) => h("option", { value: st }, `step ${st}`)));
    if (chosen !== "") this.stepSel.value = chosen;
  }

  // Whether the run's memory is a CUDA device's: the allocator's figures (allocated, reserved,
  // "other") exist only there, and a CPU run must not read as if it had them.
  cuda() {
    const s = this.series || {};
    return /^cuda/.test(this.app.meta?.device || "") || ["allocated", "reserved", "other"].some((k) => (s[k] || []).some((v) => v !== null && v !== undefined));
  }

  drawPerStep() {
    const s = this.series;
    const cuda = this.cuda();
    this.perStep.setTitle(cuda ? "bytes at each step boundary (allocated / reserved come from the CUDA caching allocator)"
      : "bytes at each step boundary, counted from the tensors' storages");
    // a category with no value anywhere (no CUDA, no captured step) is left out of the legend
    const shown = CATEGORIES.filter(([k]) => (s[k] || []).some((v) => v !== null && v !== undefined))
      .map(([k, name]) => [k, k === "other" && !cuda ? "other (not in a named tensor)" : name]);
    const marks = this.findingMarks();
    const alive = s.graphs_alive || [];
    this.aliveBox.hidden = !alive.some((v) => v > 0);
    if (!this.aliveBox.hidden) this.alive.setData(s.step || [], [{ name: "nodes alive", y: alive }], marks);
    const kept = s.hook_bytes || [];
    this.hooksBox.hidden = !kept.some((v) => v > 0);
    if (!this.hooksBox.hidden) this.hooks.setData(s.step || [], [{ name: "kept by forward hooks", y: kept }], marks);
    return this.perStep.setData(s.step || [], shown.map(([k, name]) => ({ name, y: s[k] || [] })), marks);
  }

  // The Doctor's finding followed here (null: none, its note closed): its code, title and
  // steps, its message (its numbers as the Doctor formats them), its source lines, and its
  // steps marked at the top of the per-step charts; for P6 the forwards themselves.
  async showFinding(f) {
    this.finding = f || null;
    this.app.setState({ finding: f?.code });
    findingNote(this.findingBox, f, "memory", () => this.showFinding(null),
      f ? h("div", { class: "muted" }, `${stepsText(f) || "Its steps"} marked at the top of the per-step charts below.`) : null);
    if (this.series) this.drawPerStep();
    if (!f) return;
    if (f.code === "P6" && f.data?.forwards) await this.drawUnused(f);
  }

  // The finding named in the page's URL (a reload, Back, Forward): the Doctor's of this rank.
  async findAsked(code) {
    const all = await api(`${sessionPath(this.app.id)}/diagnostics?${rankQuery(this.app.rank)}`).catch(() => []);
    const mine = all.filter((f) => f.code === code && f.view === "memory");
    const f = mine.find((x) => (x.steps || []).includes(this.app.state.step)) || mine[0];
    if (f) await this.showFinding(f);
  }

  findingMarks() {
    const color = SEVERITY_COLOR[this.finding?.severity] || SEVERITY_COLOR.info;
    return (this.finding?.steps || []).map((x) => ({ x, color }));
  }

  // P6's forwards, one a row, from the step events that hold them: no per-step series has them
  // ("saved activations" is the most the graphs backward() went through held), and an evaluation
  // run after step N's optimizer.step() is in step N+1's event -- the Doctor tells it with step
  // N, as it ran after it (doctor/run.py step_of_forward): both are said.
  async drawUnused(f) {
    const steps = (f.steps || []).slice(0, MAX_FINDING_STEPS);
    const got = await Promise.all(steps.map((s) => api(`${sessionPath(this.app.id)}/steps?start=${s}&end=${s + 1}&${rankQuery(this.app.rank)}`).catch(() => [])));
    if (this.finding !== f) return; // (another finding, or none, since)
    const events = [...new Map(got.flat().map((ev) => [ev.step, ev])).values()].sort((a, b) => a.step - b.step);
    const rows = [];
    for (const ev of events) {
      const fw = ev.forwards || [];
      const trained = fw.findIndex((x) => x.backward === true);
      fw.forEach((x, i) => {
        if (x.built_graph !== true || x.backward !== false) return;
        // before the step's trained forward: it ran after the previous step's optimizer.step()
        const after = ev.step > 0 && i < trained;
        if (!steps.includes(ev.step) && !(after && steps.includes(ev.step - 1))) return;
        rows.push(h("tr", {},
          h("td", {}, after ? `after step ${ev.step - 1}'s optimizer.step() (recorded with step ${ev.step})` : `in step ${ev.step}`),
          h("td", { class: "src" }, x.src || "–"), h("td", {}, x.training === false ? "eval" : "train"),
          h("td", {}, x.saved_bytes === undefined ? "–" : fmtBytes(x.saved_bytes))));
      });
    }
    if (!rows.length) return;
    this.findingBox.append(h("table", { class: "tensors", "data-testid": "memory-finding-forwards" },
      h("tr", {}, ...["forward no backward() used: ran", "source", "mode", "saved for backward"].map((x) => h("th", {}, x))), rows),
    h("div", { class: "muted" }, "Their saved activations are not in \"saved activations\" below, the most that the graphs " +
      "backward() went through held; one still held at a later step's end (its output, or a loss made from it, kept in a " +
      "variable) is in \"saved by earlier steps' graphs still alive\" there."));
    if (f.steps.length > steps.length) this.findingBox.append(h("div", { class: "muted" }, `(of its first ${steps.length} steps of ${f.steps.length})`));
  }

  // ``auto``: the first captured step, shown because the user asked for none: not marked,
  // nor written to the URL (the other views would mark it).
  async loadTimeline(step, auto = false) {
    this.focus = auto ? undefined : step; // the step asked for (a finding's, a click's), marked on the per-step chart
    this.perStep.draw();
    if (!this.aliveBox.hidden) this.alive.draw();
    if (!this.hooksBox.hidden) this.hooks.draw();
    if (!this.captured?.length) return;
    const asked = step;
    if (!this.captured.includes(step)) step = nearest(this.captured, step);
    this.stepNote.hidden = auto || asked === step;
    this.stepNote.textContent = this.stepNote.hidden ? "" : `Step ${asked} has no captured graph: the op-by-op timeline below is step ${step}'s, the nearest captured.`;
    this.stepSel.value = step;
    if (!auto) this.app.setState({ step: asked }); // the step asked for stays in the URL
    const ev = await api(`${sessionPath(this.app.id)}/graph?step=${step}${this.app.rank !== undefined ? "&rank=" + this.app.rank : ""}`);
    this.graph = ev;
    this.opById = new Map((ev.ops || []).map((o) => [o.id, o]));
    const tl = ev.memory_timeline && ev.memory_timeline.length ? ev.memory_timeline : (ev.ops || []).filter((o) => o.live !== undefined).map((o) => [o.id, o.live]);
    this.tl = tl;
    this.lives = hasLifetimes(this.app.meta) ? lifetimes(ev) : null;
    this.drawTimeline();
    this.drawTop(ev, tl);
  }

  setBy(by) {
    this.by = by === "module" ? "module" : "total";
    this.app.setState({ timeline: this.by === "module" ? "module" : undefined });
    if (this.tl) this.drawTimeline();
  }

  // The in-step timeline: the live bytes as one line, or "by module" stacked bands whose sum
  // is that line (the baseline plus what lifetimes() has alive after each op).
  drawTimeline() {
    const bands = this.by === "module" && this.lives ? this.moduleBands() : null;
    this.timeline.opts.stacked = !!bands;
    this.timeline.setTitle(bands ? BANDS_TITLE : TOTAL_TITLE);
    return this.timeline.setData(this.tl.map((_, i) => i), bands || [{ name: `live bytes, step ${this.graph.step}`, y: this.tl.map((p) => p[1]) }]);
  }

  // The bands, bottom up: what the step began with, then each module's allocations still alive
  // (forward order: the first made first), the largest MAX_BANDS by their own highest point,
  // the others summed on top.  ``keys``: the groups of a band (bandOf's keys, for the tests).
  moduleBands() {
    const ids = this.tl.map((p) => p[0]), band = new Map(), names = new Map();
    for (const l of this.lives) { const b = this.bandOf(l.made); band.set(l, b.key); names.set(b.key, b.name); }
    const tops = highestBy(this.lives, ids, (l) => band.get(l));
    const keys = [...tops.keys()]; // (first made first)
    const kept = new Set(keys.length > MAX_BANDS + 1 ? keys.slice().sort((a, b) => tops.get(b) - tops.get(a)).slice(0, MAX_BANDS) : keys);
    const rest = keys.filter((k) => !kept.has(k));
    const OTHER = "\0other";
    const by = aliveBy(this.lives, ids, (l) => (kept.has(band.get(l)) ? band.get(l) : OTHER));
    const bands = [{ name: "held before the step's first op (parameters, .grad, optimizer state, inputs)", y: baselineAfter(this.graph, this.lives, ids), color: BASE_COLOR, keys: [] }];
    keys.filter((k) => kept.has(k)).forEach((k, i) => bands.push({ name: names.get(k), y: by.get(k), color: SERIES[i], keys: [k] }));
    if (rest.length) bands.push({ name: `other modules (${rest.length})`, y: by.get(OTHER), color: OTHER_COLOR, keys: rest });
    return bands;
  }

  // The band of the tensors an op made: its module (its backward apart, in full mode), the
  // loss and the like "(outside the model)", optimizer.step()'s state its own.
  bandOf(op) {
    if (op.phase === "optimizer") return { key: "optimizer", name: "optimizer.step()" };
    const outside = !op.module && (op.flags || []).includes("outside_model");
    const back = op.phase === "backward" ? " (backward)" : "";
    return { key: (outside ? "outside" : `module:${op.module || ""}`) + back, name: opWhere(op, this.app.moduleType) + back };
  }

  // What was holding memory at the in-step peak: with the frees recorded (format 1.9), the
  // tensors made in the step and still alive then; in an older file, the largest allocations
  // made up to it (some of which may have been freed before it).
  drawTop(ev, tl) {
    clear(this.top);
    if (!tl.length) return;
    let peakI = 0;
    tl.forEach((p, i) => { if (p[1] > tl[peakI][1]) peakI = i; });
    if (hasLifetimes(this.app.meta)) return this.drawAlive(ev, tl[peakI]);
    const upTo = new Set(tl.slice(0, peakI + 1).map((p) => p[0]));
    const tensors = new Map((ev.tensors || []).map((t) => [t.id, t]));
    const ops = (ev.ops || []).filter((o) => upTo.has(o.id) && o.alloc > 0).sort((a, b) => b.alloc - a.alloc).slice(0, 10);
    this.top.append(h("h3", { title: OP_PEAK }, `In-step peak ${fmtBytes(tl[peakI][1])} after op #${tl[peakI][0]} — largest allocations before it`),
      h("table", { class: "tensors" }, h("tr", {}, ...["bytes", "op", "module", "output shape", ""].map((x) => h("th", {}, x))),
        ops.map((o) => h("tr", {}, h("td", {}, fmtBytes(o.alloc)), h("td", {}, o.name), h("td", {}, opWhere(o, this.app.moduleType)),
          h("td", {}, shape(tensors.get((o.outputs || [])[0])?.shape)),
          h("td", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); this.app.openNode(this.graph.step, "o" + o.id); } }, "show in graph"))))));
  }

  drawAlive(ev, [peakId, peakLive]) {
    const peakOp = this.opById.get(peakId);
    if (!peakOp) return;
    const alive = aliveAfter(this.lives, peakOp).sort((a, b) => b.bytes - a.bytes);
    const made = alive.reduce((a, l) => a + l.bytes, 0), before = baseline(ev);
    const held = baselineAfter(ev, this.lives, [peakId])[0]; // (less the .grad zero_grad() freed before it)
    const show = (o) => h("a", { href: "#", onclick: (e) => { e.preventDefault(); this.app.openNode(this.graph.step, "o" + o.id); } }, `#${o.id}`);
    const until = (l) => (l.freed ? h("span", {}, `freed in #${l.freed.id} ${l.freed.name} (${l.freed.phase || "forward"})`)
      : h("span", { class: "muted" }, "still alive after the last recorded op"));
    const rows = alive.slice(0, MAX_ALIVE).map((l) => h("tr", { "data-sid": l.sid },
      h("td", {}, fmtBytes(l.bytes)),
      // the module as the by-module bands name it: "layers.11.linear2 (backward)" for a weight's
      // gradient backward() made, which read as the forward's tensor (QA 50b)
      h("td", {}, show(l.made), " ", l.made.name), h("td", {}, this.bandOf(l.made).name),
      h("td", {}, shape(l.tensor.shape)), h("td", {}, l.tensor.dtype || "–"), h("td", { class: "src" }, l.made.src || "–"), h("td", {}, until(l))));
    this.top.append(
      h("h3", { title: OP_PEAK }, `In-step peak ${fmtBytes(peakLive)} after op #${peakId} ${peakOp.name} — what was alive then`),
      h("p", { class: "muted", "data-testid": "alive-summary" },
        (held < before
          ? `${fmtBytes(held)} of what the step held when its recording began (parameters, the .grad and optimizer state that existed then, the forward's inputs: ` +
            `${fmtBytes(before)}, less ${fmtBytes(before - held)} of .grad freed before the backward by zero_grad()) + `
          : `${fmtBytes(before)} held when the step's recording began (parameters, the .grad and optimizer state that existed then -- none before the first step's backward and update --, the forward's inputs) + `) +
        `${fmtBytes(made)} in ${alive.length} tensor${alive.length === 1 ? "" : "s"} made in the step and not yet freed` +
        (alive.length > MAX_ALIVE ? ` (the largest ${MAX_ALIVE} below)` : "") + "."),
      h("table", { class: "tensors", "data-testid": "alive-at-peak" },
        h("tr", {}, ...["bytes", "made by op", "module", "shape", "dtype", "source", "until"].map((x) => h("th", {}, x))), rows));
  }

  // No captured step (a light run; a run before its first captured step): a sentence saying
  // why, not an empty step list over a chart that says "No data yet" for good.
  onStatus() {
    const none = !this.captured?.length;
    this.timelineNote.hidden = !none;
    this.stepSel.hidden = this.timeline.root.hidden = this.peakNote.hidden = none;
    this.bySel.hidden = none || !hasLifetimes(this.app.meta);
    if (none) this.timelineNote.textContent = `The op-by-op timeline comes from a captured step's graph. ${this.app.emptyText("graph")}`;
  }

  opLabel(i) {
    const op = this.opById?.get(this.tl[i][0]);
    return op ? `#${op.id} ${op.name} · ${opWhere(op, this.app.moduleType)} · ${op.phase || "forward"}` : `op ${this.tl[i][0]}`;
  }

  // A dashed line where each phase (forward, backward, optimizer) starts.
  phaseLines() {
    const res = [];
    let prev = null;
    (this.tl || []).forEach((p, i) => {
      const ph = this.opById?.get(p[0])?.phase || "forward";
      if (ph !== prev && i > 0) res.push({ x: i, label: ph });
      prev = ph;
    });
    return res;
  }

  openOp(i) {
    const p = this.tl && this.tl[i];
    if (p) this.app.openNode(this.graph.step, "o" + p[0]);
  }

  onStep() { // live: append without touching the timeline the user is reading
    this.reload ||= coalesce(async () => {
      const had = this.tl !== undefined;
      await this.fetchSteps();
      // the run's first captured step, while this view shows (and asks for) none yet
      const asked = this.app.state.step;
      if (!had && this.captured.length && !this.root.hidden) await this.loadTimeline(asked ?? this.captured[0], asked === undefined);
    }, 500);
    this.reload();
  }

  debug() {
    return { steps: this.series?.step?.length || 0, timeline: this.tl?.length || 0, drawMs: this.perStep.lastDrawMs,
      info: this.info.textContent, options: [...this.stepSel.options].map((o) => +o.value), selected: this.stepSel.value,
      graphsAlive: this.aliveBox.hidden ? null : Math.max(...(this.series?.graphs_alive || []).map((v) => v || 0)),
      hookBytes: this.hooksBox.hidden ? null : Math.max(...(this.series?.hook_bytes || []).map((v) => v || 0)),
      finding: this.finding?.code ?? null, findingMarks: this.perStep.markers.map((m) => m.x),
      categories: (this.perStep.series || []).map((s) => s.name), timelineAxis: this.timeline.axis, timelineBy: this.by,
      bands: this.timeline.opts.stacked ? this.timeline.series.map((s) => s.name) : null };
  }
}
