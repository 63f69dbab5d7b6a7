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

// What the step held before its first recorded op (parameters, their .grad, optimizer state):
// the first op's live bytes less what it changed.
export function baseline(ev) {
  const first = (ev.ops || []).reduce((a, o) => (a === null || o.id < a.id ? o : a), null);
  return first ? first.live - (first.alloc || 0) + (first.free || 0) : 0;
}
