// The session dashboard (/sessions/{id}): header, view tabs, URL state (deep links), live
// updates, theme.  Views are created lazily and kept, so switching back keeps zoom,
// selection and expanded groups.
import { h, clear, withLoading, coalesce } from "./dom.js";
import { api, sessionPath, rankQuery, live, showConnection, ApiError, UNREACHABLE } from "./api.js";
import { GraphView } from "./graph/view.js";
import { MemoryView } from "./memory.js";
import { GradientsView } from "./gradients.js";
import { RanksView } from "./ranks.js";
import { DiagnosticsView } from "./diagnostics.js";
import { initTheme } from "./theme.js";

const VIEWS = { graph: ["Graph", GraphView], memory: ["Memory", MemoryView], gradients: ["Loss & gradients", GradientsView],
  // the step time of every run (a line per rank): a single-GPU user looks for it too
  ranks: ["Step time & ranks", RanksView], diagnostics: ["Doctor", DiagnosticsView] };
// what the tabs say, as a URL's view= may name them too
const ALIASES = { doctor: "diagnostics" };
const QUIET_S = 10; // a running session's silence worth saying (showQuiet)

class App {
  constructor() {
    this.id = document.body.dataset.sessionId;
    const q = new URLSearchParams(location.search);
    // (a step that is no number -- a typo'd link -- is none: the view's first; QA 42b)
    this.state = { view: q.get("view") || "graph", step: /^-?\d+$/.test(q.get("step") || "") ? +q.get("step") : undefined,
      node: normalizeNode(q.get("node")), overlay: q.get("overlay") || undefined, layout: q.get("layout") || undefined,
      params: q.get("params") || undefined };
    this.rank = q.has("rank") ? +q.get("rank") : undefined;
    this.views = {};
    this.main = document.getElementById("main");
    this.tabs = document.getElementById("tabs");
    this.title = document.getElementById("session-title");
    this.statusEl = document.getElementById("session-status");
    this.conn = document.getElementById("conn");
  }

  async start() {
    initTheme();
    for (const [v, [label]] of Object.entries(VIEWS)) {
      // (roving tabindex, set by go(): Tab stops at the selected tab alone, the arrows move
      // between them; each controls its view's section, made on the first visit)
      this.tabs.append(h("button", { role: "tab", id: `tab-${v}`, "data-view": v, "aria-controls": `view-${v}`, tabindex: -1, onclick: () => this.go(v) },
        label, v === "diagnostics" ? h("span", { class: "count", id: "finding-count" }) : null));
    }
    // the tab pattern's keys (QA 45c): arrows move to the previous or next tab and open it,
    // Home and End to the first and last
    this.tabs.addEventListener("keydown", (e) => {
      const tabs = [...this.tabs.children], i = tabs.indexOf(document.activeElement);
      const j = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[e.key];
      if (i < 0 || j === undefined || tabs[0].disabled) return;
      e.preventDefault();
      const next = tabs[(j + tabs.length) % tabs.length];
      next.focus();
      this.go(next.dataset.view);
    });
    try {
      this.summary = await api(sessionPath(this.id));
    } catch (e) {
      return this.fatal(e instanceof ApiError && e.status === 404 ? `No session ${this.id} on this server.` : e.message);
    }
    this.meta = this.summary.meta || {};
    this.moduleType = new Map((this.meta.modules || []).map((m) => [m.path, m.type]));
    // what print(model) says of each module: Linear(in_features=8, out_features=4, bias=True)
    this.moduleRepr = new Map((this.meta.modules || []).filter((m) => m.extra_repr).map((m) => [m.path, m.extra_repr]));
    this.paramDtype = new Map((this.meta.params || []).map((p) => [p.name, p.dtype]));
    this.openedAt = Date.now();
    this.renderHeader();
    setInterval(() => this.showQuiet(), 1000);
    if (!this.summary.steps && !(this.summary.graphs > 0)) this.main.before(h("div", { class: "notice", id: "empty-note" }, this.emptyText()));
    const dot = showConnection(this.conn);
    live((ev) => this.onLive(ev), (ok, refused) => { dot(ok, refused); this.onConnection(ok, refused); });
    const asked = this.state.view;
    if (!VIEWS[ALIASES[asked] || asked]) {
      // a typo'd link (?view=grads) said nothing and showed the graph (QA 49b): it says which views there are
      const names = Object.keys(VIEWS).map((v) => `${v} (${VIEWS[v][0]})`).join(", ");
      this.main.before(h("div", { class: "notice", id: "unknown-view", role: "status" },
        `There is no view "${asked}" (the views are ${names}): showing the graph.`));
    }
    await this.go(this.state.view, {}, true);
    this.badge = new DiagnosticsView(h("div"), this); // keeps the count on the Doctor tab
    this.badge.load().catch(() => {});
    window.addEventListener("popstate", () => location.reload());
  }

  renderHeader() {
    const s = this.summary;
    this.title.textContent = s.name || s.id;
    this.title.title = s.name || s.id; // the whole name, where the header cuts a long one (style.css)
    this.statusEl.textContent = s.status || "";
    this.statusEl.title = "";
    this.statusEl.className = `badge status-${(s.status || "").replace(/ /g, "-")}`;
    this.showQuiet();
    document.title = `${s.name || s.id} · torchscope`;
    const sub = document.getElementById("session-sub");
    const ranks = (s.ranks || []).map((r) => (typeof r === "object" ? r.rank : r));
    const rsel = document.getElementById("rank");
    if (rsel && ranks.length > 1 && !rsel.options.length) { // a distributed run: choose the rank
      rsel.append(...ranks.map((r) => h("option", { value: r }, `rank ${r}`)));
      rsel.value = String(this.rank ?? ranks[0]);
      rsel.hidden = false;
      rsel.onchange = () => { this.rank = +rsel.value; this.setState({}); location.reload(); };
    }
    sub.textContent = [this.meta.model, this.meta.device, `${s.steps ?? 0} step${s.steps === 1 ? "" : "s"}`, (s.ranks || []).length > 1 ? `${s.ranks.length} ranks` : null].filter(Boolean).join(" · ");
    sub.title = sub.textContent; // (cut too, past 30 % of the window: a long model class name)
  }

  get running() { return this.summary?.status === "running"; }

  // What an empty session or an empty graph view says: a running script still fills it in,
  // an ended one never will, and a light-mode run captures no graph at all.
  emptyText(what = "steps") {
    const status = this.summary?.status || "";
    if (what === "graph") {
      if (this.meta.mode === "light") return 'No graph: this run was watched with mode="light", which records per-step facts only (gradients, memory, timings). Watch with mode="default" to capture the graph.';
      if (this.running) return "No graph captured yet. It appears when the first captured step ends.";
      const steps = this.summary?.steps || 0;
      // steps ended and none had a graph: a step's graph is taken at its backward, and no
      // backward reached the model (a GAN's generator loss from D(fake.detach()): QA 44c)
      return steps ? `No graph was captured in this session (${status}): a step's graph is taken at its backward(), ` +
          `and no backward() of its ${steps} step${steps === 1 ? "" : "s"} reached the model's parameters. The Doctor tab says why.`
        : `No graph was captured in this session (${status}): the script ended before a captured step completed.`;
    }
    return this.running ? "This session has no steps yet. It fills in live as the script runs."
      : `This session recorded no steps (${status}): the script ended before its first optimizer step.`;
  }

  // A page with no session behind it (unknown, deleted, or the server gone at the start): one
  // sentence and the way back; the tabs are disabled, each would only repeat the error.
  fatal(msg) {
    for (const b of this.tabs.children) { b.disabled = true; b.setAttribute("aria-selected", "false"); }
    this.tabs.hidden = true; // (QA 45c: five greyed tabs above "No session ... on this server")
    document.getElementById("empty-note")?.remove();
    this.offline?.remove();
    clear(this.main).append(h("div", { class: "notice error", id: "fatal" }, msg, " ", h("a", { href: "/" }, "All sessions")));
  }

  // The page's state in its URL.  ``push``: as a new entry of the browser's history (another
  // view: a tab, a finding's or a chart's link), so Back returns to where the user was; a
  // view's own changes (a step, a selection) replace the entry (QA 42b: every change replaced
  // it, and Back left the dashboard).
  setState(patch, push = false) {
    Object.assign(this.state, patch);
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(this.state)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
    if (this.rank !== undefined) q.set("rank", this.rank);
    history[push ? "pushState" : "replaceState"](null, "", `${location.pathname}?${q}`);
  }

  async go(view, patch = {}, first = false) {
    view = ALIASES[view] || view;
    if (!VIEWS[view]) view = "graph";
    if (!first) document.getElementById("unknown-view")?.remove();
    // (a finding followed to the memory view is that view's: not carried to another's URL)
    this.setState({ view, ...(view !== "memory" && { finding: undefined }), ...patch }, !first && view !== this.state.view);
    for (const b of this.tabs.children) { b.setAttribute("aria-selected", String(b.dataset.view === view)); b.tabIndex = b.dataset.view === view ? 0 : -1; }
    for (const [k, v] of Object.entries(this.views)) v.el.hidden = k !== view;
    let v = this.views[view];
    if (!v) {
      const el = h("section", { class: `view view-${view}`, "data-view": view, id: `view-${view}`, role: "tabpanel", "aria-labelledby": `tab-${view}` });
      this.main.append(el);
      v = this.views[view] = { el, obj: new VIEWS[view][1](el, this) };
      try {
        await withLoading(el, v.loaded = v.obj.load());
      } catch (e) {
        // the server gone: the page's banner says so, and the view loads once it is back
        // (or refusing this page's token: the banner says that instead)
        if (e instanceof ApiError && (e.status === 0 || e.status === 401)) {
          el.remove(); delete this.views[view]; this.onConnection(false, e.status ? e : null); return v.obj;
        }
        el.prepend(h("div", { class: "notice error" }, e.message));
      }
      if (view === "graph" && first && this.state.overlay) v.obj.setOverlay(this.state.overlay);
    } else if (patch.step !== undefined && v.obj.showStep) {
      await v.obj.showStep(patch.step);
    } else if (patch.step !== undefined && v.obj.loadTimeline) {
      await v.obj.loadTimeline(patch.step);
    } else if (v.obj.focusOn) {
      v.obj.focusOn();
    }
    return v.obj;
  }

  async openNode(step, key) {
    const g = await this.go("graph");
    if (g.step !== step) await g.showStep(step);
    await g.select(key, true);
  }

  // ``steps``: a finding's steps, of which the first with a captured graph is shown where its
  // target's step has none (QA 42b: P10's step 1 opened step 0, from before the bug, where its
  // step 2 shows the graph kept across steps); else the nearest captured step, which showStep
  // says (not silently)
  async openTargets(step, targets, steps = []) {
    const g = await this.go("graph");
    if (step !== undefined && !g.captured.includes(step)) step = steps.find((s) => g.captured.includes(s)) ?? step;
    if (step !== undefined && g.step !== step) await g.showStep(step);
    await g.highlightTargets(targets);
  }

  async openModule(step, module) { return this.openTargets(step, [{ module }]); }

  // the tab's count takes the colour of the worst finding: red for an error, amber for a
  // warning, grey for notes only (an info is no alarm)
  setFindingCount(n, worst) {
    const c = document.getElementById("finding-count");
    if (c) { c.textContent = n ? String(n) : ""; c.className = `count ${n ? { error: "err", warning: "warn" }[worst] || "note" : ""}`; }
    // (its text read with the count as one word, "Doctor1", QA 50b)
    const tab = document.getElementById("tab-diagnostics");
    if (tab) { if (n) tab.setAttribute("aria-label", `Doctor, ${n} finding${n === 1 ? "" : "s"}`); else tab.removeAttribute("aria-label"); }
  }

  // A running session none of whose steps has arrived for a while -- five of its usual gaps,
  // at least QUIET_S -- says since when: a killed script reads "running" until the server's
  // 30 s of silence (QA 37d: 32 s of "running", the counter frozen, nothing said).  Neutral
  // words: a long evaluation or a slow step is as quiet.
  showQuiet() {
    if (!this.running || this.deleted) return;
    const quiet = (Date.now() - (this.lastStepAt ?? this.openedAt)) / 1000;
    const over = quiet >= Math.max(QUIET_S, 5 * (this.stepGap || 0) / 1000);
    const text = over ? `running · last step ${Math.round(quiet)} s ago` : "running";
    if (this.statusEl.textContent !== text) {
      this.statusEl.textContent = text;
      this.statusEl.title = over ? "No step of this run has arrived for a while: the script may be evaluating, slow, paused " +
        "or stopped. The server calls a run it has not heard from for 30 s \"ended unexpectedly\"." : "";
    }
  }

  onLive(ev) {
    // a deleted session's page shows that, and nothing more: its header kept counting the steps
    // a run still streaming sent (QA 51c: "running · 216 steps" under "This session was deleted.")
    if (ev.session !== this.id || this.deleted) return;
    if (this.rank !== undefined && ev.rank !== undefined && ev.rank !== this.rank) return;
    if (ev.kind === "deleted") {
      this.deleted = true;
      this.statusEl.textContent = "deleted";
      this.statusEl.title = "";
      this.statusEl.className = "badge status-deleted";
      return this.fatal("This session was deleted.");
    }
    if (ev.kind === "step") {
      const now = Date.now();
      if (this.lastStepAt !== undefined) this.stepGap = this.stepGap === undefined ? now - this.lastStepAt : 0.8 * this.stepGap + 0.2 * (now - this.lastStepAt);
      this.lastStepAt = now;
    }
    if (ev.kind === "step" || ev.kind === "end" || ev.kind === "session" || ev.kind === "status") {
      if (ev.kind === "step") document.getElementById("empty-note")?.remove();
      this.refreshSummary ||= coalesce(async () => {
        // (asked before the deletion was heard: its 404 is no error of the page)
        const summary = await api(sessionPath(this.id)).catch((e) => { if (this.deleted) return null; throw e; });
        if (this.deleted) return;
        this.summary = summary; this.meta = this.summary.meta || this.meta; this.renderHeader(); this.onStatus();
      }, 300);
      this.refreshSummary();
    }
    if (ev.kind === "graph" && this.views.graph) this.views.graph.obj.onCapturedStep(ev.step);
    if ((ev.kind === "finding" || ev.kind === "end") && !this.views.diagnostics) this.badge.onStep();
    for (const [k, v] of Object.entries(this.views)) if (k !== "graph" && v.obj.onStep && (ev.kind === "step" || ev.kind === "finding")) v.obj.onStep(ev);
  }

  // A run that ended (or went silent: killed) while the page was open: the empty states say
  // so instead of promising live updates, and the Doctor that the recording is incomplete.
  onStatus() {
    const note = document.getElementById("empty-note");
    if (note) note.textContent = this.emptyText();
    for (const v of Object.values(this.views)) v.obj.onStatus?.();
  }

  // The server gone: whatever view is open says so, not only the header's dot (a graph
  // already drawn showed no sign of it).  Back: a view that could not load meanwhile loads.
  // ``refused``: the server is there but refuses the page (its token), said in those words.
  onConnection(ok, refused = null) {
    if (this.deleted) return; // (nothing to load or catch up on: the header's dot says the rest)
    if (!ok) {
      const text = refused ? refused.message : `${UNREACHABLE} This page reconnects by itself.`;
      if (!this.offline) this.main.before(this.offline = h("div", { class: "notice error", id: "offline", role: "status" }));
      if (this.offline.textContent !== text) this.offline.textContent = text;
    } else if (ok && this.offline) {
      this.offline.remove();
      this.offline = null;
      if (!this.views[this.state.view]) this.go(this.state.view);
      this.catchUp();
    } else if (ok && !this.heard) {
      // the live channel's first opening: what a running session published between the
      // page's first fetches and this moment reached neither (two graphs of a live run were
      // missing from the step scrubber for good)
      this.catchUp();
    }
    if (ok) this.heard = true;
  }

  // Heard again after a gap: what the server published meanwhile never reached this page (a
  // run that streamed on, or ended, while the server restarted), so the header, the views and
  // the Doctor's count refetch as on a live step, and the graph's scrubber gets the steps
  // captured meanwhile.
  catchUp() {
    this.onLive({ session: this.id, kind: "status" });
    for (const [k, v] of Object.entries(this.views)) if (k !== "graph") v.obj.onStep?.({ session: this.id, kind: "step" });
    if (!this.views.diagnostics) this.badge?.onStep();
    const g = this.views.graph;
    // after the view's own first fetch (else that older list would land last)
    if (g) Promise.resolve(g.loaded).catch(() => {}).then(() => api(`${sessionPath(this.id)}/graphs?${rankQuery(this.rank)}`))
      .then((gs) => { for (const x of gs) g.obj.onCapturedStep(x.step); }, () => {});
  }

  debug() {
    return { view: this.state.view, url: location.href, graph: this.views.graph?.obj.debug(), memory: this.views.memory?.obj.debug(),
      gradients: this.views.gradients?.obj.debug?.() };
  }
}

// "?node=12" means grad_fn node 12 (FindingTarget.node); "o12"/"n12"/"g:..." are explicit.
function normalizeNode(v) {
  if (!v) return null;
  return /^\d+$/.test(v) ? "n" + v : v;
}

const app = new App();
window.__torchscope = {
  app,
  state: () => app.debug(),
  select: (key) => app.views.graph?.obj.select(key, true),
  expand: async (path, phase = "forward") => { const g = app.views.graph.obj; const i = g.model.gIndex.get(`${phase}:${path}`); if (i === undefined) throw new Error("no group " + path); if (!g.isExpanded(i)) await g.toggleGroup(i); },
  expandAll: () => app.views.graph.obj.expandAll(),
  showStep: (s) => app.views.graph.obj.showStep(s),
  ready: app.start(),
};
