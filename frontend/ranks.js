// "Step time & ranks" view: the time and peak memory of each step, a line per rank (side by side
// in a distributed session).  A single-process run's only step-time chart is here, so the tab
// names the step time first, not the ranks alone.
import { h, fmtBytes, fmtUs, coalesce } from "./dom.js";
import { allSteps } from "./api.js";
import { LineChart } from "./chart.js";

export class RanksView {
  constructor(root, app) {
    this.app = app;
    this.info = h("p", { class: "muted", "data-testid": "ranks-info" });
    this.heading = h("h2", {}, "Step time");
    root.append(this.heading, this.info);
    this.time = new LineChart(root, { title: "step time", fmt: fmtUs });
    this.mem = new LineChart(root, { title: "peak live bytes", fmt: fmtBytes });
  }

  async load() {
    const ranks = (this.app.summary?.ranks || [0]).map((r) => (typeof r === "object" ? r.rank : r));
    const many = ranks.length > 1;
    this.heading.textContent = many ? "Step time and memory per rank" : "Step time and memory";
    this.info.textContent = (many ? `${ranks.length} ranks, a line each. ` : "This session has a single rank. ")
      + "A step's time runs from the previous optimizer.step() (the first step's: from watch()) to its own: data loading, forward, backward and update."
      + (many ? "" : " Forward is the time in the watched model's forward calls, backward in backward(); the rest is everything else in the step.");
    this.time.setTitle(many ? "step time per rank" : "step time, and where it went");
    this.mem.setTitle(many ? "peak live bytes per rank" : "peak live bytes");
    const per = await Promise.all(ranks.map((r) => allSteps(this.app.id, r).then((s) => [r, s])));
    const steps = [...new Set(per.flatMap(([, s]) => s.map((e) => e.step)))].sort((a, b) => a - b);
    const col = (list, f) => { const m = new Map(list.map((e) => [e.step, f(e)])); return steps.map((s) => m.get(s) ?? null); };
    this.time.setData(steps, many ? per.map(([r, s]) => ({ name: `rank ${r}`, y: col(s, (e) => e.duration_us) }))
      : stepParts(per[0][1], col));
    this.mem.setData(steps, per.map(([r, s]) => ({ name: `rank ${r}`, y: col(s, (e) => e.memory?.peak ?? e.memory?.live) })));
  }

  onStep() { (this.reload ||= coalesce(() => this.load(), 1000))(); }
}

// A single rank's step time split as the profiler's step view splits it: the watched model's
// forward calls, the backward passes, and the rest of the step (the step time minus both:
// fetching the batch, the loss function, optimizer.step(), zero_grad(), logging).  A line of
// the whole step alone hid where it went: a data loader starving the loop reads as a slow model.
function stepParts(list, col) {
  const rest = (e) => (typeof e.duration_us === "number" && typeof e.forward_us === "number" && typeof e.backward_us === "number"
    ? Math.max(0, e.duration_us - e.forward_us - e.backward_us) : null);
  return [
    { name: "whole step", y: col(list, (e) => e.duration_us) },
    { name: "forward", y: col(list, (e) => e.forward_us) },
    { name: "backward", y: col(list, (e) => e.backward_us) },
    { name: "the rest (data loading, loss, optimizer.step(), your code)", y: col(list, rest) },
  ];
}
