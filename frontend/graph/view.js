// The Graph view: step scrubber, overlays, search, module expansion, details panel, diff.
// Layout runs in a Web Worker; the main thread only builds the scene and draws.
import { h, clear, coalesce, fmtShort, fmtBytes, fmtUs, withLoading } from "../dom.js";
import { api, sessionPath, rankQuery } from "../api.js";
import { buildModel, ancestors } from "./model.js";
import { diffGraphs } from "./diff.js";
import { buildScene, lossPath, leafSub } from "./scene.js";
import { GraphCanvas, TEXT_MIN_SCALE } from "./render.js";
import { renderDetails, nodeSummary } from "./details.js";
import { TopOps } from "./topops.js";
import { Minimap } from "./minimap.js";
import { NONFINITE, rampLegend, legendItem } from "../colors.js";
import { THEME_EVENT } from "../theme.js";

const CANCEL_MS = 300;
const SEARCH_MS = 150; // typing pauses this long before the matches are marked (a 10k-node graph redraws)
const CONTAINERS = new Set(["ModuleList", "ModuleDict"]);

// The captured step closest to `step` (the last one at or before it, else the first).
export function nearest(captured, step) {
  let best = captured[0];
  for (const s of captured) if (s <= step) best = s;
  return best;
}
// What a zero of each numeric overlay means (its own colour, outside the ramp)
const ZERO_TEXT = { grad: "exactly zero", memory: "0 B: allocated / saved nothing (a view, an in-place op)", time: "0 µs" };
// Short names (the legend under the canvas says the rest): with the diff's step menu beside
// it, "phase (forward / backward)" made the toolbar two rows at 1280 px; in full on hover.
const OVERLAYS = [["phase", "phase", "forward / backward"], ["grad", "gradient norm", "the gradient norm of each parameter (AccumulateGrad) and module"],
  ["memory", "memory", "bytes an op allocated, bytes a grad_fn saved; a collapsed backward module: its saved activations, each storage once, parameters left out"],
  ["time", "time", "an op's or a grad_fn's duration; a collapsed backward module: its grad_fn nodes' (their aten kernels are inside them)"], ["dtype", "dtype", "the output's dtype"],
  ["diff", "diff", "added / changed / same against another captured step (the menu beside it), of this run or of another (the run menu in the legend bar)"]];
const NO_DIFF = "only one step is captured: no other step to compare with";
// The other runs the diff offers (GET /api/sessions, newest first): the MAX_RUNS most recent
// ones (light-mode runs, which capture no graph, left out first), those with a captured graph;
// of each its first MAX_RUN_STEPS captured steps.  The menus say what they leave out.
const MAX_RUNS = 20, MAX_RUN_STEPS = 10;
// This run's diff menu: the captured steps nearest the one shown, at most MAX_OWN_STEPS.  A
// full-mode run captures every step: a menu of all of them, rebuilt at each live graph, froze a
// live 12,000-step run's page for minutes (QA 51a).
const MAX_OWN_STEPS = 40;

// The page's query as it was loaded, read before the app rewrites the URL from the state it
// knows (which has no top= / topby=): ?top=1 opens the Top ops table (top=nodes: the grad_fn
// nodes', top=backward / optimizer / all: those ops'), &topby=module groups it by module,
// &topsort=mean (a column, in its first order) or &topsort=name-desc sorts it.
const LOADED_QUERY = new URLSearchParams(location.search);
const TOP_SECTION = { 1: "forward", true: "forward", forward: "forward", backward: "backward", optimizer: "optimizer", all: "all", nodes: "nodes" };
// &diffrun=<session id>&diffstep=N: the diff against that run's captured step (with overlay=diff)
const ASKED_DIFF = LOADED_QUERY.get("diffrun")
  ? { run: LOADED_QUERY.get("diffrun"), step: /^\d+$/.test(LOADED_QUERY.get("diffstep") || "") ? +LOADED_QUERY.get("diffstep") : undefined } : null;
// Export PNG: the caps on the image (a side, all its pixels), past which the current view is exported
const PNG_MAX_SIDE = 8192, PNG_MAX_PIXELS = 32 * 1024 * 1024;

// Why a graph is partial: a step past max_ops records its first ops and counts the rest; a
// recorder that failed partway (its error is in the run's log) has no count.
function partialNote(ev, cap, compiled) {
  const shed = ev.shed_ops || 0;
  if (!shed && !compiled && !(ev.ops || []).length && (ev.nodes || []).length) {
    // no recorder ran: the model's own forward() never did (a container whose submodules the
    // loop calls directly), and the capture learned of those calls on this step (QA 48b: "the
    // op recorder stopped ... its error is in the run's log", of a log with no error)
    return "No op of this step was recorded: the loop called the model's submodules, not the model itself, and the " +
      "capture starts recording ops at a forward() call it knows of -- it learned of those calls on this step. " +
      "The grad_fn graph is whole; later captured steps record the ops too.";
  }
  if (!shed) return "Partial graph: the op recorder stopped partway through this step (its error is in the run's log).";
  const ran = (ev.ops || []).length + shed;
  return `Partial graph: this step ran ${ran.toLocaleString("en-US")} ops and its graph holds the first ${(cap || ran - shed).toLocaleString("en-US")} ` +
    `(watch(..., max_ops=N) records more); ${shed.toLocaleString("en-US")} are not shown.`;
}

// Whether keys typed into ``el`` are text: a text-like input, a textarea, a select (its
// type-ahead), an editable element.  A button, checkbox or the step slider is not.
const NOT_TEXT = new Set(["button", "checkbox", "radio", "range", "submit", "reset", "color", "file", "image"]);
export function typingIn(el) {
  if (!el) return false;
  if (el.tagName === "INPUT") return !NOT_TEXT.has((el.type || "text").toLowerCase());
  return el.tagName === "TEXTAREA" || el.tagName === "SELECT" || el.isContentEditable;
}

// The step shown and where it sits among the captured ones: "step 0 · graph 1 of 4" ("step 0
// (1/4 captured)" read as one of four steps captured, QA 41a; short: the toolbar is one row at 1280 px).
// Whether the sorted ``arr`` holds ``x`` (a reconnect replays a long run's thousands of graphs)
function sortedHas(arr, x) {
  let lo = 0, hi = arr.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (arr[mid] < x) lo = mid + 1; else hi = mid; }
  return arr[lo] === x;
}

function stepOf(step, captured) {
  return `step ${step} · graph ${captured.indexOf(step) + 1} of ${captured.length}`;
}

export class GraphView {
  constructor(root, app) {
    this.app = app;
    this.root = root;
    this.captured = [];
    this.model = null;
    this.layout = null;
    // module paths, not group keys: a module's forward and backward are separate groups, and
    // a user who opens a module expects both open (its grad_fn nodes beside its ops); kept
    // across steps so expansion survives
    this.expandedPaths = new Set();
    this.selected = app.state.node || null;
    this.sideBySide = app.state.layout !== "dag"; // side by side unless the URL asks for one DAG
    this.overlay = "phase";
    this.highlight = null;
    this.cut = new Set();
    this.reqId = 0;
    this.diffRun = ""; // what the diff compares with: "" this run, else another session's id
    this.otherRuns = new Map(); // session id -> {name, steps}: the other runs with a captured graph
    this.diffSeq = 0;
    this.startWorker();
    this.waiters = [];
    const top = LOADED_QUERY.get("top");
    this.topOps = new TopOps(this, { section: TOP_SECTION[top] || "forward", by: LOADED_QUERY.get("topby") || "name",
      sort: LOADED_QUERY.get("topsort") || "" });
    this.build();
    if (top && TOP_SECTION[top] && top !== "0") this.toggleTopOps(true);
  }

  startWorker() {
    this.worker = new Worker(new URL("./layout_worker.js", import.meta.url), { type: "module" });
    this.worker.onmessage = (m) => { this.inFlight = null; this.onLayout(m.data); };
    if (this.workerInput) this.worker.postMessage({ type: "init", input: this.workerInput });
  }

  build() {
    this.stepSel = h("input", { type: "range", min: 0, max: 0, value: 0, "aria-label": "captured step", "data-testid": "step-range",
                                oninput: () => this.showStep(this.captured[+this.stepSel.value]) });
    this.stepLabel = h("span", { class: "step-label", "data-testid": "step-label", title: "the step shown, and which of the run's captured graphs (steps with a graph) it is" }, "–");
    this.overlaySel = h("select", { "aria-label": "overlay", "data-testid": "overlay", onchange: () => this.setOverlay(this.overlaySel.value) },
      OVERLAYS.map(([v, t, title]) => h("option", { value: v, title }, t)));
    this.diffSel = h("select", { "aria-label": "diff against step", hidden: true, onchange: () => { this.diffMissing = null; this.loadDiff(); } });
    // whose step: this run's, or another run's (an extra layer, ReLU swapped for GELU); in the
    // legend bar beside the diff's counts, once another run has a captured graph -- in the
    // toolbar it made that two rows at 1280 px
    this.runSel = h("select", { "aria-label": "diff against run", "data-testid": "diff-run", class: "diff-run",
                                onchange: () => this.setDiffRun(this.runSel.value) });
    this.runPick = h("label", { class: "diff-run-pick", title: "the run whose captured step the diff compares with: this one, or another on this server (newest first)" },
      "run ", this.runSel);
    // a placeholder that fits the box (cut, "Search name, module, sha" read as a typo); the
    // rest is the tooltip
    this.search = h("input", { type: "search", placeholder: "Find op, module, shape (/)", "aria-label": "search", "data-testid": "search",
                               title: "op name, grad_fn class, module path or type, or shape: matches light up as you type; Enter: next match, Shift+Enter: previous; / from anywhere",
                               oninput: () => { clearTimeout(this.searchTimer); this.searchTimer = setTimeout(() => this.searchMark(), SEARCH_MS); },
                               onkeydown: (e) => { if (e.key === "Enter") { e.preventDefault(); this.searchNext(e.shiftKey ? -1 : 1); } } });
    this.searchInfo = h("span", { class: "muted" });
    this.cutInfo = h("span", { class: "cut-info" });
    const btn = (label, fn, title, testid) => h("button", { onclick: fn, title, "data-testid": testid }, label);
    // named in words: a screen reader said the glyphs ("◀") (QA 50b)
    const stepBtn = (glyph, by, name, key) => h("button", { onclick: () => this.stepBy(by), title: `${name} ( ${key} )`, "aria-label": name }, glyph);
    // controls that belong together wrap together: a narrow window moves a whole group to
    // the next row, never a lone "Fit"
    const group = (...kids) => h("span", { class: "tool-group" }, ...kids);
    this.toolbar = h("div", { class: "toolbar" },
      group(stepBtn("◀", -1, "previous captured step", "["), this.stepSel, stepBtn("▶", 1, "next captured step", "]"), this.stepLabel),
      group(h("label", {}, "colour ", this.overlaySel), this.diffSel), group(this.search, this.searchInfo),
      group(btn("Expand all", () => this.expandAll(), "expand every module", "expand-all"), btn("Collapse", () => this.collapseAll(), "collapse to top-level modules"),
        h("label", { title: "forward on the left flowing down, backward on the right flowing up" },
          h("input", { type: "checkbox", checked: this.sideBySide || undefined, "data-testid": "side-by-side", onchange: (e) => this.setSideBySide(e.target.checked) }), " side by side"),
        btn("Fit", () => this.canvas.fitOrOverview(), "fit to screen, readable (f); again: the whole graph", "fit")),
      this.cutInfo);
    // Top ops and Export PNG: at the right of the bar under the canvas, above the table the
    // first opens -- the toolbar is one full row at 1280 px (with the diff's step menu), and
    // two more buttons there moved a whole group to a second row
    this.topBtn = h("button", { onclick: () => this.toggleTopOps(), "aria-pressed": "false", "data-testid": "top-ops-toggle",
      title: "Top ops: this step's ops (or grad_fn nodes) by name or module -- calls, time, share, bytes -- as the profiler's table; a row lights its ops up in the graph" }, "Top ops");
    this.pngBtn = btn("Export PNG", () => this.exportPng().catch((e) => this.exportNote(`Export failed: ${e.message}`)),
      "the whole graph as laid out now (expanded modules, colours, highlight) as a PNG image; past 8192 px a side or 32 MP, the current view", "export-png");
    // an application (its own keys) whose label a screen reader reads -- a canvas with no role
    // was not exposed at all -- and a live region that says the node n / p / a click selects (QA 50b)
    this.canvasEl = h("canvas", { tabindex: 0, role: "application", "aria-label": "computation graph; n / p: next / previous node, Enter: expand, Backspace: collapse" });
    this.announce = h("div", { class: "sr-only", role: "status", "aria-live": "polite", "data-testid": "graph-announce" });
    this.legend = h("div", { class: "legend", "data-testid": "legend" });
    this.status = h("div", { class: "graph-status" });
    this.stage = h("div", { class: "stage" }, this.canvasEl, this.status, this.announce);
    this.details = h("aside", { class: "details", "data-testid": "details" });
    // the legend is a bar under the canvas, not over it: floating there it hid the nodes at
    // the bottom left of every graph taller than the canvas, wherever the user panned
    this.root.append(this.toolbar, h("div", { class: "graph-body" }, h("div", { class: "graph-main" }, this.stage,
      h("div", { class: "graph-foot" }, this.legend, h("span", { class: "graph-foot-tools" }, this.topBtn, this.pngBtn)), this.topOps.el), this.details));
    this.canvas = new GraphCanvas(this.canvasEl, {
      onSelect: (it) => this.select(it ? it.key : null),
      onDblClick: (it) => { if (it && it.group !== undefined) this.toggleGroup(it.group); },
      // the status line floats over the canvas's top: a fitted graph starts below it
      topInset: () => (this.status.textContent ? this.status.offsetHeight + 10 : 0),
    });
    // the whole graph small in the canvas's corner, its viewport following the main view's
    this.minimap = new Minimap(this.stage, this.canvas);
    this.canvas.afterDraw = () => this.minimap.update();
    window.addEventListener(THEME_EVENT, () => this.redraw());
    // The view's keys work wherever the focus is, not on the canvas alone: a toolbar button
    // keeps the focus once clicked, and "f" after "Expand all" did nothing.  Not while the
    // user types (the search box, a select's type-ahead), nor with Ctrl / Alt / Meta (the
    // browser's own keys), nor Enter on a button or link, which it presses.
    document.addEventListener("keydown", (e) => {
      if (this.root.hidden || e.ctrlKey || e.altKey || e.metaKey || typingIn(document.activeElement)) return;
      if (e.key === "/") { e.preventDefault(); this.search.focus(); return; } // the search box from anywhere
      const el = document.activeElement;
      if (e.key === "Enter" && el && el !== document.body && el !== this.canvasEl) return;
      this.onKey(e);
    });
    renderDetails(this.details, null, null, this.ctx());
  }

  ctx() {
    const app = this.app;
    return {
      select: (k) => this.select(k, true), togglePath: (k) => this.togglePath(k), toggleGroup: (g) => this.toggleGroup(g),
      isExpanded: (g) => this.isExpanded(g),
      moduleType: app.moduleType, moduleRepr: app.moduleRepr, params: app.meta?.params || [], paramNorm: this.paramNorm, paramDtype: app.paramDtype,
      diff: this.diff, gradStats: (p) => this.gradStats(p),
    };
  }

  async load() {
    this.captured = (await api(`${sessionPath(this.app.id)}/graphs?${rankQuery(this.app.rank)}`)).map((g) => g.step);
    this.captured = [...new Set(this.captured)].sort((a, b) => a - b);
    this.stepSel.max = Math.max(0, this.captured.length - 1);
    // no graph: no step to scrub, nothing to colour or expand (a light run never has one)
    this.toolbar.hidden = !this.captured.length;
    this.hasGraph(this.captured.length > 0);
    if (!this.captured.length) { this.status.textContent = this.app.emptyText("graph"); return; }
    // the other runs the diff can compare with: waited for only when the URL asks for one
    const runs = this.loadOtherRuns().then(() => {
      if (this.step === undefined) return;
      this.fillDiff();
      // the run menu joins the legend (and a diff with no step to compare with says it is there)
      if (this.overlay === "diff" && this.scene) { if (this.diff) this.drawLegend(); else this.loadDiff(); }
    }, () => {});
    if (ASKED_DIFF) { await runs; await this.askDiff(ASKED_DIFF); }
    const asked = this.app.state.step;
    await this.showStep(asked ?? this.captured[0], asked === undefined);
  }

  onStatus() { if (!this.captured.length) this.status.textContent = this.app.emptyText("graph"); }

  // With no graph (a light run, a live run before its first captured step) nothing can be
  // exported, tabled or clicked: the buttons go and the details panel says so (QA 48b: an empty
  // Top ops table, "Export failed: no graph shown", "Click a node to see its details").
  hasGraph(yes) {
    this.topBtn.hidden = this.pngBtn.hidden = !yes;
    if (!yes) {
      if (this.topOps.open) this.toggleTopOps();
      clear(this.details).append(h("p", { class: "muted", "data-testid": "details-empty" }, "No graph to show: the details of its ops and grad_fn nodes appear here once a step's graph is captured."));
    }
  }

  // ``auto``: the step shown because the user asked for none (the first captured one): not
  // written to the URL, whose step= the other views mark as the one the user picked.
  async showStep(step, auto = false) {
    if (step === undefined || !this.captured.length) return;
    // e.g. a finding's or a chart's step that has no graph: the nearest captured one, said so
    this.askedStep = this.captured.includes(step) ? undefined : step;
    if (this.askedStep !== undefined) step = nearest(this.captured, step);

    this.step = step;
    this.stepSel.value = this.captured.indexOf(step);
    this.stepSel.setAttribute("aria-valuetext", `step ${step}`); // (its value is the index: "4" for step 104)
    this.stepLabel.textContent = stepOf(step, this.captured);
    if (!auto) this.app.setState({ step });
    this.fillDiff();
    const ev = await withLoading(this.stage, api(`${sessionPath(this.app.id)}/graph?step=${step}${this.app.rank !== undefined ? "&rank=" + this.app.rank : ""}`), "Loading graph…");
    if (this.step !== step) return; // scrubbed on meanwhile
    const steps = await api(`${sessionPath(this.app.id)}/steps?start=${step}&end=${step}&${rankQuery(this.app.rank)}`).catch(() => []);
    if (this.step !== step) return; // and again: a later step's graph must not get this one's facts
    this.stepEvent = (steps || []).find((s) => s.step === step) || null;
    this.t0 = performance.now(); // data arrived: first paint is measured from here
    this.computeStepFacts();
    this.model = buildModel(ev);
    // a Top ops row's highlight named the last step's ops ("o12" is another op here)
    if (this.topHi && this.highlight === this.topHi) this.highlight = null;
    this.topHi = null;
    this.topOps.render();
    const m = this.model;
    this.workerInput = {
      leafGroup: Int32Array.from(m.leaves, (l) => l.group), leafPos: Int32Array.from(m.leaves, (l) => l.pos),
      groupParent: this.layoutParents(new Set()), groupPos: Float64Array.from(m.groups, (g) => (Number.isFinite(g.pos) ? g.pos : -1)),
      edges: Int32Array.from(m.edges.flatMap((e) => [e[0], e[1]])),
      links: Int32Array.from(m.edges.flatMap((e) => (e[2] === 2 ? [e[0], e[1]] : []))), // op -> its grad_fn
      leafBackward: Uint8Array.from(m.leaves, (l) => (l.phase === "backward" ? 1 : 0)),
      groupBackward: Uint8Array.from(m.groups, (g) => (g.phase === "backward" ? 1 : 0)),
    };
    this.openContainers = null; // relayout sends the worker this graph, with its layout tree
    const inset = this.canvas.topInset(), fitted = this.fitted;
    this.status.textContent = this.statusLine(ev);
    if (this.overlay === "diff") await this.loadDiff(false);
    await this.relayout(true);
    // a note that appears over a graph already in view (a finding's step without a graph, after
    // the first captured step was shown and fitted) moves the graph down from under it, as a
    // fit does (QA 42b: it covered the top row, the first module box of a small graph)
    const grew = this.canvas.topInset() - inset;
    if (fitted && grew > 0) { this.canvas.ty += grew; this.canvas.requestDraw(); }
    if (this.selected && !this.model.byKey.has(this.selected) && !this.selected.startsWith("g:")) {
      this.selected = null; // (nor kept in the URL: a node=zz there selects nothing, QA 42b)
      if (this.app.state.node !== undefined) this.app.setState({ node: undefined });
    }
    if (this.selected) await this.select(this.selected, true);
  }

  computeStepFacts() {
    const params = this.app.meta?.params || [];
    const g = this.stepEvent?.grads || {};
    this.paramNorm = new Map();
    // Number(): a non-finite norm comes as the JSON string "NaN"/"Infinity", which the colour scale counts as NaN
    (g.norm || []).forEach((v, i) => { if (params[i] && v !== null) this.paramNorm.set(params[i].name, Number(v)); });
    const notTrained = new Set(g.not_trained || []);  // no gradient by design: no optimizer trains them
    const none = (g.none || []).filter((i) => !notTrained.has(i)).map((i) => params[i]?.name).filter(Boolean);
    const idle = [...notTrained].map((i) => params[i]?.name).filter(Boolean);
    this.noGrad = none;
    clear(this.cutInfo);
    if (none.length) this.cutInfo.append(h("button", { class: "badge err", "data-testid": "cut-params", title: none.join("\n"), onclick: () => this.showCut() }, `${none.length} param(s) got no gradient`));
    if (idle.length) this.cutInfo.append(h("span", { class: "badge", "data-testid": "not-trained", title: idle.join("\n") }, `${idle.length} param(s) not trained (in no optimizer group)`));
    // A loop that catches a failed backward (P8, P10) and goes on: the step's graph holds the
    // forward whose backward failed beside what ran after it, which reads as a duplicate
    const errors = this.stepEvent?.backward_errors || [];
    if (errors.length) {
      this.cutInfo.append(h("span", { class: "badge err", "data-testid": "backward-errors", title: errors.join("\n\n") },
        `backward() failed ${errors.length === 1 ? "once" : `${errors.length}×`} in this step`));
    }
  }

  // The line under the graph: what it does not show as it is.
  statusLine(ev) {
    const notes = [];
    if (this.askedStep !== undefined) {
      const mode = this.app.meta?.mode;
      const every = this.app.meta?.settings?.sample_every;
      const steps = this.app.summary?.steps;
      // a step past the run's end (a link's step=999) is said to be so (QA 45c)
      if (steps && this.askedStep >= steps && !this.app.running) notes.push(`This run has ${steps} step${steps === 1 ? "" : "s"} (0–${steps - 1}), no step ${this.askedStep}; showing step ${this.step}, the nearest captured.`);
      else notes.push(`Step ${this.askedStep} has no captured graph${mode === "default" ? ` (mode="default" captures the first step, every ${every || "N"} steps, each step whose structure changes and the steps after a NaN/Inf)` : ""}; showing step ${this.step}, the nearest captured.`);
    }
    // gradient accumulation: the ops are every micro-batch's (OpRecord.micro), the autograd
    // graph the first backward's only (GraphEvent.micro); unsaid, one forward read as making
    // several losses that a single backward went through
    const micros = new Set((ev.ops || []).map((o) => o.micro ?? 0));
    const passes = this.stepEvent?.micro_batches;
    if (micros.size > 1 && (passes === undefined || passes === micros.size)) {
      notes.push(`${micros.size} micro-batches: forward ops of all, backward (grad_fn) of micro-batch ${ev.micro ?? 0}.`);
    } else if (micros.size > 1) {
      // forwards that are no micro-batches of their own: a GAN's discriminator called on real,
      // fake and detached fakes, two losses (QA 48b: "4 micro-batches" of a step with 2 backwards)
      notes.push(`${micros.size} forward calls and ${passes} backward pass${passes === 1 ? "" : "es"} in this step: the forward ops of all, ` +
        `the grad_fn graph of backward pass ${(ev.micro ?? 0) + 1}.`);
    }
    const compiled = (this.stepEvent?.forwards || []).some((f) => f.compiled);
    if (ev.complete === false) notes.push(partialNote(ev, this.app.meta?.settings?.max_ops, compiled));
    // a compiled forward runs as compiled code, none of its ops through the recorder: one grad_fn
    // node stands for it (QA 44c: an empty forward column, unexplained)
    if (compiled && !(ev.ops || []).some((o) => (o.phase || "forward") === "forward")) {
      notes.push("The forward ran compiled (torch.compile): its ops are not recorded, and its grad_fn graph shows it as one node, the torch.compile region.");
    }
    // GraphEvent.failed: no step event, no backward -- the run raised (on a NaN loss, say) first
    if (ev.failed) notes.push(`The run stopped with an error in step ${ev.step}, before its backward: these are the ops its forward (and loss) ran, with no grad_fn graph.`);
    const errors = this.stepEvent?.backward_errors || [];
    if (errors.length) {
      const first = String(errors[0]).split(/[.:]/)[0];
      // the run's last step of a run that ended with an error: that backward's error ended it
      const sum = this.app.summary || {};
      const died = sum.status === "error" && ev.step >= (sum.steps ?? 0) - 1;
      notes.push(died
        ? `backward() raised in this step ("${first}…") and the run stopped with that error: the graph holds the forward whose backward failed.`
        : `backward() raised in this step ("${first}…") and the loop went on: the graph holds every forward of the step, the one whose backward failed among them.`);
    }
    return notes.join(" ");
  }

  gradStats(param) {
    const params = this.app.meta?.params || [];
    const i = params.findIndex((p) => p.name === param);
    const g = this.stepEvent?.grads;
    if (i < 0 || !g) return null;
    const res = {};
    for (const k of ["norm", "max_abs", "mean", "std", "zero_frac", "nan", "inf"]) if (g[k]) res[k] = g[k][i];
    return res;
  }

  showCut() {
    const keys = new Set();
    for (const p of this.noGrad || []) for (const k of this.model.paramOps.get(p) || []) keys.add(k);
    this.cut = keys;
    this.highlight = keys;
    // the parameters no op of the step used (a layer the forward never called) light up
    // nothing: said beside the badge, by name (QA 41a: the click did nothing visible)
    const unused = (this.noGrad || []).filter((p) => !(this.model.paramOps.get(p) || []).length);
    this.cutInfo.querySelector("[data-testid=cut-unused]")?.remove();
    if (unused.length) {
      const one = unused.length === 1;
      this.cutInfo.append(h("span", { class: "muted", "data-testid": "cut-unused" },
        `${unused.join(", ")}: no op of this step used ${one ? "it" : "them"} (${one ? "its" : "their"} module never ran in the forward)`));
    }
    this.redraw();
  }

  // nn.ModuleList and nn.ModuleDict are never called: their children run from the parent's
  // forward, between the parent's own ops (`x = x + layer(x)`).  Expanded, such a container
  // is no frame: its children are laid out among the parent's ops, where they ran, and their
  // parent in the layout is the nearest ancestor that is not an open container (-1 for the
  // container itself: laid out nowhere).
  layoutParents(expandedIdx) {
    const { groups, leaves } = this.model, type = this.app.moduleType;
    const own = new Set(leaves.map((l) => l.group));
    const open = (g) => g > 0 && expandedIdx.has(g) && !own.has(g) && CONTAINERS.has(type?.get(groups[g].path));
    return Int32Array.from(groups, (G, g) => {
      if (open(g)) return -1;
      let p = G.parent;
      while (open(p)) p = groups[p].parent;
      return p;
    });
  }

  isExpanded(g) { return !!this.model && this.expandedPaths.has(this.model.groups[g].path); }

  // Indices of the groups drawn open: every phase's group of each expanded module path.
  expandedGroups() {
    return this.model.groups.flatMap((G, g) => (g > 0 && this.expandedPaths.has(G.path) ? [g] : []));
  }

  relayout(fit = false) {
    const expanded = this.expandedGroups();
    this.expandedIdx = new Set(expanded);
    const parents = this.layoutParents(this.expandedIdx), open = parents.join(",");
    if (open !== this.openContainers) { // an open container changed: the layout's tree did
      this.openContainers = open;
      this.workerInput = { ...this.workerInput, groupParent: parents };
      this.worker.postMessage({ type: "init", input: this.workerInput });
    }
    // A layout still running after CANCEL_MS when a newer one is asked for is cancelled: the
    // worker is replaced (it cannot be interrupted mid-computation) and re-initialised.
    if (this.inFlight && performance.now() - this.inFlight > CANCEL_MS) { this.worker.terminate(); this.startWorker(); }
    const id = ++this.reqId;
    this.inFlight = this.inFlight || performance.now();
    this.worker.postMessage({ type: "layout", id, expanded, sideBySide: this.sideBySide });
    return new Promise((resolve) => this.waiters.push({ id, resolve, fit }));
  }

  onLayout(res) {
    if (res.id !== this.reqId) return; // superseded by a newer request
    this.layout = res;
    this.lastLayoutMs = res.ms;
    this.redraw();
    const waiters = this.waiters.filter((w) => w.id <= res.id);
    this.waiters = this.waiters.filter((w) => w.id > res.id);
    if (waiters.some((w) => w.fit) && !this.fitted) { this.canvas.fit(); this.fitted = true; }
    if (this.firstPaintMs === undefined) { this.firstPaintMs = null; requestAnimationFrame(() => { this.firstPaintMs = performance.now() - this.t0; }); }
    waiters.forEach((w) => w.resolve());
  }

  redraw() {
    if (!this.model || !this.layout) return;
    const ctx = this.ctx();
    // the scene drawn until now: what a new selection or highlight leaves as it was is kept
    // a diff with nothing to compare against colours nothing (every node "same" said nothing)
    const overlay = this.overlay === "diff" && !this.diff ? "phase" : this.overlay;
    this.scene = buildScene(this.model, this.layout, { expandedIdx: this.expandedIdx, overlay, ctx,
      highlight: this.highlight, cut: this.cut, selected: this.selectedVisibleKey(), sideBySide: this.sideBySide }, this.scene);
    this.canvas.setScene(this.scene);
    this.drawLegend();
    if (this.highlight !== this.topHi || !this.highlight) this.topOps.unmark();
  }

  // The Top ops table shown (``on``), hidden, or toggled; kept in the URL (top=, topby=).
  toggleTopOps(on = !this.topOps.open) {
    this.topOps.el.hidden = !on;
    this.topBtn.setAttribute("aria-pressed", String(on));
    this.topBtn.classList.toggle("on", on);
    if (on) this.topOps.render();
    else if (this.topHi && this.highlight === this.topHi) { this.highlight = this.topHi = null; this.redraw(); }
    this.onTopOpsState();
  }

  onTopOpsState() {
    const t = this.topOps;
    this.app.setState({ top: t.open ? (t.section === "forward" ? "1" : t.section) : undefined, topby: t.open && t.by === "module" ? "module" : undefined,
      topsort: t.open ? t.sortParam() : undefined });
  }

  // A Top ops row: its leaves lit up (the rest dimmed, a collapsed module holding one marked)
  // and the first of them selected and centred; the same row again: the next one.
  async highlightKeys(keys) {
    if (!this.model) return;
    const ks = keys.filter((k) => this.model.byKey.has(k));
    if (!ks.length) return;
    const same = this.topHi && this.highlight === this.topHi && ks.length === this.topHi.size && ks.every((k) => this.topHi.has(k));
    if (!same) this.highlight = this.topHi = new Set(ks);
    const i = same ? ks.indexOf(this.selected) : -1;
    const next = ks[(i + 1) % ks.length];
    this.searchInfo.textContent = ks.length > 1 ? `${ks.indexOf(next) + 1}/${ks.length}` : "";
    this.keepHighlight = true; // the others stay marked
    await this.select(next, true);
  }

  // Export PNG: the graph as laid out now (expanded modules, overlay colours, highlight and
  // selection) drawn by the canvas renderer into an image of its own and downloaded as
  // "<session>-step<N>.png": the whole graph when it fits the caps, else the current view, which
  // the image's title line says.  ``download: false`` only makes it; ``dataUrl``: the image as a
  // data: URL too (tests).  Resolves to {width, height, bytes, whole, scale, filename, dataUrl?}.
  async exportPng({ download = true, dataUrl = false } = {}) {
    if (!this.scene) throw new Error("no graph shown");
    const name = this.app.summary?.name || this.app.id || "graph";
    const header = (whole, full) => `${name} · step ${this.step} · ${this.overlay === "phase" ? "forward / backward" : this.overlay}` +
      (whole ? "" : ` · current view only: the whole graph (${full[0]}×${full[1]} px) is over the ${PNG_MAX_SIDE} px / 32 MP cap`);
    const out = this.canvas.exportCanvas({ ratio: Math.min(2, Math.max(1, window.devicePixelRatio || 1)), maxSide: PNG_MAX_SIDE, maxPixels: PNG_MAX_PIXELS, header });
    const blob = await new Promise((resolve, reject) => out.canvas.toBlob((b) => (b ? resolve(b) : reject(new Error("the browser made no image"))), "image/png"));
    const filename = `${String(name).replace(/[^\w.-]+/g, "_").replace(/^_+|_+$/g, "") || "graph"}-step${this.step}.png`;
    if (download) {
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: filename });
      document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    }
    this.exportNote(out.whole ? `Saved ${filename} (${out.width}×${out.height} px${out.scale < 1 ? `, the whole graph at ${Math.round(out.scale * 100)} %` : ""})`
      : `Saved ${filename}: the current view only (${out.width}×${out.height} px) -- the whole graph would be ${out.full[0]}×${out.full[1]} px, over the ${PNG_MAX_SIDE} px / 32 MP cap`, !download);
    const res = { width: out.width, height: out.height, bytes: blob.size, whole: out.whole, scale: out.scale, ratio: out.ratio, filename };
    if (dataUrl) {
      res.dataUrl = await new Promise((resolve, reject) => {
        const r = new FileReader();
        r.onload = () => resolve(r.result); r.onerror = () => reject(r.error);
        r.readAsDataURL(blob);
      });
    }
    return res;
  }

  // What an export did, for a few seconds over the canvas's bottom (not in the toolbar: one row)
  exportNote(text, quiet = false) {
    if (quiet) return;
    this.exportMsg?.remove();
    this.exportMsg = h("div", { class: "export-note", role: "status", "data-testid": "export-note" }, text);
    this.stage.append(this.exportMsg);
    const el = this.exportMsg;
    setTimeout(() => el.remove(), 6000);
  }

  selectedVisibleKey() { return this.visibleKey(this.selected); }

  // What stands for a leaf on screen: itself, or the outermost collapsed group around it.
  visibleKey(key) {
    if (!key || !this.model) return null;
    const l = this.model.byKey.get(key);
    if (!l) return key;
    const hidden = ancestors(this.model, l.group).filter((g) => !this.expandedIdx.has(g));
    return hidden.length ? "g:" + this.model.groups[hidden[hidden.length - 1]].key : key;
  }

  drawLegend() {
    clear(this.legend);
    const lg = this.scene.legend;
    if (!lg) {
      const kinds = [["forward op", "--op-fwd"], ["grad_fn node, backward op", "--op-bwd"], ["AccumulateGrad", "--op-acc"]];
      // full mode's optimizer.step() ops, in a colour of their own (QA 44c: not in the legend)
      const opt = this.model?.leaves?.some((l) => l.kind === "op" && l.phase === "optimizer");
      if (opt) kinds.push(["optimizer.step() op", "--op-opt"]);
      for (const [name, v] of kinds) this.legend.append(legendItem(`var(${v})`, name));
      // a collapsed module is a box in each column: its forward's colour and its backward's
      // (and the "(optimizer.step())" group's lilac: it read as a forward module, QA 50b)
      this.legend.append(opt
        ? legendItem("linear-gradient(90deg, var(--group-fwd) 33%, var(--group-bwd) 33% 67%, var(--group-opt) 67%)",
          "module, collapsed (forward | backward | optimizer.step())")
        : legendItem("linear-gradient(90deg, var(--group-fwd) 50%, var(--group-bwd) 50%)", "module, collapsed (forward | backward)"));
      this.legend.append(h("span", { class: "muted" }, "≡ n: same structure as sibling n"));
    } else if (lg.kind === "cats") {
      for (const [k, c] of lg.entries) this.legend.append(legendItem(c, k));
    } else {
      const fmt = lg.overlay === "memory" ? fmtBytes : lg.overlay === "time" ? fmtUs : fmtShort;
      const name = lg.overlay === "grad" ? "‖grad‖" : lg.overlay;
      if (!lg.positive) this.legend.append(h("span", {}, `${name}: no positive value in this step`));
      else this.legend.append(...rampLegend(name, lg.lo, lg.hi, fmt));
      if (lg.zeros) this.legend.append(legendItem(lg.zero, ZERO_TEXT[lg.overlay]));
      if (lg.nonfinite) this.legend.append(legendItem(NONFINITE, "NaN / Inf"));
      if (lg.overlay === "grad") this.legend.append(legendItem("var(--node-none)", "no gradient (.grad is None) or not a parameter"));
      else if (lg.missing) this.legend.append(legendItem("var(--node-none)", "not recorded"));
    }
    if (this.overlay === "diff" && this.otherRuns.size) this.legend.append(this.runPick);
    if (this.diffSummary && this.overlay === "diff") this.legend.append(h("span", { class: "muted" }, this.diffSummary));
  }

  async setSideBySide(on) {
    this.sideBySide = on;
    this.app.setState({ layout: on ? undefined : "dag" });
    if (this.model) { await this.relayout(); this.canvas.fit(); }
  }

  // The other runs on this server with a captured graph (this page's rank), newest first.
  async loadOtherRuns() {
    const all = await api("/api/sessions");
    const others = all.filter((s) => s.id !== this.app.id && s.mode !== "light");
    const near = others.slice(0, MAX_RUNS);
    const got = await Promise.all(near.map((s) => this.runSteps(s.id).then((steps) => ({ s, steps }), () => null)));
    for (const x of got) if (x && x.steps.length) this.otherRuns.set(x.s.id, { name: x.s.name || x.s.id, steps: x.steps, model: x.s.model });
    this.olderRuns = others.length - near.length;
  }

  async runSteps(id) {
    const gs = await api(`${sessionPath(id)}/graphs?${rankQuery(this.app.rank)}`);
    return [...new Set(gs.map((g) => g.step))].sort((a, b) => a - b);
  }

  // The URL's diffrun= / diffstep=: that run (one past the list's cut too) and that step; a
  // run not on this server (or with no graph) is said in the legend, and this run's steps offered.
  async askDiff({ run, step }) {
    if (run === this.app.id) return;
    if (!this.otherRuns.has(run)) {
      try {
        const [s, steps] = await Promise.all([api(sessionPath(run)), this.runSteps(run)]);
        if (steps.length) this.otherRuns.set(run, { name: s.name || run, steps });
      } catch { /* not on this server: said below */ }
    }
    if (!this.otherRuns.has(run)) { this.diffMissing = run; return; }
    this.diffRun = run;
    this.pendingDiffStep = step;
  }

  // The menu of runs: this one, then the others (newest first), and how many older ones are
  // not listed; in the legend while the diff is on and another run has a captured graph.
  fillRuns() {
    const runs = [...this.otherRuns];
    const named = new Map();
    for (const [, r] of runs) named.set(r.name, (named.get(r.name) || 0) + 1);
    const others = h("optgroup", { label: "other runs, newest first" }, runs.map(([id, r]) =>
      h("option", { value: id, title: `${r.name} (${id}): captured steps ${r.steps.slice(0, MAX_RUN_STEPS).join(", ")}${r.steps.length > MAX_RUN_STEPS ? ", …" : ""}` },
        `${r.name}${named.get(r.name) > 1 ? ` [${id}]` : ""}`)));
    if (this.olderRuns > 0) others.append(h("option", { value: "-", disabled: true }, `… ${this.olderRuns} older run${this.olderRuns === 1 ? "" : "s"} not listed`));
    clear(this.runSel).append(h("option", { value: "" }, "this run"), others);
    this.runSel.value = this.diffRun;
  }

  setDiffRun(id) {
    this.diffRun = this.otherRuns.has(id) ? id : "";
    this.diffMissing = null;
    this.fillDiff(false);
    this.loadDiff();
  }

  // The steps a diff can compare with.  This run's: every captured step but the one shown.  The
  // choice is kept while it is one of them; else (at first, or now the step shown) the captured
  // step before the one shown (after, for the first): what changed since last time.  Another
  // run's: its first MAX_RUN_STEPS captured steps (and the one asked for, past them); at first
  // the step of the same number, else its first.
  fillDiff(keepChoice = true) {
    let chosen = keepChoice ? this.diffSel.value : "";
    const at = this.captured.indexOf(this.step);
    const from = Math.max(0, Math.min(at - MAX_OWN_STEPS / 2, this.captured.length - MAX_OWN_STEPS - 1));
    const near = this.captured.length > MAX_OWN_STEPS + 1 ? this.captured.slice(from, from + MAX_OWN_STEPS + 1) : this.captured;
    const others = near.filter((s) => s !== this.step);
    // one captured step and no other run: nothing to diff against, so no "diff" to choose
    // (painted all "same" grey, every node read as unchanged); the option says why
    const opt = this.overlaySel.querySelector("option[value=diff]");
    opt.disabled = !others.length && !this.otherRuns.size;
    opt.title = opt.disabled ? NO_DIFF : OVERLAYS.find(([v]) => v === "diff")[2];
    this.fillRuns();
    const run = this.otherRuns.get(this.diffRun);
    if (run) {
      if (this.pendingDiffStep !== undefined) { chosen = String(this.pendingDiffStep); this.pendingDiffStep = undefined; }
      const want = chosen !== "" && run.steps.includes(+chosen) ? +chosen : run.steps.includes(this.step) ? this.step : run.steps[0];
      const listed = run.steps.slice(0, MAX_RUN_STEPS);
      if (!listed.includes(want)) listed.push(want);
      clear(this.diffSel).append(...listed.map((s) => h("option", { value: s }, `diff vs step ${s}`)));
      const cut = run.steps.length - listed.length;
      if (cut > 0) this.diffSel.append(h("option", { value: "-", disabled: true }, `… ${cut} later captured step${cut === 1 ? "" : "s"} not listed`));
      this.diffSel.value = String(want);
      return;
    }
    clear(this.diffSel).append(...others.map((s) => h("option", { value: s }, `diff vs step ${s}`)));
    const before = near === this.captured ? 0 : from, after = this.captured.length - before - near.length;
    const more = (n, which) => h("option", { value: "-", disabled: true }, `… ${n} ${which} captured step${n === 1 ? "" : "s"} (scrub to one)`);
    if (before > 0) this.diffSel.prepend(more(before, "earlier"));
    if (after > 0) this.diffSel.append(more(after, "later"));
    if (others.some((s) => String(s) === chosen)) { this.diffSel.value = chosen; return; }
    const i = this.captured.indexOf(this.step);
    const other = this.captured[i > 0 ? i - 1 : i + 1];
    if (other !== undefined) this.diffSel.value = String(other);
  }

  setOverlay(v) {
    if (![...this.overlaySel.options].some((o) => o.value === v)) v = "phase"; // (an overlay=bogus URL's: QA 42b)
    const was = this.overlay;
    this.overlay = v;
    this.overlaySel.value = v;
    this.diffSel.hidden = v !== "diff";
    if (v === "diff" && was !== "diff") {
      // a run with one captured step has only other runs to compare with: the newest of the
      // same model class, else the newest (QA 48b: a ResNet diffed against an MLP run)
      if (!this.diffRun && this.captured.length < 2 && this.otherRuns.size) {
        const model = this.app.meta?.model;
        const same = [...this.otherRuns].find(([, r]) => model && r.model === model);
        this.diffRun = same ? same[0] : this.otherRuns.keys().next().value;
      }
      // turned on: this run's step before; another run's step as chosen; the user's later choice is kept
      this.fillDiff(!!this.diffRun);
    }
    this.app.setState({ overlay: v === "phase" ? undefined : v, ...(v === "diff" ? {} : { diffrun: undefined, diffstep: undefined }) });
    if (v === "diff") this.loadDiff(); else this.redraw();
  }

  async loadDiff(redraw = true) {
    if (!this.model) return;
    const mine = ++this.diffSeq;
    const run = this.otherRuns.get(this.diffRun);
    const value = this.diffSel.value;
    // kept in the URL when it is another run's (this run's: the step before, as at first)
    this.app.setState({ diffrun: run ? this.diffRun : undefined, diffstep: run && /^\d+$/.test(value) ? +value : undefined });
    const missing = this.diffMissing ? `no run ${this.diffMissing} with a captured graph on this server; ` : "";
    if (!/^\d+$/.test(value)) { // one captured step (diff asked by the URL): nothing to compare with
      this.diff = null; // uncoloured: the phase's colours, and the legend says why
      this.diffSummary = `diff: ${missing}${NO_DIFF}${this.otherRuns.size ? "; the run menu offers other runs' steps" : ""}`;
      if (redraw) this.redraw();
      return;
    }
    const other = +value;
    const url = `${sessionPath(run ? this.diffRun : this.app.id)}/graph?step=${other}${this.app.rank !== undefined ? "&rank=" + this.app.rank : ""}`;
    let om;
    try {
      om = this.diffCache?.url === url ? this.diffCache.model : buildModel(await api(url));
    } catch (e) {
      if (mine !== this.diffSeq) return;
      this.diff = null;
      this.diffSummary = `diff: could not load ${run ? `${run.name} ` : ""}step ${other} (${e.message})`;
      if (redraw) this.redraw();
      return;
    }
    if (mine !== this.diffSeq) return; // another choice (or step) meanwhile
    this.diffCache = { url, model: om };
    const d = diffGraphs(this.model, om);
    this.diff = d.marks;
    this.diffSummary = `${missing ? `diff: ${missing}` : ""}vs ${run ? `${run.name} step` : "step"} ${other}: ${d.added} added, ${d.changed} changed, ${d.removed} removed` +
      // (a full-mode run against one in another mode: only full mode records the backward's and
      // optimizer.step()'s ops)
      (Object.keys(d.skipped).length ? `; ${Object.entries(d.skipped).map(([p, n]) => `${n} ${p === "optimizer" ? "optimizer.step()" : p} ops`).join(" and ")} ` +
        "left out (recorded in full mode by one of the runs only)" : "");
    if (redraw) this.redraw();
  }

  // The box of a group (collapsed item or expanded frame) in the current scene.
  groupBox(g) {
    const key = "g:" + this.model.groups[g].key;
    const it = this.scene?.byKey.get(key) || this.scene?.frames.find((f) => f.key === key);
    return it ? it.box : null;
  }

  async toggleGroup(g) {
    const path = this.model.groups[g].path;
    const before = this.groupBox(g);
    if (this.expandedPaths.has(path)) this.expandedPaths.delete(path); else this.expandedPaths.add(path);
    await this.relayout();
    const after = this.groupBox(g);
    if (before && after) { // keep the group where the user was looking: expanding moves nothing under the pointer
      const c = this.canvas;
      c.tx += (before[0] - after[0]) * c.scale; c.ty += (before[1] - after[1]) * c.scale;
      c.requestDraw();
    }
    if (this.selected && this.selected.startsWith("g:")) renderDetails(this.details, this.model, this.selected, this.ctx());
  }

  async expandAll() { if (!this.model) return; for (const g of this.model.groups) if (g.path) this.expandedPaths.add(g.path); await this.relayout(); this.canvas.fit(); }
  async collapseAll() { if (!this.model) return; this.expandedPaths.clear(); await this.relayout(); this.canvas.fit(); }

  // Select a leaf or group; hidden leaves get their module groups expanded first.
  async select(key, center = false) {
    this.selected = key;
    this.app.setState({ node: key || undefined });
    if (key && this.model) {
      const l = this.model.byKey.get(key);
      if (l) {
        const need = ancestors(this.model, l.group).filter((g) => !this.isExpanded(g));
        if (need.length) { need.forEach((g) => this.expandedPaths.add(this.model.groups[g].path)); await this.relayout(); }
      }
    }
    if (this.highlight && !this.keepHighlight) { this.highlight = null; }
    this.keepHighlight = false;
    this.redraw();
    renderDetails(this.details, this.model, key, this.ctx());
    this.announce.textContent = nodeSummary(this.model, key, this.ctx());
    if (center === "reveal" && key && this.scene) this.revealSelected();
    else if (center && key && this.scene) this.centerOnSelected();
  }

  // Stepping through nodes (n/p, search matches): the view stays where it is while the node is
  // in it, labelled; else it is centred -- across the whole graph's width where both columns
  // fit at that zoom (QA 45c: centring each forward op pushed the backward column off-screen).
  revealSelected() {
    const c = this.canvas, it = this.scene.byKey.get(this.selectedVisibleKey());
    if (!it) return;
    c.measure();
    const [x, y, w, h] = it.box, s = c.scale;
    const inView = x * s + c.tx >= 10 && (x + w) * s + c.tx <= c.w - 10 && y * s + c.ty >= c.topInset() + 10 && (y + h) * s + c.ty <= c.h - 10;
    if (inView && s >= TEXT_MIN_SCALE) return;
    this.centerOnSelected();
    const width = this.scene.width * c.scale;
    if (width <= c.w - 40) { c.tx = (c.w - width) / 2; c.requestDraw(); }
  }

  // The selected item in the middle, and with it, for a grad_fn node, the forward op that
  // created it (a finding about the node highlights both; the op is one column away).
  // ``also``: more keys that must be in view with it (a finding's other targets).
  centerOnSelected(also = []) {
    const it = this.scene.byKey.get(this.selectedVisibleKey());
    if (!it) return;
    const l = this.model.byKey.get(this.selected);
    const op = l && l.kind === "node" && l.rec.op !== undefined && l.rec.op !== null ? this.scene.byKey.get(this.visibleKey("o" + l.rec.op)) : null;
    const more = new Set(also.map((k) => this.scene.byKey.get(this.visibleKey(k))).filter((x) => x && x !== it));
    this.canvas.centerOn([it.box, ...[...more].map((x) => x.box)], 0.8, op && op !== it && !more.has(op) ? [op.box] : []);
  }

  // The path highlighted (or taken off); returns what to say when it does not reach the loss
  // (a mask built and never used lit up its few descendants and said nothing), else "".
  togglePath(key) {
    const path = this.highlight && this.highlight.has(key) ? null : lossPath(this.model, key);
    this.highlight = path ? path.keys : null;
    this.redraw();
    if (!path || path.reaches !== false) return "";
    const l = this.model.byKey.get(key);
    if (!l) return "";
    const n = path.keys.size - 1, ops = (k) => `${k} op${k === 1 ? "" : "s"}`;
    if (l.kind === "node") return "This grad_fn node is not on the way back from the loss's grad_fn.";
    if (l.phase === "backward") {
      return "This op, run by backward(), is not on the gradient's way back from the loss: nothing it reads was computed from the loss's gradient " +
        `(${n ? `highlighted: the ${ops(n)} of the backward it reads from` : "it reads only tensors the forward saved, or none"}).`;
    }
    return `This op does not reach the loss: nothing computed from its output feeds the loss (${n ? `highlighted: the ${ops(n)} computed from it` : "nothing uses its output"}).`;
  }

  // Highlight a finding's targets (diagnostics panel).
  async highlightTargets(targets) {
    const keys = new Set();
    for (const t of targets) {
      if (t.node !== undefined) keys.add("n" + t.node);
      if (t.op !== undefined) keys.add("o" + t.op);
      if (t.param) { const k = this.model.nodeOfParam.get(t.param); if (k) keys.add(k); for (const o of this.model.paramOps.get(t.param) || []) keys.add(o); }
      if (t.module !== undefined && t.node === undefined && t.op === undefined && !t.param) {
        for (const l of this.model.leaves) if (l.module === t.module || l.module.startsWith(t.module + ".")) keys.add(l.key);
      }
    }
    const first = [...keys].find((k) => this.model.byKey.has(k));
    this.keepHighlight = true;
    this.highlight = keys;
    if (!first) { this.redraw(); return; }
    // the first target selected, and every target in view: P8's in-place op and the grad_fn
    // whose saved tensor it overwrote are rows and a column apart, and centred on the op the
    // grad_fn was off the canvas
    await this.select(first);
    if (this.scene && this.selected === first) this.centerOnSelected([...keys].filter((k) => this.model.byKey.has(k)));
  }

  stepBy(d) {
    const i = this.captured.indexOf(this.step) + d;
    if (i >= 0 && i < this.captured.length) this.showStep(this.captured[i]);
  }

  matches() {
    const q = this.search.value.trim().toLowerCase();
    if (!q || !this.model) return [];
    const type = this.app.moduleType;
    return this.model.leaves.filter((l) => `${l.label} ${l.rec.name} ${l.module} ${type?.get(l.module) || ""} ${leafSub(this.model, l)}`.toLowerCase().includes(q));
  }

  // As the user types: every match highlighted (the rest dimmed, a collapsed module holding
  // one marked) and counted, without moving the view; Enter then walks through them.  An
  // emptied box takes back the highlight it made, and no other.
  searchMark() {
    clearTimeout(this.searchTimer);
    const q = this.search.value.trim();
    const ms = this.matches();
    this.searchInfo.textContent = !q ? "" : ms.length ? `${ms.length} match${ms.length === 1 ? "" : "es"}` : "no match";
    if (!q && this.highlight !== this.searchHi) return ms;
    this.highlight = this.searchHi = q ? new Set(ms.map((l) => l.key)) : null;
    this.redraw();
    return ms;
  }

  searchNext(dir) {
    const ms = this.searchMark();
    if (!ms.length) return;
    const cur = ms.findIndex((l) => l.key === this.selected);
    const next = ms[(cur + dir + ms.length) % ms.length];
    this.searchInfo.textContent = `${ms.indexOf(next) + 1}/${ms.length}`;
    this.keepHighlight = true; // the other matches stay marked
    this.select(next.key, "reveal");
  }

  onKey(e) {
    if (!this.scene) return;
    const items = this.scene.items;
    if (e.key === "n" || e.key === "p") { // next/previous visible node or collapsed module, in execution order
      const order = items.filter((it) => it.order !== undefined).sort((a, b) => a.order - b.order);
      const dir = e.key === "n" ? 1 : -1;
      let i = order.findIndex((it) => it.key === this.selected);
      // a module expanded by Enter stays selected, a frame now, in no place of that order:
      // it stands just before its first op, so "n" goes into it (and "p" to what ran before
      // it), not back to the graph's first node
      const first = i < 0 ? this.firstLeafOf(this.selected) : -1;
      if (first >= 0) {
        const j = order.findIndex((it) => it.order >= first);
        i = (j < 0 ? order.length : j) - (dir > 0 ? 1 : 0);
      }
      const next = order[(i + dir + order.length) % order.length];
      if (next) this.select(next.key, "reveal");
    } else if (e.key === "Enter") {
      const it = this.scene.byKey.get(this.selected) || this.scene.frames.find((f) => f.key === this.selected);
      if (it && it.group !== undefined) this.toggleGroup(it.group);
    } else if (e.key === "Backspace") {
      const l = this.model.byKey.get(this.selected);
      const g = l ? l.group : this.selected?.startsWith("g:") ? this.model.groups[this.model.gIndex.get(this.selected.slice(2))].parent : 0;
      if (g > 0) { this.expandedPaths.delete(this.model.groups[g].path); this.select("g:" + this.model.groups[g].key); this.relayout(); }
    } else if (e.key === "f") this.canvas.fitOrOverview();
    else if (e.key === "[" || e.key === "]") this.stepBy(e.key === "]" ? 1 : -1);
    else if (e.key === "Escape") { this.highlight = null; this.select(null); }
    else if (e.key === "+" || e.key === "-") this.canvas.zoomAt(this.canvas.w / 2, this.canvas.h / 2, e.key === "+" ? 1.25 : 0.8);
    else return;
    e.preventDefault();
  }

  // The first leaf (in execution order) of a group's key ("g:forward:2"), -1 for none.
  firstLeafOf(key) {
    const g = key?.startsWith("g:") && this.model ? this.model.gIndex.get(key.slice(2)) : undefined;
    if (g === undefined) return -1;
    const l = this.model.leaves.find((x) => ancestors(this.model, x.group).includes(g));
    return l ? l.index : -1;
  }

  // Live: a newly captured step joins the scrubber; the current view stays as it is.
  onCapturedStep(step) {
    const n = this.captured.length;
    if (n && step > this.captured[n - 1]) this.captured.push(step); // (live: in order)
    else if (sortedHas(this.captured, step)) return;
    else { this.captured.push(step); this.captured.sort((a, b) => a - b); }
    this.toolbar.hidden = false;
    if (!n) this.hasGraph(true);
    this.stepSel.max = this.captured.length - 1;
    this.stepSel.value = this.captured.indexOf(this.step);
    // (a full-mode run captures every step: the menus follow at most twice a second)
    this.fillDiffSoon ||= coalesce(() => this.fillDiff(), 500);
    this.fillDiffSoon();
    if (this.step === undefined) this.showStep(step, true);
    else this.stepLabel.textContent = stepOf(this.step, this.captured);
  }

  // For tests and the benchmark (the canvas cannot be queried otherwise).
  debug() {
    return {
      step: this.step, captured: this.captured.slice(), selected: this.selected, overlay: this.overlay,
      layoutMs: this.lastLayoutMs, firstPaintMs: this.firstPaintMs, sideBySide: this.sideBySide,
      nodes: (this.scene?.items || []).map((it) => ({ key: it.key, label: it.label, sub: it.sub, group: it.group !== undefined, hi: it.hi, cut: it.cut, color: it.color })),
      frames: (this.scene?.frames || []).map((f) => f.title),
      expanded: this.model ? this.expandedGroups().map((g) => this.model.groups[g].key) : [], leaves: this.model?.leaves.length || 0, status: this.status.textContent,
      topOps: this.topOps.debug(), highlighted: this.highlight ? [...this.highlight] : [],
    };
  }
}
