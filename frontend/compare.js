// Compare two to eight runs (/compare?a=<id>&b=<id>[&c=...][&runs=<id>,<id>,...][&rank=N]):
// "why did my change make it worse?", and which run of a sweep did best.  The server reads the
// ids (the letters a..z in letter order, then runs=; server/routes_pages.py compare_page) and
// passes the first MAX (8) as data-runs and the rest as data-left-out, which the page names.
// The facts of the sessions side by side (model, command line, mode, parameters, optimizer,
// torch, steps, final loss, the doctor's findings by code), then one chart per quantity on a
// shared step axis, a colour per run (colors.js RUNS; lettered A, B, C, ... in the legends):
// the loss, the total gradient norm, the learning rate (param group 0), the step time, and the
// peak and live memory.  Everything comes from the per-session
// endpoints the session dashboard reads (/loss, /grads, /memory, /steps, /diagnostics); a run
// still going is followed through the live channel (/api/live), as the other pages are.
import { h, clear, fmtTime, fmtNum, fmtUs, fmtBytes, coalesce } from "./dom.js";
import { api, sessionPath, allSteps, live, showConnection, ApiError } from "./api.js";
import { LineChart } from "./chart.js";
import { RUNS, legendItem } from "./colors.js";
import { initTheme } from "./theme.js";

const main = document.getElementById("compare");
const data = document.body.dataset;
const list = (s) => (s || "").split(",").filter(Boolean);
const ids = list(data.runs);
const leftOut = list(data.leftOut); // named past the first MAX: said over the page, not drawn
// their names, as the server found them (null: no session has that id), in leftOut's order
const leftOutNames = (() => { try { return JSON.parse(data.leftOutNames || "[]"); } catch { return []; } })();
const repeated = list(data.repeated); // ids named more than once: each compared once, and said
const MAX = Number(data.maxRuns) || RUNS.length;
const rank = Number(data.rank || 0);
const LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"; // run k's letter in the legends (A blue, B vermillion, ...)
// The server's JSON writes a non-finite float as the string "NaN" / "Infinity" / "-Infinity".
const num = (v) => (typeof v === "string" ? Number(v) : v ?? null);
// ... and the tests compare the charts' values with the recorded files in that form
const wire = (v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v);

// The charts: a key of Run.cols each, its title, its axis format; log: always on a log10
// axis, autoLog: once the values span two decades (a loss from 10 down to 0.01), steps: a value
// in force until the next one (the learning rate), marks: what a NaN/Inf value is called, drawn
// as a tick at the top in its run's colour (a non-finite gradient norm drawn as no data read as
// "not recorded after step 99", QA 50b).
const CHARTS = [
  { key: "loss", title: "loss per step", autoLog: true, marks: "loss" },
  { key: "grad_norm", title: "total gradient norm ‖grad‖₂ of all parameters, per step (log scale)", log: true, marks: "norm" },
  { key: "lr", title: "learning rate per step (param group 0)", autoLog: true, steps: true },
  { key: "step_time", title: "step time (from the previous optimizer.step() to this one)", fmt: fmtUs },
  { key: "peak", title: "peak memory per step (the most bytes the step's forward and backward held at once; optimizer.step() not seen)", fmt: fmtBytes },
  { key: "live", title: "live memory per step (parameters + gradients + optimizer state)", fmt: fmtBytes },
];

// a torchscope.log() name's key among Run.cols and the charts; at most MAX_METRICS charts of them
const METRIC = "metric:";
const MAX_METRICS = 8;

// The charts of this draw: CHARTS, then one per name any run logged (the first MAX_METRICS, A to Z).
function chartList() {
  const names = new Set();
  for (const r of runs) for (const k of Object.keys(r.cols)) if (k.startsWith(METRIC)) names.add(k.slice(METRIC.length));
  const logged = [...names].sort().slice(0, MAX_METRICS).map((n) => ({ key: METRIC + n, title: `${n} (torchscope.log)`, autoLog: false, metric: n }));
  return [...CHARTS, ...logged];
}

// A run's status once its end event is stored: its series are whole and never change.
const ENDED = new Set(["finished", "error", "interrupted"]);

class Run {
  constructor(id, k) {
    this.id = id; this.k = k; this.color = RUNS[k % RUNS.length]; this.letter = LETTERS[k];
    this.cols = {}; // chart key -> Map(step -> value)
    this.bad = {}; // chart key -> the steps of a NaN/Inf value (CHARTS' marks)
    this.badSets = { loss: new Set(), grad_norm: new Set() };
    this.findings = undefined; // undefined: not asked yet; null: the doctor could not answer
    // per endpoint, the last step it answered: a refresh asks for the steps from there on (that
    // step again: a torchscope.log() after optimizer.step() lands on the step already fetched)
    this.last = null;
    this.complete = false; // every series fetched after the run ended: nothing more to fetch
    this.inflight = null; this.again = false; this.againSummary = false;
  }

  async loadSummary() {
    this.summary = await api(sessionPath(this.id));
    this.meta = this.summary.meta || {};
  }

  get name() { return this.summary?.name || this.id; }
  get running() { return this.summary?.status === "running"; }

  // The summary, then what the series lack: everything on the first load, then only the steps
  // from the last ones fetched on; nothing once the run's end was in before a load (a finished
  // run of the page is fetched once: a Compare page of 8 live runs refetched every series of
  // every run at each refresh, QA 51c).  One load at a time per run; asked meanwhile, it runs
  // once more after.
  async refresh(summary = true) {
    if (this.inflight) { this.again = true; this.againSummary ||= summary; return this.inflight; }
    this.inflight = (async () => {
      let withSummary = summary;
      do {
        this.again = false; this.againSummary = false;
        if (withSummary) await this.loadSummary();
        if (!this.complete) await this.loadSeries();
        withSummary = this.againSummary;
      } while (this.again);
    })();
    try { await this.inflight; } finally { this.inflight = null; }
  }

  // The series of this page's rank, from the endpoints the dashboard's views read.
  async loadSeries() {
    const ended = ENDED.has(this.summary?.status); // (read before the series: they are whole then)
    const base = sessionPath(this.id), q = `rank=${rank}`;
    const last = this.last;
    const from = (k) => (last && last[k] !== null ? `&start=${last[k]}` : "");
    // torchscope.log()'s numbers are rows of their own, of a step whose event may be in already:
    // asked once the loss has answered, from the loss's last step of the load before on (a
    // number of step s is written before step s + 1's event, so none before that step is missing)
    const lossAsked = api(`${base}/loss?${q}${from("loss")}`);
    const [loss, grads, mem, steps, metrics] = await Promise.all([lossAsked,
      api(`${base}/grads?${q}&max_steps=100000${from("grads")}`), api(`${base}/memory?${q}${from("memory")}`),
      allSteps(this.id, rank, last ? last.steps : null), lossAsked.then(() => api(`${base}/metrics?${q}${from("loss")}`))]);
    const put = (key, xs, ys, f = num) => {
      const m = this.cols[key] || (this.cols[key] = new Map());
      (xs || []).forEach((s, i) => m.set(s, f((ys || [])[i])));
    };
    // the NaN/Inf steps a chart marks: the loss's (the server lists them), and the gradients'
    // -- a NaN or Inf counted in any parameter's .grad -- as the session page marks them
    const counted = (s) => [...(grads.nan?.[s] || []), ...(grads.inf?.[s] || [])].some((n) => n > 0);
    for (const s of loss.nonfinite || []) this.badSets.loss.add(s);
    (grads.steps || []).forEach((step, i) => { if (counted(i)) this.badSets.grad_norm.add(step); });
    this.bad = { loss: [...this.badSets.loss].sort((a, b) => a - b), grad_norm: [...this.badSets.grad_norm].sort((a, b) => a - b) };
    put("loss", loss.step, loss.loss);
    put("lr", loss.step, loss.lr, (g) => (Array.isArray(g) && typeof g[0] === "number" ? g[0] : null));
    put("grad_norm", grads.steps, grads.total_norm);
    put("step_time", steps.map((e) => e.step), steps.map((e) => (typeof e.duration_us === "number" ? e.duration_us : null)), (v) => v);
    put("peak", mem.step, mem.peak);
    put("live", mem.step, mem.live);
    // what the loop logged with torchscope.log(): a chart per name any run logged
    for (const [name, c] of Object.entries(metrics || {})) put(METRIC + name, c.step, c.value);
    const top = (xs, prev) => (xs && xs.length ? xs[xs.length - 1] : prev);
    this.last = {
      loss: top(loss.step, last?.loss ?? null), grads: top(grads.steps, last?.grads ?? null),
      memory: top(mem.step, last?.memory ?? null), steps: top(steps.map((e) => e.step), last?.steps ?? null),
    };
    if (ended) this.complete = true;
  }

  async loadFindings() {
    try { this.findings = await api(`${sessionPath(this.id)}/diagnostics?rank=${rank}`); } catch (e) {
      if (e?.status === 0 || e?.status === 401) throw e;
      this.findings = null;
    }
  }

  steps() {
    const all = new Set();
    for (const m of Object.values(this.cols)) for (const s of m.keys()) all.add(s);
    return all;
  }

  // The last recorded loss and its step ("final loss"), and the lowest finite one.
  lossFacts() {
    const m = this.cols.loss || new Map();
    let last = null, best = null;
    for (const [s, v] of m) {
      if (v === null) continue;
      if (!last || s > last[0]) last = [s, v];
      if (Number.isFinite(v) && (!best || v < best[1])) best = [s, v];
    }
    return { last, best };
  }
}

const runs = ids.map((id, k) => new Run(id, k));
let charts = null; // key -> LineChart, once every run's summary is in
let stopped = false; // a fatal message is shown: nothing more draws
let loadedMs = null; // the page's time from navigation to every chart drawn

// One sentence and the way back: no session behind the page (absent, unknown, deleted).
function fatal(msg) {
  stopped = true;
  clear(main).append(h("div", { class: "notice error", id: "fatal", role: "alert" }, msg, " ", h("a", { href: "/" }, "All sessions")));
}

// Each run as the legends name it: its name and start time, and its id when another run of the
// page has its name (a sweep's runs of one script share the script's default name, and runs
// started within the same second read alike).
// ``short``: past two runs, the charts' legends and the facts table's head name a run by its
// letter, name (and id), without the start time: eight full names stacked eight lines over each
// chart and made the table's head taller than its rows; the page's legend keeps the full ones.
function labels(short = false) {
  return runs.map((r) => {
    const twin = runs.some((o) => o.id !== r.id && o.name === r.name) ? ` [${r.id}]` : "";
    return short ? `${r.name}${twin}` : `${r.name} (started ${fmtTime(r.summary?.started_at)})${twin}`;
  });
}

// The charts' names of the runs: "A: name [id]" past two runs (the letter of the page's legend).
const seriesNames = () => (runs.length > 2 ? labels(true).map((l, k) => `${runs[k].letter}: ${l}`) : labels());

// "A: name (started ...)": a run in the page's legend and the facts table's head.
const lettered = (r, names) => legendItem(r.color, `${r.letter}: ${names[r.k]}`);

async function start() {
  initTheme();
  if (ids.length < 2) {
    const missing = ids.length ? ["a", "b"].filter((k) => !data[k]) : ["a", "b"];
    const what = missing.length && ids.length + missing.length === 2 ? `${missing.join(" and ")} ${missing.length > 1 ? "are" : "is"} missing` : "one given";
    const twice = repeated.length ? ` ${quoted(repeated)} ${repeated.length > 1 ? "are each" : "is"} named more than once: a run is compared with another, not with itself.` : "";
    return fatal(`Pick two sessions to compare: this page needs ?a=<session id>&b=<session id> (${what}), or ?runs=<id>,<id>,... for up to ${MAX}.${twice} Tick two or more runs on the sessions page.`);
  }
  const got = await Promise.allSettled(runs.map((r) => r.loadSummary()));
  const unknown = runs.filter((r, k) => got[k].status === "rejected" && got[k].reason instanceof ApiError && got[k].reason.status === 404);
  if (unknown.length) return fatal(`No session ${unknown.map((r) => `"${r.id}"`).join(" or ")} on this server.`);
  const failed = got.find((g) => g.status === "rejected");
  if (failed) return fatal(`Could not open the runs: ${failed.reason?.message || failed.reason}.`);
  document.title = `${runs[0].name} vs ${runs[1].name}${runs.length > 2 ? ` and ${runs.length - 2} more` : ""} · torchscope`;
  initRanks();
  layout();
  const dot = showConnection(document.getElementById("conn"));
  let heard = null;
  live(onLive, (ok) => {
    dot(ok);
    if (ok && heard === false) { everything(); reloadAll(); reloadFindings(); } // heard again: catch up
    heard = ok;
  });
  graphLink();
  await loadSeries();
  loadedMs = performance.now(); // (the browser test's load-time figure: every chart drawn)
  for (const r of runs) doctorChanged.add(r.id);
  reloadFindings();
}

// "Compare graphs", once both runs have a captured graph: run A's Graph view coloured by its
// diff against run B's captured step (docs/dashboard.md, the diff overlay) -- A's first captured
// step against B's step of the same number, else B's first.
let linked = false;
async function graphLink() {
  if (linked || stopped) return;
  // (a run that had ended when asked has all the graphs it will have: asked once)
  const steps = await Promise.all(runs.slice(0, 2).map((r) => r.graphSteps || ((ended) => api(`${sessionPath(r.id)}/graphs?rank=${rank}`)
    .then((gs) => [...new Set(gs.map((g) => g.step))].sort((x, y) => x - y), () => null)
    .then((s) => { if (s && ended) r.graphSteps = s; return s || []; }))(ENDED.has(r.summary?.status))));
  const slot = document.getElementById("compare-graphs");
  if (linked || stopped || !slot || steps.some((s) => !s.length)) return;
  linked = true;
  const a = steps[0][0], b = steps[1].includes(a) ? a : steps[1][0];
  const q = new URLSearchParams({ view: "graph", step: a, overlay: "diff", diffrun: runs[1].id, diffstep: b });
  if (rank) q.set("rank", rank);
  slot.append(h("a", { href: `/sessions/${encodeURIComponent(runs[0].id)}?${q}`, class: "compare-graphs", "data-testid": "compare-graphs",
    title: `run A's graph (step ${a}) coloured by what differs from run B's step ${b}: added, changed, same, and a count of what was removed` },
  "Compare graphs"));
}

// A distributed run: the rank whose steps are compared (the same for both runs).
function initRanks() {
  const ranks = [...new Set(runs.flatMap((r) => (r.summary.ranks || []).map((x) => (typeof x === "object" ? x.rank : x))))].sort((a, b) => a - b);
  const sel = document.getElementById("rank");
  if (!sel || ranks.length < 2) return;
  sel.append(...ranks.map((r) => h("option", { value: r }, `rank ${r}`)));
  sel.value = String(rank);
  sel.hidden = false;
  sel.onchange = () => { const q = new URLSearchParams(location.search); q.set("rank", sel.value); location.search = String(q); };
}

function layout() {
  clear(main);
  const names = labels();
  main.append(
    h("h2", {}, runs.length > 2 ? `Compare ${runs.length} runs` : "Compare runs"),
    ...leftOutNote(),
    ...repeatedNote(),
    h("div", { class: "compare-runs", "data-testid": "compare-legend" }, runs.map((r) =>
      h("a", { href: `/sessions/${encodeURIComponent(r.id)}${rank ? `?rank=${rank}` : ""}`, class: "compare-run", "data-run": r.letter.toLowerCase() },
        lettered(r, names))), h("span", { id: "compare-graphs" })),
    h("table", { class: "compare-facts", "data-testid": "compare-facts" }),
    h("p", { class: "muted small", id: "compare-note" },
      `Rank ${rank}. A step one run lacks is a gap in its line. Cells that differ between the runs are marked.`),
  );
  const grid = h("div", { class: "chart-pair compare-charts" });
  main.append(grid);
  charts = {};
  for (const c of CHARTS) addChart(grid, c);
  renderFacts();
}

// The runs named past the first MAX: which they are, and a page comparing them (QA: a sweep's
// fifth run on was dropped from the URL without a word).
// Each by its name (QA 52a: by its id, "3aeaa1ee6ec34ecd", which said not which run it was), with
// its id where another run named on the page has the same name, or where no session has that id.
function leftOutNote() {
  if (!leftOut.length) return [];
  const rest = new URLSearchParams({ runs: leftOut.slice(0, MAX).join(",") });
  if (rank) rest.set("rank", rank);
  const names = leftOut.map((id, k) => leftOutNames[k] ?? null);
  const all = [...runs.map((r) => r.name), ...names];
  const said = leftOut.map((id, k) => {
    const name = names[k];
    if (name === null) return `"${id}" (no such session)`;
    return all.filter((n) => n === name).length > 1 && name !== id ? `"${name}" [${id}]` : `"${name}"`;
  });
  return [h("p", { class: "notice", id: "compare-left-out", "data-testid": "compare-left-out", role: "note" },
    `This page compares at most ${MAX} runs: the first ${MAX} named are shown; left out: ${said.join(", ")}. `,
    leftOut.length > 1 ? h("a", { href: `/compare?${rest}` }, `Compare ${leftOut.length > MAX ? `the next ${MAX}` : `those ${leftOut.length}`}`) : null)];
}

// The runs the address named more than once: each is compared once (QA 52a: ?runs=X,X drew a run
// against itself as A and B without a word).
function repeatedNote() {
  if (!repeated.length) return [];
  const names = repeated.map((id) => runs.find((r) => r.id === id)?.name ?? id);
  return [h("p", { class: "notice", id: "compare-repeated", "data-testid": "compare-repeated", role: "note" },
    `${quoted(names)} ${repeated.length > 1 ? "were each" : "was"} named more than once in the address: compared once.`)];
}

const quoted = (xs) => xs.map((x) => `"${x}"`).join(", ");

function addChart(grid, c) {
  const box = h("div", { "data-testid": c.metric !== undefined ? "compare-metric" : `compare-${c.key}` });
  grid.append(box);
  charts[c.key] = new LineChart(box, { title: c.title, fmt: c.fmt, log: !!c.log, height: 200 });
}

// Refresh these runs (summary, then the series they lack), then draw.
// (Each refresh draws what every run holds then: runs load on their own, merged into their columns.)
async function loadSeries(which = runs, summary = false) {
  await Promise.all(which.map((r) => r.refresh(summary)));
  if (stopped) return;
  draw();
  renderFacts();
}

function draw() {
  const all = new Set();
  for (const r of runs) for (const s of r.steps()) all.add(s);
  const x = [...all].sort((a, b) => a - b);
  const names = seriesNames();
  const grid = main.querySelector(".compare-charts");
  for (const c of chartList()) {
    if (!charts[c.key]) addChart(grid, c);
    const chart = charts[c.key];
    const series = runs.map((r, k) => {
      const m = r.cols[c.key] || new Map();
      return { name: names[k], color: r.color, steps: !!c.steps, y: x.map((s) => (m.has(s) ? m.get(s) : null)) };
    });
    if (c.autoLog) {
      let lo = Infinity, hi = -Infinity;
      for (const s of series) for (const v of s.y) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      chart.opts.log = lo > 0 && hi / lo >= 100;
    }
    chart.setTitle(c.title + (c.autoLog && chart.opts.log ? " (log scale)" : "") + (c.marks ? ` — ticks at the top: a NaN/Inf ${c.marks}, in its run's colour` : ""));
    chart.opts.empty = runs.some((r) => r.running) ? "Nothing recorded yet." : runs.length > 2 ? "No run recorded this." : "Neither run recorded this.";
    const marks = c.marks ? runs.flatMap((r) => (r.bad[c.key] || []).map((s) => ({ x: s, color: r.color }))) : [];
    chart.setData(x, series, marks);
  }
}

// The facts table: a row per fact, a column per run; a row whose cells differ is marked.
function renderFacts() {
  const table = main.querySelector("table.compare-facts");
  if (!table) return;
  const names = labels(runs.length > 2);
  const facts = factRows();
  clear(table).append(
    h("thead", {}, h("tr", {}, h("th", {}, ""), runs.map((r) => h("th", { "data-run": r.letter.toLowerCase() }, lettered(r, names))))),
    h("tbody", {}, facts.map(([label, cells, key]) => {
      const texts = cells.map((c) => (c instanceof Node ? c.textContent : String(c)));
      const differ = texts.some((t) => t !== texts[0]);
      return h("tr", { "data-fact": key, class: differ ? "differs" : null, title: differ ? "the runs differ here" : null },
        h("th", {}, label), cells.map((c) => h("td", {}, c)));
    })));
}

function factRows() {
  const v = (x) => (x === undefined || x === null || x === "" ? "–" : String(x));
  const row = (key, label, f) => [label, runs.map((r) => f(r)), key];
  return [
    row("status", "status", (r) => h("span", { class: `badge status-${(r.summary.status || "").replace(/ /g, "-")}` }, r.summary.status || "–")),
    row("model", "model class", (r) => v(r.meta.model)),
    // (what tells a sweep's runs of one script apart: --lr 0.01 vs --lr 0.1)
    row("argv", "command line", (r) => (Array.isArray(r.meta.argv) && r.meta.argv.length ? r.meta.argv.map(shellWord).join(" ") : "–")),
    row("mode", "mode", (r) => v(r.meta.mode ?? r.summary.mode)),
    row("params", "parameters", (r) => paramText(r.meta.params)),
    row("optimizer", "optimizer", (r) => v(r.meta.optimizer)),
    row("lr0", "lr (group 0) at its first step", (r) => { const m = r.cols.lr; const first = m && [...m.values()].find((x) => x !== null); return first === undefined ? "–" : String(+first.toPrecision(6)); }),
    row("device", "device", (r) => v(r.meta.device)),
    row("torch", "torch version", (r) => v(r.meta.torch_version)),
    row("steps", "steps recorded", (r) => { const ri = (r.summary.rank_info || []).find((x) => x.rank === rank); return String(ri ? ri.steps : r.summary.steps ?? 0); }),
    row("final_loss", "final loss", (r) => { const { last } = r.lossFacts(); return last ? `${fmtNum(last[1])} (step ${last[0]})` : "–"; }),
    row("best_loss", "lowest loss", (r) => { const { best } = r.lossFacts(); return best ? `${fmtNum(best[1])} (step ${best[0]})` : "–"; }),
    row("doctor", "doctor's findings", doctorCell),
  ];
}

// One word of a command line as a POSIX shell reads it back: plain, or in single quotes ('it'\''s')
// when it holds a space, a quote or another character the shell would take apart.
function shellWord(w) {
  const s = String(w);
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`;
}

// "12,345 in 6 tensors": the elements of every watched parameter, and how many tensors hold them.
function paramText(params) {
  if (!Array.isArray(params) || !params.length) return "–";
  const n = params.reduce((t, p) => t + (typeof p?.numel === "number" ? p.numel : 0), 0);
  return `${n.toLocaleString("en-US")} in ${params.length} tensor${params.length === 1 ? "" : "s"}`;
}

// The doctor's findings by code ("P4 ×1"), in the colour of their severity; "none".
function doctorCell(r) {
  if (r.findings === undefined) return h("span", { class: "muted" }, "checking…");
  if (r.findings === null) return "–";
  if (!r.findings.length) return r.running ? "none so far" : "none";
  const by = new Map();
  for (const f of r.findings) {
    const e = by.get(f.code) || { code: f.code, n: 0, severity: f.severity, title: f.title };
    e.n++;
    if (f.severity === "error" || (f.severity === "warning" && e.severity === "info")) e.severity = f.severity;
    by.set(f.code, e);
  }
  const order = { error: 0, warning: 1, info: 2 };
  return h("span", { class: "compare-codes" }, [...by.values()].sort((a, b) => order[a.severity] - order[b.severity] || String(a.code).localeCompare(String(b.code), undefined, { numeric: true }))
    .map((e) => h("span", { class: `badge ${{ error: "err", warning: "warn" }[e.severity] || ""}`, "data-code": e.code, title: `${e.title || ""} (${e.severity})` }, `${e.code} ×${e.n}`)));
}

// The runs the live channel named since the last refresh (every run after the channel was
// lost: it may have missed anything): a refresh fetches theirs only, the others unchanged.
const changed = new Set();
const doctorChanged = new Set();
const pick = (set) => { const which = runs.filter((r) => set.has(r.id)); set.clear(); return which; };

const reloadAll = coalesce(async () => {
  if (stopped) return;
  const which = pick(changed);
  if (!which.length) return;
  graphLink(); // a run still going may capture its first graph now
  await loadSeries(which, true);
}, 1000);

const reloadFindings = coalesce(async () => {
  if (stopped) return;
  await Promise.all(pick(doctorChanged).map((r) => r.loadFindings()));
  if (!stopped) renderFacts();
}, 300);

const everything = () => { for (const r of runs) { changed.add(r.id); doctorChanged.add(r.id); } };

// A step (or the end) of a run refreshes that run; a finding refreshes its doctor's cell.
function onLive(ev) {
  if (stopped || !ids.includes(ev.session)) return;
  if (ev.rank !== undefined && ev.rank !== rank && ev.kind !== "deleted") return;
  if (ev.kind === "deleted") return fatal(`Session "${ev.session}" was deleted.`);
  if (["step", "end", "status", "session"].includes(ev.kind)) { changed.add(ev.session); reloadAll(); }
  if (ev.kind === "finding" || ev.kind === "end") { doctorChanged.add(ev.session); reloadFindings(); }
}

// For the browser tests: what each chart holds, and the facts table's text.
function state() {
  const out = { ids, rank, charts: {}, legend: [], facts: {} };
  if (!charts) return out;
  for (const c of chartList()) {
    const ch = charts[c.key];
    if (!ch) continue;
    out.charts[c.key] = { x: ch.x || [], log: !!ch.opts.log, legend: [...ch.legend.children].map((e) => e.textContent), marks: ch.markers.map((m) => m.x), markColors: ch.markers.map((m) => m.color),
      series: (ch.series || []).map((s) => ({ name: s.name, color: s.color, y: s.y.map(wire) })) };
  }
  out.legend = [...main.querySelectorAll("[data-testid=compare-legend] .compare-run")].map((e) => e.textContent);
  for (const tr of main.querySelectorAll("table.compare-facts tbody tr")) out.facts[tr.dataset.fact] = [...tr.cells].slice(1).map((td) => td.textContent);
  return out;
}

// (drawMs: the time to repaint every chart once, as a resize or a theme switch does)
const drawMs = () => Object.values(charts || {}).reduce((t, ch) => t + ch.draw(), 0);
window.__torchscope = { ready: start().catch((e) => fatal(e?.message || String(e))), state, reload: () => loadSeries(runs, true),
  get loadedMs() { return loadedMs; }, drawMs };
