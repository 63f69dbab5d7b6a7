// The graph diff: which leaves of one graph (the step shown) are new or changed against
// another graph -- another captured step of the same run, or a step of another run (an extra
// layer, ReLU swapped for GELU).  One rule for both: a leaf is known by its signature
// "phase|module|label", and by its sub-label too (output shape and where it ran, an
// AccumulateGrad's parameter); module paths are the same when the two models share structure.
import { leafSub } from "./scene.js";

const sig = (m, l) => `${l.phase}|${l.module}|${l.label}`;
const full = (m, l) => `${sig(m, l)}|${leafSub(m, l)}`;

function count(m, key) {
  const c = new Map();
  for (const l of m.leaves) { const k = key(m, l); c.set(k, (c.get(k) || 0) + 1); }
  return c;
}

// ``model`` against ``other`` (buildModel's both): each leaf of ``model`` whose full signature
// ``other`` has (as many times) is the same; else one whose signature it has left is
// "changed"; else "added".  What of ``other`` no leaf took is "removed" (a count).
// {marks: Map leaf key -> "added" | "changed" (the same are absent), added, changed, removed}
export function diffGraphs(model, other) {
  const of = count(other, full), os = count(other, sig);
  const marks = new Map();
  let added = 0, changed = 0;
  for (const l of model.leaves) {
    const f = full(model, l), s = sig(model, l);
    if (of.get(f) > 0) { of.set(f, of.get(f) - 1); os.set(s, os.get(s) - 1); continue; }
    if (os.get(s) > 0) { os.set(s, os.get(s) - 1); marks.set(l.key, "changed"); changed++; } else { marks.set(l.key, "added"); added++; }
  }
  const removed = [...os.values()].reduce((a, b) => a + Math.max(b, 0), 0);
  return { marks, added, changed, removed };
}
