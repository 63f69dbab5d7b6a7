// Each allocation's lifetime in a captured step (memory_viz's question "what is holding memory
// at the peak?"): an op's outputs whose storage it allocated (OpRecord.alloc counted them: no
// input shares that storage, none alive has it) live until the op whose ``freed`` lists their
// storage id (format 1.9), or past the step's last recorded op.  Storage ids are by address,
// so an address reused after a free is a new allocation under the same id: the ops are walked
// in order, frees first (noticed as the op began).

// Whether the file records the frees (SessionEvent.schema >= 1.9): older ones do not, and every
// allocation would read as alive to the end.
export function hasLifetimes(meta) {
  const v = meta?.schema || [];
  return v[0] > 1 || (v[0] === 1 && v[1] >= 9);
}

// [{ sid, bytes, tensor, made, freed }] in the order made: ``made`` the op that allocated it,
// ``freed`` the op during which its last tensor died (null: alive past the recorded ops).
export function lifetimes(ev) {
  const tensors = new Map((ev.tensors || []).map((t) => [t.id, t]));
  const ops = (ev.ops || []).slice().sort((a, b) => a.id - b.id);
  const open = new Map(); // storage id -> its lifetime, while alive
  const all = [];
  for (const op of ops) {
    for (const sid of op.freed || []) {
      const life = open.get(sid);
      if (life) { life.freed = op; open.delete(sid); }
    }
    if (!(op.alloc > 0)) continue;
    const shared = new Set((op.inputs || []).map((i) => tensors.get(i)?.storage));
    let made = 0;
    for (const id of op.outputs || []) {
      const t = tensors.get(id);
      const sid = t?.storage;
      if (made >= op.alloc || sid === undefined || open.has(sid) || shared.has(sid)) continue;
      const life = { sid, bytes: t.nbytes || 0, tensor: t, made: op, freed: null };
      open.set(sid, life);
      all.push(life);
      made += life.bytes;
    }
  }
  return all;
}

// Those alive right after op ``at`` (an OpRecord): made at or before it, freed after it.
export function aliveAfter(lives, at) {
  return lives.filter((l) => l.made.id <= at.id && (!l.freed || l.freed.id > at.id));
}

// What the step held before its first recorded op (parameters, their .grad, optimizer state, the
// tensors the first forward was called with):
// the first op's live bytes less what it changed.
export function baseline(ev) {
  const first = (ev.ops || []).reduce((a, o) => (a === null || o.id < a.id ? o : a), null);
  return first ? first.live - (first.alloc || 0) + (first.free || 0) : 0;
}

// What the step's baseline still held after each op of ``ids`` (op ids, ascending): less the
// bytes each op freed beyond the step's own allocations it ended (``lives``' whose ``freed`` it
// is) -- the .grad tensors zero_grad() dropped between the forward and the backward, which the
// baseline counted and no op freed (the recorder tells them as a free of the next op).
export function baselineAfter(ev, lives, ids) {
  const ended = new Map(); // op id -> bytes of the step's allocations it freed
  for (const l of lives) if (l.freed) ended.set(l.freed.id, (ended.get(l.freed.id) || 0) + l.bytes);
  const ops = (ev.ops || []).slice().sort((a, b) => a.id - b.id), base = baseline(ev);
  let gone = 0, j = 0;
  return ids.map((id) => {
    for (; j < ops.length && ops[j].id <= id; j++) gone += Math.max((ops[j].free || 0) - (ended.get(ops[j].id) || 0), 0);
    return base - gone;
  });
}

// The index in ``ids`` (op ids, ascending: a memory timeline's) of the first op at or after op
// id ``id``: where a lifetime made (or freed) by that op starts (or stops) counting.
function indexOf(ids, id) {
  let lo = 0, hi = ids.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (ids[mid] < id) lo = mid + 1; else hi = mid; }
  return lo;
}

// The bytes alive right after each op of ``ids`` (op ids, ascending), split by ``key(life)``
// (the module that made it, say): Map key -> number[], the keys in the order first made.  As
// aliveAfter, a lifetime counts from its making op up to the op that freed it, that one
// excluded; one sweep of running sums, not a filter per op.  An array per key: a caller with
// many keys groups them first (highestBy).
export function aliveBy(lives, ids, key) {
  const diff = new Map();
  for (const l of lives) {
    const k = key(l);
    if (!diff.has(k)) diff.set(k, new Array(ids.length + 1).fill(0));
    const d = diff.get(k);
    d[indexOf(ids, l.made.id)] += l.bytes;
    if (l.freed) d[indexOf(ids, l.freed.id)] -= l.bytes;
  }
  const out = new Map();
  for (const [k, d] of diff) {
    let sum = 0;
    out.set(k, ids.map((_, i) => (sum += d[i])));
  }
  return out;
}

// The highest of aliveBy's values for each key, without its arrays (a model of a thousand
// modules over a timeline of 50,000 ops): Map key -> bytes, the keys in the order first made.
export function highestBy(lives, ids, key) {
  const steps = new Map(); // key -> [index, +bytes made / -bytes freed]
  for (const l of lives) {
    const k = key(l);
    if (!steps.has(k)) steps.set(k, []);
    const e = steps.get(k);
    e.push([indexOf(ids, l.made.id), l.bytes]);
    if (l.freed) e.push([indexOf(ids, l.freed.id), -l.bytes]);
  }
  const out = new Map();
  for (const [k, e] of steps) {
    e.sort((a, b) => a[0] - b[0]);
    let sum = 0, top = 0;
    e.forEach(([i, b], j) => { // (read once an index's changes are all in, and only at an op of ``ids``)
      sum += b;
      if (i < ids.length && (j + 1 === e.length || e[j + 1][0] !== i) && sum > top) top = sum;
    });
    out.set(k, top);
  }
  return out;
}
