// The node details panel: everything the capture recorded about one op, grad_fn node or
// module group, in PyTorch's words.  Text only (h() never parses markup).
import { h, clear, fmtBytes, fmtNum, fmtUs, shape, moduleTyped, wrappable } from "../dom.js";
import { leafWhere } from "./scene.js";
import { savedActivations, groupTotals, groupLeaves } from "./model.js";

// An op record's flags (capture/schema.py OpRecord.flags) in words.
const FLAGS = {
  nan: "NaN or ±Inf in an output (an attention mask of -inf is one on purpose)",
  outside_model: "ran outside the model's forward",
  inplace: "in-place",
  inplace_saved: "in-place write to a tensor a grad_fn saved for backward (P8)",
  non_differentiable: "output cannot carry a gradient (integer / bool)",
  autocast: "ran under autocast",
  autocast_cast: "a dtype cast autocast inserted",
  breaks_graph: "the graph is cut here: a value taken out of it (.item(), .numpy(), .tolist(), .detach(), .data, torch.tensor(t))",
  new_leaf: "a new leaf enters the graph from outside",
  copy_h2d: "host → device copy",
};

const GRAD_WORDS = { norm: "‖grad‖", max_abs: "max |grad|", mean: "mean", std: "std", zero_frac: "share of zeros",
  nan: "NaN count", inf: "Inf count" };

function row(k, v, title) { return h("tr", {}, h("th", { title }, k), h("td", { title }, v ?? "–")); }

// A saved attribute's value as Python prints it: a tuple (1, 1) or (1,), True, inf, 1e-05
// (NodeRecord.attrs holds tuples as lists, numbers and bools as JSON has them).
function pyValue(v) {
  if (Array.isArray(v)) return `(${v.map(pyValue).join(", ")}${v.length === 1 ? "," : ""})`;
  if (typeof v === "boolean") return v ? "True" : "False";
  if (typeof v !== "number") return String(v);
  if (!Number.isFinite(v)) return Number.isNaN(v) ? "nan" : v > 0 ? "inf" : "-inf";
  const a = Math.abs(v); // Python's repr goes exponential below 1e-4 and from 1e16, with two exponent digits
  return a && (a < 1e-4 || a >= 1e16) ? v.toExponential().replace(/e([+-])(\d)$/, "e$10$2") : String(v);
}
const ATTRS_TITLE = "What this node saved for backward besides tensors (its _saved_* fields, as torchviz's show_attrs " +
  "lists them): a convolution's stride and padding, a reduction's dim, a view's sizes.";

// An op record's kind, by its phase (OpRecord.phase): full mode records the backward's aten
// kernels and the optimizer's ops too, and "forward op #14 · backward" read as a contradiction.
const OP_KINDS = { forward: "forward op", backward: "aten op run by backward()", optimizer: "optimizer op (optimizer.step())",
  other: "op outside the forward, backward and optimizer step" };
export function opKind(r) { return OP_KINDS[r.phase || "forward"] || `${r.phase} op`; }

// "1.25 KiB of it net.4.weight, a parameter" / "2.50 KiB of it parameters (a.weight, b.weight)"
function paramPart(params) {
  const names = [...params.keys()], bytes = [...params.values()].reduce((a, b) => a + b, 0);
  return names.length === 1 ? `${fmtBytes(bytes)} of it ${names[0]}, a parameter` : `${fmtBytes(bytes)} of it parameters (${names.join(", ")})`;
}

const SAVED_GROUP = "The activations this module's grad_fn nodes hold saved for backward: each storage counted once (an " +
  "activation saved by two nodes, a ReLU's output by ReluBackward0 and by the next AddmmBackward0, is one tensor), " +
  "parameters left out (the weight.t() an AddmmBackward0 saves is the parameter's own memory, no extra bytes) -- " +
  "what the Memory view's \"saved activations\" counts for the whole step.";

function tensorTable(model, ids, title) {
  if (!ids || !ids.length) return null;
  const firstOfStorage = new Map();
  for (const t of model.ev.tensors || []) if (t.storage !== undefined && !firstOfStorage.has(t.storage)) firstOfStorage.set(t.storage, t.id);
  const rows = ids.map((id) => {
    const t = model.tensors.get(id) || { id };
    const base = firstOfStorage.get(t.storage);
    const view = base !== undefined && base !== t.id ? `view of storage #${t.storage} (tensor ${base}), offset ${t.offset ?? 0}` : t.storage !== undefined ? `storage #${t.storage}` : "–";
    return h("tr", { class: "tensor" },
      h("td", {}, String(t.id)), h("td", { class: "shape" }, shape(t.shape)), h("td", {}, t.dtype || "–"),
      h("td", {}, shape(t.stride)), h("td", { class: "storage" }, view, t.param ? h("div", { class: "param" }, "parameter ", wrappable(t.param)) : null));
  });
  return h("div", {}, h("h4", {}, title),
    h("table", { class: "tensors" }, h("tr", {}, ...["id", "shape", "dtype", "stride", "storage"].map((x) => h("th", {}, x))), rows));
}

// Where a leaf ran: "(outside the model)" for the loop's loss, not "(root)"; a module with its
// type, as the heat map and the memory view name it ("3 (Linear)", not "3": QA 42b)
function leafModule(model, l, ctx) {
  const own = l.module && !l.module.startsWith("(");
  return own ? moduleTyped(l.module, ctx.moduleType?.get(l.module)) : leafWhere(model, l);
}

// The details panel's head in one line, for a screen reader to say as a node is selected:
// "aten::embedding, forward op #0, emb (Embedding), [4, 32, 128]" (its first output's shape),
// "AddmmBackward0, grad_fn node #3, fc1 (Linear)", "encoder, module group, forward".
export function nodeSummary(model, key, ctx) {
  if (!model || !key) return "";
  if (key.startsWith("g:")) {
    const G = model.groups[model.gIndex.get(key.slice(2))];
    return G ? `${G.path}, module group, ${G.phase}` : "";
  }
  const l = model.byKey.get(key);
  if (!l) return "";
  const r = l.rec, out = l.kind === "op" && r.outputs?.length ? model.tensors.get(r.outputs[0]) : null;
  return [r.name, l.kind === "op" ? `${opKind(r)} #${r.id}` : `grad_fn node #${r.id}`, leafModule(model, l, ctx),
    out?.shape ? shape(out.shape) : null].filter(Boolean).join(", ");
}

export function renderDetails(panel, model, key, ctx) {
  clear(panel);
  if (!key) { panel.append(h("p", { class: "muted" }, "Click a node to see its details. Double-click a module to expand it.")); return; }
  if (key.startsWith("g:")) return groupDetails(panel, model, key, ctx);
  const l = model.byKey.get(key);
  if (!l) { panel.append(h("p", { class: "muted" }, `Node ${key} is not in this step's graph.`)); return; }
  const r = l.rec;
  const link = (k, text) => h("a", { href: "#", class: "nodelink", onclick: (e) => { e.preventDefault(); ctx.select(k); } }, ...wrappable(text));
  panel.append(h("h3", { class: "details-title" }, ...wrappable(r.name)),
    h("div", { class: "muted", "data-testid": "details-kind" }, l.kind === "op" ? `${opKind(r)} #${r.id}` : `grad_fn node #${r.id}`));
  const t = h("table", { class: "kv" });
  t.append(row("module", leafModule(model, l, ctx)));
  if (l.kind === "op") {
    t.append(row("call", r.call), row("micro-batch", r.micro), row("grad mode", r.grad_mode === undefined ? "–" : String(r.grad_mode)),
      row("in-place", r.inplace ? "yes" : "no"), row("duration", fmtUs(r.dur_us)), row("allocated", fmtBytes(r.alloc)),
      row("freed", fmtBytes(r.free)), row("live after", fmtBytes(r.live)), row("source", r.src));
    if (r.flags && r.flags.length) t.append(row("flags", r.flags.map((f) => FLAGS[f] || f).join("; ")));
    // the grad_fn node(s) this op created: the capture links node -> op (NodeRecord.op) only
    const made = model.leaves.filter((x) => x.kind === "node" && x.rec.op === r.id);
    if (made.length) t.append(h("tr", {}, h("th", {}, "grad_fn"), h("td", {}, ...made.map((x, i) => [i ? ", " : "", link(x.key, x.label)]).flat())));
    panel.append(...[t, tensorTable(model, r.inputs, "inputs"), tensorTable(model, r.outputs, "outputs")].filter(Boolean));
  } else {
    if (r.param) {
      // the parameter's shape and dtype (the session event's list; its .grad has the same),
      // beside the gradient's statistics below
      const p = (ctx.params || []).find((x) => x.name === r.param);
      t.append(row("parameter", r.param), row("shape", shape(p?.shape)), row("dtype", p?.dtype));
    }
    if (r.op !== undefined && model.byKey.has("o" + r.op)) t.append(h("tr", {}, h("th", {}, "created by"), h("td", {}, link("o" + r.op, model.byKey.get("o" + r.op).label))));
    // what of it is a parameter's storage (a weight.t() saved): no extra memory, and said so
    const sv = savedActivations(model, [r]);
    const savedText = r.saved_bytes === undefined ? undefined
      : sv.params.size ? `${fmtBytes(r.saved_bytes)} (${paramPart(sv.params)}: not extra memory)` : fmtBytes(r.saved_bytes);
    t.append(row("backward order", r.order), row("duration", fmtUs(r.dur_us)), row("saved bytes", savedText));
    if (r.higher_order) t.append(row("higher-order", "built by a create_graph=True backward / autograd.grad"));
    if (r.autocast_cast) t.append(row("autocast", "a dtype cast autocast inserted (its backward casts the gradient back)"));
    if (r.checkpointed) t.append(row("checkpoint", "under torch.utils.checkpoint: what it needs for backward is recomputed there (its forward op runs again inside the backward)"));
    if (r.made_nonfinite) t.append(row("NaN / Inf", "made here: a finite gradient came in, NaN or ±Inf went out (P4)"));
    panel.append(t);
    const attrs = r.attrs && typeof r.attrs === "object" ? Object.entries(r.attrs) : [];
    if (attrs.length) {
      panel.append(h("h4", { title: ATTRS_TITLE }, "attributes (saved for backward)"),
        h("table", { class: "kv attrs", "data-testid": "node-attrs" }, attrs.map(([k, v]) => row(k, pyValue(v)))));
    }
    if (r.saved && r.saved.length) {
      panel.append(h("h4", {}, "saved tensors"), h("table", { class: "tensors" },
        h("tr", {}, h("th", {}, "name"), h("th", {}, "shape"), h("th", {}, "dtype"), h("th", {}, "bytes")),
        r.saved.map((s) => {
          const p = model.paramStorage?.get(s.storage);
          return h("tr", {}, h("td", {}, s.name, p ? h("div", { class: "param" }, "parameter ", wrappable(p)) : null), h("td", { class: "shape" }, shape(s.shape)),
            h("td", {}, s.dtype), h("td", {}, fmtBytes(s.nbytes)));
        })));
    }
    if (r.param && ctx.gradStats) {
      const gs = ctx.gradStats(r.param);
      if (gs) {
        const g = h("table", { class: "kv" });
        // in the Loss & gradients view's words, not the event's keys (QA 45c: "max_abs, zero_frac")
        for (const [k, v] of Object.entries(gs)) g.append(row(GRAD_WORDS[k] || k, typeof v === "number" ? fmtNum(v) : String(v)));
        panel.append(h("h4", {}, "gradient (.grad) at this step"), g);
      }
    }
    const succ = []; // next_functions
    for (const [from, to] of model.ev.edges || []) if ("n" + from === key && model.byKey.has("n" + to)) succ.push("n" + to);
    if (succ.length) panel.append(h("h4", {}, "next_functions"), h("ul", { class: "links" }, succ.map((k) => h("li", {}, link(k, model.byKey.get(k).label)))));
  }
  // what the highlight cannot say by itself: that the path ends short of the loss
  const note = h("p", { class: "path-note", "data-testid": "path-note", hidden: true });
  const path = () => { const t = ctx.togglePath(key) || ""; note.textContent = t; note.hidden = !t; };
  panel.append(h("div", { class: "actions" }, h("button", { onclick: path, "data-testid": "path-to-loss" }, "Path to loss")), note);
}

// A module's parameters as PyTorch counts them (sum(p.numel() for p in m.parameters())), then
// the tensors by name, relative to the module, with their shapes: "448 (weight [16, 3, 3, 3],
// bias [16])".  The count of tensors alone ("2") read as the parameter count.  A module with
// many tensors lists its first few (the tooltip has them all).  [text, tooltip]
const LISTED = 4;
function paramSummary(params, path) {
  const numel = (p) => p.numel ?? (Array.isArray(p.shape) ? p.shape.reduce((a, b) => a * b, 1) : undefined);
  const counts = params.map(numel);
  const known = counts.every((c) => typeof c === "number");
  const total = known ? counts.reduce((a, b) => a + b, 0) : undefined;
  const tensors = params.map((p) => `${path && p.name.startsWith(path + ".") ? p.name.slice(path.length + 1) : p.name} ${shape(p.shape)}`);
  const more = tensors.length - LISTED;
  const list = more > 1 ? `${tensors.slice(0, LISTED).join(", ")}, … ${more} more tensors` : tensors.join(", ");
  const n = tensors.length, head = total !== undefined ? total.toLocaleString("en-US") : `${n} tensor${n === 1 ? "" : "s"}`;
  const title = `${total !== undefined ? `${head} parameters (the sum of p.numel()) in ` : ""}${n} tensor${n === 1 ? "" : "s"}:\n${tensors.join("\n")}`;
  return [`${head} (${list})`, title];
}

function groupDetails(panel, model, key, ctx) {
  const g = model.gIndex.get(key.slice(2));
  const G = model.groups[g];
  const tot = groupTotals(model, groupLeaves(model, g));
  const mtype = ctx.moduleType?.get(G.path);
  panel.append(h("h3", { class: "details-title" }, G.path), h("div", { class: "muted" }, `module group · ${G.phase}`));
  const t = h("table", { class: "kv" });
  const back = G.phase === "backward";
  const timeTitle = tot.timedBy === "nodes" && tot.ops
    ? "the grad_fn nodes' durations: each holds the aten kernels it ran (the backward kernels row), not added again"
    : tot.timedBy === "nodes" ? "the grad_fn nodes' durations" : tot.timedBy === "ops" ? "the ops' durations" : undefined;
  const described = ctx.moduleRepr?.get(G.path);
  t.append(row("module type", mtype));
  if (described) t.append(row("module", wrappable(`${mtype || ""}(${described})`), "what print(model) shows: the module's extra_repr()"));
  // a backward group in full mode holds grad_fn nodes and the aten kernels they ran: counted apart
  if (back) {
    t.append(row("grad_fn nodes", tot.nodes));
    if (tot.ops) t.append(row("backward kernels (aten ops)", tot.ops, "aten ops the grad_fn nodes ran (full mode records them)"));
  } else t.append(row("ops", tot.ops));
  // a backward group holds no kernels outside full mode: what they allocated is not known, not 0 B (QA 42b)
  t.append(row("time", fmtUs(tot.time), timeTitle),
    row("allocated", back && !tot.ops ? "not recorded (full mode records the backward's ops)" : fmtBytes(tot.alloc)));
  // a module's saved activations are its grad_fn nodes' (the backward group's); a forward
  // group's ops carry none of their own, so 0 B there would be wrong (nor a group of backward
  // kernels alone: no grad_fn node of it saved anything)
  if (back && tot.nodes) {
    const left = [...tot.savedParams.values()].reduce((a, b) => a + b, 0);
    const text = left ? `${fmtBytes(tot.saved)} (left out: ${fmtBytes(left)} of parameters it saves, not extra memory)` : fmtBytes(tot.saved);
    t.append(row("saved for backward (activations)", text, SAVED_GROUP));
  }
  const params = (ctx.params || []).filter((p) => p.module === G.path || (p.module || "").startsWith(G.path + "."));
  if (params.length) { const [text, title] = paramSummary(params, G.path); t.append(row("parameters", text, title)); }
  panel.append(t, h("div", { class: "actions" },
    h("button", { onclick: () => ctx.toggleGroup(g), "data-testid": "toggle-group" }, ctx.isExpanded(g) ? "Collapse" : "Expand")));
}
