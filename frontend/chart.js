// A small canvas line chart for long series: each series is reduced to one min/max pair per
// pixel column (linear in the number of points), so 100,000 steps draw in a few ms.
// One finite spike (a diverging run's loss of 7e27 at one step) no longer sets the y range:
// when values lie far outside the bulk of the data (its 1st to 99th percentile), the axis
// fits the rest and those points are drawn at the plot's edge as ▲ / ▼ (a per-chart
// "ignore outliers" checkbox gives the whole range back).
import { h, clear, fmtNum, fmtBytes, fmtUs, decadeFormat, columnFormat } from "./dom.js";
import { SERIES, legendItem } from "./colors.js";
import { THEME_EVENT } from "./theme.js";

export class LineChart {
  // opts: {title, fmt(y), onClick(index), height, xTitle, stacked, fromZero (a linear axis from 0)}
  // stacked: the series drawn as filled bands, each over the ones before it (memory_viz's
  // stacked areas: the top edge is their sum at every x; a linear axis from 0; no outlier fit)
  constructor(parent, opts = {}) {
    this.opts = opts;
    this.root = h("div", { class: "chart" });
    this.title = h("span", { class: "chart-title" }, opts.title || "");
    this.head = h("div", { class: "chart-head" }, this.title);
    this.legend = h("span", { class: "chart-legend" });
    // what the outlier fit left out ("1 point off scale ▲"), and the checkbox that undoes it;
    // both shown only on a chart that has values far outside the bulk of its data
    this.offNote = h("span", { class: "chart-offscale", hidden: true });
    this.fitBox = h("input", { type: "checkbox", onchange: () => this.setFit(this.fitBox.checked) });
    this.fitLabel = h("label", { class: "chart-fit", hidden: true,
      title: "Scale the y axis to the bulk of the values: points far outside it (a spike) are drawn as ▲ / ▼ at the plot's edge, " +
        "their true values in the tooltip. Unchecked: the whole range." }, this.fitBox, "ignore outliers");
    this.head.append(this.legend, this.offNote, this.fitLabel);
    // a chart a screen reader can read and a keyboard can walk: the canvas is an image whose
    // label sums up each line (its range and last value), and ← → Home End move a read-out
    // over the points, said aloud as the pointer's tooltip (WCAG 1.1.1, 2.1.1)
    this.canvas = h("canvas", { height: opts.height || 220, role: "img", tabindex: 0 });
    // (the read-out is always in the accessibility tree, its box shrunk to nothing while idle: a
    // live region added in the task that fills it goes unsaid by several screen readers, QA 50b)
    this.tip = h("div", { class: "chart-tip idle", role: "status", "aria-live": "polite" });
    this.root.append(this.head, h("div", { class: "chart-body" }, this.canvas, this.tip));
    parent.append(this.root);
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => this.hideTip());
    this.canvas.addEventListener("keydown", (e) => this.key(e));
    this.canvas.addEventListener("blur", () => this.hideTip());
    this.canvas.addEventListener("click", (e) => { const i = this.indexAt(e.offsetX); if (i >= 0 && this.opts.onClick) this.opts.onClick(i); });
    new ResizeObserver(() => this.draw()).observe(this.root);
    window.addEventListener(THEME_EVENT, () => this.draw());
    this.markers = [];
    this.version = 0; // (setData's count: the bulk range is computed once per data, not per draw)
  }

  // Whether the y axis fits the bulk of the data: the user's choice for this chart, else the
  // last one made on any chart (kept in localStorage), else yes.
  get fitOutliers() {
    if (this.fitChoice !== undefined) return this.fitChoice;
    try { return localStorage.getItem(FIT_KEY) !== "0"; } catch { return true; }
  }

  setFit(on) {
    this.fitChoice = !!on;
    try { localStorage.setItem(FIT_KEY, on ? "1" : "0"); } catch { /* (storage off: this chart keeps it) */ }
    return this.draw();
  }

  // How a value is written in the read-out and the description: the chart's own format (bytes,
  // durations) or one notation for all its values.
  valueFmt() { return this.opts.fmt || this.columnFmt || fmtNum; }

  setTitle(text) { this.title.textContent = text; this.describe(); }

  // The canvas's text for assistive technology: each line's range (of its finite values), its
  // last value as it is -- NaN included: "last 0.066" of a run NaN for its second half read as
  // a healthy end (QA 50b) -- and how many steps are NaN/Inf, from which; a sentence a line.
  describe() {
    const x = this.x || [];
    const lines = (this.series || []).filter((s) => !s.dash).slice(0, 8).map((s) => this.describeLine(s, x));
    const more = (this.series || []).length > 8 ? `. And ${this.series.length - 8} more lines` : "";
    const end = this.opts.xRange?.[1], past = x.length && end > x[x.length - 1] ? ` (of ${this.opts.xLabel || "step"}s ${Math.min(x[0], this.opts.xRange[0])} to ${end})` : "";
    const span = x.length ? `${x.length.toLocaleString("en-US")} points, ${this.opts.xLabel || "step"} ${x[0]} to ${x[x.length - 1]}${past}` : "no data yet";
    // (the sentence on arrow keys stays last: the browser tests read the label's end)
    const enter = this.opts.onClick ? "Enter marks the step of the point read, as a click does. " : "";
    this.canvas.setAttribute("aria-label", `${this.title.textContent || "chart"}: ${span}${lines.length ? ". " + lines.join(". ") : ""}${more}. ` +
      `${enter}Arrow keys read the points.`);
  }

  // One line's words: "loss: from 0.03 to 5.5, last NaN (step 199); NaN/Inf at 100 steps,
  // first at step 100".  The last value's step is said where it is not the chart's last one or
  // not finite (a line that ends early, or in NaN).
  describeLine(s, x) {
    const fmt = this.valueFmt(), xl = this.opts.xLabel || "step";
    let lo = Infinity, hi = -Infinity, last = -1, bad = 0, firstBad = -1;
    s.y.forEach((v, i) => {
      if (nonFinite(v)) { bad++; if (firstBad < 0) firstBad = i; last = i; } else if (typeof v === "number") {
        if (v < lo) lo = v;
        if (v > hi) hi = v;
        last = i;
      }
    });
    if (last < 0) return `${s.name}: no value`;
    const lv = s.y[last], lastBad = nonFinite(lv);
    const early = last !== x.length - 1 || this.opts.xRange?.[1] > x[last];
    const lastText = `last ${lastBad ? String(Number(lv)) : fmt(lv)}${lastBad || early ? ` (${xl} ${x[last]})` : ""}`;
    const range = lo <= hi ? `from ${fmt(lo)} to ${fmt(hi)}` : "no finite value";
    const nan = bad ? `; NaN/Inf at ${bad.toLocaleString("en-US")} ${xl}${bad === 1 ? "" : "s"}, first at ${xl} ${x[firstBad]}` : "";
    return `${s.name}: ${range}, ${lastText}${nan}`;
  }

  // ← → one point, Page Up / Down a tenth of them, Home / End the ends; Enter clicks the point.
  key(e) {
    const n = this.x?.length || 0;
    if (!n || !this.geom) return;
    const step = Math.max(1, Math.round(n / 10));
    const moves = { ArrowLeft: -1, ArrowRight: 1, PageUp: -step, PageDown: step, Home: -n, End: n };
    if (e.key === "Enter" && this.keyIndex !== undefined) { this.opts.onClick?.(this.keyIndex); e.preventDefault(); return; }
    if (!(e.key in moves)) return;
    e.preventDefault();
    const at = this.keyIndex ?? (moves[e.key] < 0 ? n : -1);
    this.keyIndex = Math.min(n - 1, Math.max(0, at + moves[e.key]));
    const { L, pw, xmin, xmax } = this.geom;
    this.showTip(this.keyIndex, L + ((this.x[this.keyIndex] - xmin) / ((xmax - xmin) || 1)) * pw);
  }

  // x: number[]; series: [{name, y: number[] (null = gap), color?, dash?, steps?}] (dash: a
  // threshold such as clip_grad_norm_'s max_norm, drawn dashed to read as a limit, not as data;
  // steps: a value in force from its x to the next one's, the learning rate, drawn as a step
  // line: a ramp between two points read as a warmup or a decay that never happened)
  setData(x, series, markers = []) {
    this.x = x; this.series = series.filter((s) => s.y && s.y.some((v) => v !== null && v !== undefined));
    this.markers = markers;
    // one notation for the chart's values, read point after point (QA 53c: a warm-up's lr read
    // "6.00e-4" at step 0 and "0.001200" at step 1, fmtNum choosing per value)
    this.columnFmt = columnFormat(this.series.flatMap((s) => s.y));
    this.version++;
    if (this.keyIndex !== undefined && this.keyIndex >= x.length) this.keyIndex = undefined;
    clear(this.legend);
    this.series.forEach((s, k) => {
      s.color = s.color || SERIES[k % SERIES.length];
      // a series equal to an earlier one (parameters and gradients of the same bytes) is drawn
      // dashed over it, and the legend says so: else the later line hides the earlier
      // (two series of NaN alone are not "equal": they say nothing about each other)
      s.same = !this.opts.stacked && !s.dash && s.y.some((v) => typeof v === "number" && Number.isFinite(v)) &&
        this.series.slice(0, k).find((o) => o.y.length === s.y.length && o.y.every((v, i) => alike(v, s.y[i])));
      // (worded as equal values: "gradients (= parameters)" read as gradients counted as parameters)
      this.legend.append(legendItem(s.color, s.same ? sameName(s, s.same, this.opts.fmt) : s.dash ? thresholdName(s, this.series) : s.name));
    });
    this.describe();
    return this.draw();
  }

  draw() {
    const t0 = performance.now();
    const c = this.canvas, dpr = window.devicePixelRatio || 1;
    const W = Math.max(100, this.root.clientWidth), H = this.opts.height || 220;
    c.width = W * dpr; c.height = H * dpr; c.style.width = W + "px"; c.style.height = H + "px";
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const css = getComputedStyle(document.documentElement);
    ctx.fillStyle = css.getPropertyValue("--panel").trim(); ctx.fillRect(0, 0, W, H);
    if (!this.x || !this.x.length || !this.series.length) {
      this.fitLabel.hidden = this.offNote.hidden = true;
      ctx.fillStyle = css.getPropertyValue("--muted").trim(); ctx.font = "13px system-ui";
      ctx.fillText(this.opts.empty || "No data yet", 12, 24);
      return 0;
    }
    const L = 64, R = 10, T = 8, B = 22;
    const pw = W - L - R, ph = H - T - B;
    const n = this.x.length;
    // (opts.xRange: the run's steps, wider than the points of a statistic read on some steps)
    const [r0, r1] = this.opts.xRange || [this.x[0], this.x[n - 1]];
    const xmin = Math.min(this.x[0], r0), xend = Math.max(this.x[n - 1], r1), xmax = xend === xmin ? xmin + 1 : xend;
    // opts.log: a log10 axis (gradient norms span decades; a spike of 1e6 flattens the rest on
    // a linear one); zero and negative values are gaps there, as non-finite ones are anywhere
    const log = !!this.opts.log, stacked = !!this.opts.stacked && !log;
    const ys = (stacked ? cumulative(this.series) : this.series.map((s) => s.y)).map((y) => y.map((v) => (typeof v !== "number" || !Number.isFinite(v) || (log && v <= 0) ? null : log ? Math.log10(v) : v)));
    let ymin = Infinity, ymax = -Infinity;
    for (const y of ys) for (const v of y) if (v !== null) { if (v < ymin) ymin = v; if (v > ymax) ymax = v; }
    if (stacked) ymin = Math.min(ymin, 0); // (a band's area reads as its bytes only from 0)
    // the bulk of the values, when some lie far outside it (else null: the whole range, as ever)
    const key = `${this.version} ${log} ${stacked}`;
    if (this.bulkKey !== key) { this.bulkKey = key; this.bulk = stacked ? null : bulkRange(ys, log); }
    const fit = !!this.bulk && this.fitOutliers;
    let ax = log ? logAxis(ymin, ymax) : this.linearAxis(ymin, ymax);
    let off = null; // the points outside the fitted axis: counts by direction, per series
    if (fit) {
      const bulk = log ? logAxis(this.bulk.lo, this.bulk.hi) : this.linearAxis(this.bulk.lo, this.bulk.hi);
      off = offScale(ys, bulk.lo, bulk.hi);
      if (off.above + off.below) ax = bulk; else off = null; // (rounded out to whole steps, the axis took them in)
    }
    const { lo, hi, ystep, fmt } = ax;
    ymin = lo; ymax = hi;
    this.geom = { L, pw, xmin, xmax, T, ph }; // (T, ph: the plot's top and height, for the tests' pixels)
    // (the browser tests read the range: in decades on a log axis; fit: whether it leaves
    // outliers out, offScale: how many points it leaves out)
    this.axis = { lo, hi, log, labels: [], fit: !!off, offScale: off ? off.above + off.below : 0 };
    this.fitLabel.hidden = !this.bulk;
    this.fitBox.checked = fit;
    this.offNote.hidden = !off;
    if (off) {
      const n = off.above + off.below;
      this.offNote.textContent = `${n} point${n === 1 ? "" : "s"} off scale ${off.above ? "▲" : ""}${off.below ? "▼" : ""}`;
      this.offNote.title = "Far outside the bulk of the values: drawn at the plot's edge, their values in the tooltip " +
        "(uncheck \"ignore outliers\" for the whole range)";
    }
    const X = (v) => L + ((v - xmin) / (xmax - xmin)) * pw;
    // (a value off scale is drawn at the plot's edge: clamped, its line runs into the edge)
    const Y = (v) => Math.min(T + ph, Math.max(T, T + ph - ((v - ymin) / (ymax - ymin)) * ph));
    this.plot = { X, Y, ys }; // (where the read-out's markers go)
    // axes
    ctx.strokeStyle = css.getPropertyValue("--border").trim(); ctx.fillStyle = css.getPropertyValue("--muted").trim();
    ctx.font = "11px system-ui"; ctx.lineWidth = 1;
    let prevLabel = null;
    for (let k = 0; ymin + k * ystep <= ymax + ystep / 1e6; k++) {
      const v = ymin + k * ystep, y = Y(v), label = fmt(v);
      ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - R, y); ctx.stroke();
      if (label !== prevLabel) { ctx.fillText(label, 4, y + 4, L - 8); this.axis.labels.push(label); } // a narrow range rounds to one label
      prevLabel = label;
    }
    const tick = Math.max(1, niceStep((xmax - xmin) / 6)); // steps are whole numbers
    // opts.xTitle: the x axis's name at its right end ("op # →"), the tick labels it would
    // overlap left out
    const xTitle = this.opts.xTitle, titleX = xTitle ? W - R - ctx.measureText(xTitle).width : Infinity;
    if (xTitle) { ctx.fillText(xTitle, titleX, H - 6); this.axis.xTitle = xTitle; }
    for (let v = Math.ceil(xmin / tick) * tick; v <= xmax; v += tick) {
      const label = String(v), x = X(v) - 8;
      if (x + ctx.measureText(label).width + 6 < titleX) ctx.fillText(label, x, H - 6);
    }
    // series, decimated to min/max per pixel column
    const cols = Math.max(1, Math.floor(pw));
    this.offMarks = []; // the ▲ / ▼ drawn: {x, y, up, color} (one per pixel column and series)
    // earlier series drawn wider: two equal series show both colours, not only the last one
    const last = this.series.length - 1;
    for (const [k, s] of this.series.entries()) {
      const y = ys[k];
      if (stacked) { this.drawBand(ctx, s, k ? ys[k - 1] : null, y, X, Y); continue; }
      ctx.strokeStyle = s.color; ctx.lineWidth = 1.5 + (last ? (2 * (last - k)) / last : 0); ctx.setLineDash(s.same || s.dash ? [6, 5] : []);
      ctx.beginPath();
      if (n <= cols * 2) {
        let pen = false;
        const gap = (j) => j < 0 || j >= n || y[j] === null;
        for (let i = 0; i < n; i++) {
          const v = y[i];
          if (gap(i)) { pen = false; continue; }
          if (pen && s.steps) ctx.lineTo(X(this.x[i]), Y(y[i - 1])); // across at the last value, then up or down
          if (pen) ctx.lineTo(X(this.x[i]), Y(v)); else ctx.moveTo(X(this.x[i]), Y(v));
          // a value between two gaps (e.g. only captured steps have it) is a dot, not nothing
          if (!pen && gap(i + 1)) { ctx.moveTo(X(this.x[i]) + 2.5, Y(v)); ctx.arc(X(this.x[i]), Y(v), 2.5, 0, 2 * Math.PI); ctx.moveTo(X(this.x[i]), Y(v)); }
          pen = true;
        }
      } else {
        // each pixel column's first, lowest, highest and last value, joined to the next
        // column's in one path: a flat or slow line stays a line, in its width and dashes (a
        // stroke per column, unjoined, drew a 5,000-step run's lines as faint dots, QA 46c)
        const mn = new Float64Array(cols).fill(Infinity), mx = new Float64Array(cols).fill(-Infinity);
        const first = new Float64Array(cols), lastv = new Float64Array(cols);
        const scale = (cols - 1) / (xmax - xmin);
        let prev = -1; // the column of the value before, or -1 after a gap (a null)
        const broken = new Uint8Array(cols); // a gap (null) just before this column's first value
        for (let i = 0; i < n; i++) {
          const v = y[i];
          if (v === null) { prev = -1; continue; }
          const col = Math.round((this.x[i] - xmin) * scale);
          if (mn[col] === Infinity) { first[col] = v; broken[col] = prev < 0 ? 1 : 0; }
          if (v < mn[col]) mn[col] = v;
          if (v > mx[col]) mx[col] = v;
          lastv[col] = v;
          prev = col;
        }
        let pen = false;
        for (let col = 0; col < cols; col++) {
          if (mn[col] === Infinity) { pen = false; continue; }
          const x = L + col;
          if (pen && !broken[col]) ctx.lineTo(x, Y(first[col])); else ctx.moveTo(x, Y(first[col]));
          ctx.lineTo(x, Y(mn[col])); ctx.lineTo(x, Y(mx[col])); ctx.lineTo(x, Y(lastv[col]));
          pen = true;
        }
      }
      ctx.stroke();
      if (off?.series[k]) this.drawOffScale(ctx, s, y, X, T, ph, cols);
    }
    ctx.setLineDash([]);
    for (const v of this.opts.vlines?.() || []) { // phase boundaries and the like
      ctx.strokeStyle = css.getPropertyValue("--muted").trim(); ctx.setLineDash([3, 3]);
      ctx.beginPath(); ctx.moveTo(X(v.x), T); ctx.lineTo(X(v.x), T + ph); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = css.getPropertyValue("--muted").trim(); ctx.fillText(v.label, X(v.x) + 4, T + 12);
    }
    // NaN/Inf (and other point) markers: a thin row of ticks just inside the top edge, one a
    // pixel column (dots 8 px wide, at a few px a step, were a thick bar along the top of a
    // diverged run, over the line's first pixels)
    this.markRow = { top: T + 1, height: MARK_H, width: MARK_W };
    let lastCol = null, lastColor = null;
    for (const m of this.markers) {
      const col = Math.round(X(m.x)), color = m.color || "#b91c1c";
      if (col === lastCol && color === lastColor) continue;
      lastCol = col; lastColor = color;
      ctx.fillStyle = color;
      ctx.fillRect(col - MARK_W / 2, T + 1, MARK_W, MARK_H);
    }
    this.lastDrawMs = performance.now() - t0;
    return this.lastDrawMs;
  }

  // A linear axis over [ymin, ymax] in round steps (1, 2 or 5 times a power of ten), the
  // range widened to whole steps so the labels read 40 / 50 / 60 rather than 36 / 43 / 50;
  // bytes step in round KiB / MiB / GiB ("10 KiB / 20 KiB", not "9.77 KiB").  Bytes and
  // durations label every tick in the step's unit: formatted one by one, an axis read
  // "0 µs / 50.0 ms / 100.0 ms".
  linearAxis(ymin, ymax) {
    if (ymin === Infinity) { ymin = 0; ymax = 1; }
    // (opts.fromZero: always from 0 -- a peak of 61,192 to 61,200 bytes drew an 8-byte wobble
    // as a full-height spike, QA 50b)
    if (ymin > 0 && (ymin < ymax * 0.5 || this.opts.fromZero)) ymin = 0;
    if (ymax === ymin) { // a constant: in the middle of a range its axis labels tell apart
      const pad = Math.abs(ymin) / 2 || 1;
      ymin = ymin >= 0 ? Math.max(0, ymin - pad) : ymin - pad;
      ymax += pad;
    }
    const raw = (ymax - ymin) / 4;
    // (a step of half a unit or more steps in whole units: "1 / 2 / 3 MiB", not "1000 / 2000 KiB")
    const unit = this.opts.fmt === fmtBytes && raw >= 512 ? 1024 ** Math.floor(Math.log(raw * 2) / Math.log(1024)) : 1;
    const ystep = niceStep(raw / unit) * unit;
    const units = UNITS.get(this.opts.fmt);
    const lo = Math.floor(ymin / ystep) * ystep, hi = Math.ceil(ymax / ystep - 1e-9) * ystep;
    let fmt = this.opts.fmt || axisNum(ystep, Math.max(Math.abs(lo), Math.abs(hi)));
    if (units) {
      const [div, name] = units.find(([d]) => ystep >= d) || units[units.length - 1];
      const num = axisNum(ystep / div, Math.max(Math.abs(lo), Math.abs(hi)) / div);
      fmt = (v) => `${num(v / div)} ${name}`;
    }
    return { lo, hi, ystep, fmt };
  }

  // The ▲ (above the axis) or ▼ (below) at the plot's edge of each point of series ``s`` (its
  // values ``y`` on the axis's scale) outside the axis, in the series' colour; one a pixel
  // column (a long run's columns hold many steps).
  drawOffScale(ctx, s, y, X, T, ph, cols) {
    const { lo, hi } = this.axis, seen = new Uint8Array(cols + 1);
    const { L, pw } = this.geom;
    ctx.fillStyle = s.color; ctx.setLineDash([]);
    for (let i = 0; i < y.length; i++) {
      const v = y[i];
      if (v === null || (v >= lo && v <= hi)) continue;
      const up = v > hi, px = X(this.x[i]), col = Math.max(0, Math.min(cols, Math.round(((px - L) / pw) * cols)));
      if (seen[col] & (up ? 1 : 2)) continue;
      seen[col] |= up ? 1 : 2;
      const tip = up ? T : T + ph, base = up ? T + TRI_H : T + ph - TRI_H;
      ctx.beginPath(); ctx.moveTo(px, tip); ctx.lineTo(px + TRI_W / 2, base); ctx.lineTo(px - TRI_W / 2, base); ctx.closePath(); ctx.fill();
      this.offMarks.push({ x: this.x[i], px, y: tip, up, color: s.color });
    }
  }

  // A stacked series' band: filled between the sums below it (``below``, null: 0) and with it
  // (``top``), its top edge a line in its colour.
  drawBand(ctx, s, below, top, X, Y) {
    const n = top.length;
    ctx.setLineDash([]); ctx.beginPath();
    for (let i = 0; i < n; i++) ctx.lineTo(X(this.x[i]), Y(top[i]));
    for (let i = n - 1; i >= 0; i--) ctx.lineTo(X(this.x[i]), Y(below ? below[i] : 0));
    ctx.closePath();
    ctx.globalAlpha = 0.55; ctx.fillStyle = s.color; ctx.fill(); ctx.globalAlpha = 1;
    ctx.beginPath();
    for (let i = 0; i < n; i++) ctx.lineTo(X(this.x[i]), Y(top[i]));
    ctx.strokeStyle = s.color; ctx.lineWidth = 1; ctx.stroke();
  }

  // Whether a value is off the drawn axis: " (off scale ▲)", " (off scale ▼)" or "" (tooltips).
  offLabel(v) {
    const a = this.axis;
    if (!a?.fit || typeof v !== "number" || !Number.isFinite(v) || (a.log && v <= 0)) return "";
    const t = a.log ? Math.log10(v) : v;
    return t > a.hi ? " (off scale ▲)" : t < a.lo ? " (off scale ▼)" : "";
  }

  indexAt(px) {
    if (!this.geom || !this.x) return -1;
    const { L, pw, xmin, xmax } = this.geom;
    const xv = xmin + ((px - L) / pw) * (xmax - xmin);
    let lo = 0, hi = this.x.length - 1; // binary search: x is sorted
    while (lo < hi) { const mid = (lo + hi) >> 1; if (this.x[mid] < xv) lo = mid + 1; else hi = mid; }
    if (lo > 0 && Math.abs(this.x[lo - 1] - xv) < Math.abs(this.x[lo] - xv)) lo--;
    return lo;
  }

  // The read-out emptied and its box shrunk to nothing (it stays a live region).
  hideTip() { clear(this.tip).classList.add("idle"); this.markPoint(-1); }

  hover(e) {
    const i = this.indexAt(e.offsetX);
    if (i >= 0) this.showTip(i, e.offsetX);
  }

  // The read-out of point i beside pixel column px: the pointer's tooltip, the keyboard's too.
  showTip(i, px) {
    const fmt = this.valueFmt();
    // (stacked: the bands holding bytes there, top first as drawn, then their sum; a list of
    // "0 B" rows covered the chart, QA 41a)
    const rows = this.opts.stacked ? [...this.series].reverse().filter((s) => s.y[i]) : this.series;
    clear(this.tip).append(h("b", {}, this.opts.tipLabel ? this.opts.tipLabel(i) : `${this.opts.xLabel || "step"} ${this.x[i]}`),
      ...rows.map((s) => h("div", {}, `${s.name}: ${fmt(s.y[i])}${this.offLabel(s.y[i])}`)),
      ...(this.opts.stacked ? [h("div", {}, h("b", {}, `total: ${fmt(this.series.reduce((a, s) => a + (Number.isFinite(s.y[i]) ? s.y[i] : 0), 0))}`))] : []));
    this.tip.classList.remove("idle");
    this.tip.style.left = Math.min(px + 12, this.root.clientWidth - 180) + "px";
    this.tip.style.top = "10px";
    this.markPoint(i);
  }

  // A dot on each line at the point read: with the tooltip offset up and left it was not plain
  // which point "step 60, loss 0.1048" was (QA 50b).  Stacked bands and gaps get none.
  markPoint(i) {
    for (const m of this.marks || []) m.remove();
    this.marks = [];
    if (i < 0 || !this.plot || this.opts.stacked) return;
    const { X, Y, ys } = this.plot, left = this.canvas.offsetLeft, top = this.canvas.offsetTop;
    this.series.forEach((s, k) => {
      const v = ys[k]?.[i];
      if (v === null || v === undefined) return;
      const dot = h("span", { class: "chart-dot", "aria-hidden": "true",
        style: `left:${left + X(this.x[i])}px;top:${top + Y(v)}px;background:${s.color}` });
      this.canvas.parentElement.append(dot);
      this.marks.push(dot);
    });
  }
}

// The running sums of the series' values (a gap or a non-finite value adds 0): a stacked chart's
// band k lies between sums k - 1 and k.
function cumulative(series) {
  let acc = null;
  return series.map((s) => (acc = s.y.map((v, i) => (acc ? acc[i] : 0) + (typeof v === "number" && Number.isFinite(v) ? v : 0))));
}

// A NaN or ±Inf: a number, or the string the server's JSON writes one as ("NaN", "Infinity").
function nonFinite(v) {
  return typeof v === "number" ? !Number.isFinite(v) : v === "NaN" || v === "Infinity" || v === "-Infinity";
}

// Equal as a chart can show: to a millionth (QA 42b: a gradient norm before clipping, read in
// float32, and after it, in float64, differ in the last bits when clipping did nothing, and
// the two lines were drawn one over the other in one colour, with no word in the legend).
// ``rel``: a threshold line (max_norm) drawn over a norm clipped to it is that value to 1e-4.
function alike(a, b, rel = 1e-6) {
  return a === b || (Number.isFinite(a) && Number.isFinite(b) && Math.abs(a - b) <= rel * Math.max(Math.abs(a), Math.abs(b)));
}

// The legend name of a series equal to an earlier one at every step: "gradients (same bytes as
// parameters)", "… (same durations as …)", "… (same values as …)".
function sameName(s, same, fmt) {
  const what = fmt === fmtBytes ? "bytes" : fmt === fmtUs ? "durations" : "values";
  // (the other's own parenthesis left out: "parameters (same bytes as live state)", QA 44c)
  return `${s.name} (same ${what} as ${same.name.replace(/ \(.*\)$/, "")})`;
}

// A threshold's legend name (a dashed series: clip_grad_norm_'s max_norm), with its value when
// another series lies on it at every step it has (a run clipped at every step: the norm after
// clipping is max_norm), where the dashed line is hidden under the other: "max_norm (= 0.5)".
function thresholdName(s, series) {
  const at = s.y.map((v, i) => [v, i]).filter(([v]) => typeof v === "number" && Number.isFinite(v));
  const under = at.length ? series.find((o) => o !== s && at.every(([v, i]) => alike(v, o.y[i], 1e-4))) : null;
  if (!under) return s.name;
  const values = [...new Set(at.map(([v]) => v))];
  return `${s.name} (= ${values.length === 1 ? String(+values[0].toPrecision(6)) : under.name})`;
}

const FIT_KEY = "torchscope-chart-fit"; // localStorage: "0" once the user asked for the whole range
const MARK_W = 2, MARK_H = 5; // a NaN/Inf tick
const TRI_W = 9, TRI_H = 6; // an off-scale triangle

// The range [lo, hi] (on the axis's scale: log10 on a log axis) of the values of ``ys`` (the
// series, null: no value) that are not far outside the bulk of them, or null when none is
// (the axis is then the whole range, as it always was). The bulk: the values between the
// 1st and the 99th percentile (at least one value left out at each end), found by selection,
// in time linear in the number of values. Far: on a linear axis, more than ten times the
// bulk's width or magnitude beyond it (a first step of 5 s among steps of 50 ms is; a loss
// curve's first steps, a memory peak of 10x are not); on a log axis, more than three times
// its width in decades (at least three decades) beyond it (a loss of 7e27 among losses of
// 0.01 to 2 is).
function bulkRange(ys, log) {
  let n = 0;
  for (const y of ys) for (const v of y) if (v !== null) n++;
  if (n < 8) return null;
  const a = new Float64Array(n);
  let j = 0;
  for (const y of ys) for (const v of y) if (v !== null) a[j++] = v;
  const t = Math.max(1, Math.round(n * 0.01));
  select(a, n - 1 - t, 0, n - 1);
  const qhi = a[n - 1 - t];
  select(a, t, 0, n - 1 - t);
  const qlo = a[t];
  const width = qhi - qlo;
  const room = log ? 3 * Math.max(width, 1) : 10 * Math.max(width, Math.abs(qlo), Math.abs(qhi));
  if (!(room > 0) || !Number.isFinite(room)) return null;
  const below = qlo - room, above = qhi + room;
  let lo = Infinity, hi = -Infinity, far = 0;
  for (let i = 0; i < n; i++) {
    const v = a[i];
    if (v < below || v > above) far++;
    else { if (v < lo) lo = v; if (v > hi) hi = v; }
  }
  return far ? { lo, hi } : null;
}

// Rearranges a[l..r] so that a[k] holds the value a sorted a would, none greater before it
// and none smaller after (Hoare's selection, the pivot the median of three: linear on average,
// and on the sorted or reversed series a chart gets).
function select(a, k, l, r) {
  while (r > l) {
    const p = a[l], q = a[(l + r) >> 1], s = a[r];
    const x = p < q ? (q < s ? q : p < s ? s : p) : (p < s ? p : q < s ? s : q);
    let i = l, j = r;
    do {
      while (a[i] < x) i++;
      while (x < a[j]) j--;
      if (i <= j) { const t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
    } while (i <= j);
    if (j < k) l = i;
    if (k < i) r = j;
  }
}

// The points of ``ys`` outside [lo, hi]: how many above, how many below, and which series have any.
function offScale(ys, lo, hi) {
  let above = 0, below = 0;
  const series = ys.map((y) => {
    let any = false;
    for (const v of y) if (v !== null) { if (v > hi) { above++; any = true; } else if (v < lo) { below++; any = true; } }
    return any;
  });
  return { above, below, series };
}

// The units of an axis of bytes or of durations (µs), largest first.
const UNITS = new Map([[fmtBytes, [[1024 ** 4, "TiB"], [1024 ** 3, "GiB"], [1024 ** 2, "MiB"], [1024, "KiB"], [1, "B"]]],
  [fmtUs, [[1e6, "s"], [1e3, "ms"], [1, "µs"]]]]);

// A log10 axis over [lmin, lmax] (log values): whole decades, a label every decade (every
// few when there are many), in one format for the whole axis (decadeFormat).
function logAxis(lmin, lmax) {
  if (lmin === Infinity) { lmin = 0; lmax = 1; }
  const lo = Math.floor(lmin), hi = Math.max(Math.ceil(lmax), lo + 1);
  const ystep = Math.max(1, Math.ceil((hi - lo) / 6));
  const top = lo + Math.ceil((hi - lo) / ystep) * ystep;
  return { lo, hi: top, ystep, fmt: decadeFormat(lo, top) };
}


// The smallest of 1, 2, 5 times a power of ten that is at least ``raw``.
function niceStep(raw) {
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const mag = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * mag).find((t) => t >= raw * (1 - 1e-9));
}

// Plain numbers on an axis of round steps: as many decimals as the step has, all alike
// ("0.50 / 0.75 / 1.00", not "0.7500" beside "1.000"); exponents only on an axis of the very
// large or small (``top``: its largest magnitude), and then on every label of it (QA 42b: a
// learning rate's axis read "5.0e-4 / 0.0010 / 0.0015").
function axisNum(step, top) {
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const exp = top >= 1e5 || top < 1e-3 || decimals > 6;
  const digits = Math.min(6, Math.max(1, Math.ceil(Math.log10(top / step) - 1e-9))); // (what tells the steps apart)
  return (v) => {
    if (Math.abs(v) < step * 1e-6) v = 0; // a sum of steps a rounding error off zero: not "-0.00"
    if (!exp) return v.toFixed(decimals);
    return v === 0 ? "0" : v.toExponential(digits);
  };
}
