// Turns one GraphEvent into the structure the layout and the renderer share:
// leaves (forward ops and autograd nodes), the module-group tree (one tree per phase, so a
// module's forward and its backward are separate boxes), and leaf edges.  Linear time.
//
// Leaf keys: "o<id>" for an OpRecord, "n<id>" for a NodeRecord (grad_fn).
import { OUTSIDE_MODULES, OPTIMIZER_STEP } from "../dom.js";

export const ROOT = 0;
export const OUTSIDE = OUTSIDE_MODULES;

export function buildModel(ev) {
  const ops = ev.ops || [];
  const nodes = ev.nodes || [];
  const tensors = new Map();
  for (const t of ev.tensors || []) tensors.set(t.id, t);

  const leaves = []; // {key, kind: "op"|"node", rec, label, module, phase, pos, group}
  const byKey = new Map();
  const add = (leaf) => { leaf.index = leaves.length; leaves.push(leaf); byKey.set(leaf.key, leaf); };

  // Forward/optimizer ops come in execution order already: that order is topological.
  const opsSorted = ops.slice().sort((a, b) => a.id - b.id);
  for (const op of opsSorted) {
    const phase = op.phase || "forward";
    // full mode's backward kernels outside every module (the loss's backward, each
    // AccumulateGrad's detach: dozens) in a group of their own, not loose beside the grad_fn nodes
    // (and optimizer.step()'s ops, hundreds for a per-parameter Adam, in one group too)
    const module = op.module || (phase === "backward" ? OUTSIDE : phase === "optimizer" ? OPTIMIZER_STEP : "");
    add({ key: "o" + op.id, kind: "op", rec: op, label: shortOp(op.name), module, phase });
  }
  for (const n of backwardOrder(nodes, ev.edges || [])) {
    // AccumulateGrad belongs with its parameter's module (the capture may leave it at the root).
    const pmod = n.param && !n.module ? n.param.slice(0, Math.max(0, n.param.lastIndexOf("."))) : "";
    // a torch.compile region is one opaque node in autograd's graph: say so in its label (its
    // node's name is in the details: with it, the box cut the label mid-word, QA 44c); a cast
    // autocast inserted says whose it is (M7)
    const label = n.name === "CompiledFunctionBackward" ? "torch.compile region"
      : n.autocast_cast ? `${n.name} (autocast cast)` : n.name || "?";
    add({ key: "n" + n.id, kind: "node", rec: n, label, module: n.module || pmod, phase: "backward" });
  }
  leaves.forEach((l, i) => { l.pos = i; });

  // Edges: forward dataflow through tensor ids, autograd next_functions, and the link from a
  // forward op to the grad_fn node it created.
  const edges = []; // [fromIndex, toIndex, type] type 0 = dataflow, 1 = autograd, 2 = op->grad_fn
  const producer = new Map();
  for (const op of opsSorted) {
    const me = byKey.get("o" + op.id).index;
    const seen = new Set();
    for (const t of op.inputs || []) {
      const p = producer.get(t);
      if (p !== undefined && p !== me && !seen.has(p)) { seen.add(p); edges.push([p, me, 0]); }
    }
    for (const t of op.outputs || []) producer.set(t, me);
  }
  for (const [from, to] of ev.edges || []) {
    const a = byKey.get("n" + from);
    const b = byKey.get("n" + to);
    if (a && b) edges.push([a.index, b.index, 1]);
  }
  for (const n of nodes) {
    if (n.op === undefined || n.op === null) continue;
    const a = byKey.get("o" + n.op);
    const b = byKey.get("n" + n.id);
    if (a && b) edges.push([a.index, b.index, 2]);
  }

  // Group tree: key "<phase>:<module path>"; index 0 is the virtual root that holds every
  // phase's top-level modules and the ops that ran directly in the root module.
  const groups = [{ key: "", phase: "", path: "", parent: -1, depth: 0, pos: -1, count: 0, label: "" }];
  const gIndex = new Map([["", 0]]);
  const groupOf = (phase, path) => {
    if (!path) return ROOT;
    const key = phase + ":" + path;
    let g = gIndex.get(key);
    if (g !== undefined) return g;
    const dot = path.startsWith("(") ? -1 : path.lastIndexOf("."); // ("(optimizer.step())": one name)
    const parent = groupOf(phase, dot < 0 ? "" : path.slice(0, dot));
    g = groups.length;
    groups.push({ key, phase, path, parent, depth: groups[parent].depth + 1, pos: Infinity, count: 0,
                  label: dot < 0 ? path : path.slice(dot + 1) });
    gIndex.set(key, g);
    return g;
  };
  for (const l of leaves) {
    l.group = groupOf(l.phase, l.module);
    // count: every leaf; nodes / ops: of each kind (a backward group in full mode holds
    // grad_fn nodes and the aten kernels they ran)
    for (let g = l.group; g > 0; g = groups[g].parent) {
      groups[g].count++;
      if (l.kind === "node") groups[g].nodes = (groups[g].nodes || 0) + 1; else groups[g].ops = (groups[g].ops || 0) + 1;
    }
  }
  // A group's place among its siblings (the layout ranks only edges that follow it) is its
  // first leaf's, for a backward group its first grad_fn node's: full mode's backward kernels
  // are numbered with the ops, before every node, so by them each module's backward came
  // before the loss's grad_fn that feeds it, and the loss's grad_fn, unranked, landed at the
  // top of the backward column instead of at its bottom, across from the loss.  Nodes first,
  // in order, then ops for the groups without a node; each climb stops at a placed group.
  const placing = leaves.filter((l) => l.kind === "node").concat(leaves.filter((l) => l.kind === "op"));
  for (const l of placing) for (let g = l.group; g > 0 && groups[g].pos === Infinity; g = groups[g].parent) groups[g].pos = l.pos;

  // Repeated blocks: numbered children (ModuleList / Sequential) with the same structure (op
  // names at the same relative depth, in order) under the same parent; the lowest-numbered
  // names the rest, in both phases: the backward groups are made in the backward's order (the
  // last block first), and marked in that order the backward column read "0 ≡ 4" across
  // from the forward's "4 ≡ 0".
  const sig = new Int32Array(groups.length);
  for (const l of leaves) {
    let hsh = 0;
    for (let i = 0; i < l.label.length; i++) hsh = (hsh * 31 + l.label.charCodeAt(i)) | 0;
    for (let g = l.group; g > 0; g = groups[g].parent) sig[g] = (Math.imul(sig[g], 1000003) + hsh + groups[l.group].depth - groups[g].depth) | 0;
  }
  const firstOf = new Map();
  const numbered = []; // repeated blocks live in ModuleList / Sequential
  for (let g = 1; g < groups.length; g++) if (/^\d+$/.test(groups[g].label)) numbered.push(g);
  numbered.sort((a, b) => +groups[a].label - +groups[b].label || a - b);
  for (const g of numbered) {
    const k = `${groups[g].parent}|${sig[g]}|${groups[g].count}`;
    if (firstOf.has(k)) groups[g].repeatOf = firstOf.get(k); else firstOf.set(k, g);
  }

  // Data the details panel and the overlays read.
  const paramOps = new Map(); // param name -> op keys consuming it (for cut paths, P1)
  for (const op of opsSorted) {
    for (const t of op.inputs || []) {
      const tm = tensors.get(t);
      if (tm && tm.param) {
        if (!paramOps.has(tm.param)) paramOps.set(tm.param, []);
        paramOps.get(tm.param).push("o" + op.id);
      }
    }
  }
  const nodeOfParam = new Map();
  for (const n of nodes) if (n.param) nodeOfParam.set(n.param, "n" + n.id);
  // storage id -> parameter name: a saved tensor in a parameter's storage (AddmmBackward0's
  // _saved_mat2 is weight.t()) is that parameter's memory, not an activation
  const paramStorage = new Map();
  for (const t of ev.tensors || []) if (t.param && t.storage !== undefined && !paramStorage.has(t.storage)) paramStorage.set(t.storage, t.param);
  return { ev, leaves, byKey, edges, groups, gIndex, tensors, paramOps, nodeOfParam, paramStorage,
           rootKey: ev.root !== undefined ? "n" + ev.root : null };
}

// Bytes of one element of a dtype as the events name it ("float32"); 1 for one unknown here
// (as capture/_overlap.py's itemsize for a name torch does not know).
const ITEMSIZE = { float64: 8, float32: 4, float16: 2, bfloat16: 2, complex128: 16, complex64: 8, complex32: 4,
  int64: 8, int32: 4, int16: 2, int8: 1, uint64: 8, uint32: 4, uint16: 2, uint8: 1, bool: 1 };
const itemsize = (dtype) => ITEMSIZE[dtype] ?? 1;

// The part of its storage a saved tensor holds, [first byte, bytes]: the whole storage (its
// nbytes are the storage's, more than the view spans), or, for a view of data that needs no
// gradient (a batch sliced out of a dataset), the span the capture recorded as its nbytes.
function savedSpan(s) {
  const n = s.nbytes || 0;
  if (!Array.isArray(s.shape) || !Array.isArray(s.stride) || s.offset === undefined) return [0, n];
  let span = 1;
  for (let i = 0; i < s.shape.length; i++) {
    if (s.shape[i] === 0) return [0, 0];
    span += (s.shape[i] - 1) * Math.abs(s.stride[i] ?? 0);
  }
  span *= itemsize(s.dtype);
  return n !== span ? [0, n] : [s.offset * itemsize(s.dtype), n];
}

// Bytes covered by [start, bytes] spans of one storage (capture/_autograd.py's _union).
function union(spans) {
  if (spans.length === 1) return spans[0][1];
  let total = 0, end = -1;
  for (const [start, n] of spans.slice().sort((a, b) => a[0] - b[0] || a[1] - b[1])) {
    const stop = start + n;
    if (stop > end) { total += stop - Math.max(start, end); end = stop; }
  }
  return total;
}

// What the grad_fn node records ``recs`` hold saved for backward, as the Memory view's "saved
// activations" counts a step's: each storage once (a ReLU's output saved by ReluBackward0 and
// by the next AddmmBackward0 is one tensor), parameters apart (a weight.t() AddmmBackward0
// saves is the parameter's own memory, there anyway).  {bytes: the activations', params:
// Map parameter name -> bytes of its storage saved}.
export function savedActivations(model, recs) {
  const spans = new Map(); // storage id -> [[start, bytes]] (a saved tensor with no storage id: its own key)
  let loose = 0;
  for (const r of recs) {
    for (const s of r.saved || []) {
      const key = s.storage;
      if (key === undefined || key === null) { loose++; spans.set("loose" + loose, [savedSpan(s)]); continue; }
      const sp = savedSpan(s), at = spans.get(key);
      if (!at) spans.set(key, [sp]);
      else if (!at.some((x) => x[0] === sp[0] && x[1] === sp[1])) at.push(sp);
    }
  }
  let bytes = 0;
  const params = new Map();
  for (const [key, at] of spans) {
    const p = model.paramStorage?.get(key);
    if (p !== undefined) params.set(p, (params.get(p) || 0) + union(at));
    else bytes += union(at);
  }
  return { bytes, params };
}

// What a module group's leaves (indices into model.leaves) add up to.  Time: the grad_fn
// nodes' durations where any node was timed -- a node's duration holds the aten kernels it ran
// (full mode's backward ops, in the same group), so adding both counted the backward twice --
// else the ops' (a forward group; a backward group of kernels alone).  Saved: the nodes' saved
// activations (savedActivations).
export function groupTotals(model, idx) {
  let nodes = 0, ops = 0, nodeUs = 0, opUs = 0, timedNodes = 0, timedOps = 0, alloc = 0;
  const recs = [];
  for (const i of idx) {
    const l = model.leaves[i], d = l.rec.dur_us;
    if (l.kind === "node") {
      nodes++; recs.push(l.rec);
      if (typeof d === "number") { timedNodes++; nodeUs += d; }
    } else {
      ops++; alloc += l.rec.alloc || 0;
      if (typeof d === "number") { timedOps++; opUs += d; }
    }
  }
  const saved = savedActivations(model, recs);
  return { nodes, ops, alloc, timedBy: timedNodes ? "nodes" : timedOps ? "ops" : null, time: timedNodes ? nodeUs : timedOps ? opUs : undefined,
           saved: saved.bytes, savedParams: saved.params };
}

// The leaves (indices) inside group ``g``, at any depth.
export function groupLeaves(model, g) {
  const res = [];
  for (const l of model.leaves) {
    let x = l.group;
    while (x > 0 && x !== g) x = model.groups[x].parent;
    if (x === g) res.push(l.index);
  }
  return res;
}

export function shortOp(name) {
  if (!name) return "?";
  return name.startsWith("aten::") ? name.slice(6) : name;
}

// Autograd nodes in an order where every edge goes forward: Kahn's algorithm from the loss's
// grad_fn, ties broken by the recorded backward execution order.
function backwardOrder(nodes, edges) {
  const indeg = new Map();
  const out = new Map();
  for (const n of nodes) { indeg.set(n.id, 0); out.set(n.id, []); }
  for (const [a, b] of edges) {
    if (!out.has(a) || !indeg.has(b)) continue;
    out.get(a).push(b);
    indeg.set(b, indeg.get(b) + 1);
  }
  const rank = (n) => (n.order ?? 1e12) * 1e6 + n.id;
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const ready = nodes.filter((n) => indeg.get(n.id) === 0).sort((x, y) => rank(x) - rank(y));
  const res = [];
  for (let i = 0; i < ready.length; i++) {
    const n = ready[i];
    res.push(n);
    for (const b of out.get(n.id)) {
      const d = indeg.get(b) - 1;
      indeg.set(b, d);
      if (d === 0) ready.push(byId.get(b));
    }
  }
  if (res.length < nodes.length) { // a cycle cannot happen in autograd; keep every node anyway
    const have = new Set(res.map((n) => n.id));
    for (const n of nodes) if (!have.has(n.id)) res.push(n);
  }
  return res;
}

// Representative of each leaf under a set of expanded groups: itself when every ancestor
// group is expanded, else the outermost collapsed group (as -1 - groupIndex).
export function representatives(model, expanded) {
  const { groups, leaves } = model;
  const gRep = new Int32Array(groups.length);
  gRep[0] = 0;
  for (let g = 1; g < groups.length; g++) { // parents come before children in this array
    const p = groups[g].parent;
    gRep[g] = gRep[p] !== 0 ? gRep[p] : (expanded.has(g) ? 0 : -1 - g);
  }
  const rep = new Int32Array(leaves.length);
  for (const l of leaves) rep[l.index] = gRep[l.group] !== 0 ? gRep[l.group] : l.index;
  return { rep, gRep };
}

export function ancestors(model, g) {
  const res = [];
  for (let x = g; x > 0; x = model.groups[x].parent) res.push(x);
  return res;
}
