"""The graph layout (frontend/graph/layout.js), run in the real browser on graphs built the way
the capture builds them: execution order is topological, edges point forward, modules nest.

Checks the layout's promises: every edge that follows execution order goes downward, siblings
never overlap, children sit inside their expanded group's frame, and expanding a group lays
out only that group and its ancestors (every other group's cached layout is reused)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_page import checked_page
from conftest import ServerProc

playwright_sync = pytest.importorskip("playwright.sync_api")

# A random nested graph: groups form a tree (parents first), leaves are in execution order,
# each leaf has 1-3 edges from earlier leaves.  Returns the checks' results.
CHECK = """async () => {
  const { Layouter, SIZE } = await import("/static/graph/layout.js");
  let seed = 7;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const nG = 60, nL = 3000;
  const groupParent = new Int32Array(nG); groupParent[0] = -1;
  for (let g = 1; g < nG; g++) groupParent[g] = Math.floor(rnd() * g);
  const leafGroup = new Int32Array(nL), leafPos = new Int32Array(nL);
  let cur = 0; // modules run their ops in stretches, as in a real forward
  for (let i = 0; i < nL; i++) { if (rnd() < 0.05) cur = Math.floor(rnd() * nG); leafGroup[i] = cur; leafPos[i] = i; }
  const groupPos = new Float64Array(nG).fill(Infinity); groupPos[0] = -1;
  for (let i = 0; i < nL; i++) for (let g = leafGroup[i]; g > 0; g = groupParent[g]) groupPos[g] = Math.min(groupPos[g], i);
  for (let g = 1; g < nG; g++) if (!Number.isFinite(groupPos[g])) groupPos[g] = nL;
  const e = [];
  for (let i = 1; i < nL; i++) { const k = 1 + Math.floor(rnd() * 3); for (let j = 0; j < k; j++) e.push(Math.max(0, i - 1 - Math.floor(rnd() * 20)), i); }
  const edges = Int32Array.from(e);
  const L = new Layouter({ leafGroup, leafPos, groupParent, groupPos, edges });
  const all = Array.from({ length: nG - 1 }, (_, k) => k + 1);
  L.setExpanded(all);
  const t0 = performance.now();
  const res = L.place();
  const ms = performance.now() - t0;
  const box = (i) => Array.from(res.leafBox.slice(4 * i, 4 * i + 4));
  // 1. edges between leaves of the same group go downward
  let up = 0, sameGroup = 0;
  for (let k = 0; k < edges.length; k += 2) {
    const a = edges[k], b = edges[k + 1];
    if (leafGroup[a] !== leafGroup[b]) continue;
    sameGroup++;
    if (!(box(b)[1] > box(a)[1])) up++;
  }
  // 2. siblings (leaves and group frames of one parent) never overlap
  const kids = Array.from({ length: nG }, () => []);
  for (let i = 0; i < nL; i++) kids[leafGroup[i]].push(box(i));
  for (let g = 1; g < nG; g++) kids[groupParent[g]].push(Array.from(res.groupBox.slice(5 * g, 5 * g + 4)));
  let overlaps = 0;
  for (const list of kids) {
    list.sort((p, q) => p[1] - q[1]);
    for (let i = 0; i < list.length; i++) for (let j = i + 1; j < list.length && list[j][1] < list[i][1] + list[i][3]; j++) {
      const [a, b] = [list[i], list[j]];
      if (a[0] < b[0] + b[2] - 0.01 && b[0] < a[0] + a[2] - 0.01 && a[1] < b[1] + b[3] - 0.01 && b[1] < a[1] + a[3] - 0.01) overlaps++;
    }
  }
  // 3. children inside their expanded parent's frame
  let outside = 0;
  for (let i = 0; i < nL; i++) {
    const g = leafGroup[i]; if (g === 0) continue;
    const [x, y, w, h] = box(i), f = res.groupBox.slice(5 * g, 5 * g + 4);
    if (x < f[0] || y < f[1] || x + w > f[0] + f[2] + 0.01 || y + h > f[1] + f[3] + 0.01) outside++;
  }
  // 4. collapsing one group keeps every other group's cached layout (same object)
  const victim = 5;
  const before = new Map([...L.cache.entries()]);
  L.setExpanded(all.filter((g) => g !== victim));
  L.place();
  const chain = new Set(); for (let g = victim; g >= 0; g = groupParent[g]) chain.add(g);
  let recomputed = 0, reused = 0;
  for (const [g, lay] of before) { if (chain.has(g) || g === victim) continue; if (L.cache.get(g) === lay) reused++; else recomputed++; }
  // 5. side by side: backward groups (here: the subtree of group 1) flow upward, to the right
  const groupBackward = new Uint8Array(nG);
  for (let g = 1; g < nG; g++) groupBackward[g] = g === 1 || groupBackward[groupParent[g]] ? 1 : 0;
  const leafBackward = Uint8Array.from(leafGroup, (g) => groupBackward[g]);
  const S = new Layouter({ leafGroup, leafPos, groupParent, groupPos, edges, leafBackward, groupBackward });
  S.setSideBySide(true); S.setExpanded(all);
  const sres = S.place();
  const sbox = (i) => Array.from(sres.leafBox.slice(4 * i, 4 * i + 4));
  let wrongWay = 0, checkedB = 0, checkedF = 0;
  for (let k = 0; k < edges.length; k += 2) {
    const a = edges[k], b = edges[k + 1];
    if (leafGroup[a] !== leafGroup[b]) continue;
    if (leafBackward[a]) { checkedB++; if (!(sbox(b)[1] < sbox(a)[1])) wrongWay++; }
    else { checkedF++; if (!(sbox(b)[1] > sbox(a)[1])) wrongWay++; }
  }
  const g1 = sres.groupBox.slice(5, 9);
  let rightOf = 0;
  for (let g = 2; g < nG; g++) if (groupParent[g] === 0 && !groupBackward[g] && sres.groupBox[5 * g] + sres.groupBox[5 * g + 2] <= g1[0]) rightOf++;
  const hidden = Array.from({ length: nL }, (_, i) => i).filter((i) => Number.isNaN(res.leafBox[4 * i]));
  return { up, sameGroup, overlaps, outside, recomputed, reused, ms, hiddenWhenAllExpanded: hidden.length, nL,
           wrongWay, checkedB, checkedF, rightOf, forwardTop: groupParent.filter((p, g) => g > 1 && p === 0 && !groupBackward[g]).length };
}"""


@pytest.fixture(scope="module")
def static_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    with ServerProc(tmp_path_factory.mktemp("layout-server")) as s:
        yield s


def run_in_page(server: ServerProc, script: str) -> dict[str, Any]:
    """``script`` (an async function) evaluated in a page of the server's origin."""
    with checked_page() as page:
        page.goto(server.url + "/")
        result: dict[str, Any] = page.evaluate(script)
    return result


def test_layout_promises_on_a_random_nested_graph(static_server: ServerProc) -> None:
    r = run_in_page(static_server, CHECK)
    assert r["sameGroup"] > 1000
    assert r["up"] == 0, r
    assert r["overlaps"] == 0, r
    assert r["outside"] == 0, r
    assert r["hiddenWhenAllExpanded"] == 0
    assert r["reused"] > 0 and r["recomputed"] == 0, r
    assert r["checkedB"] > 100 and r["checkedF"] > 100 and r["wrongWay"] == 0, r  # side by side
    assert r["rightOf"] == r["forwardTop"] > 0, r  # the backward column is right of every forward group
    print(f"layout of {r['nL']} leaves in 60 nested groups: {r['ms']:.1f} ms")


# Three hundred ops of one module that feed nothing in it (every AccumulateGrad's detach in a
# full capture, a mask's slices) after a chain of five: one layer, which must wrap into rows.
WIDE = """async () => {
  const { Layouter, SIZE } = await import("/static/graph/layout.js");
  const nL = 305;
  const leafGroup = new Int32Array(nL), leafPos = Int32Array.from({ length: nL }, (_, i) => i);
  const edges = Int32Array.from([0, 1, 1, 2, 2, 3, 3, 4]);
  const L = new Layouter({ leafGroup, leafPos, groupParent: Int32Array.from([-1]), groupPos: Float64Array.from([-1]), edges });
  const res = L.place();
  const box = (i) => Array.from(res.leafBox.slice(4 * i, 4 * i + 4));
  let overlaps = 0;
  for (let i = 0; i < nL; i++) for (let j = i + 1; j < nL; j++) {
    const [a, b] = [box(i), box(j)];
    if (a[0] < b[0] + b[2] && b[0] < a[0] + a[2] && a[1] < b[1] + b[3] && b[1] < a[1] + a[3]) overlaps++;
  }
  const down = [0, 1, 2, 3].every((i) => box(i + 1)[1] > box(i)[1]);
  return { width: res.width, height: res.height, overlaps, down, leafW: SIZE.leafW + SIZE.xGap };
}"""


def test_a_wide_layer_wraps_into_rows(static_server: ServerProc) -> None:
    r = run_in_page(static_server, WIDE)
    assert r["overlaps"] == 0 and r["down"], r
    # one row of 300 was 49,000 px wide; wrapped, the graph is at most 12 ops wide and
    # about as tall as it is wide (26 rows of 12)
    assert r["width"] <= 12 * r["leafW"], r
    assert r["height"] >= 25 * 34, r
