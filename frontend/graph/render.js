// Canvas 2D renderer for the graph: one canvas, no DOM element per node, so 10,000+ nodes
// pan and zoom smoothly.  Draws only what intersects the viewport; below a zoom threshold
// nodes become plain rectangles without text (level of detail).  Edges are cached as one
// Path2D per kind in world coordinates and rebuilt only when the layout changes.
import { OUTSIDE_MODEL } from "../dom.js";

export const TEXT_MIN_SCALE = 0.45;
const MIN_SCALE = 0.002; // the overview (a second "Fit") reaches a 10k-node graph's full height

function batchByColour(items, dim) {
  const m = new Map();
  for (const it of items) {
    const key = `${it.color || ""}|${dim && !it.hi ? 0.25 : 1}`;
    let p = m.get(key);
    if (!p) { p = new Path2D(); m.set(key, p); }
    p.rect(it.box[0], it.box[1], it.box[2], it.box[3]);
  }
  return m;
}

// Cut a label to a width with an ellipsis; computed once per item (world units don't zoom).
// ``s`` cut in the middle to fit ``width``: a module path's end (".layers.3.proj") tells
// siblings apart, its start where it lives; cutting the end made every block read the same.
// ``head``: the share of what is kept taken from the start (0: its end only).
export function fit(ctx, s, width, head = 1 / 3) {
  if (ctx.measureText(s).width <= width) return s;
  const cut = (k) => { const n = Math.ceil(k * head); return s.slice(0, n) + "…" + s.slice(s.length - (k - n)); };
  let lo = 0, hi = s.length;
  while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (ctx.measureText(cut(mid)).width <= width) lo = mid; else hi = mid - 1; }
  return lo ? cut(lo) : "…";
}

// An expanded frame's title cut to ``width``, giving up first what the picture already says:
// the phase (the frame's colour and column), then where the module lives (the frames around
// it), cut at the start; its own name and type go last.  Cut at the start as one string,
// "blocks (TransformerEncoder) · forward" lost the name and kept the phase.
export function frameTitle(ctx, f, width) {
  const type = f.type ? ` (${f.type})` : "";
  const fits = (t) => ctx.measureText(t).width <= width;
  if (fits(f.title)) return f.title;
  const whole = `${f.path}${type}`;
  if (fits(whole)) return whole;
  const own = `${f.path.slice(f.path.lastIndexOf(".") + 1)}${type}`;
  return fits("…" + own) ? fit(ctx, whole, width, 0) : fit(ctx, own, width, 1 / 2);
}

// A collapsed module's label ("blocks: TransformerEncoder  ≡ 0") cut to ``width``: its name
// and its "≡ n" kept, its type cut at the end ("blocks: TransformerEnc…"); cut in the
// middle as one string it read "blocks: …nsformerEncoder".
export function groupLabel(ctx, it, width) {
  if (!it.type || ctx.measureText(it.label).width <= width) return fit(ctx, it.label, width);
  const head = `${it.name}: `, room = width - ctx.measureText(head + it.mark).width;
  return room >= ctx.measureText("Xxx…").width ? head + fit(ctx, it.type, room, 1) + it.mark : fit(ctx, it.label, width);
}

// A box's sub-label ("[16, 8, 32] · blocks.layers.0.self_attn", a module's "3 ops · blocks.0")
// cut to ``width``: the shape (the op count) kept whole, the path cut from its start
// ("[16, 8, 32] · …self_attn": its end tells sibling blocks apart, the frames around say where
// it lives), and left out when not even a few of its characters fit.  Cut in the middle as one
// string, "[16, 8, 3…layers.0.self_attn" read as a shape whose last dimension is 3.
export function subLabel(ctx, it, width) {
  const fits = (t) => ctx.measureText(t).width <= width;
  if (!it.subHead || fits(it.sub)) return fit(ctx, it.sub, width);
  const room = width - ctx.measureText(`${it.subHead} · `).width;
  // a word in parentheses, no path: "(outside the model)" cut from its start read "…tside the
  // model" (QA 36c); its short form, else cut at its end
  if (it.subPath.startsWith("(")) {
    const short = it.subPath === OUTSIDE_MODEL ? "(not in model)" : it.subPath; // ("(outside)" read as nothing, QA 50b)
    if (room >= ctx.measureText(short.slice(0, 4) + "…").width) return `${it.subHead} · ${fit(ctx, short, room, 1)}`;
  } else if (room >= ctx.measureText("…" + it.subPath.slice(-4)).width) return `${it.subHead} · ${fit(ctx, it.subPath, room, 0)}`;
  if (fits(it.subHead)) return it.subHead;
  if (!it.subHead.startsWith("[")) return fit(ctx, it.subHead, width, 1);
  // a shape wider than its box: whole dimensions dropped from its end, "[16, 8, …]"
  const dims = it.subHead.slice(1, -1).split(", ");
  for (let k = dims.length - 1; k >= 0; k--) {
    const t = `[${[...dims.slice(0, k), "…"].join(", ")}]`;
    if (fits(t)) return t;
  }
  return "…";
}

export class GraphCanvas {
  constructor(canvas, { onSelect, onDblClick, topInset = () => 0 }) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d");
    this.scene = null;
    this.scale = 1; this.tx = 20; this.ty = 20;
    this.onSelect = onSelect; this.onDblClick = onDblClick; this.topInset = topInset;
    this.frames = 0;
    this.pending = false;
    this._bind();
    // A canvas that changes size while it shows the fit (the window sized after the page
    // opened, a view first fitted while its tab was hidden) is fitted again: its first view
    // kept the old size's zoom, and at 1024 px a small graph's backward column ran off the
    // canvas's edge until "f" (QA 42b).  A view the user moved (pan, zoom, a selection
    // centred, the minimap) is no longer the fit, and stays where it is.
    new ResizeObserver(() => {
      const fitted = this.atFit();
      this.resize();
      if (fitted) this.fit();
    }).observe(canvas.parentElement);
    this.resize();
  }

  _bind() {
    const c = this.canvas;
    let drag = null;
    c.addEventListener("pointerdown", (e) => { drag = { x: e.clientX, y: e.clientY, moved: false }; c.setPointerCapture(e.pointerId); });
    c.addEventListener("pointermove", (e) => {
      if (!drag) { this.hoverTitle(e.offsetX, e.offsetY); return; }
      const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 2) drag.moved = true;
      if (drag.moved) { this.tx += dx; this.ty += dy; drag.x = e.clientX; drag.y = e.clientY; this.requestDraw(); }
    });
    c.addEventListener("pointerup", (e) => {
      if (drag && !drag.moved) {
        const hit = this.hit(e.offsetX, e.offsetY);
        this.onSelect(hit);
      }
      drag = null;
    });
    c.addEventListener("dblclick", (e) => this.onDblClick(this.hit(e.offsetX, e.offsetY)));
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      this.zoomAt(e.offsetX, e.offsetY, Math.exp(-e.deltaY * 0.0015));
    }, { passive: false });
  }

  zoomAt(px, py, f) {
    const s = Math.min(4, Math.max(MIN_SCALE, this.scale * f));
    const k = s / this.scale;
    this.tx = px - (px - this.tx) * k; this.ty = py - (py - this.ty) * k; this.scale = s;
    this.requestDraw();
  }

  // The canvas's size now, not as the last ResizeObserver call saw it: a fit or a centring
  // right after the legend bar below the canvas was filled (or the details panel beside it
  // changed) used the old height, and the first view cut the loss off under the legend.
  measure() {
    const r = this.canvas.parentElement.getBoundingClientRect();
    if (Math.max(1, r.width) !== this.w || Math.max(1, r.height) !== this.h) this.resize();
  }

  resize() {
    const r = this.canvas.parentElement.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    this.w = Math.max(1, r.width); this.h = Math.max(1, r.height);
    this.canvas.width = Math.round(this.w * dpr); this.canvas.height = Math.round(this.h * dpr);
    this.canvas.style.width = this.w + "px"; this.canvas.style.height = this.h + "px";
    this.dpr = dpr;
    this.requestDraw();
  }

  setScene(scene) { this.scene = scene; this.requestDraw(); }

  // The whole graph, however small that makes it: centred across, from its top.
  overviewView() {
    this.measure();
    const { width, height } = this.scene;
    const s = Math.max(MIN_SCALE, Math.min(1, (this.w - 40) / Math.max(width, 1), (this.h - 40 - this.topInset()) / Math.max(height, 1)));
    return { scale: s, tx: (this.w - width * s) / 2, ty: 20 + this.topInset() };
  }

  // What Fit shows: the whole graph when its labels are still drawn there.  A large graph
  // (full mode, everything expanded) fitted whole is unlabelled boxes, which name nothing a
  // user could click on; it is fitted to its width instead, no smaller than the label zoom,
  // from where the step starts: its first op at the top (with the frames of the modules it
  // ran in), where a user starts reading and scrolls on down.  The graph's own top is no such
  // place side by side: the columns end level at the loss, so above a short forward column
  // there is only the tall backward's end.
  fitView() {
    const all = this.overviewView(); // (measured the canvas)
    const start = this.startPoint();
    if (all.scale >= TEXT_MIN_SCALE || !start) return all;
    // what lies above the start (side by side: the end of a backward column a few rows taller
    // than the forward) is in view too when it is short: cut by a row, the top of the backward
    // read as lost; a tall one stays above, where the overview shows it
    const inset = this.topInset(), room = this.h - 40 - inset;
    const topAt = (s) => (start[1] * s <= (this.h - inset) / 5 ? 0 : start[1]);
    // Fitted to the width of what the first screen shows, not the whole graph's: in full mode
    // the last rows (the "(outside modules)" backward group: a detach per AccumulateGrad, a
    // dozen a row) are the widest, 35,000 px below, and fitting them left both columns small
    // with a third of the canvas empty.  The band is the one seen at the label zoom (the
    // tallest a fitted view shows), so what it holds fits at any larger zoom too.
    const [x0, x1] = this.extentAcross(topAt(TEXT_MIN_SCALE), start[1] + room / TEXT_MIN_SCALE);
    const width = x1 - x0;
    const scale = Math.max(TEXT_MIN_SCALE, Math.min(1, (this.w - 40) / Math.max(width, 1)));
    // wider than the canvas even so: the first op in the middle, no margin beyond the band's edges
    const tx = width * scale <= this.w - 40 ? this.w / 2 - (x0 + x1) / 2 * scale
      : Math.min(20 - x0 * scale, Math.max(this.w - 20 - x1 * scale, this.w / 2 - start[0] * scale));
    return { scale, tx, ty: 20 + inset - topAt(scale) * scale };
  }

  // The horizontal extent (world x0, x1) of the boxes and frames across rows y0..y1.
  extentAcross(y0, y1) {
    let x0 = Infinity, x1 = -Infinity;
    const take = (b) => { if (b[1] < y1 && b[1] + b[3] > y0) { x0 = Math.min(x0, b[0]); x1 = Math.max(x1, b[0] + b[2]); } };
    for (const it of this.scene.items) take(it.box);
    for (const f of this.scene.frames) take(f.box);
    return x0 <= x1 ? [x0, x1] : [0, this.scene.width];
  }

  // Where the step starts, in world coordinates: the centre of its first item in execution
  // order, at the top of the outermost module frame around it.
  startPoint() {
    let first = null;
    for (const it of this.scene.items) if (it.order !== undefined && (!first || it.order < first.order)) first = it;
    if (!first) return null;
    const [x, y, w, h] = first.box;
    const around = (f) => f[0] <= x && f[1] <= y && f[0] + f[2] >= x + w && f[1] + f[3] >= y + h;
    return [x + w / 2, Math.min(y, ...this.scene.frames.filter((f) => around(f.box)).map((f) => f.box[1]))];
  }

  show(v) { Object.assign(this, v); this.requestDraw(); }

  // Whether the view is ``v`` (a view of fitView or overviewView), to half a pixel.
  isAt(v) { return Math.abs(v.scale - this.scale) < 1e-9 && Math.abs(v.tx - this.tx) < 0.5 && Math.abs(v.ty - this.ty) < 0.5; }

  // Whether the view is still where the last fit() put it: nothing moved it since.
  atFit() { return !!this.scene && !!this.lastFit && this.isAt(this.lastFit); }

  fit() { if (this.scene) this.show(this.lastFit = this.fitView()); }

  // The Fit button and key: a second press where Fit left the view shows the whole graph,
  // so the overview of a large graph is one press away rather than a dozen zoom steps.
  fitOrOverview() {
    if (!this.scene) return;
    const v = this.fitView();
    if (this.isAt(v)) this.show(this.overviewView()); else this.fit();
  }

  // Centre ``must`` (boxes) at a readable zoom, zooming out as far as it takes to show all of
  // them (a finding's targets: an in-place op and the grad_fn that needed the value it
  // overwrote, rows and a column apart); with ``extra`` too when everything fits at a zoom
  // where labels are drawn (a grad_fn node and the forward op that created it, one column
  // away).  The canvas below the status line floating over its top counts.
  centerOn(must, minScale = 0.8, extra = []) {
    this.measure();
    const top = this.topInset(), room = this.h - top;
    const bbox = (bs) => {
      const x0 = Math.min(...bs.map((b) => b[0])), y0 = Math.min(...bs.map((b) => b[1]));
      return [x0, y0, Math.max(...bs.map((b) => b[0] + b[2])) - x0, Math.max(...bs.map((b) => b[1] + b[3])) - y0];
    };
    const fits = (b) => Math.min((this.w - 40) / Math.max(b[2], 1), (room - 40) / Math.max(b[3], 1));
    const want = Math.max(this.scale, minScale);
    let box = bbox([...must, ...extra]);
    if (!extra.length || fits(box) < TEXT_MIN_SCALE) box = bbox(must);
    const s = Math.max(MIN_SCALE, Math.min(want, fits(box)));
    this.scale = s;
    this.tx = this.w / 2 - (box[0] + box[2] / 2) * s;
    this.ty = top + room / 2 - (box[1] + box[3] / 2) * s;
    this.requestDraw();
  }

  // The full text of what is under the pointer as the canvas's tooltip, when its label or
  // frame title was cut to fit.
  hoverTitle(px, py) {
    const it = this.hit(px, py);
    const full = !it ? "" : it.title !== undefined ? it.title : `${it.label}\n${it.sub}`;
    const cut = it && (it.title !== undefined ? it.fitTitle !== it.title : it.fitLabel !== it.label || it.fitSub !== it.sub);
    const title = cut ? full : "";
    if (this.canvas.title !== title) this.canvas.title = title;
  }

  requestDraw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  hit(px, py) {
    if (!this.scene) return null;
    const x = (px - this.tx) / this.scale, y = (py - this.ty) / this.scale;
    const inside = (b) => x >= b[0] && x <= b[0] + b[2] && y >= b[1] && y <= b[1] + b[3];
    for (const it of this.scene.items) if (inside(it.box)) return it;
    let best = null; // the innermost expanded frame under the pointer
    for (const f of this.scene.frames) if (inside(f.box) && (!best || f.depth > best.depth)) best = f;
    return best;
  }

  draw() {
    this.frames++;
    this.paint();
    if (this.afterDraw) this.afterDraw(); // the minimap's viewport follows
  }

  // The graph drawn into a canvas of its own, for an image (Export PNG): the whole graph at
  // ``ratio`` image pixels per CSS pixel, else at 1, else as small as the caps (``maxSide`` a
  // side, ``maxPixels`` in all) need while its labels are still drawn; past that, the current
  // view alone (whole: false).  ``header(whole, size)``: a title line above the graph, in the
  // image (size: the whole graph's [width, height] at the ratio asked).  Returns {canvas,
  // width, height, whole, scale, ratio, full}.
  exportCanvas({ ratio = 1, maxSide = 8192, maxPixels = 32 * 1024 * 1024, header = () => "" } = {}) {
    const sc = this.scene;
    if (!sc) return null;
    const M = 20, HEAD = 30;
    const size = (w, h, r) => [Math.ceil(w * r), Math.ceil(h * r)];
    const ok = ([W, H]) => W <= maxSide && H <= maxSide && W * H <= maxPixels;
    const wholeAt = (s, r) => size(sc.width * s + 2 * M, sc.height * s + 2 * M + HEAD, r);
    const full = wholeAt(1, ratio);
    let plan = null;
    for (const r of ratio > 1 ? [ratio, 1] : [ratio]) if (!plan && ok(wholeAt(1, r))) plan = { whole: true, scale: 1, ratio: r };
    if (!plan) {
      let s = Math.min(1, (maxSide - 2 * M) / Math.max(sc.width, 1), (maxSide - 2 * M - HEAD) / Math.max(sc.height, 1),
        Math.sqrt(maxPixels / Math.max(sc.width * sc.height, 1)));
      while (s > 0 && !ok(wholeAt(s, 1))) s *= 0.99;
      if (s >= TEXT_MIN_SCALE) plan = { whole: true, scale: s, ratio: 1 };
    }
    let W, H, view;
    if (plan) {
      [W, H] = wholeAt(plan.scale, plan.ratio);
      view = { scale: plan.scale, tx: M, ty: M + HEAD };
    } else { // the current view, as the canvas shows it, under the title line
      this.measure();
      let r = ratio;
      while (r > 0.25 && !ok(size(this.w, this.h + HEAD, r))) r /= 2;
      plan = { whole: false, scale: this.scale, ratio: r };
      [W, H] = size(this.w, this.h + HEAD, r);
      view = { scale: this.scale, tx: this.tx, ty: this.ty + HEAD };
    }
    const canvas = document.createElement("canvas");
    canvas.width = W; canvas.height = H;
    const saved = { ctx: this.ctx, w: this.w, h: this.h, dpr: this.dpr, scale: this.scale, tx: this.tx, ty: this.ty };
    Object.assign(this, { ctx: canvas.getContext("2d"), w: W / plan.ratio, h: H / plan.ratio, dpr: plan.ratio }, view);
    try {
      this.paint();
      const ctx = this.ctx, th = this.theme();
      ctx.setTransform(plan.ratio, 0, 0, plan.ratio, 0, 0);
      ctx.fillStyle = th.bg; ctx.fillRect(0, 0, this.w, HEAD); // under the title: nothing of a panned view
      ctx.fillStyle = th.text; ctx.font = "13px system-ui, sans-serif";
      ctx.fillText(fit(ctx, header(plan.whole, full) || "", this.w - 2 * M), M, 20);
    } finally {
      Object.assign(this, saved);
    }
    return { canvas, width: W, height: H, whole: plan.whole, scale: plan.scale, ratio: plan.ratio, full };
  }

  paint() {
    const ctx = this.ctx, sc = this.scene, th = this.theme();
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    ctx.fillStyle = th.bg; ctx.fillRect(0, 0, this.w, this.h);
    if (!sc) return;
    ctx.setTransform(this.dpr * this.scale, 0, 0, this.dpr * this.scale, this.dpr * this.tx, this.dpr * this.ty);
    const x0 = -this.tx / this.scale, y0 = -this.ty / this.scale;
    const x1 = x0 + this.w / this.scale, y1 = y0 + this.h / this.scale;
    const vis = (b) => b[0] < x1 && b[0] + b[2] > x0 && b[1] < y1 && b[1] + b[3] > y0;
    const text = this.scale >= TEXT_MIN_SCALE;
    const lw = 1 / this.scale;

    for (const f of sc.frames) {
      if (!vis(f.box)) continue;
      ctx.fillStyle = f.phase === "backward" ? th.frameBwd : th.frameFwd;
      ctx.strokeStyle = th.frameLine; ctx.lineWidth = lw;
      ctx.fillRect(f.box[0], f.box[1], f.box[2], f.box[3]);
      ctx.strokeRect(f.box[0], f.box[1], f.box[2], f.box[3]);
      if (text) {
        ctx.fillStyle = th.muted; ctx.font = "11px system-ui, sans-serif";
        if (f.fitTitle === undefined) f.fitTitle = frameTitle(ctx, f, f.box[2] - 12);
        ctx.fillText(f.fitTitle, f.box[0] + 6, f.box[1] + 14);
      }
    }
    ctx.lineWidth = Math.max(lw, 1);
    for (const ep of sc.edgePaths) {
      if (ep.y1 < y0 || ep.y0 > y1) continue;
      ctx.strokeStyle = th.edge[ep.type];
      ctx.stroke(ep.path);
      if (text) ctx.stroke(ep.heads);
    }
    if (sc.hiPath) { ctx.strokeStyle = th.hiEdge; ctx.lineWidth = Math.max(2.5 * lw, 2.5); ctx.stroke(sc.hiPath); }

    ctx.font = "12px system-ui, sans-serif";
    const dim = sc.dimOthers;
    if (!text) { // zoomed out: one filled path per colour, built once per scene (per highlight
      // of the scene's boxes: a scene for a new selection keeps them, see buildScene)
      const memo = sc.marks || sc;
      if (!memo.batches) memo.batches = batchByColour(sc.items, dim);
      for (const [key, path] of memo.batches) {
        const [color, alpha] = key.split("|");
        ctx.globalAlpha = +alpha; ctx.fillStyle = color || th.node; ctx.fill(path);
      }
      ctx.globalAlpha = 1;
    }
    for (const it of sc.items) {
      const b = it.box;
      if (!text && !it.hi && !it.cut && it.key !== sc.selected && it.group === undefined) continue;
      if (!vis(b)) continue;
      ctx.globalAlpha = dim && !it.hi ? 0.25 : 1;
      if (text) { ctx.fillStyle = it.color || th.node; ctx.fillRect(b[0], b[1], b[2], b[3]); }
      if (it.group !== undefined) { ctx.strokeStyle = th.groupLine; ctx.lineWidth = 2 * lw; ctx.strokeRect(b[0], b[1], b[2], b[3]); }
      if (it.cut) { ctx.strokeStyle = th.cut; ctx.lineWidth = 3 * lw; ctx.strokeRect(b[0] - 2, b[1] - 2, b[2] + 4, b[3] + 4); }
      if (it.hi) { ctx.strokeStyle = th.hi; ctx.lineWidth = 2.5 * lw; ctx.strokeRect(b[0] - 1, b[1] - 1, b[2] + 2, b[3] + 2); }
      if (it.key === sc.selected) { ctx.strokeStyle = th.sel; ctx.lineWidth = Math.max(3 * lw, 3); ctx.strokeRect(b[0] - 3, b[1] - 3, b[2] + 6, b[3] + 6); }
      if (text) {
        const ink = it.color ? inkOn(it.color) : null; // an overlay's fill: text that contrasts with it
        ctx.fillStyle = ink ? ink[0] : th.text;
        if (it.fitLabel === undefined) it.fitLabel = it.group !== undefined ? groupLabel(ctx, it, b[2] - 10) : fit(ctx, it.label, b[2] - 10);
        ctx.fillText(it.fitLabel, b[0] + 5, b[1] + 14);
        ctx.fillStyle = ink ? ink[1] : th.sub; ctx.font = "10px system-ui, sans-serif";
        if (it.fitSub === undefined) it.fitSub = subLabel(ctx, it, b[2] - 10);
        ctx.fillText(it.fitSub, b[0] + 5, b[1] + 28);
        ctx.font = "12px system-ui, sans-serif";
      }
    }
    ctx.globalAlpha = 1;
    // the selected node's link to its op / grad_fn, over the boxes: it crosses the column
    // between them, and under the boxes there it was lost.  Cased in the canvas's colour: over
    // a grey box (a view's 0 B, an op's 0 µs) the dark theme's grey dashes were invisible
    const linkW = Math.max(1.5 * lw, 1.5);
    ctx.strokeStyle = th.bg; ctx.lineWidth = linkW + 3 * lw;
    ctx.stroke(sc.linkPath);
    ctx.strokeStyle = th.edge[2]; ctx.lineWidth = linkW;
    ctx.setLineDash([6 / this.scale, 4 / this.scale]); // dashes in screen pixels
    ctx.stroke(sc.linkPath);
    ctx.setLineDash([]);
  }

  theme() {
    const css = getComputedStyle(document.documentElement);
    const v = (n) => css.getPropertyValue(n).trim();
    if (!this._th || this._thKey !== document.documentElement.dataset.theme) {
      this._thKey = document.documentElement.dataset.theme;
      this._th = {
        bg: v("--graph-bg"), node: v("--node"), text: v("--node-text"), sub: v("--node-sub"), muted: v("--muted"),
        frameFwd: v("--frame-fwd"), frameBwd: v("--frame-bwd"), frameLine: v("--frame-line"), groupLine: v("--group-line"),
        edge: [v("--edge-data"), v("--edge-grad"), v("--edge-link")], hi: v("--hi"), hiEdge: v("--hi"), sel: v("--sel"), cut: v("--cut"),
      };
    }
    return this._th;
  }
}

// Label and sub-label colours readable on a node filled with ``color`` (a "#rrggbb" overlay
// colour, whatever the theme): dark ink on light fills, light ink on dark ones (WCAG relative
// luminance); null for a colour it cannot read, which keeps the theme's.
const INK = new Map();
export function inkOn(color) {
  if (INK.has(color)) return INK.get(color);
  const m = /^#([0-9a-f]{6})$/i.exec(color);
  let ink = null;
  if (m) {
    const lin = [0, 2, 4].map((i) => {
      const c = parseInt(m[1].slice(i, i + 2), 16) / 255;
      return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    const lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
    // the ink with the higher contrast ratio against the fill
    ink = (lum + 0.05) / 0.05 > 1.05 / (lum + 0.05) ? ["#111827", "#1f2937"] : ["#ffffff", "#f3f4f6"];
  }
  INK.set(color, ink);
  return ink;
}
