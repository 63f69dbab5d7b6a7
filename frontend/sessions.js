// Sessions page (/): every run on this server, filtered and sorted, import by drag-and-drop
// or file picker, rename, tag, delete, download, compare two.  Refreshes on live events.
import { h, clear, fmtTime, coalesce } from "./dom.js";
import { api, sessionPath, live, showConnection } from "./api.js";
import { initTheme } from "./theme.js";

const body = document.getElementById("sessions");
const note = document.getElementById("note");
const filter = document.getElementById("filter");
const shown = document.getElementById("shown");
const compareBtn = document.getElementById("compare");

// Each sortable column: the key a row sorts by, and the order of a first click (counts and the
// start time most / newest first, words from A).  Unsorted, the list is the server's: newest
// added first.  Ties keep that order (the sort is stable).
const ranksOf = (s) => (Array.isArray(s.ranks) ? s.ranks.length : s.ranks ?? 1);
// The capture mode (watch(mode=...)), in the order of what it records: light < default < full.
const MODES = {
  light: "light: step facts only (loss, gradients, memory, timings), no graph",
  default: "default: step facts every step, the graph of step 0 and of sampled steps",
  full: "full: the graph of every step, the backward's ops too",
};
const modeRank = (s) => { const i = Object.keys(MODES).indexOf(s.mode); return i < 0 ? -1 : i; };
const SORTS = {
  name: [(s) => (s.name || s.id).toLowerCase(), "asc"],
  status: [(s) => s.status || "", "asc"],
  started: [(s) => s.started_at ?? -Infinity, "desc"],
  steps: [(s) => s.steps ?? 0, "desc"],
  ranks: [ranksOf, "desc"],
  mode: [modeRank, "asc"],
  doctor: [(s) => (s.errors || 0) * 1e9 + (s.warnings || 0), "desc"], // errors first, then warnings
};

// The filter and the sort live in the URL (?q=&sort=&dir=): a reload or a shared link keeps them.
const params = new URLSearchParams(location.search);
const view = { sort: SORTS[params.get("sort")] ? params.get("sort") : null, dir: params.get("dir") === "asc" ? "asc" : "desc" };
filter.value = params.get("q") || "";
const COLUMNS = 9; // name, status, started, steps, ranks, doctor, mode, tags, actions
let sessions = null; // the last list the server sent; the filter and the sort apply to it
// The runs ticked for comparison, in the order ticked (the first is run A): up to MAX_COMPARE
// (the Compare page's runs A to H); one more is refused and said.  Kept across refreshes while
// the sessions are still listed.
const MAX_COMPARE = 8;
let picked = [];

// The note says what the user's last action did (an import, a refused rename) and stays
// until the next action; a failed list refresh says so too, and is cleared by the next
// refresh that works, which leaves the user's message alone.
let listFailed = false;
function say(msg, error = false, ...extra) {
  clear(note).append(msg, ...extra);
  note.className = `notice ${error ? "error" : ""}`;
  note.hidden = !msg;
  listFailed = false;
}

async function refresh() {
  let list;
  try { list = await api("/api/sessions"); } catch (e) { say(e.message, true); listFailed = true; return; }
  if (listFailed) say("");
  sessions = list;
  picked = picked.filter((id) => list.some((s) => s.id === id));
  render();
}

// The line that sends a run to this page's server: watch(model) alone goes to
// $TORCHSCOPE_SERVER or 127.0.0.1:6150 (starting a second server there), so a server anywhere
// else names itself (QA 50b: "Add torchscope.watch(model)" on port 6712 never reached the page).
const DEFAULT_ORIGINS = new Set(["http://127.0.0.1:6150", "http://localhost:6150"]);
function watchCall() {
  const here = location.origin;
  return DEFAULT_ORIGINS.has(here) ? "torchscope.watch(model)"
    : `torchscope.watch(model, server="${here}") (or set TORCHSCOPE_SERVER=${here})`;
}

// The list's rows by session id, kept from one render to the next: a live run's refresh (a few a
// second while it streams) updates the cells whose values changed and leaves the row, its
// buttons and its tick box in place (QA 52a: every row was rebuilt at each refresh, so a row's
// button under the pointer or the keyboard focus was replaced, and a scripted click on a live
// row's Delete timed out on "element was detached").
const rowsById = new Map(); // id -> { tr, s, cells: [td, ...], keys: [string, ...], box }

function render() {
  showPicked();
  // every word somewhere in the row's name, id, status, mode, model or tags, in any case
  const words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
  const rows = sessions.filter((s) => { const text = [s.name, s.id, s.status, s.mode, s.model, ...(s.tags || [])].join("\n").toLowerCase(); return words.every((w) => text.includes(w)); });
  if (view.sort) {
    const [key] = SORTS[view.sort], sign = view.dir === "asc" ? 1 : -1;
    const cmp = (a, b) => (typeof a === "string" ? a.localeCompare(b, undefined, { numeric: true }) : a - b);
    rows.sort((a, b) => sign * cmp(key(a), key(b)));
  }
  // the rows shown, updated in place; the others (deleted, filtered out) leave the table
  const shownRows = rows.map(upsertRow);
  const keep = new Set(shownRows);
  for (const [id, r] of rowsById) if (!keep.has(r.tr)) { r.tr.remove(); rowsById.delete(id); }
  for (const tr of [...body.children]) if (!keep.has(tr)) tr.remove(); // "no sessions", "no match"
  // in the order wanted, moving a row only when it is out of place (a move drops its focus)
  let at = body.firstElementChild;
  for (const tr of shownRows) {
    if (tr === at) at = at.nextElementSibling;
    else body.insertBefore(tr, at);
  }
  if (!sessions.length) {
    shown.textContent = "";
    body.append(h("tr", {}, h("td", { colspan: COLUMNS, class: "muted", id: "empty" }, `No sessions yet. Add ${watchCall()} to a training script, run \`torchscope demo\`, or drop a .tscope file here.`)));
    return;
  }
  shown.textContent = words.length ? `${rows.length} of ${sessions.length} sessions` : `${sessions.length} session${sessions.length > 1 ? "s" : ""}`;
  if (!rows.length) body.append(h("tr", {}, h("td", { colspan: COLUMNS, class: "muted", id: "no-match" }, `No session matches "${filter.value.trim()}".`)));
}

// A column header's click sorts by it; a second click reverses the order.
function initListTools() {
  // the whole header cell sorts, not its text alone (a wide column's centre missed the
  // button); the button inside stays for the keyboard, and its click reaches the cell
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      view.dir = view.sort === key ? (view.dir === "asc" ? "desc" : "asc") : SORTS[key][1];
      view.sort = key;
      changed();
    });
  }
  filter.addEventListener("input", changed);
  compareBtn?.addEventListener("click", openCompare);
  showSort();
}

function changed() {
  const q = new URLSearchParams();
  if (filter.value) q.set("q", filter.value);
  if (view.sort) { q.set("sort", view.sort); q.set("dir", view.dir); }
  history.replaceState(null, "", `${location.pathname}${String(q) ? `?${q}` : ""}`);
  showSort();
  if (sessions) render();
}

function showSort() {
  for (const th of document.querySelectorAll("th[data-sort]")) {
    if (th.dataset.sort === view.sort) th.setAttribute("aria-sort", view.dir === "asc" ? "ascending" : "descending");
    else th.removeAttribute("aria-sort");
  }
}

// A row's cells but its actions: each the values it shows (compared as text: a cell is redrawn
// only when they changed) and how it draws them.
const CELLS = [
  { key: (s) => [s.name || s.id, s.model || ""], attrs: { class: "session-name" },
    fill: (s) => [h("a", { href: `/sessions/${encodeURIComponent(s.id)}`, class: "session-link", id: `session-name-${s.id}` }, s.name || s.id),
      h("div", { class: "muted small" }, s.model || "")] },
  { key: (s) => [s.status], fill: (s) => [h("span", { class: `badge status-${(s.status || "").replace(/ /g, "-")}` }, s.status)] },
  { key: (s) => [s.started_at], fill: (s) => [fmtTime(s.started_at)] },
  { key: (s) => [s.steps ?? 0], attrs: { class: "num" }, fill: (s) => [String(s.steps ?? 0)] },
  { key: (s) => [ranksOf(s)], attrs: { class: "num" }, fill: (s) => [String(ranksOf(s))] },
  { key: (s) => [s.errors, s.warnings, s.status, s.diagnosed], attrs: { "data-testid": "doctor-cell" },
    fill: (s) => [s.errors ? h("span", { class: "badge err", title: "doctor errors" }, `${s.errors} error${s.errors > 1 ? "s" : ""}`) : null,
      s.warnings ? h("span", { class: "badge warn" }, `${s.warnings} warning${s.warnings > 1 ? "s" : ""}`) : null,
      s.errors || s.warnings ? null : doctorVerdict(s)] },
  { key: (s) => [s.mode], attrs: { class: "mode", "data-testid": "mode-cell" },
    fill: (s, td) => { td.title = MODES[s.mode] || ""; return [s.mode || "–"]; } },
  { key: (s) => s.tags || [], fill: (s) => [h("span", { class: "tags" }, (s.tags || []).map((t) => h("span", { class: "tag", title: t }, t)))] },
];

// A session's row: the one already shown, its changed cells redrawn, else a new one.  The row's
// controls act on its latest values (r.s), so they are made once.
function upsertRow(s) {
  let r = rowsById.get(s.id);
  if (!r) {
    // the run each row's control acts on, said with it ("Delete, button, live200"): a screen
    // reader's "Delete" alone said not which (QA 50b); a description, the buttons' names kept
    const who = `session-name-${s.id}`;
    const box = h("input", { type: "checkbox", "data-testid": "compare-pick", "aria-describedby": who, onchange: (e) => pick(s.id, e.target.checked) });
    r = { s, cells: CELLS.map((c) => h("td", c.attrs || {})), keys: CELLS.map(() => null), box };
    r.tr = h("tr", { "data-id": s.id }, r.cells,
      h("td", { class: "row-actions" },
        h("label", { class: "compare-pick", title: `tick two to ${MAX_COMPARE} runs, then "Compare" above the list` }, box, "compare"),
        h("button", { title: "rename", "aria-describedby": who, onclick: () => rename(r.s) }, "Rename"),
        h("button", { title: "tags, comma separated", "aria-describedby": who, onclick: () => tag(r.s) }, "Tag"),
        h("button", { title: "download the .tscope file", "aria-describedby": who, onclick: () => download(r.s) }, "Download"),
        h("button", { class: "danger", title: "delete", "aria-describedby": who, onclick: () => remove(r.s) }, "Delete")));
    rowsById.set(s.id, r);
  }
  r.s = s;
  CELLS.forEach((c, i) => {
    const key = JSON.stringify(c.key(s));
    if (key === r.keys[i]) return;
    r.keys[i] = key;
    const td = r.cells[i];
    clear(td).append(...c.fill(s, td).filter((x) => x !== null && x !== undefined));
  });
  r.box.checked = picked.includes(s.id);
  return r.tr;
}

// The doctor cell of a run without errors or warnings: a clean run says so, not a blank cell
// (the list counts errors and warnings only: notes are on the session's Doctor tab).  A verdict
// only where the doctor looked: a running one it has looked at may still get some ("none so
// far"), one it has not looked at is no verdict -- running, it reads "not checked yet" (QA 51c:
// "none so far" read as checked and clean while the run had gone NaN), just imported or ended,
// "checking…" (its diagnosis is queued).
const DOCTOR_TITLE = "the doctor's errors and warnings (notes: on the session's Doctor tab)";
function doctorVerdict(s) {
  const running = s.status === "running", looked = s.diagnosed !== false;
  const [text, title] = running && !looked ? ["not checked yet", "the doctor has not looked at this run yet: its Doctor tab checks it now"]
    : running ? ["none so far", `${DOCTOR_TITLE}, as of the doctor's last look at this running run`]
      : !looked ? ["checking…", "the doctor is looking at this run"] : ["no errors or warnings", DOCTOR_TITLE];
  return h("span", { class: `muted small verdict${looked ? "" : " unchecked"}`, title }, text);
}

// A tick of a row's "compare" box.  A sweep's runs are compared side by side, up to
// MAX_COMPARE (QA 51c: a third tick silently dropped the first); one more is unticked and said.
function pick(id, on) {
  picked = picked.filter((x) => x !== id);
  if (on && picked.length >= MAX_COMPARE) say(`At most ${MAX_COMPARE} runs can be compared at once: untick one first.`, true);
  else if (on) picked.push(id);
  for (const box of body.querySelectorAll("input[data-testid=compare-pick]")) box.checked = picked.includes(box.closest("tr").dataset.id);
  showPicked();
}

// The "Compare" button: enabled with two to MAX_COMPARE runs ticked; two open /compare?a=&b=,
// more /compare?runs=a,b,... (URLSearchParams: an id may hold a "+")
function showPicked() {
  if (!compareBtn) return;
  compareBtn.disabled = picked.length < 2;
  compareBtn.textContent = picked.length >= 2 ? `Compare the ${picked.length} ticked runs` : `Compare runs (tick ${2 - picked.length} more)`;
}

function openCompare() {
  if (picked.length < 2) return;
  const query = picked.length === 2 ? { a: picked[0], b: picked[1] } : { runs: picked.join(",") };
  location.href = `/compare?${new URLSearchParams(query)}`;
}

async function rename(s) {
  const name = prompt("New name", s.name || "");
  if (name === null) return;
  await patch(s, { name }, "rename");
}

async function tag(s) {
  const v = prompt("Tags (comma separated)", (s.tags || []).join(", "));
  if (v === null) return;
  const tags = v.split(",").map((t) => t.trim()).filter(Boolean);
  await patch(s, { tags }, "tag");
}

// A rename or retag; a refusal is said in words ("Could not rename "x": name: ...").
async function patch(s, body, verb) {
  // done: the note of an earlier refusal goes (QA 48d: it stayed up over the next rename, which worked)
  await api(sessionPath(s.id), { method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })
    .then(() => { if (note.classList.contains("error")) say(""); },
      (e) => say(`Could not ${verb} "${s.name || s.id}": ${e.detail}`, true));
  refresh();
}

async function remove(s) {
  if (!confirm(`Delete session "${s.name || s.id}"? This cannot be undone.`)) return;
  await api(sessionPath(s.id), { method: "DELETE" }).catch((e) => say(`Could not delete "${s.name || s.id}": ${e.detail}`, true));
  refresh();
}

// Fetch (so the token header goes along) and save as a file.
async function download(s) {
  try {
    const resp = await api(`${sessionPath(s.id)}/export`);
    const blob = await resp.blob();
    const a = h("a", { href: URL.createObjectURL(blob), download: `${s.name || s.id}.tscope` });
    document.body.append(a); a.click(); a.remove();
  } catch (e) { say(`Could not download "${s.name || s.id}": ${e.detail}`, true); }
}

async function importFiles(files) {
  if (!files.length) return; // (a drop of text or a link, not of files)
  const links = [];
  const notes = []; // what the server left out of a damaged or cut file: never read short silently
  // files the server refused, each with its words: the files after one still go in, and the
  // note names both kinds (QA 51c: it stopped at the first bad file and said only that one)
  const refused = [];
  let added = 0; // files that brought a run (or frames) this server did not have
  for (const f of files) {
    const fd = new FormData();
    fd.append("file", f, f.name);
    say(`Importing ${f.name}…`);
    try {
      const res = await api("/api/sessions/import", { method: "POST", body: fd });
      // a file of a run this server has already (imported before, or streamed live): no new row
      const known = res.frames > 0 && res.new_frames === 0;
      added += known ? 0 : 1;
      links.push(h("a", { href: res.url, class: "imported" }, known ? `open ${f.name} (already here: the same run)` : `open ${f.name}`));
      if (res.note) notes.push(res.note);
    } catch (e) { refused.push([f.name, e.detail]); } // words, not "400: …"
  }
  const told = notes.flatMap((n) => [h("br"), `Note: ${n}.`]);
  const taken = links.length === files.length ? (files.length === 1 ? files[0].name : `${files.length} files`)
    : `${links.length} of ${files.length} files`;
  // (in a note that is an error for the refused files, the imported ones' line keeps the text colour)
  const opened = links.length ? [h("span", { class: "done" }, added ? `Imported ${taken}: ` : `${taken}: nothing new to import, `, ...links.flatMap((a, i) => (i ? [", ", a] : [a])))] : [];
  const why = refused.flatMap(([name, detail], i) => [...(i || links.length ? [h("br")] : []), h("span", { class: "refused" }, `Could not import ${name}: ${detail}`)]);
  const said = [...opened, ...told, ...why];
  say(said[0], refused.length > 0, ...said.slice(1));
  refresh();
}

function initImport() {
  const zone = document.getElementById("drop");
  const input = document.getElementById("file");
  input.addEventListener("change", () => importFiles([...input.files]));
  for (const t of [document.body]) {
    t.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
    t.addEventListener("dragleave", () => zone.classList.remove("over"));
    t.addEventListener("drop", (e) => { e.preventDefault(); zone.classList.remove("over"); importFiles([...e.dataTransfer.files]); });
  }
}

initTheme();
initImport();
initListTools();
// A live channel refused (this page's token): the note says so at once, not at the next refresh;
// heard again, the list is refetched (what changed meanwhile sent no event this page heard).
const dot = showConnection(document.getElementById("conn"));
live(coalesce(refresh, 300), (ok, refused) => {
  dot(ok, refused);
  if (refused) { say(refused.message, true); listFailed = true; } else if (ok && listFailed) refresh();
});
window.__torchscope = { ready: refresh(), refresh };
