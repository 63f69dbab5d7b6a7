// Turns one GraphEvent into the structure the layout and the renderer share:
// leaves (forward ops and autograd nodes), the module-group tree (one tree per phase, so a
// module's forward and its backward are separate boxes), and leaf edges.  Linear time.
//
// Leaf keys: "o<id>" for an OpRecord, "n<id>" for a NodeRecord (grad_fn).
export const ROOT = 0;
export const OUTSIDE = "(outside modules)";

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
    const module = op.module || (phase === "backward" ? OUTSIDE : "");
    add({ key: "o" + op.id, kind: "op", rec: op, label: shortOp(op.name), module, phase });
  }
  for (const n of backwardOrder(nodes, ev.edges || [])) {
    // AccumulateGrad belongs with its parameter's module (the capture may leave it at the root).
    const pmod = n.param && !n.module ? n.param.slice(0, Math.max(0, n.param.lastIndexOf("."))) : "";
    // a torch.compile region is one opaque node in autograd's graph: say so in its label; a
    // cast autocast inserted says whose it is (M7)
    const label = n.name === "CompiledFunctionBackward" ? "torch.compile region (CompiledFunctionBackward)"
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
    const dot = path.lastIndexOf(".");
    const parent = groupOf(phase, dot < 0 ? "" : path.slice(0, dot));
    g = groups.length;
    groups.push({ key, phase, path, parent, depth: groups[parent].depth + 1, pos: Infinity, count: 0,
                  label: dot < 0 ? path : path.slice(dot + 1) });
    gIndex.set(key, g);
    return g;
  };
  for (const l of leaves) {
    l.group = groupOf(l.phase, l.module);
    for (let g = l.group; g > 0; g = groups[g].parent) groups[g].count++;
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
  return { ev, leaves, byKey, edges, groups, gIndex, tensors, paramOps, nodeOfParam,
           rootKey: ev.root !== undefined ? "n" + ev.root : null };
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
