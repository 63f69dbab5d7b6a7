// The Graph view's minimap: the whole laid-out scene, small, in the canvas's bottom-right
// corner (module frames and node boxes as filled rectangles in their colours, no text), with
// the main view's viewport as a rectangle on it.  A click or a drag on it centres the main
// view there.  Cheap on a 10,000-node graph: the scene is drawn once into an offscreen canvas,
// again only when the scene's boxes or colours change (a new layout, overlay, expansion,
// theme: a new ``scene.base``); a pan or a zoom only copies that image and draws the rectangle.
// Hidden while the whole graph fits the view; "–" on it hides it for good (localStorage
// "torchscope-minimap"), a small "map" button brings it back.
import { h } from "../dom.js";

const MAX_W = 180, MAX_H = 140, MIN_SIDE = 48, PAD = 4; // CSS px; a very tall graph keeps some width
const MIN_RECT = 6; // the viewport's rectangle, drawn no smaller (CSS px)
const KEY = "torchscope-minimap"; // localStorage: "0" once the user hid it

function stored() { try { return localStorage.getItem(KEY) !== "0"; } catch { return true; } }

export class Minimap {
  constructor(stage, graph) {
    this.graph = graph; // the GraphCanvas
    this.on = stored(); // the user's choice
    this.fits = true; // the whole graph in view: nothing to show
    this.cacheDraws = 0; this.viewDraws = 0; // for tests: the scene's redraws, the viewport's
    this.cache = null; this.cacheOf = null;
    this.canvas = h("canvas", { class: "minimap-canvas", "data-testid": "minimap-canvas", "aria-label": "minimap: click or drag to move the view there" });
    this.hideBtn = h("button", { class: "minimap-hide", title: "hide the minimap", "aria-label": "hide the minimap", "data-testid": "minimap-hide",
                                 onclick: (e) => { e.stopPropagation(); this.setOn(false); } }, "–");
    this.showBtn = h("button", { class: "minimap-show", title: "show the minimap (an overview of the whole graph)", "data-testid": "minimap-show",
                                 onclick: (e) => { e.stopPropagation(); this.setOn(true); } }, "map");
    this.el = h("div", { class: "minimap", "data-testid": "minimap", hidden: true }, this.canvas, this.hideBtn);
    stage.append(this.el, this.showBtn);
    this.showBtn.hidden = true;
    this._bind();
  }

  setOn(on) {
    this.on = on;
    try { localStorage.setItem(KEY, on ? "1" : "0"); } catch { /* storage off: this page keeps it */ }
    this.update();
  }

  _bind() {
    const c = this.canvas;
    let dragging = false;
    const go = (e) => { const r = c.getBoundingClientRect(); this.centerAt(e.clientX - r.left, e.clientY - r.top); };
    c.addEventListener("pointerdown", (e) => { dragging = true; c.setPointerCapture(e.pointerId); go(e); e.preventDefault(); });
    c.addEventListener("pointermove", (e) => { if (dragging) go(e); });
    const stop = () => { dragging = false; };
    c.addEventListener("pointerup", stop); c.addEventListener("pointercancel", stop);
    // the wheel over the minimap zooms the main view about its centre (not the page)
    c.addEventListener("wheel", (e) => { e.preventDefault(); const g = this.graph; g.zoomAt(g.w / 2, g.h / 2, Math.exp(-e.deltaY * 0.0015)); }, { passive: false });
  }

  // The mapping scene -> minimap CSS px for the current scene: {sx, sy, ox, oy, w, h}.  The
  // graph's aspect ratio, within MAX_W x MAX_H; a graph so tall (or so wide) that it would be
  // thinner than MIN_SIDE there is stretched across to that width (a 10,000-node full-mode
  // graph is ~200 times taller than wide: kept to scale, its two columns were one line).
  geometry() {
    const sc = this.graph.scene;
    const W = Math.max(sc.width, 1), H = Math.max(sc.height, 1);
    const s = Math.min(MAX_W / W, MAX_H / H);
    const axis = (L) => (L * s >= MIN_SIDE ? { n: Math.round(L * s), k: s, o: (Math.round(L * s) - L * s) / 2 }
      : { n: MIN_SIDE, k: (MIN_SIDE - 2 * PAD) / L, o: PAD });
    const X = axis(W), Y = axis(H);
    return { sx: X.k, sy: Y.k, ox: X.o, oy: Y.o, w: X.n, h: Y.n };
  }

  // A minimap point (CSS px from its top-left) as a scene point, and back.
  toScene(mx, my) { const g = this.geo; return [(mx - g.ox) / g.sx, (my - g.oy) / g.sy]; }
  toMap(x, y) { const g = this.geo; return [g.ox + x * g.sx, g.oy + y * g.sy]; }

  // The main view centred on the scene point under minimap point (mx, my).
  centerAt(mx, my) {
    if (!this.geo) return;
    const [x, y] = this.toScene(mx, my);
    const g = this.graph;
    g.tx = g.w / 2 - x * g.scale; g.ty = g.h / 2 - y * g.scale;
    g.requestDraw();
  }

  // The scene rectangle the main view shows: [x, y, w, h].
  viewport() {
    const g = this.graph;
    return [-g.tx / g.scale, -g.ty / g.scale, g.w / g.scale, g.h / g.scale];
  }

  // After each draw of the main canvas (GraphCanvas.afterDraw).
  update() {
    const g = this.graph, sc = g.scene;
    if (!sc) { this.el.hidden = this.showBtn.hidden = true; return; }
    const [vx, vy, vw, vh] = this.viewport(), tol = 1 / g.scale; // a CSS pixel's slack
    this.fits = vx <= tol && vy <= tol && vx + vw >= sc.width - tol && vy + vh >= sc.height - tol;
    const show = this.on && !this.fits;
    if (this.el.hidden !== !show) this.el.hidden = !show;
    const btn = !this.on && !this.fits;
    if (this.showBtn.hidden !== !btn) this.showBtn.hidden = !btn;
    if (!show) return;
    const dpr = window.devicePixelRatio || 1;
    const of = [sc.base || sc.items, dpr, g.theme()];
    if (!this.cacheOf || of.some((x, i) => x !== this.cacheOf[i])) this.drawCache(dpr);
    this.drawView(dpr);
  }

  // The scene, once, into an offscreen canvas of the minimap's size.
  drawCache(dpr) {
    const sc = this.graph.scene, th = this.graph.theme();
    this.cacheDraws++;
    this.cacheOf = [sc.base || sc.items, dpr, th];
    const geo = this.geo = this.geometry();
    const W = Math.round(geo.w * dpr), H = Math.round(geo.h * dpr);
    if (!this.cache) this.cache = document.createElement("canvas");
    const cv = this.cache;
    if (cv.width !== W || cv.height !== H) { cv.width = W; cv.height = H; }
    if (this.canvas.width !== W || this.canvas.height !== H) { this.canvas.width = W; this.canvas.height = H; }
    this.canvas.style.width = geo.w + "px"; this.canvas.style.height = geo.h + "px";
    const ctx = cv.getContext("2d");
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = th.bg; ctx.fillRect(0, 0, W, H);
    const kx = geo.sx * dpr, ky = geo.sy * dpr, ox = geo.ox * dpr, oy = geo.oy * dpr;
    const rect = (p, b, min) => p.rect(ox + b[0] * kx, oy + b[1] * ky, Math.max(b[2] * kx, min), Math.max(b[3] * ky, min));
    // frames first, outer before inner (nested frames lie inside their parent's box); one path
    // per colour: thousands of rectangles filled in a few calls
    const fwd = new Path2D(), bwd = new Path2D();
    for (const f of [...sc.frames].sort((a, b) => (a.depth || 0) - (b.depth || 0))) rect(f.phase === "backward" ? bwd : fwd, f.box, 0);
    ctx.fillStyle = th.frameFwd; ctx.fill(fwd);
    ctx.fillStyle = th.frameBwd; ctx.fill(bwd);
    const byColour = new Map();
    for (const it of sc.items) {
      const c = it.color || th.node;
      let p = byColour.get(c);
      if (!p) byColour.set(c, p = new Path2D());
      rect(p, it.box, 0.75 * dpr); // a node thinner than a pixel stays visible
    }
    for (const [c, p] of byColour) { ctx.fillStyle = c; ctx.fill(p); }
  }

  // The cached scene and the viewport's rectangle over it.
  drawView(dpr) {
    this.viewDraws++;
    const ctx = this.canvas.getContext("2d"), geo = this.geo;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.drawImage(this.cache, 0, 0);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const [vx, vy, vw, vh] = this.viewport();
    const [x0, y0] = this.toMap(vx, vy), [x1, y1] = this.toMap(vx + vw, vy + vh);
    this.rect = [x0, y0, x1 - x0, y1 - y0];
    // zoomed far in, the view is a speck on a 10,000-node graph: drawn no smaller than MIN_RECT
    // (clipped to the minimap first: a view larger than the graph, or panned off it, shows its edges)
    const side = (a, b, n) => {
      if (b < 0 || a > n) return null; // off the graph on this axis
      let c0 = Math.max(1, a), c1 = Math.min(n - 1, b);
      if (c1 < c0) c0 = c1 = Math.min(n - 1, Math.max(1, (a + b) / 2)); // a speck at the very edge
      const m = Math.min(MIN_RECT, n - 2);
      if (c1 - c0 < m) {
        c0 = Math.min(Math.max(1, (c0 + c1 - m) / 2), n - 1 - m);
        c1 = c0 + m;
      }
      return [c0, c1];
    };
    const X = side(x0, x1, geo.w), Y = side(y0, y1, geo.h);
    this.drawn = X && Y ? [X[0], Y[0], X[1] - X[0], Y[1] - Y[0]] : null;
    if (!this.drawn) return;
    // on whole device pixels, a line 2 device pixels wide across each: crisp, not smeared
    const snap = (v) => Math.round(v * dpr) / dpr;
    const [cx0, cy0, cx1, cy1] = [snap(X[0]), snap(Y[0]), snap(X[1]), snap(Y[1])];
    this.drawn = [cx0, cy0, cx1 - cx0, cy1 - cy0];
    const ink = this.ink();
    ctx.fillStyle = ink; ctx.globalAlpha = 0.15; ctx.fillRect(cx0, cy0, cx1 - cx0, cy1 - cy0); ctx.globalAlpha = 1;
    ctx.strokeStyle = ink; ctx.lineWidth = 2 / dpr; ctx.strokeRect(cx0, cy0, cx1 - cx0, cy1 - cy0);
  }

  // The viewport's colour: the page's accent, read again only when the theme changes.
  ink() {
    const th = this.graph.theme();
    if (this._inkOf !== th) { this._inkOf = th; this._ink = getComputedStyle(document.documentElement).getPropertyValue("--accent").trim() || th.sel; }
    return this._ink;
  }

  // For tests: what it shows and where.
  state() {
    const r = this.canvas.getBoundingClientRect();
    return {
      visible: !this.el.hidden && r.width > 0, on: this.on, fits: this.fits, showButton: !this.showBtn.hidden,
      scale: this.geo ? [this.geo.sx, this.geo.sy] : null, // minimap px per scene px, across and down
      offset: this.geo ? [this.geo.ox, this.geo.oy] : null, size: this.geo ? [this.geo.w, this.geo.h] : null,
      viewport: this.graph.scene ? this.viewport() : null, rect: this.rect || null, // the viewport in scene coords; on the minimap (CSS px)
      drawn: this.drawn || null, // the rectangle drawn: ``rect`` clipped to the minimap, no smaller than MIN_RECT
      box: [r.left, r.top, r.width, r.height], cacheDraws: this.cacheDraws, viewDraws: this.viewDraws,
    };
  }

  // For tests: a click at minimap point (mx, my) (CSS px from its top-left), as the pointer's.
  clickAt(mx, my) { this.centerAt(mx, my); }
}
