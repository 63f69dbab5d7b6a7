// "Your metrics": the numbers the script recorded with torchscope.log(acc=..., val_loss=...)
// (LogEvent.metrics), a small line chart per name, from /metrics: {name: {step, value}} in step
// order, NaN/Infinity as strings as /loss writes them.  The charts span the loss chart's steps
// (a metric logged from step 10 on starts where step 10 is), mark NaN/Inf with the loss chart's
// red ticks and mark the step the view focuses.  Many names: the first MAX_SHOWN, and a "show
// all" button; a menu focuses one (?metric=acc in the URL, ?metrics=all for all of them).
import { h, clear } from "./dom.js";
import { api, sessionPath, rankQuery, ApiError } from "./api.js";
import { LineChart } from "./chart.js";

export const MAX_SHOWN = 8;
const HINT = "Log your own numbers with torchscope.log(acc=...)";
// what the URL asked for when this module loaded (the app rewrites the URL before the view
// exists, keeping only the keys it knows)
const ASKED = (() => {
  try { const q = new URLSearchParams(location.search); return { metric: q.get("metric"), all: q.get("metrics") === "all" }; } catch { return {}; }
})();

export class MetricsPanel {
  // opts: {range(): [first, last] step of the loss chart or null, vlines(), onMark(step)}
  constructor(parent, app, opts = {}) {
    this.app = app;
    this.opts = opts;
    this.data = {}; // name -> {step: number[], value: number[]} (NaN/Inf as numbers)
    this.names = [];
    this.charts = new Map(); // name -> LineChart, kept while hidden (zoom-free, cheap)
    this.focus = app.state.metric ?? ASKED.metric ?? null; // one name shown alone
    this.all = app.state.metrics === "all" || !!ASKED.all;
    this.loaded = false;
    this.queue = Promise.resolve();
    this.pick = h("select", { "aria-label": "metric to show", "data-testid": "metric-pick", onchange: () => this.setFocus(this.pick.value || null) });
    this.allBtn = h("button", { type: "button", class: "metric-all", "data-testid": "metric-show-all", hidden: true, onclick: () => this.setAll(!this.all) });
    this.note = h("span", { class: "muted small", "data-testid": "metric-note" });
    this.controls = h("div", { class: "metric-controls small", hidden: true }, h("label", {}, "show: ", this.pick), this.allBtn, this.note);
    this.grid = h("div", { class: "metric-grid", "data-testid": "metric-charts" });
    this.title = h("h2", {}, "Your metrics (torchscope.log)");
    this.hint = h("p", { class: "muted small metric-hint", "data-testid": "metrics-hint", hidden: true }, HINT);
    this.body = h("div", { hidden: true }, this.title, this.controls, this.grid);
    this.root = h("section", { class: "user-metrics", "data-testid": "user-metrics" }, this.body, this.hint);
    parent.append(this.root);
    if (this.focus || this.all) app.setState({ metric: this.focus || undefined, metrics: this.all ? "all" : undefined });
  }

  // The run's metrics now; one fetch at a time (live reloads overlap).  The server gone (or
  // refusing the page's token) is thrown, as the view's other fetches do; another refusal is
  // said in the section, not in place of the view.
  update() {
    this.queue = this.queue.catch(() => {}).then(() => this.fetch());
    return this.queue;
  }

  async fetch() {
    let got;
    try {
      got = await api(`${sessionPath(this.app.id)}/metrics?${rankQuery(this.app.rank)}`);
    } catch (e) {
      if (!(e instanceof ApiError) || e.status === 0 || e.status === 401) throw e;
      this.error = e.message;
      this.render();
      return;
    }
    this.error = null;
    const num = (v) => (typeof v === "string" ? Number(v) : v);
    this.data = {};
    for (const [name, col] of Object.entries(got || {})) {
      this.data[name] = { step: col.step || [], value: (col.value || []).map(num) };
    }
    this.names = Object.keys(this.data).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    this.loaded = true;
    // a focus the URL asked for that this run never logged (a finished run): dropped
    if (this.focus && !this.data[this.focus] && !this.app.running) this.setFocus(null, false);
    this.render();
  }

  // The names drawn: the focused one alone, else all of them or the first MAX_SHOWN.
  shown() {
    if (this.focus && this.data[this.focus]) return [this.focus];
    return this.all ? this.names : this.names.slice(0, MAX_SHOWN);
  }

  setFocus(name, redraw = true) {
    this.focus = name || null;
    this.app.setState({ metric: this.focus || undefined });
    if (redraw) this.render();
  }

  setAll(on) {
    this.all = !!on;
    this.app.setState({ metrics: this.all ? "all" : undefined });
    this.render();
  }

  render() {
    const n = this.names.length;
    this.body.hidden = !n && !this.error;
    this.hint.hidden = !this.loaded || n > 0 || !!this.error;
    if (this.error) { clear(this.grid).append(h("p", { class: "muted small" }, `Your metrics could not be read: ${this.error}`)); return; }
    if (!n) { clear(this.grid); return; }
    // the menu: every name, and the default (all of them, or the first MAX_SHOWN)
    const many = n > MAX_SHOWN;
    const options = [["", many && !this.all ? `first ${MAX_SHOWN} of ${n}` : `all ${n}`], ...this.names.map((m) => [m, m])];
    if (this.pick.options.length !== options.length || [...this.pick.options].some((o, i) => o.value !== options[i][0] || o.textContent !== options[i][1])) {
      clear(this.pick).append(...options.map(([v, t]) => h("option", { value: v }, t)));
    }
    this.pick.value = this.focus && this.data[this.focus] ? this.focus : "";
    this.controls.hidden = n < 2;
    this.allBtn.hidden = !many || !!(this.focus && this.data[this.focus]);
    this.allBtn.textContent = this.all ? `show the first ${MAX_SHOWN}` : `show all ${n}`;
    const shown = this.shown();
    this.note.textContent = shown.length < n ? `${shown.length} of ${n} shown` : "";
    this.grid.classList.toggle("metric-one", shown.length === 1 && n > 1);
    // the charts in order, each one's data redrawn; the hidden ones detached, kept
    const want = shown.map((name) => this.chart(name));
    const have = [...this.grid.children];
    if (have.length !== want.length || have.some((el, i) => el !== want[i].root)) clear(this.grid).append(...want.map((c) => c.root));
    shown.forEach((name, i) => this.draw(name, want[i]));
  }

  chart(name) {
    let c = this.charts.get(name);
    if (!c) {
      const box = h("div");
      c = new LineChart(box, { title: name, height: 150, vlines: this.opts.vlines,
        empty: "No value logged yet.", onClick: (i) => this.onClick(name, i) });
      c.root.dataset.testid = "metric-chart";
      c.root.dataset.metric = name;
      this.charts.set(name, c);
    }
    return c;
  }

  // x: the metric's steps, widened (null values at the ends) to the loss chart's first and
  // last steps, so its axis reads as the loss chart's; y: its values, NaN/Inf as numbers,
  // drawn as gaps and marked with red ticks at the top.
  draw(name, c) {
    const { step, value } = this.data[name];
    const x = [...step], y = [...value];
    const range = this.opts.range?.();
    if (range && step.length) {
      if (range[0] < step[0]) { x.unshift(range[0]); y.unshift(null); }
      if (range[1] > step[step.length - 1]) { x.push(range[1]); y.push(null); }
    }
    const marks = step.filter((_, i) => typeof value[i] === "number" && !Number.isFinite(value[i])).map((s) => ({ x: s }));
    c.setTitle(marks.length ? `${name} (red ticks at the top: NaN/Inf, at ${marks.length === 1 ? "step" : "steps"} ${marks.map((m) => m.x).join(", ")})` : name);
    c.setData(x, [{ name, y }], marks);
  }

  onClick(name, i) {
    const c = this.charts.get(name), step = c?.x?.[i];
    if (step === undefined || !this.data[name].step.includes(step)) return; // (the padding to the loss's range)
    this.opts.onMark?.(step);
  }

  redraw() { for (const name of this.shown()) this.charts.get(name)?.draw(); }

  // For the tests: per name drawn, its steps and values as the server's JSON writes them (the
  // padding to the loss's range left out), the NaN/Inf ticks, the title.
  debug() {
    const wire = (v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v);
    const charts = {};
    for (const name of this.shown()) {
      const c = this.charts.get(name);
      if (!c?.x) continue;
      const y = c.series[0]?.y || [];
      const keep = c.x.map((_, i) => y[i] !== null && y[i] !== undefined);
      charts[name] = { step: c.x.filter((_, i) => keep[i]), value: y.filter((_, i) => keep[i]).map(wire), x: c.x,
        marks: c.markers.map((m) => m.x), title: c.title.textContent };
    }
    return { names: this.names, shown: this.shown(), focus: this.focus, all: this.all, hint: !this.hint.hidden,
      visible: !this.body.hidden, charts };
  }
}
