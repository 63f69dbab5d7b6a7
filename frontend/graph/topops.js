// The "Top ops" table of the step the Graph view shows, as torch.profiler's
// key_averages().table() reads: the step's ops (or its grad_fn nodes) grouped by name -- or by
// the module they ran in -- with their number of calls, summed time, share of the section's
// time, mean and longest call, and the bytes they allocated (a grad_fn node: saved).  Sorted by
// a click on a column's header; a click on a row lights up those ops in the graph.
import { h, clear, fmtUs, fmtBytes, moduleTyped } from "../dom.js";
import { leafWhere } from "./scene.js";

// What the table can list: the ops of one phase (OpRecord.phase), every op, or the autograd
// graph's grad_fn nodes (NodeRecord).  A phase's section is offered only when the step has ops
// of that phase (full mode records the backward's aten kernels and the optimizer's ops).
export const SECTIONS = [
  ["forward", "forward ops", (l) => l.kind === "op" && (l.rec.phase || "forward") === "forward"],
  ["backward", "backward ops (aten kernels)", (l) => l.kind === "op" && l.rec.phase === "backward"],
  ["optimizer", "optimizer ops", (l) => l.kind === "op" && l.rec.phase === "optimizer"],
  ["all", "all ops", (l) => l.kind === "op"],
  ["nodes", "grad_fn nodes (backward)", (l) => l.kind === "node"],
];
const SECTION = new Map(SECTIONS.map(([k, label, test]) => [k, { label, test }]));

// Columns: key, heading, tooltip, first-click order.  "bytes" is the ops' allocation, the
// nodes' saved tensors; shown only when the step recorded any.
const COLUMNS = [
  ["name", "Name", "the op's name as recorded (aten::…), a grad_fn's class, or the module's path", "asc"],
  ["calls", "# of Calls", "how many times it ran in this step (every micro-batch's)", "desc"],
  ["total", "Total time", "its calls' durations added up (the recorded ops do not nest: this is their self time, as the profiler's Self CPU total)", "desc"],
  ["share", "% of time", "its total time as a share of the section's summed time (the caption's total)", "desc"],
  ["mean", "Mean time", "total time / timed calls", "desc"],
  ["max", "Max time", "its longest call", "desc"],
  ["bytes", "Allocated", "bytes of new storages its calls allocated (OpRecord.alloc)", "desc"],
];

// One row per name (or module) of the leaves of ``section``: {key, label, keys (leaf keys, in
// execution order), calls, timed, total (µs), mean, max, bytes}.  Totals: {count, timed, total, bytes}.
export function aggregate(model, section, by = "name", moduleType = null) {
  const test = (SECTION.get(section) || SECTION.get("forward")).test;
  const rows = new Map();
  let count = 0, timed = 0, total = 0, bytes = 0, anyBytes = false;
  for (const l of model.leaves) {
    if (!test(l)) continue;
    const r = l.rec;
    const where = leafWhere(model, l);
    const key = by === "module" ? where : r.name || l.label;
    let row = rows.get(key);
    if (!row) {
      const label = by === "module" ? (l.module && where === l.module ? moduleTyped(where, moduleType?.get(where)) : where) : key;
      row = { key, label, keys: [], calls: 0, timed: 0, total: 0, max: undefined, bytes: 0 };
      rows.set(key, row);
    }
    row.keys.push(l.key);
    row.calls++; count++;
    if (typeof r.dur_us === "number") {
      row.timed++; timed++;
      row.total += r.dur_us; total += r.dur_us;
      row.max = row.max === undefined ? r.dur_us : Math.max(row.max, r.dur_us);
    }
    const b = l.kind === "op" ? r.alloc : r.saved_bytes;
    if (typeof b === "number") { row.bytes += b; bytes += b; anyBytes = true; }
  }
  const list = [...rows.values()];
  for (const row of list) {
    row.mean = row.timed ? row.total / row.timed : undefined;
    row.share = total > 0 && row.timed ? row.total / total : undefined;
    if (!row.timed) row.total = undefined;
  }
  return { rows: list, count, timed, total, bytes: anyBytes ? bytes : undefined };
}

// Rows in a column's order; ties (and missing values, last either way) by name.
export function sortRows(rows, key, dir) {
  const sign = dir === "asc" ? 1 : -1;
  const val = (r) => (key === "name" ? r.label : r[key]);
  return rows.slice().sort((a, b) => {
    const x = val(a), y = val(b);
    const mx = x === undefined || x === null, my = y === undefined || y === null;
    if (mx || my) return mx && my ? a.label.localeCompare(b.label) : mx ? 1 : -1;
    const c = typeof x === "string" ? x.localeCompare(y) : x - y;
    return c ? sign * c : a.label.localeCompare(b.label);
  });
}

const pct = (x) => (x === undefined ? "–" : `${(x * 100).toFixed(x >= 0.1 ? 1 : 2)} %`);

export class TopOps {
  // ``view``: the GraphView (its model, step, step event and highlightKeys); ``state``: the
  // section, grouping and sort to start with.
  constructor(view, { section = "forward", by = "name", sort = "" } = {}) {
    this.view = view;
    this.section = SECTION.has(section) ? section : "forward";
    this.by = by === "module" ? "module" : "name";
    // the sort, as the URL keeps it (topsort=mean, topsort=name-desc): a column and its order,
    // the column's first order when none is given; "total", largest first, when none is
    const [col, order] = String(sort || "").split("-");
    const known = COLUMNS.find(([k]) => k === col);
    this.sort = known ? col : "total";
    this.dir = known && (order === "asc" || order === "desc") ? order : known ? known[3] : "desc";
    this.active = null; // the row whose ops are lit up in the graph
    this.sectionSel = h("select", { "aria-label": "top ops: what to list", "data-testid": "top-ops-section", onchange: () => this.set({ section: this.sectionSel.value }) });
    this.bySel = h("select", { "aria-label": "top ops: group by", "data-testid": "top-ops-by", onchange: () => this.set({ by: this.bySel.value }) },
      h("option", { value: "name" }, "by name"), h("option", { value: "module" }, "by module"));
    this.title = h("strong", {}, "Top ops");
    this.caption = h("span", { class: "muted top-ops-caption", "data-testid": "top-ops-caption" });
    this.table = h("table", { class: "list top-ops-table", "data-testid": "top-ops-table" });
    this.el = h("section", { class: "top-ops", "data-testid": "top-ops", hidden: true, "aria-label": "top ops of this step" },
      h("div", { class: "top-ops-head" }, this.title, this.sectionSel, this.bySel, this.caption,
        h("button", { class: "top-ops-close", title: "close the table", "aria-label": "close top ops", onclick: () => view.toggleTopOps(false) }, "×")),
      h("div", { class: "top-ops-scroll" }, this.table));
  }

  get open() { return !this.el.hidden; }

  set(patch) {
    if (patch.section !== undefined) this.section = patch.section;
    if (patch.by !== undefined) this.by = patch.by;
    this.active = null;
    this.view.onTopOpsState();
    this.render();
  }

  // The shown step's table, again (a new step, a new section, a new order).
  render() {
    const model = this.view.model;
    if (!model || !this.open) return;
    // the sections this step has something in (forward and the nodes always offered)
    const have = SECTIONS.filter(([k, , test]) => k === "forward" || k === "nodes" || k === "all" || model.leaves.some(test));
    if (!have.some(([k]) => k === this.section)) this.section = "forward";
    clear(this.sectionSel).append(...have.map(([k, label]) => h("option", { value: k }, label)));
    this.sectionSel.value = this.section;
    this.bySel.value = this.by;
    this.title.textContent = `Top ops · step ${this.view.step}`;
    const agg = this.agg = aggregate(model, this.section, this.by, this.view.app.moduleType);
    const rows = this.rows = sortRows(agg.rows, this.sort, this.dir);
    this.caption.textContent = this.captionText(agg);

    const cols = COLUMNS.filter(([k]) => k !== "bytes" || agg.bytes !== undefined);
    const head = h("tr", {}, ...cols.map(([k, label, title, first]) => {
      const heading = k === "name" ? (this.by === "module" ? "Module" : this.section === "nodes" ? "grad_fn" : "Name")
        : k === "bytes" && this.section === "nodes" ? "Saved" : label;
      const tip = k === "bytes" && this.section === "nodes" ? "bytes of the tensors its nodes saved for backward (NodeRecord.saved_bytes)" : title;
      const th = h("th", { "data-sort": k, title: tip, class: k === "name" ? "" : "num" },
        h("button", { class: "sort", type: "button", tabindex: -1 }, heading));
      if (k === this.sort) th.setAttribute("aria-sort", this.dir === "asc" ? "ascending" : "descending");
      th.addEventListener("click", () => {
        this.dir = this.sort === k ? (this.dir === "asc" ? "desc" : "asc") : first;
        this.sort = k;
        this.render();
        this.view.onTopOpsState();
      });
      return th;
    }));
    const cell = (k, r) => {
      switch (k) {
        case "name": return h("td", { class: "top-ops-name", title: r.label }, r.label);
        case "calls": return h("td", { class: "num" }, r.calls.toLocaleString("en-US"));
        case "total": return h("td", { class: "num", title: r.total === undefined ? "not timed" : `${r.total.toFixed(2)} µs` }, fmtUs(r.total));
        case "share": return h("td", { class: "num" }, h("span", { class: "top-ops-bar", style: `width: ${Math.round((r.share || 0) * 100)}%` }), h("span", {}, pct(r.share)));
        case "mean": return h("td", { class: "num" }, fmtUs(r.mean));
        case "max": return h("td", { class: "num" }, fmtUs(r.max));
        case "bytes": return h("td", { class: "num", title: `${r.bytes} B` }, fmtBytes(r.bytes));
        default: return h("td", {});
      }
    };
    const body = rows.map((r) => {
      const tr = h("tr", { class: `top-ops-row${this.active === r.key ? " on" : ""}`, tabindex: 0, title: "light up these in the graph; click again: the next one",
        "data-key": r.key, "data-calls": r.calls, "data-total-us": r.total ?? "",
        onclick: () => this.pick(r),
        onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); this.pick(r); } } }, ...cols.map(([k]) => cell(k, r)));
      return tr;
    });
    clear(this.table).append(h("thead", {}, head), h("tbody", {}, ...body));
    if (!rows.length) this.table.append(h("tbody", {}, h("tr", {}, h("td", { colspan: cols.length, class: "muted" }, `No ${SECTION.get(this.section).label} in this step.`))));
  }

  captionText(agg) {
    const what = SECTION.get(this.section).label;
    const groups = `${agg.rows.length} ${this.by === "module" ? "module" : "name"}${agg.rows.length === 1 ? "" : "s"}`;
    let s = `${agg.count.toLocaleString("en-US")} ${what}, ${groups}; ${fmtUs(agg.total)} summed`;
    if (agg.timed < agg.count) s += ` (${agg.count - agg.timed} not timed)`;
    const ev = this.view.stepEvent;
    if (ev && this.section === "forward" && ev.forward_us) s += `; the forward took ${fmtUs(ev.forward_us)}`;
    if (ev && (this.section === "nodes" || this.section === "backward") && ev.backward_us) s += `; backward() took ${fmtUs(ev.backward_us)}`;
    if (ev && ev.duration_us) s += `, the whole step ${fmtUs(ev.duration_us)}`;
    // the first watched step pays what later ones do not: a short run's only captured step read
    // as its steady times (QA 48b: a stem convolution's 133 ms of 154)
    if (this.view.step === 0) s += ". Step 0's times include one-time costs (first calls of each kernel, memory first allocated, the optimizer's state made)";
    return s;
  }

  // A row clicked: its ops lit up in the graph, the first selected; again: the next one.
  pick(r) {
    this.active = r.key;
    for (const tr of this.table.querySelectorAll("tr.top-ops-row")) tr.classList.toggle("on", tr.dataset.key === r.key);
    this.view.highlightKeys(r.keys);
  }

  // The graph's highlight is no longer the row's (Escape, a search, a finding): no row marked.
  unmark() {
    if (this.active === null) return;
    this.active = null;
    for (const tr of this.table.querySelectorAll("tr.top-ops-row.on")) tr.classList.remove("on");
  }

  // The sort for the URL: undefined for the default (total time, largest first); the column
  // alone in its first order.
  sortParam() {
    if (this.sort === "total" && this.dir === "desc") return undefined;
    const first = COLUMNS.find(([k]) => k === this.sort)?.[3];
    return this.dir === first ? this.sort : `${this.sort}-${this.dir}`;
  }

  debug() {
    return { open: this.open, section: this.section, by: this.by, sort: this.sort, dir: this.dir, active: this.active,
      rows: (this.open ? this.rows || [] : []).map((r) => ({ key: r.key, label: r.label, calls: r.calls, total: r.total ?? null,
        mean: r.mean ?? null, max: r.max ?? null, share: r.share ?? null, bytes: r.bytes })) };
  }
}
