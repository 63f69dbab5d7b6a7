// Diagnostics panel: the doctor's findings (GET /diagnostics); a click opens the graph at
// the finding's step with its targets highlighted, or the memory / gradients view.
import { h, clear, coalesce } from "./dom.js";
import { api, sessionPath, rankQuery } from "./api.js";

const PLOTTED = 8;  // a finding's parameters drawn as lines in the gradients view, and listed

// (the memory view's note on a finding followed there says its steps as this list does)
export function stepsText(f) {
  const s = f.steps || [];
  if (!s.length) return "";
  if (s.length > 2 && s[s.length - 1] - s[0] === s.length - 1) return `steps ${s[0]}–${s[s.length - 1]}`;
  return `step${s.length > 1 ? "s" : ""} ${s.slice(0, 8).join(", ")}${s.length > 8 ? "…" : ""}`;
}

// The note of a finding followed into a view (memory, gradients): what it found, its steps, its
// lines, and ``more`` (what the view marks of it); the × takes it off (``onClose``).
export function findingNote(box, f, prefix, onClose, ...more) {
  clear(box).hidden = !f;
  if (!f) return;
  const sev = f.severity === "error" ? "err" : f.severity === "warning" ? "warn" : "";
  const srcs = [...new Set([f.src, ...(f.data?.src || [])].filter(Boolean))];
  // (the DOM's own append writes a null as the text "null": QA 48b, under a P3 without a line)
  box.append(...[
    h("div", { class: "finding-head" }, h("span", { class: `badge ${sev}` }, f.code), h("b", {}, f.title || ""),
      h("span", { class: "muted", "data-testid": `${prefix}-finding-steps` }, stepsText(f)),
      h("button", { "aria-label": "close the finding's note", title: "close", onclick: onClose }, "×")),
    h("div", {}, f.message || ""),
    srcs.length ? h("div", { "data-testid": `${prefix}-finding-src` }, "at ", ...srcs.flatMap((x, i) => [i ? ", " : "", h("code", {}, x)])) : null,
    ...more].filter(Boolean));
}

// Where the keyboard lands once a finding is followed: the opened view's note of it (or the
// graph): left on the finding's button, hidden with its view, it fell to <body> (QA 50b).
function landOn(el) {
  if (!el || el.hidden) return;
  if (!el.hasAttribute("tabindex")) el.tabIndex = -1; // (focusable from script, not a Tab stop)
  el.focus();
}

export class DiagnosticsView {
  constructor(root, app) {
    this.app = app;
    this.list = h("div", { class: "findings", "data-testid": "findings" });
    this.note = h("p", { class: "notice", "data-testid": "doctor-note", hidden: true });
    root.append(h("h2", {}, "Doctor"), this.note, this.list);
    this.findings = [];
  }

  async load() {
    const findings = await api(`${sessionPath(this.app.id)}/diagnostics?${rankQuery(this.app.rank)}`);
    this.onStatus();
    // a live run is diagnosed again every few steps: the same findings leave the list as it is,
    // and a changed list keeps the focus on the finding it was on (QA 45c: it fell to the page)
    const text = JSON.stringify(findings);
    if (text === this.shown) return;
    this.shown = text;
    this.findings = findings;
    const focused = this.list.contains(document.activeElement) ? document.activeElement.dataset.key : undefined;
    clear(this.list);
    const worst = ["error", "warning"].find((sev) => this.findings.some((f) => f.severity === sev)) || "info";
    this.app.setFindingCount(this.findings.length, worst);
    if (!this.findings.length) { this.list.append(h("p", { class: "muted", "data-testid": "no-findings" }, this.noneText())); return; }
    for (const f of this.findings) {
      const key = `${f.code}|${f.title || ""}|${f.src || ""}|${(f.modules || []).join(",")}`;
      const item = h("button", { class: `finding ${f.severity}`, "data-code": f.code, "data-key": key, onclick: () => this.open(f) },
        h("div", { class: "finding-head" }, h("span", { class: `badge ${f.severity === "error" ? "err" : f.severity === "warning" ? "warn" : ""}` }, f.code),
          h("b", {}, f.title || ""), h("span", { class: "muted" }, stepsText(f))),
        h("div", {}, f.message || ""),
        f.fix ? h("div", { class: "fix" }, "Fix: ", f.fix) : null,
        f.src ? h("code", {}, f.src) : null,
        (f.params || []).length ? h("div", { class: "muted", title: f.params.join("\n") }, "parameters: ", f.params.slice(0, PLOTTED).join(", "),
          f.params.length > PLOTTED ? ` … and ${f.params.length - PLOTTED} more` : "") : null,
        (f.modules || []).length ? h("div", { class: "muted" }, "modules: ", f.modules.map((m) => m || "(root)").join(", ")) : null);
      this.list.append(item);
      if (key === focused) item.focus();
    }
  }

  // A recording without its end (the training process was killed, or the file cut short):
  // the findings cover only the steps it holds, as `torchscope doctor`'s note says.
  onStatus() {
    const s = this.app.summary || {};
    this.note.hidden = s.status !== "ended unexpectedly";
    this.note.textContent = this.note.hidden ? "" : `This recording is incomplete: it has no end event (the training process was killed, ` +
      `its file was cut short, or the file was imported while its run was still writing it). The findings cover the ` +
      `${s.steps ?? 0} step${(s.steps ?? 0) === 1 ? "" : "s"} it holds.`;
    // the run's end (or its death) changes what "nothing found" means: said anew, not left as
    // the live run's "so far"
    const none = this.list.querySelector("[data-testid=no-findings]");
    if (none) none.textContent = this.noneText();
  }

  // a live run is diagnosed again as it goes on: nothing found yet is no all-clear
  noneText() {
    return this.app.running ? "No pitfall found so far; the doctor looks again as the run goes on and when it ends." : "No pitfall found in this session.";
  }

  async open(f) {
    const targets = f.targets || [];
    const step = targets.find((t) => t.step !== undefined)?.step ?? f.since ?? (f.steps || [])[0];
    if (f.view === "memory") { // the finding goes with it: that view says it and marks its steps (QA 43)
      const memory = await this.app.go("memory", { step, finding: f.code });
      await memory.showFinding?.(f);
      return landOn(memory.findingBox);
    }
    // the finding's step marked, its first parameters the ones plotted: a finding about a whole
    // frozen backbone names hundreds, more lines than a chart can tell apart and a URL can carry
    if (f.view === "gradients") { // the finding goes with it, as into the memory view (QA 45c: its evidence unsaid)
      const gradients = await this.app.go("gradients", { step, params: (f.params || []).slice(0, PLOTTED).join(",") || undefined });
      gradients.showFinding?.(f, PLOTTED);
      return landOn(gradients.findingBox);
    }
    const tg = targets.length ? targets : [...(f.params || []).map((param) => ({ param })), ...(f.modules || []).map((module) => ({ module }))];
    await this.app.openTargets(step, tg, f.steps || []);
    landOn(this.app.views.graph?.obj.canvasEl);
  }

  onStep() { (this.reload ||= coalesce(() => this.load().catch(() => {}), 1500))(); }
}
