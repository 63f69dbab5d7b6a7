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
    // (from 0: a step's few bytes more are no spike; labelled in KiB / MiB, as the memory view)
    this.mem = new LineChart(root, { title: "peak live bytes", fmt: fmtBytes, fromZero: true });
  }

  async load() {
    const ranks = (this.app.summary?.ranks || [0]).map((r) => (typeof r === "object" ? r.rank : r));
    const many = ranks.length > 1;
    this.heading.textContent = many ? "Step time and memory per rank" : "Step time and memory";
    this.info.textContent = (many ? `${ranks.length} ranks, a line each. ` : "This session has a single rank. ")
      + "A step's time runs from the previous optimizer.step() (the first step's: from watch()) to its own: data loading, forward, backward and update."
      + (many ? "" : " Forward is the time in the watched model's forward calls, backward in backward(); before the forward is the wait for the next batch (and zero_grad()), then optimizer.step(); the rest is everything else in the step.");
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
// forward calls, the backward passes, the wait before the step's first forward (fetching the
// batch, zero_grad(): StepEvent.before_forward_us, format 1.12), optimizer.step() (optimizer_us)
// and the rest (the loss function, logging).  A line of the whole step alone hid where it went:
// a data loader starving the loop reads as a slow model (QA 48d: it was one "rest" with the loss
// and the update).  A file from before 1.12 has forward, backward and the rest only.
function stepParts(list, col) {
  const num = (v) => (typeof v === "number" ? v : null);
  const split = list.some((e) => typeof e.before_forward_us === "number");
  const rest = (e) => (typeof e.duration_us === "number" && typeof e.forward_us === "number" && typeof e.backward_us === "number"
    ? Math.max(0, e.duration_us - e.forward_us - e.backward_us - (split ? (num(e.before_forward_us) ?? 0) + (num(e.optimizer_us) ?? 0) : 0)) : null);
  return [
    { name: "whole step", y: col(list, (e) => e.duration_us) },
    { name: "forward", y: col(list, (e) => e.forward_us) },
    { name: "backward", y: col(list, (e) => e.backward_us) },
    ...(split ? [
      { name: "before the forward (the next batch, zero_grad(), your code)", y: col(list, (e) => num(e.before_forward_us)) },
      { name: "optimizer.step()", y: col(list, (e) => num(e.optimizer_us)) },
      { name: "the rest (loss, logging, your code)", y: col(list, rest) },
    ] : [{ name: "the rest (data loading, loss, optimizer.step(), your code)", y: col(list, rest) }]),
  ];
}
