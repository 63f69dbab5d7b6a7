// The graph diff: which leaves of one graph (the step shown) are new or changed against
// another graph -- another captured step of the same run, or a step of another run (an extra
// layer, ReLU swapped for GELU).  One rule for both: a leaf is known by its signature
// "phase|module|label", and by its sub-label too (output shape and where it ran, an
// AccumulateGrad's parameter); module paths are the same when the two models share structure.
import { leafSub } from "./scene.js";

const sig = (m, l) => `${l.phase}|${l.module}|${l.label}`;
const full = (m, l) => `${sig(m, l)}|${leafSub(m, l)}`;

// Ops only full mode records (the other modes record none): the backward's kernels and
// optimizer.step()'s ops, each phase by itself.
const FULL_ONLY = ["backward", "optimizer"];
const phaseOp = (phase) => (l) => l.kind === "op" && l.phase === phase;

function count(m, key, skip) {
  const c = new Map();
  for (const l of m.leaves) { if (skip(l)) continue; const k = key(m, l); c.set(k, (c.get(k) || 0) + 1); }
  return c;
}

// ``model`` against ``other`` (buildModel's both), in two passes so that neither the order of
// the leaves nor the direction of the diff decides what matches: first each leaf of ``model``
// whose full signature ``other`` has (as many times) is the same; then each leaf left whose
// signature ``other`` has left (no exact match took it) is "changed"; the rest are "added".
// What of ``other`` no leaf took is "removed" (a count) -- so ``other`` against ``model``
// counts added / changed / removed as this one counts removed / changed / added.
// A graph recorded in full mode has backward and optimizer.step() ops, one in another mode
// none: where only one of the two has a phase's ops, they are left out of the diff (unmarked,
// not counted; ``skipped`` says how many, by phase) rather than all "added" or "removed".
// {marks: Map leaf key -> "added" | "changed" (the same are absent), added, changed, removed,
//  skipped: {phase: ops left out of both graphs}}
export function diffGraphs(model, other) {
  const apart = FULL_ONLY.filter((p) => model.leaves.some(phaseOp(p)) !== other.leaves.some(phaseOp(p)));
  const skip = (l) => l.kind === "op" && apart.includes(l.phase);
  const of = count(other, full, skip), os = count(other, sig, skip);
  const marks = new Map();
  let added = 0, changed = 0;
  const skipped = {};
  const rest = [];
  for (const l of model.leaves) { // pass 1: the exact matches
    if (skip(l)) { skipped[l.phase] = (skipped[l.phase] || 0) + 1; continue; }
    const f = full(model, l);
    if (of.get(f) > 0) { of.set(f, of.get(f) - 1); const s = sig(model, l); os.set(s, os.get(s) - 1); } else rest.push(l);
  }
  for (const l of rest) { // pass 2: the signatures left
    const s = sig(model, l);
    if (os.get(s) > 0) { os.set(s, os.get(s) - 1); marks.set(l.key, "changed"); changed++; } else { marks.set(l.key, "added"); added++; }
  }
  const removed = [...os.values()].reduce((a, b) => a + Math.max(b, 0), 0);
  for (const l of other.leaves) if (skip(l)) skipped[l.phase] = (skipped[l.phase] || 0) + 1;
  return { marks, added, changed, removed, skipped };
}
