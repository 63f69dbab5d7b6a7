// Web Worker: keeps one Layouter per graph and answers layout requests off the main thread.
// A request carries an id; the page ignores answers to requests it has superseded.
import { Layouter } from "./layout.js";

let layouter = null;
self.onmessage = (msg) => {
  const m = msg.data;
  if (m.type === "init") {
    layouter = new Layouter(m.input);
    return;
  }
  if (m.type === "layout" && layouter) {
    const t0 = performance.now();
    layouter.setSideBySide(!!m.sideBySide);
    layouter.setExpanded(m.expanded);
    const res = layouter.place();
    res.ms = performance.now() - t0;
    res.id = m.id;
    self.postMessage(res, [res.leafBox.buffer, res.groupBox.buffer]);
  }
};
