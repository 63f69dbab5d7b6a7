"""Edge cases the recorder must survive: inference tensors (no version counter), sparse and nested
tensors (recorded opaque), an empty tensor, a List[Optional[Tensor]] input, backward on two threads.

    python benchmarks/native_observer/edge.py
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import common
import ext
import torch


def _backward() -> None:
    (torch.randn(8, 8, requires_grad=True) * 2).sum().backward()


def _brief(v: Any) -> Any:
    # only the fields the edge cases are about
    if isinstance(v, list):
        return [_brief(e) for e in v]
    if isinstance(v, dict):
        return {k: v[k] for k in ("sizes", "version", "opaque") if k in v}
    return v


def main() -> None:
    # torch.nested's "prototype stage" warning is expected here and only clutters the output.
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
    rec: Any = ext.get()
    rec.drain()
    rec.start(True, True)
    with torch.inference_mode():
        a = torch.randn(3, 3)
        a @ a  # inference tensors: version = -1
    s = torch.randn(4, 4).to_sparse()
    s + s  # sparse: opaque
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
    nt * 2  # nested: sizes() would throw -> opaque
    torch.empty(0) + 1
    torch.randn(5, 5)[torch.tensor([0, 2])]  # aten::index takes List[Optional[Tensor]]
    threads = [threading.Thread(target=_backward) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.stop()
    ops = common.decode(rec.drain(), rec.names())
    print(len(ops), "records; threads:", sorted({d["tid"] for d in ops}))
    for d in ops:
        if d["name"] in ("aten::mm", "aten::add.Tensor", "aten::mul.Tensor", "aten::index.Tensor"):
            print(" ", d["name"], [_brief(v) for v in d["inputs"]][:3])


if __name__ == "__main__":
    main()
