// Linear-time layered layout of a module-grouped computation graph, one group at a time.
//
// Execution order is a topological order for free, so a layer is the longest path from a
// source computed in one pass over the edges sorted by target (no cycle breaking, no
// crossing minimisation iterations).  Each expanded group is laid out on its own, its
// children being its direct ops/nodes and its child groups (a collapsed group is a box, an
// expanded one a frame whose size is its own layout's).  Expanding a group therefore lays
// out that group and re-stacks its ancestors' levels only; every other group's layout is
// reused from the cache.  Pure functions: runs in layout_worker.js, and in tests.
export const SIZE = { leafW: 150, leafH: 34, groupW: 176, groupH: 38, xGap: 14, yGap: 26, pad: 10, header: 20 };
const ROW_W = 12 * (SIZE.leafW + SIZE.xGap); // a wider layer wraps into rows

// Children ids: a leaf is its index (>= 0), a group g is -1 - g.  A group whose parent is -1
// is laid out nowhere (an open container whose children the caller gave to its parent).
export function prepare({ leafGroup, leafPos, groupParent, groupPos, edges, links, leafBackward, groupBackward }) {
  const nG = groupParent.length;
  const children = Array.from({ length: nG }, () => []);
  for (let g = 1; g < nG; g++) if (groupParent[g] >= 0) children[groupParent[g]].push(-1 - g);
  for (let i = 0; i < leafGroup.length; i++) children[leafGroup[i]].push(i);
  const posOf = (c) => (c >= 0 ? leafPos[c] : groupPos[-1 - c]);
  const local = new Int32Array(leafGroup.length + nG); // leaf i at i, group g at nLeaves + g
  const nL = leafGroup.length;
  for (let g = 0; g < nG; g++) {
    children[g].sort((a, b) => posOf(a) - posOf(b));
    children[g].forEach((c, k) => { local[c >= 0 ? c : nL + (-1 - c)] = k; });
  }
  // Ancestor chains are short (module depth), so lifting every edge to the level of its
  // lowest common group is O(E * depth).
  const depth = new Int32Array(nG);
  for (let g = 1; g < nG; g++) depth[g] = groupParent[g] < 0 ? 0 : depth[groupParent[g]] + 1;
  const levelEdges = Array.from({ length: nG }, () => []);
  for (let e = 0; e < edges.length; e += 2) {
    let a = edges[e], b = edges[e + 1];
    let ga = leafGroup[a], gb = leafGroup[b];
    let ca = a, cb = b; // child of the current group on each side
    while (depth[ga] > depth[gb]) { ca = -1 - ga; ga = groupParent[ga]; }
    while (depth[gb] > depth[ga]) { cb = -1 - gb; gb = groupParent[gb]; }
    while (ga !== gb) { ca = -1 - ga; ga = groupParent[ga]; cb = -1 - gb; gb = groupParent[gb]; }
    if (ca === cb) continue;
    const la = local[ca >= 0 ? ca : nL + (-1 - ca)], lb = local[cb >= 0 ? cb : nL + (-1 - cb)];
    if (la < lb) levelEdges[ga].push(la, lb); // edges against execution order don't rank
  }
  addDetourEdges({ leafGroup, groupParent, edges, children, local, depth, levelEdges });
  for (let g = 0; g < nG; g++) {
    const le = levelEdges[g];
    const idx = Array.from({ length: le.length / 2 }, (_, k) => k).sort((x, y) => le[2 * x + 1] - le[2 * y + 1]);
    const sorted = new Int32Array(le.length);
    idx.forEach((k, j) => { sorted[2 * j] = le[2 * k]; sorted[2 * j + 1] = le[2 * k + 1]; });
    levelEdges[g] = sorted;
  }
  return { nL, nG, children, levelEdges, groupParent, rootLinks: rootPairs(links || [], leafGroup, groupParent, local, nL),
           leafBackward: leafBackward || new Uint8Array(nL), groupBackward: groupBackward || new Uint8Array(nG) };
}

// The op -> grad_fn links lifted to the root's children they run between (a forward and a
// backward group never share any other ancestor), as local index pairs.
function rootPairs(links, leafGroup, groupParent, local, nL) {
  const child = (v) => {
    let x = leafGroup[v];
    if (x === 0) return local[v];
    while (groupParent[x] > 0) x = groupParent[x];
    return groupParent[x] === 0 ? local[nL + x] : -1;
  };
  const res = [];
  for (let e = 0; e < links.length; e += 2) {
    const a = child(links[e]), b = child(links[e + 1]);
    if (a >= 0 && b >= 0) res.push(a, b);
  }
  return res;
}

// A group's children can be ordered by data flowing outside the group only: a residual stack
// in an nn.ModuleList runs `x = x + layer(x)` in its parent, so block i reaches block i + 1
// through the parent's add, and the ModuleList's own level has no edge at all (its blocks
// landed in one row).  For each group, one pass over the edges inside its stretch of
// execution order carries to every leaf outside the group the latest child (in execution
// order) that reached it; an edge from there back into the group orders that child before
// the one it enters.  Each added edge stands for a real path, so branches that never feed
// each other stay side by side.  Leaves are numbered in execution order and a module runs
// its ops in one stretch, so the stretches nest and all groups cost about O(E * depth).
function addDetourEdges({ leafGroup, groupParent, edges, children, local, depth, levelEdges }) {
  const nL = leafGroup.length, nG = groupParent.length;
  const { lo, hi } = stretches(leafGroup, groupParent);
  const { start, source } = sourcesOf(edges, nL);
  const reach = new Int32Array(nL).fill(-1), touched = [];
  // local index of g's child that holds leaf v, or -1 when v is outside g
  const childIn = (g, v) => {
    let x = leafGroup[v];
    if (x === g) return local[v];
    while (depth[x] > depth[g] + 1) x = groupParent[x];
    return depth[x] === depth[g] + 1 && groupParent[x] === g ? local[nL + x] : -1;
  };
  for (let g = 1; g < nG; g++) {
    if (children[g].length < 2) continue;
    for (let b = lo[g]; b <= hi[g]; b++) {
      const cb = childIn(g, b);
      for (let j = start[b]; j < start[b + 1]; j++) {
        const a = source[j];
        if (a < lo[g] || a >= b) continue;
        const ca = childIn(g, a), from = ca >= 0 ? ca : reach[a];
        if (from < 0) continue;
        if (cb < 0) { if (from > reach[b]) { if (reach[b] < 0) touched.push(b); reach[b] = from; } }
        else if (ca < 0 && from < cb) levelEdges[g].push(from, cb);
      }
    }
    for (const v of touched) reach[v] = -1; // reset for the next group, in time linear in its stretch
    touched.length = 0;
  }
}

// First and last leaf (in execution order) of every group's subtree.
function stretches(leafGroup, groupParent) {
  const nL = leafGroup.length, nG = groupParent.length;
  const lo = new Int32Array(nG).fill(nL), hi = new Int32Array(nG).fill(-1);
  for (let i = 0; i < nL; i++) {
    for (let g = leafGroup[i]; g > 0; g = groupParent[g]) { if (i < lo[g]) lo[g] = i; if (i > hi[g]) hi[g] = i; }
  }
  return { lo, hi };
}

// Each leaf's sources: those of leaf b are source[start[b] .. start[b + 1]) (a counting sort
// of the edges on their target).
function sourcesOf(edges, nL) {
  const start = new Int32Array(nL + 1);
  for (let e = 1; e < edges.length; e += 2) start[edges[e] + 1]++;
  for (let i = 0; i < nL; i++) start[i + 1] += start[i];
  const source = new Int32Array(edges.length / 2), fill = start.slice(0, nL);
  for (let e = 0; e < edges.length; e += 2) source[fill[edges[e + 1]]++] = edges[e];
  return { start, source };
}

// Layered placement of the children k with member[k] set, using only the level's edges
// between members; reverse = the layers go bottom-up (backward, side by side).
function layered(ch, le, member, sizeOf, reverse) {
  const n = ch.length;
  const layer = new Int32Array(n);
  for (let e = 0; e < le.length; e += 2) {
    if (!member[le[e]] || !member[le[e + 1]]) continue;
    const v = layer[le[e]] + 1;
    if (v > layer[le[e + 1]]) layer[le[e + 1]] = v;
  }
  // Sources (an op fed only by inputs and parameters) sit just above their first consumer
  // rather than all in the top layer; isolated children sit beside their predecessor in
  // execution order.  Both keep the graph narrow.  Still one pass over the edges.
  const hasIn = new Uint8Array(n), firstUse = new Int32Array(n).fill(-1);
  for (let e = 0; e < le.length; e += 2) {
    const a = le[e], b = le[e + 1];
    if (!member[a] || !member[b]) continue;
    hasIn[b] = 1;
    const L = layer[b] - 1;
    if (firstUse[a] < 0 || L < firstUse[a]) firstUse[a] = L;
  }
  let prev = -1;
  for (let k = 0; k < n; k++) {
    if (!member[k]) continue;
    if (!hasIn[k]) { if (firstUse[k] >= 0) layer[k] = firstUse[k]; else if (prev >= 0) layer[k] = layer[prev]; }
    prev = k;
  }
  let nLayers = 0;
  for (let k = 0; k < n; k++) if (member[k] && layer[k] + 1 > nLayers) nLayers = layer[k] + 1;
  // A layer is cut into rows at most ROW_W wide: children of one layer never feed each other,
  // and hundreds of them (the detach of every AccumulateGrad, a mask's slices) in one row made
  // a graph 50,000 px wide that "Fit" shrank to nothing.
  const w = new Float64Array(n), h = new Float64Array(n), rowOf = new Int32Array(n);
  const rowW = [], rowH = [], rowLayer = [], lastRow = new Int32Array(nLayers).fill(-1);
  for (let k = 0; k < n; k++) {
    if (!member[k]) continue;
    const [cw, chh] = sizeOf(ch[k]);
    w[k] = cw; h[k] = chh;
    const L = layer[k];
    let r = lastRow[L];
    if (r < 0 || rowW[r] + SIZE.xGap + cw > ROW_W) {
      r = lastRow[L] = rowW.length;
      rowW.push(0); rowH.push(0); rowLayer.push(L);
    } else rowW[r] += SIZE.xGap;
    rowW[r] += cw;
    if (chh > rowH[r]) rowH[r] = chh;
    rowOf[k] = r;
  }
  // rows in layer order, a layer's rows in the order they filled
  const order = rowW.map((_, r) => r).sort((a, b) => rowLayer[a] - rowLayer[b] || a - b);
  const ry = new Float64Array(rowW.length);
  let y = 0, maxW = 0;
  order.forEach((r, j) => {
    if (j > 0) y += rowLayer[r] === rowLayer[order[j - 1]] ? SIZE.xGap : SIZE.yGap;
    ry[r] = y; y += rowH[r]; if (rowW[r] > maxW) maxW = rowW[r];
  });
  const total = y;
  if (reverse) for (let r = 0; r < rowW.length; r++) ry[r] = total - ry[r] - rowH[r];
  const cursor = rowW.map((rw) => (maxW - rw) / 2); // centre each row
  const rel = new Float64Array(2 * n), top = new Float64Array(n); // top: of the child's row
  for (let k = 0; k < n; k++) {
    if (!member[k]) continue;
    const r = rowOf[k];
    rel[2 * k] = cursor[r];
    rel[2 * k + 1] = ry[r] + (rowH[r] - h[k]) / 2;
    top[k] = ry[r];
    cursor[r] += w[k] + SIZE.xGap;
  }
  return { rel, top, w: Math.max(maxW, 0), h: total };
}

// Side by side, a grad_fn should sit across from the forward op that created it, but each
// column is laid out on its own and the backward one (in full mode with its kernels) grows
// taller, so the two drifted apart: a forward block across from a later block's backward.
// Each link pairs a row of the forward column with a row of the backward; the longest chain
// of pairs in the same order in both columns is lined up, pushing the rows of whichever
// column is behind down, from the paired row on.  Returns each column's pushes as sorted
// [row top, total push from there down], or null when no link pairs two rows.
function alignColumns(links, isF, F, B) {
  const pairs = new Map();
  for (let e = 0; e < links.length; e += 2) {
    const a = links[e], b = links[e + 1];
    if (isF[a] && !isF[b]) pairs.set(`${F.top[a]},${B.top[b]}`, [F.top[a], B.top[b]]);
  }
  // by forward row, and within one the lowest backward row first: a strictly increasing chain
  // then takes one pair per row
  const list = [...pairs.values()].sort((p, q) => p[0] - q[0] || q[1] - p[1]);
  if (!list.length) return null;
  const pushF = [], pushB = [];
  let dF = 0, dB = 0;
  for (const i of longestIncreasing(list.map((p) => p[1]))) {
    const [f, b] = list[i], d = f + dF - (b + dB);
    if (d < 0) { dF -= d; pushF.push([f, dF]); } else if (d > 0) { dB += d; pushB.push([b, dB]); }
  }
  return { pushF, pushB, dF, dB };
}

// How far a row whose top is at y was pushed down: the last push at or above it.
function pushAt(pushes, y) {
  let lo = 0, hi = pushes.length;
  while (lo < hi) { const m = (lo + hi) >> 1; if (pushes[m][0] <= y) lo = m + 1; else hi = m; }
  return lo ? pushes[lo - 1][1] : 0;
}

// Indices of a longest strictly increasing subsequence of xs (patience sorting, O(n log n)).
function longestIncreasing(xs) {
  const tails = [], prev = new Int32Array(xs.length).fill(-1);
  xs.forEach((x, i) => {
    let lo = 0, hi = tails.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (xs[tails[m]] < x) lo = m + 1; else hi = m; }
    if (lo > 0) prev[i] = tails[lo - 1];
    tails[lo] = i;
  });
  const res = [];
  for (let i = tails.length ? tails[tails.length - 1] : -1; i >= 0; i = prev[i]) res.push(i);
  return res.reverse();
}

// Lay out the children of one expanded group given each child's size.  One DAG: every
// child in one layered column.  Side by side: at the root, forward (and optimizer) on the
// left flowing down, backward on the right flowing up, rows lined up by the op -> grad_fn
// links (bottoms aligned when there are none), so a grad_fn sits across from the forward op
// that created it; inside backward groups layers go up too.
function layoutGroup(prep, g, sizeOf, sideBySide) {
  const ch = prep.children[g];
  const le = prep.levelEdges[g];
  const n = ch.length;
  const all = new Uint8Array(n).fill(1);
  if (!sideBySide) return layered(ch, le, all, sizeOf, false);
  if (g !== 0) return layered(ch, le, all, sizeOf, prep.groupBackward[g] === 1);
  const isB = new Uint8Array(n), isF = new Uint8Array(n);
  for (let k = 0; k < n; k++) {
    const c = ch[k];
    isB[k] = c >= 0 ? prep.leafBackward[c] : prep.groupBackward[-1 - c];
    isF[k] = 1 - isB[k];
  }
  const F = layered(ch, le, isF, sizeOf, false), B = layered(ch, le, isB, sizeOf, true);
  const al = alignColumns(prep.rootLinks, isF, F, B);
  const hF = F.h + (al ? al.dF : 0), hB = B.h + (al ? al.dB : 0), H = Math.max(hF, hB);
  const rel = new Float64Array(2 * n), top = new Float64Array(n);
  for (let k = 0; k < n; k++) {
    const src = isB[k] ? B : F;
    const down = al ? pushAt(isB[k] ? al.pushB : al.pushF, src.top[k]) : H - src.h;
    rel[2 * k] = src.rel[2 * k];
    rel[2 * k + 1] = src.rel[2 * k + 1] + down;
    top[k] = src.top[k] + down;
  }
  // the backward column as close as the rows beside each other allow, not past the forward
  // column's widest row: in full mode that is the "(optimizer.step())" group below every
  // backward row, and "Expand all" put the backward column's top off-screen (QA 50b)
  const shift = columnShift(rel, top, ch, sizeOf, isF, F.w / 2, B.w / 2);
  let x0 = Infinity, x1 = -Infinity;
  for (let k = 0; k < n; k++) {
    if (isB[k]) rel[2 * k] += shift;
    x0 = Math.min(x0, rel[2 * k]); x1 = Math.max(x1, rel[2 * k] + sizeOf(ch[k])[0]);
  }
  for (let k = 0; k < n; k++) rel[2 * k] -= x0;
  return { rel, w: x1 - x0, h: H };
}

// How far right of the forward column's left edge the backward column goes: each column's
// rows are centred on its axis (at aF, aB of its own width), and the axes are as far apart as
// the widest pair of rows that sit beside each other (overlapping in height, a gap between
// them) needs -- at least a gap, with nothing beside each other.
function columnShift(rel, top, ch, sizeOf, isF, aF, aB) {
  const rowsF = new Map(), rowsB = new Map(); // row top -> [y0, y1, x0, x1]
  for (let k = 0; k < ch.length; k++) {
    const [w, h] = sizeOf(ch[k]), x = rel[2 * k], y = rel[2 * k + 1];
    const rows = isF[k] ? rowsF : rowsB, key = top[k];
    const r = rows.get(key);
    if (r) { r[0] = Math.min(r[0], y); r[1] = Math.max(r[1], y + h); r[2] = Math.min(r[2], x); r[3] = Math.max(r[3], x + w); }
    else rows.set(key, [y, y + h, x, x + w]);
  }
  const gap = 4 * SIZE.xGap, margin = SIZE.yGap / 2;
  let apart = gap;
  for (const f of rowsF.values()) {
    for (const b of rowsB.values()) {
      if (f[0] < b[1] + margin && b[0] < f[1] + margin) apart = Math.max(apart, f[3] - aF + (aB - b[2]) + gap);
    }
  }
  return aF + apart - aB;
}

export class Layouter {
  constructor(input) {
    this.prep = prepare(input);
    this.cache = new Map(); // group -> {rel, w, h}
    this.expanded = new Set([0]);
    this.sideBySide = false;
  }

  // Switching between one DAG and side by side changes every group's layout.
  setSideBySide(on) {
    if (on !== this.sideBySide) { this.sideBySide = on; this.cache.clear(); }
  }

  // Groups whose expansion changed, and their ancestors, lose their cached layout.
  setExpanded(list) {
    const next = new Set([0, ...list]);
    const touched = [];
    for (const g of next) if (!this.expanded.has(g)) touched.push(g);
    for (const g of this.expanded) if (!next.has(g)) touched.push(g);
    for (let g of touched) for (; g >= 0; g = this.prep.groupParent[g]) this.cache.delete(g);
    this.expanded = next;
    return touched.length;
  }

  size(c) {
    if (c >= 0) return [SIZE.leafW, SIZE.leafH];
    const g = -1 - c;
    if (!this.expanded.has(g)) return [SIZE.groupW, SIZE.groupH];
    const l = this.group(g);
    return [Math.max(l.w, SIZE.groupW) + 2 * SIZE.pad, l.h + SIZE.header + 2 * SIZE.pad];
  }

  group(g) {
    let l = this.cache.get(g);
    if (!l) { l = layoutGroup(this.prep, g, (c) => this.size(c), this.sideBySide); this.cache.set(g, l); }
    return l;
  }

  // Absolute boxes of everything visible.  leaf: x,y,w,h (NaN when hidden);
  // group: x,y,w,h,state (0 hidden, 1 collapsed box, 2 expanded frame).
  place() {
    const { nL, nG, children } = this.prep;
    const leafBox = new Float32Array(4 * nL).fill(NaN);
    const groupBox = new Float32Array(5 * nG);
    const root = this.group(0);
    const stack = [[0, 0, 0]];
    while (stack.length) {
      const [g, ox, oy] = stack.pop();
      const l = this.group(g);
      const ch = children[g];
      const inner = g === 0 ? 0 : 1;
      const bx = ox + inner * SIZE.pad, by = oy + inner * (SIZE.header + SIZE.pad);
      for (let k = 0; k < ch.length; k++) {
        const c = ch[k];
        const x = bx + l.rel[2 * k], y = by + l.rel[2 * k + 1];
        const [w, h] = this.size(c);
        if (c >= 0) { leafBox.set([x, y, w, h], 4 * c); continue; }
        const cg = -1 - c;
        groupBox.set([x, y, w, h, this.expanded.has(cg) ? 2 : 1], 5 * cg);
        if (this.expanded.has(cg)) stack.push([cg, x, y]);
      }
    }
    return { leafBox, groupBox, width: root.w, height: root.h };
  }
}
