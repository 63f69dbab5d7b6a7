// The one way the dashboard builds DOM: data always goes in as text (textContent), never
// as markup, so a module named "<script>" renders as those characters.
// A name or repr that may wrap after its dots, underscores and "=" (a <wbr> after each), never
// inside a word: "conv2.weig ht", "track_running_stats=Tr ue" in a narrow panel (QA 45c).
export function wrappable(text) {
  // after . _ = and between a lower-case letter (or digit) and a capital: a grad_fn class
  // ("ScaledDotProductFlashAttentionForCpuBackward0") broke mid-word, "Backw / ard0" (QA 50b)
  return String(text).split(/(?<=[._=])|(?<=[a-z0-9])(?=[A-Z])/).flatMap((part, i) => (i ? [document.createElement("wbr"), part] : [part]));
}

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function fmtBytes(n) {
  if (n === undefined || n === null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let x = Math.abs(n);
  while (x >= 1024 && i < u.length - 1) { x /= 1024; i++; }
  return `${n < 0 ? "-" : ""}${x.toFixed(i ? (x < 10 ? 2 : 1) : 0)} ${u[i]}`;
}

export function fmtNum(x) {
  if (x === undefined || x === null) return "–";
  if (typeof x !== "number") return String(x);
  if (!Number.isFinite(x)) return String(x);
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : x.toPrecision(4);
}

// One format for a column of numbers, read down the column: four significant digits, plain
// ("0.1234", "12.50") while every value is between 1e-3 and 1e4, else every one with an
// exponent ("6.675e-4", "1.159e-3"); fmtNum's per-value choice put "6.67e-4" above "0.001159".
export function columnFormat(values) {
  const plain = values.every((x) => typeof x !== "number" || !Number.isFinite(x) || x === 0 || (Math.abs(x) >= 1e-3 && Math.abs(x) < 1e4));
  return (x) => {
    if (typeof x !== "number" || !Number.isFinite(x) || x === 0) return fmtNum(x);
    return plain ? x.toPrecision(4) : x.toExponential(3);
  };
}

// A value a reader compares at a glance (a colour scale's ends): 3 significant digits, no
// trailing zeros ("2.12", "36.6", "0.099"), an exponent for the very large or small.
export function fmtShort(x) {
  if (typeof x !== "number" || !Number.isFinite(x) || x === 0) return fmtNum(x);
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : String(+x.toPrecision(3));
}

// Two significant digits under 10 µs: most views and reshapes take well under a microsecond,
// and "0 µs" for a measured 0.47 µs read as the time overlay's zero (an op not timed at all).
export function fmtUs(us) {
  if (us === undefined || us === null) return "–";
  if (us > 0 && us < 10) return `${+us.toPrecision(2)} µs`;
  return us >= 1e6 ? `${(us / 1e6).toFixed(2)} s` : us >= 1e3 ? `${(us / 1e3).toFixed(1)} ms` : `${us.toFixed(0)} µs`;
}

// A module path as the views name it: "(root)" for the model itself, and a numbered child of
// an nn.Sequential / nn.ModuleList ("0", "layers.3") with its type ("0 (Conv2d)"): an index
// alone says nothing of what the module is.
export function moduleLabel(path, type) {
  if (!path) return "(root)";
  return type && /(^|\.)\d+$/.test(path) ? `${path} (${type})` : path;
}

// A module path with its type wherever the type is known ("inp (Linear)", "net.0 (Linear)"):
// the gradients heat map's rows, where "net.0 (Linear)" beside a bare "emb" read as if only
// numbered modules had a type.  "(root)" for the model itself.
export function moduleTyped(path, type) {
  if (!path) return "(root)";
  return type ? `${path} (${type})` : path;
}

// Where an op ran, as the views name it: an op the capture flagged outside_model (the loss a
// training loop computes after the forward) ran in no module, "(outside the model)"; "(root)"
// is the top-level module's own forward, and the two read alike.
export const OUTSIDE_MODEL = "(outside the model)";
// ... and a backward op in no module (each AccumulateGrad's detach, the loss's backward
// kernels): the Graph view's backward group of them, whose name the other views use too (QA
// 41a: the memory view read "(outside the model)" or "(root)" where the graph read this)
export const OUTSIDE_MODULES = "(outside modules)";
// ... and full mode's ops of optimizer.step(): a group of their own after the forward's
export const OPTIMIZER_STEP = "(optimizer.step())";
export function opWhere(op, types) {
  if (!op.module && op.phase === "backward") return OUTSIDE_MODULES;
  if (!op.module && op.phase === "optimizer") return OPTIMIZER_STEP;
  if (!op.module && (op.flags || []).includes("outside_model")) return OUTSIDE_MODEL;
  return moduleLabel(op.module, types?.get(op.module));
}

export function fmtTime(t) {
  return t ? new Date(t * 1000).toLocaleString() : "–";
}

export function shape(s) {
  return Array.isArray(s) ? `[${s.join(", ")}]` : "–";
}

// A refresh while a run streams: at most one call every `ms`, the first `ms` after an event
// and then again while events keep coming. Never a debounce (a timer reset by every event):
// a run that steps faster than `ms` would then never refresh the view at all.
// A refresh that finds the server gone (ApiError status 0: the header already shows
// "disconnected", and the live channel refreshes again once it is back) or refusing the page's
// token (401: the header says so) is not an error of the page; anything else still is.
export function coalesce(fn, ms) {
  let timer = null;
  return (...args) => {
    if (timer !== null) return;
    timer = setTimeout(() => {
      timer = null;
      Promise.resolve(fn(...args)).catch((e) => { if (e?.status !== 0 && e?.status !== 401) throw e; });
    }, ms);
  };
}

// Show a spinner only for things that take longer than 200 ms (issue 6).
export async function withLoading(el, promise, label = "Loading…") {
  const timer = setTimeout(() => el.classList.add("loading"), 200);
  el.dataset.loadingLabel = label;
  try { return await promise; } finally { clearTimeout(timer); el.classList.remove("loading"); }
}

// Labels for the decades 10^lo..10^hi, one format for all of them: plain ("0.01 / 0.1 / 1 /
// 10 / 1000") while every one is short, else all as powers of ten ("1e-2 / 1e0 / 1e2 / 1e4");
// formatted each on its own, an axis read "1e+8, 1e+6, 10000, 100, 1", and "1000, 1e4".
export function decadeFormat(lo, hi, plainFrom = -3, plainTo = 4) {
  const plain = lo >= plainFrom && hi <= plainTo;
  return (k) => { const e = Math.round(k); return plain ? String(+(10 ** e).toPrecision(1)) : `1e${e}`; };
}
