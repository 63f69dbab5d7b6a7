// Ranks view: step time and memory per rank side by side (distributed sessions).
import { h, fmtBytes, fmtUs, coalesce } from "./dom.js";
import { allSteps } from "./api.js";
import { LineChart } from "./chart.js";

export class RanksView {
  constructor(root, app) {
    this.app = app;
    this.info = h("p", { class: "muted" });
    root.append(h("h2", {}, "Ranks"), this.info);
    this.time = new LineChart(root, { title: "step time per rank", fmt: fmtUs });
    this.mem = new LineChart(root, { title: "peak live bytes per rank", fmt: fmtBytes });
  }

  async load() {
    const ranks = (this.app.summary?.ranks || [0]).map((r) => (typeof r === "object" ? r.rank : r));
    this.info.textContent = ranks.length > 1 ? `${ranks.length} ranks` : "This session has a single rank.";
    const per = await Promise.all(ranks.map((r) => allSteps(this.app.id, r).then((s) => [r, s])));
    const steps = [...new Set(per.flatMap(([, s]) => s.map((e) => e.step)))].sort((a, b) => a - b);
    const col = (list, f) => { const m = new Map(list.map((e) => [e.step, f(e)])); return steps.map((s) => m.get(s) ?? null); };
    this.time.setData(steps, per.map(([r, s]) => ({ name: `rank ${r}`, y: col(s, (e) => e.duration_us) })));
    this.mem.setData(steps, per.map(([r, s]) => ({ name: `rank ${r}`, y: col(s, (e) => e.memory?.peak ?? e.memory?.live) })));
  }

  onStep() { (this.reload ||= coalesce(() => this.load(), 1000))(); }
}
