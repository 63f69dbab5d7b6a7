// Builds what the renderer draws from the model, a layout and the view state (overlay,
// highlight, selection).  Linear in the visible items and the edges (each skip edge routed
// in about log time); a new selection or highlight redoes only the marks (buildScene).
import { representatives, groupTotals } from "./model.js";
import { logScale, categorical, ZERO, NOTHING } from "../colors.js";
import { OUTSIDE_MODEL } from "../dom.js";

const NOT_RECORDED = "(module not recorded)";

const PHASE_COLORS = { forward: "--op-fwd", backward: "--op-bwd", optimizer: "--op-opt", other: "--op-opt" };

// A leaf's sub-label in two parts: its output's shape (null when it has none) and where it ran
// (a module path, an AccumulateGrad's parameter).  The renderer keeps the shape whole and cuts
// only the path.
export function leafSubParts(model, l) {
  if (l.kind === "node" && l.rec.param) return [null, l.rec.param];
  const op = l.kind === "op" ? l : l.rec.op !== undefined ? model.byKey.get("o" + l.rec.op) : null;
  const t = op ? model.tensors.get((op.rec.outputs || [])[0]) : null;
  return [t ? "[" + (t.shape || []).join(", ") + "]" : null, leafWhere(model, l)];
}

export function leafSub(model, l) {
  const [shape, where] = leafSubParts(model, l);
  return shape ? `${shape} · ${where}` : where;
}

// Where a leaf ran: its module path; for an op outside the model's forward (the loss a
// training loop computes), and a grad_fn such an op created, "(outside the model)" (opWhere).
export function leafWhere(model, l) {
  if (l.module) return l.module;
  const op = l.kind === "op" ? l : l.rec.op !== undefined ? model.byKey.get("o" + l.rec.op) : null;
  if (!op && l.kind !== "op") {
    // a grad_fn node of a step whose ops were not recorded (the first step of a loop that calls
    // the model's submodules directly) ran somewhere unknown, not in the root (QA 48b)
    model.hasOps ??= model.leaves.some((x) => x.kind === "op");
    if (!model.hasOps) return NOT_RECORDED;
  }
  return op && (op.rec.flags || []).includes("outside_model") ? OUTSIDE_MODEL : "(root)";
}

// Per-leaf numeric (or categorical) value for an overlay.
export function overlayValues(model, overlay, ctx) {
  const { leaves, tensors } = model;
  const vals = new Array(leaves.length).fill(undefined);
  if (overlay === "time") leaves.forEach((l, i) => { vals[i] = l.rec.dur_us; });
  // a grad_fn node has saved_bytes only when it saved tensors: without, it saved 0 B
  else if (overlay === "memory") leaves.forEach((l, i) => { vals[i] = l.kind === "op" ? l.rec.alloc : l.rec.saved_bytes ?? 0; });
  else if (overlay === "dtype") {
    leaves.forEach((l, i) => {
      if (l.kind === "op") vals[i] = tensors.get((l.rec.outputs || [])[0])?.dtype;
      else vals[i] = (l.rec.saved || [])[0]?.dtype ?? ctx.paramDtype?.get(l.rec.param);
    });
  } else if (overlay === "grad" && ctx.paramNorm) {
    leaves.forEach((l, i) => {
      if (l.kind === "node" && l.rec.param) vals[i] = ctx.paramNorm.get(l.rec.param);
    });
  } else if (overlay === "diff" && ctx.diff) {
    leaves.forEach((l, i) => { vals[i] = ctx.diff.get(l.key) || "same"; });
  }
  return vals;
}

const EDGE_CHUNK = 256;

function addSeg(p, [ax, ay, bx, by, , via]) {
  p.moveTo(ax, ay);
  if (via !== undefined) { // a skip edge, routed along the right of what lies between its ends
    const d = by > ay ? DETOUR : -DETOUR; // down the forward column, up the backward one
    p.bezierCurveTo(ax, ay + d, via, ay, via, ay + d);
    p.lineTo(via, by - d);
    p.bezierCurveTo(via, by, bx, by - d, bx, by);
  } else if (by !== ay) p.bezierCurveTo(ax, (ay + by) / 2, bx, (ay + by) / 2, bx, by); else p.lineTo(bx, by);
}

// An arrowhead at an edge's end, B's side: every edge ends straight into B (its last curve
// vertical, or a straight line across), so the head points along that line.  Kept in paths of
// their own, drawn only at the zoom where labels are (smaller, a head is a pixel or two).
const HEAD = 5, HALF = 3.5;
function addHead(p, [ax, ay, bx, by]) {
  if (by !== ay) { const d = by > ay ? -HEAD : HEAD; p.moveTo(bx - HALF, by + d); p.lineTo(bx, by); p.lineTo(bx + HALF, by + d); }
  else { const d = bx > ax ? -HEAD : HEAD; p.moveTo(bx + d, by - HALF); p.lineTo(bx, by); p.lineTo(bx + d, by + HALF); }
}

// An edge between boxes A and B: from A's bottom to B's top, or, when B lies wholly above A
// (side by side, the backward flows up from the loss), from A's top to B's bottom, so that
// it leaves and enters the boxes on the sides that face each other.
function edgeSeg(A, B, type) {
  const up = B[1] + B[3] <= A[1];
  return [A[0] + A[2] / 2, up ? A[1] : A[1] + A[3], B[0] + B[2] / 2, up ? B[1] + B[3] : B[1], type];
}

// The dashed link from a forward op to the grad_fn node it created, drawn over the boxes
// (behind them it vanished under every box between the columns): boxes apart across (side by
// side: a grad_fn in the other column, across from its op) joined from side to side, so the
// line crosses neither end's label; else as an edge.
function linkSeg(A, B) {
  const ay = A[1] + A[3] / 2, by = B[1] + B[3] / 2;
  if (B[0] >= A[0] + A[2]) return [A[0] + A[2], ay, B[0], by, 2, undefined, true];
  if (B[0] + B[2] <= A[0]) return [A[0], ay, B[0] + B[2], by, 2, undefined, true];
  return edgeSeg(A, B, 2);
}

function addLink(p, seg) {
  if (!seg[6]) { addSeg(p, seg); return; }
  const [ax, ay, bx, by] = seg, mx = (ax + bx) / 2; // leaves and enters its boxes level
  p.moveTo(ax, ay);
  p.bezierCurveTo(mx, ay, mx, by, bx, by);
}

const DETOUR = 30, SCAN = 2000;

// The frames' boxes sorted by top, over a segment tree of their bottoms (the deepest bottom
// under each node): the frames across rows y0..y1 are found in O((k + 1) log n) for k of
// them, where a scan of every frame for every skip edge took seconds on a graph of 15,000.
function frameIndex(frames) {
  const boxes = frames.map((f) => f.box).sort((p, q) => p[1] - q[1]);
  let size = 1;
  while (size < boxes.length) size <<= 1;
  const bottom = new Float64Array(2 * size).fill(-Infinity);
  boxes.forEach((b, i) => { bottom[size + i] = b[1] + b[3]; });
  for (let i = size - 1; i >= 1; i--) bottom[i] = Math.max(bottom[2 * i], bottom[2 * i + 1]);
  return { boxes, tops: boxes.map((b) => b[1]), bottom, size };
}

// The first index whose value is >= y in an ascending array.
function lowerBound(a, y) {
  let lo = 0, hi = a.length;
  while (lo < hi) { const m = (lo + hi) >> 1; if (a[m] < y) lo = m + 1; else hi = m; }
  return lo;
}

// fn(box) for each frame with top < y1 and bottom > y0: a prefix of the sorted boxes, and
// in it the subtrees whose deepest bottom reaches below y0.
function framesAcross(fi, y0, y1, fn) {
  const end = lowerBound(fi.tops, y1);
  const visit = (node, lo, hi) => {
    if (lo >= end || fi.bottom[node] <= y0) return;
    if (node >= fi.size) { fn(fi.boxes[node - fi.size]); return; }
    const mid = (lo + hi) >> 1;
    visit(2 * node, lo, mid); visit(2 * node + 1, mid, hi);
  };
  if (end) visit(1, 0, fi.size);
}

// Where an edge that skips rows (a residual connection: x + f(x), going down the forward
// column or up the backward one) runs: right of every box it would cross (drawn straight
// behind them it looked connected to them), or undefined when it crosses none.  Boxes are
// the visible items sorted by top (binary search for the rows in between) and the frames
// across those rows (frameIndex), less the frames holding either end.
function detour(seg, boxes, tops, fi) {
  const [ax, ay, bx, by] = seg;
  const y0 = Math.min(ay, by), y1 = Math.max(ay, by);
  if (y1 - y0 < 2 * DETOUR + 10) return undefined;
  const x0 = Math.min(ax, bx), x1 = Math.max(ax, bx);
  let right = -Infinity;
  const cross = (b) => { if (b[1] < y1 && b[1] + b[3] > y0 && b[0] <= x1 && b[0] + b[2] >= x0 && b[0] + b[2] > right) right = b[0] + b[2]; };
  const lo = lowerBound(tops, y0 - 60);
  // a long edge looks at the first SCAN boxes only, so a 10,000-node graph stays fast to draw
  for (let i = lo, end = Math.min(boxes.length, lo + SCAN); i < end && boxes[i][1] < y1; i++) cross(boxes[i]);
  const holds = (b, x, y) => x >= b[0] && x <= b[0] + b[2] && y >= b[1] && y <= b[1] + b[3];
  framesAcross(fi, y0, y1, (b) => { if (!holds(b, ax, ay) && !holds(b, bx, by)) cross(b); });
  return right === -Infinity ? undefined : right + 14;
}

const CATEGORICAL = new Set(["dtype", "diff"]);
const DIFF_COLORS = new Map([["added", "#16a34a"], ["changed", "#d97706"], ["same", "#9ca3af"]]);
const THEME_VARS = ["--op-fwd", "--op-bwd", "--op-opt", "--op-acc", "--node-none", "--group-fwd", "--group-bwd"];

// A scene is a base (boxes, colours, labels, frames and every edge routed: what the layout,
// the expanded modules, the overlay and the theme make) marked with the selection and the
// highlight.  A click that selects a node changes only the marks, so the base of ``prev``
// (the scene drawn until now) is kept when everything it was built from is the same: on a
// graph of 20,000 nodes rebuilding it took seconds a click.
export function buildScene(model, layout, st, prev = null) {
  const css = getComputedStyle(document.documentElement);
  const theme = THEME_VARS.map((n) => css.getPropertyValue(n).trim()).join("|");
  const c = st.ctx;
  const from = [model, layout, st.expandedIdx, st.overlay, !!st.sideBySide, theme, c.moduleType, c.paramNorm, c.paramDtype, c.diff];
  const old = prev?.base;
  const base = old && old.from.length === from.length && old.from.every((x, i) => x === from[i]) ? old : buildBase(model, layout, st, css);
  base.from = from;
  return markScene(model, base, st);
}

function buildBase(model, layout, st, css) {
  const { leaves, groups, edges } = model;
  const { rep } = representatives(model, st.expandedIdx);
  const colours = new Map(); // a CSS variable read once, not once a node
  const cv = (n) => { let c = colours.get(n); if (c === undefined) colours.set(n, c = css.getPropertyValue(n).trim()); return c; };
  // an item the overlay has no value for (the legend names it when there is one)
  const none = () => { if (legend) legend.missing = true; return cv("--node-none"); };

  // overlay colours, aggregated over collapsed groups: for time and memory what the group's
  // details say (groupTotals: a backward group's grad_fn nodes' time, not their kernels' again;
  // its saved activations, each storage once, parameters left out; else its ops' sums); for
  // gradient norms the module's own norm, sqrt of the sum of its parameters' squared norms
  // (what clip_grad_norm_ computes), so a module reads dead only when all of it got zero
  const vals = overlayValues(model, st.overlay, st.ctx);
  let colorOf = null, legend = null;
  const agg = new Map();
  if (st.overlay !== "phase") {
    if (CATEGORICAL.has(st.overlay)) {
      const cats = st.overlay === "diff" ? DIFF_COLORS : categorical(vals);
      colorOf = (v) => (v === undefined ? null : cats.get(v) || null);
      legend = { kind: "cats", entries: [...cats.entries()] };
      leaves.forEach((l, i) => { const r = rep[i]; if (r < 0 && vals[i] !== undefined && vals[i] !== "same") agg.set(r, vals[i]); });
    } else {
      leaves.forEach((l, i) => {
        const r = rep[i], v = vals[i];
        if (r >= 0 || v === undefined || v === null) return;
        const prev = agg.get(r) ?? 0;
        agg.set(r, prev + (st.overlay === "grad" ? v * v : v));
      });
      if (st.overlay === "grad") for (const [r, v] of agg) agg.set(r, Math.sqrt(v));
      if (st.overlay === "time" || st.overlay === "memory") {
        const inside = new Map(); // collapsed group -> its leaves
        leaves.forEach((l, i) => { const r = rep[i]; if (agg.has(r)) { if (!inside.has(r)) inside.set(r, []); inside.get(r).push(i); } });
        for (const [r, idx] of inside) {
          const tot = groupTotals(model, idx);
          const v = st.overlay === "time" ? tot.time : tot.nodes ? tot.saved : tot.alloc;
          if (v === undefined) agg.delete(r); else agg.set(r, v);
        }
      }
      // zero: a colour of its own, outside the ramp (a dead branch's gradient; no bytes, no time)
      const zero = st.overlay === "grad" ? ZERO : NOTHING;
      const scale = logScale([...vals.filter((v) => typeof v === "number"), ...agg.values()], zero);
      colorOf = scale.color;
      legend = { kind: "ramp", overlay: st.overlay, lo: scale.lo, hi: scale.hi, zeros: scale.zeros, zero, positive: scale.positive,
                 nonfinite: scale.nonfinite, missing: false };
    }
  }

  const items = [], byKey = new Map();
  const firstLeaf = new Map(); // a collapsed box's place in execution order: its first op's
  leaves.forEach((l, i) => {
    const r = rep[i];
    if (r < 0) {
      if (!firstLeaf.has(r)) firstLeaf.set(r, i);
      return;
    }
    const b = layout.leafBox;
    const box = [b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]];
    const phaseVar = l.kind === "node" && l.rec.name === "AccumulateGrad" ? "--op-acc" : PHASE_COLORS[l.phase] || "--op-fwd";
    const color = colorOf ? colorOf(vals[i]) || none() : cv(phaseVar);
    const [subHead, subPath] = leafSubParts(model, l);
    const it = { key: l.key, leaf: i, order: i, box, label: l.label, sub: subHead ? `${subHead} · ${subPath}` : subPath,
                 subHead, subPath, color, hi: false, cut: false };
    items.push(it); byKey.set(l.key, it);
  });
  const frames = [];
  for (let g = 1; g < groups.length; g++) {
    const gb = layout.groupBox, s = gb[5 * g + 4];
    if (!s) continue;
    const G = groups[g];
    const box = [gb[5 * g], gb[5 * g + 1], gb[5 * g + 2], gb[5 * g + 3]];
    const mtype = st.ctx.moduleType?.get(G.path);
    if (s === 2) { frames.push({ key: "g:" + G.key, group: g, box, depth: G.depth, phase: G.phase, path: G.path, type: mtype, title: `${G.path}${mtype ? " (" + mtype + ")" : ""} · ${G.phase}` }); continue; }
    const r = -1 - g;
    const v = agg.get(r);
    const color = colorOf ? (v !== undefined ? colorOf(v) : none())
      : cv(G.phase === "backward" ? "--group-bwd" : G.phase === "optimizer" ? "--group-opt" : "--group-fwd");
    // "≡ 0": same structure as sibling 0 (repeated blocks)
    const mark = G.repeatOf ? "  ≡ " + groups[G.repeatOf].label : "";
    // a backward group's grad_fn nodes and the aten kernels they ran (full mode) counted apart
    const n = G.nodes || 0, o = G.ops || 0, plural = (k, w) => `${k} ${w}${k === 1 ? "" : "s"}`;
    const count = G.phase !== "backward" || !n ? plural(o, "op") : o ? `${plural(n, "node")} + ${plural(o, "op")}` : plural(n, "node");
    // the path after the count only where it says more than the label's name: a top-level
    // child of an nn.Sequential read "1 op · 0", its index as if a second count
    const where = G.path !== G.label;
    const it = { key: "g:" + G.key, group: g, rep: r, order: firstLeaf.get(r), box, value: v, label: `${G.label}${mtype ? ": " + mtype : ""}${mark}`, name: G.label, type: mtype, mark,
                 sub: where ? `${count} · ${G.path}` : count, subHead: where ? count : null, subPath: where ? G.path : count, color, hi: false, cut: false };
    items.push(it); byKey.set(it.key, it);
  }

  // edges between visible representatives, deduplicated, each with the leaves of the edge
  // that stands for it (a highlight marks it when it holds both)
  const boxOf = (r) => {
    if (r >= 0) { const b = layout.leafBox; return [b[4 * r], b[4 * r + 1], b[4 * r + 2], b[4 * r + 3]]; }
    const g = -1 - r, gb = layout.groupBox; return [gb[5 * g], gb[5 * g + 1], gb[5 * g + 2], gb[5 * g + 3]];
  };
  // Links from a forward op to the grad_fn it created span the whole graph; they steer the
  // layout but are drawn only for the selected node (a dashed line that long costs seconds
  // of rasterising).
  const segs = [];
  const links = [];
  const seen = new Set();
  const N = leaves.length + groups.length + 1;
  const boxes = items.map((it) => it.box).sort((p, q) => p[1] - q[1]), tops = boxes.map((b) => b[1]);
  const fi = frameIndex(frames);
  const column = (i) => (st.sideBySide && leaves[i].phase === "backward" ? 1 : 0);
  for (const [a, b, type] of edges) {
    const ra = rep[a], rb = rep[b];
    if (ra === rb) continue;
    const k = (ra + groups.length) * N + (rb + groups.length);
    if (seen.has(k)) continue;
    seen.add(k);
    if (type === 2) { links.push({ seg: linkSeg(boxOf(ra), boxOf(rb)), a, b }); continue; }
    const seg = edgeSeg(boxOf(ra), boxOf(rb), type);
    // an edge from one column to the other (full mode's backward kernels read the forward's
    // saved tensors) crosses the gap between them: routed right of the backward column it
    // would only add a long line down the graph's edge
    const via = column(a) === column(b) ? detour(seg, boxes, tops, fi) : undefined;
    if (via !== undefined) seg.push(via);
    segs.push({ seg, a, b });
  }
  // by top, for the chunks drawn (a stable sort: a highlight's rest keeps this order)
  const sorted = segs.slice().sort((p, q) => Math.min(p.seg[1], p.seg[3]) - Math.min(q.seg[1], q.seg[3]));
  return { rep, items, byKey, frames, legend, segs, sorted, links, width: layout.width, height: layout.height, marked: null };
}

// Edges go into chunks of consecutive (by top y) edges, each a Path2D with its vertical
// extent, so drawing skips chunks outside the viewport: a 10,000-node graph is tall.
function edgeChunks(segs) {
  const edgePaths = [];
  for (let i = 0; i < segs.length; i += EDGE_CHUNK) {
    const chunk = segs.slice(i, i + EDGE_CHUNK);
    const paths = [new Path2D(), new Path2D()], heads = [new Path2D(), new Path2D()];
    let y0 = Infinity, y1 = -Infinity;
    for (const sg of chunk) { addSeg(paths[sg[4]], sg); addHead(heads[sg[4]], sg); y0 = Math.min(y0, sg[1], sg[3]); y1 = Math.max(y1, sg[1], sg[3]); }
    edgePaths.push({ path: paths[0], heads: heads[0], type: 0, y0, y1 }, { path: paths[1], heads: heads[1], type: 1, y0, y1 });
  }
  return edgePaths;
}

// The base marked: items highlighted and cut, the highlighted edges drawn apart from the rest,
// the selected node's links.  Edge paths (and the renderer's boxes batched by colour) are
// kept for the highlight they were drawn for.
function markScene(model, base, st) {
  const { leaves } = model;
  const hi = st.highlight, cutKeys = st.cut || new Set(), sel = st.selected;
  const groupsOf = (keys) => {
    const res = new Set();
    if (keys) for (const k of keys) { const l = model.byKey.get(k); if (l && base.rep[l.index] < 0) res.add(base.rep[l.index]); }
    return res;
  };
  const groupHi = groupsOf(hi), groupCut = groupsOf(cutKeys);
  for (const it of base.items) {
    if (it.group === undefined) { it.hi = !!(hi && hi.has(it.key)); it.cut = cutKeys.has(it.key); } else { it.hi = groupHi.has(it.rep); it.cut = groupCut.has(it.rep); }
  }
  const isHi = (e) => hi && hi.has(leaves[e.a].key) && hi.has(leaves[e.b].key);
  if (!base.marked || base.marked.hi !== hi) {
    const hiSegs = base.segs.filter(isHi).map((e) => e.seg);
    let edgePaths;
    if (hiSegs.length) edgePaths = edgeChunks(base.sorted.filter((e) => !isHi(e)).map((e) => e.seg));
    else edgePaths = base.plain || (base.plain = edgeChunks(base.sorted.map((e) => e.seg)));
    let hiPath = null;
    if (hiSegs.length) { hiPath = new Path2D(); hiSegs.forEach((sg) => { addSeg(hiPath, sg); addHead(hiPath, sg); }); }
    base.marked = { hi, edgePaths, hiPath };
  }
  const linkPath = new Path2D();
  if (sel) for (const e of base.links) if (leaves[e.a].key === sel || leaves[e.b].key === sel) addLink(linkPath, e.seg);
  return { base, marks: base.marked, items: base.items, byKey: base.byKey, frames: base.frames, edgePaths: base.marked.edgePaths, linkPath, hiPath: base.marked.hiPath,
           width: base.width, height: base.height, selected: sel, dimOthers: !!(hi && hi.size), legend: base.legend };
}

// The keys that stand for the loss: its grad_fn (GraphEvent.root) and the op that created it,
// with gradient accumulation each micro-batch's like op (the same name where the root's ran:
// the first backward's graph only is kept, but every micro-batch's forward reaches a loss).
export function lossKeys(model) {
  const root = model.rootKey ? model.byKey.get(model.rootKey) : null;
  if (!root) return [];
  const op = root.rec.op !== undefined && root.rec.op !== null ? model.byKey.get("o" + root.rec.op) : null;
  if (!op) return [root.key];
  const like = model.leaves.filter((x) => x.kind === "op" && x.phase === op.phase && x.rec.name === op.rec.name && x.module === op.module &&
    (x.rec.micro ?? 0) !== (op.rec.micro ?? 0));
  return [root.key, op.key, ...like.map((x) => x.key)];
}

// The way from a leaf to the loss, {keys, reaches}: ``reaches`` false when it does not get
// there (the view says so), null when the graph cannot tell.
// - a forward op: its dataflow descendants in the forward (through tensor ids, op to op).  In
//   full mode the backward's kernels read the tensors the forward saved, and walking every
//   dataflow edge went on into the backward column and lit up nearly all of it;
// - a grad_fn node: its autograd ancestors, back to the loss's grad_fn;
// - an aten op run by backward() (full mode): the same way as a grad_fn's, in the backward's
//   kernels: those whose outputs it reads, back to the loss op the backward started from (its
//   first kernel reads the loss: ones_like), keeping only the kernels the loss's gradient
//   flows through (a weight's .t() it reads is no step of that way).
export function lossPath(model, key) {
  const start = model.byKey.get(key);
  if (!start) return { keys: new Set(), reaches: null };
  const { leaves } = model, n = leaves.length;
  const losses = new Set(lossKeys(model));
  const walk = (adj) => {
    const seen = new Set([start.index]), stack = [start.index];
    while (stack.length) for (const x of adj[stack.pop()]) if (!seen.has(x)) { seen.add(x); stack.push(x); }
    return seen;
  };
  const result = (idx) => {
    const keys = new Set([...idx].map((i) => leaves[i].key));
    return { keys, reaches: losses.size ? [...losses].some((k) => keys.has(k)) : null };
  };
  const adj = Array.from({ length: n }, () => []);
  if (start.kind === "node") {
    for (const [a, b, type] of model.edges) if (type === 1) adj[b].push(a);
    return result(walk(adj));
  }
  const phase = start.phase || "forward";
  if (phase !== "backward") { // forward (or optimizer) dataflow, within its own phase
    for (const [a, b, type] of model.edges) if (type === 0 && (leaves[b].phase || "forward") === phase) adj[a].push(b);
    return result(walk(adj));
  }
  // a backward kernel: back through the backward's kernels, and into the loss op they start from
  const isLoss = (i) => losses.has(leaves[i].key);
  const fromLoss = new Set(); // backward kernels that read a loss op's output
  for (const [a, b, type] of model.edges) {
    if (type !== 0 || leaves[b].phase !== "backward") continue;
    if (leaves[a].phase === "backward") adj[b].push(a);
    else if (isLoss(a)) { adj[b].push(a); fromLoss.add(b); }
  }
  const up = walk(adj);
  // of those, the ones on a way from the loss: reached going down from the loss ops inside ``up``
  const down = Array.from({ length: n }, () => []);
  for (const b of up) for (const a of adj[b]) down[a].push(b);
  const on = new Set(), stack = [...up].filter(isLoss);
  stack.forEach((i) => on.add(i));
  while (stack.length) for (const x of down[stack.pop()]) if (!on.has(x)) { on.add(x); stack.push(x); }
  if (on.has(start.index)) return result(on);
  // off the loss's way (or a backward not started from a recorded loss: nothing to tell)
  const res = result(up);
  return { keys: res.keys, reaches: fromLoss.size ? false : null };
}

// Leaves on the way from a leaf to the loss (lossPath's keys).
export function pathToLoss(model, key) {
  return lossPath(model, key).keys;
}
