// Sessions page (/): every run on this server, import by drag-and-drop or file picker,
// rename, tag, delete, download.  Refreshes on live events.
import { h, clear, fmtTime, coalesce } from "./dom.js";
import { api, sessionPath, live } from "./api.js";
import { initTheme } from "./theme.js";

const body = document.getElementById("sessions");
const note = document.getElementById("note");

function say(msg, error = false) { note.textContent = msg; note.className = `notice ${error ? "error" : ""}`; note.hidden = !msg; }

async function refresh() {
  let list;
  try { list = await api("/api/sessions"); } catch (e) { say(e.message, true); return; }
  say("");
  clear(body);
  if (!list.length) { body.append(h("tr", {}, h("td", { colspan: 8, class: "muted", id: "empty" }, "No sessions yet. Add torchscope.watch(model) to a training script, run `torchscope demo`, or drop a .tscope file here."))); return; }
  for (const s of list) body.append(row(s));
}

function row(s) {
  const href = `/sessions/${encodeURIComponent(s.id)}`;
  const tags = h("span", { class: "tags" }, (s.tags || []).map((t) => h("span", { class: "tag" }, t)));
  return h("tr", { "data-id": s.id },
    h("td", {}, h("a", { href, class: "session-link" }, s.name || s.id), h("div", { class: "muted small" }, s.model || "")),
    h("td", {}, h("span", { class: `badge status-${(s.status || "").replace(/ /g, "-")}` }, s.status)),
    h("td", {}, fmtTime(s.started_at)), h("td", { class: "num" }, String(s.steps ?? 0)), h("td", { class: "num" }, String(Array.isArray(s.ranks) ? s.ranks.length : s.ranks ?? 1)),
    h("td", {}, s.errors ? h("span", { class: "badge err", title: "doctor errors" }, `${s.errors} error${s.errors > 1 ? "s" : ""}`) : null,
      s.warnings ? h("span", { class: "badge warn" }, `${s.warnings} warning${s.warnings > 1 ? "s" : ""}`) : null),
    h("td", {}, tags),
    h("td", { class: "row-actions" },
      h("button", { title: "rename", onclick: () => rename(s) }, "Rename"),
      h("button", { title: "tags, comma separated", onclick: () => tag(s) }, "Tag"),
      h("button", { title: "download the .tscope file", onclick: () => download(s) }, "Download"),
      h("button", { class: "danger", title: "delete", onclick: () => remove(s) }, "Delete")));
}

async function rename(s) {
  const name = prompt("New name", s.name || "");
  if (name === null) return;
  await api(sessionPath(s.id), { method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ name }) }).catch((e) => say(e.message, true));
  refresh();
}

async function tag(s) {
  const v = prompt("Tags (comma separated)", (s.tags || []).join(", "));
  if (v === null) return;
  const tags = v.split(",").map((t) => t.trim()).filter(Boolean);
  await api(sessionPath(s.id), { method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ tags }) }).catch((e) => say(e.message, true));
  refresh();
}

async function remove(s) {
  if (!confirm(`Delete session "${s.name || s.id}"? This cannot be undone.`)) return;
  await api(sessionPath(s.id), { method: "DELETE" }).catch((e) => say(e.message, true));
  refresh();
}

// Fetch (so the token header goes along) and save as a file.
async function download(s) {
  try {
    const resp = await api(`${sessionPath(s.id)}/export`);
    const blob = await resp.blob();
    const a = h("a", { href: URL.createObjectURL(blob), download: `${s.name || s.id}.tscope` });
    document.body.append(a); a.click(); a.remove();
  } catch (e) { say(e.message, true); }
}

async function importFiles(files) {
  for (const f of files) {
    const fd = new FormData();
    fd.append("file", f, f.name);
    say(`Importing ${f.name}…`);
    try {
      const res = await api("/api/sessions/import", { method: "POST", body: fd });
      say(`Imported ${f.name}${res && res.id ? "" : ""}.`);
    } catch (e) { say(`Could not import ${f.name}: ${e.message}`, true); return; }
  }
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
live(coalesce(refresh, 300),
  (ok) => { const c = document.getElementById("conn"); c.textContent = ok ? "● live" : "○ disconnected"; c.className = ok ? "ok" : "bad"; });
window.__torchscope = { ready: refresh(), refresh };
