"""Build and load the C++ recorder (recorder.cpp) with torch.utils.cpp_extension.

    python benchmarks/native_observer/ext.py      # build (or load the cached build), print the time

The build goes outside the repository, into one folder per torch and Python version under
``$TORCHSCOPE_NATIVE_OBSERVER_BUILD`` (if set) or the system temp dir, so nothing lands in the
working tree and a torch upgrade recompiles instead of loading an extension built against another
libtorch ABI.  A cold compile takes ~45 s on a 2-core machine; a cached load ~0.02 s.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "recorder.cpp"
NAME = "torchscope_native_observer"


def build_dir() -> Path:
    root = os.environ.get("TORCHSCOPE_NATIVE_OBSERVER_BUILD") or os.path.join(
        tempfile.gettempdir(), "torchscope_native_observer"
    )
    # "+" in local versions (2.13.0+cpu) is harmless in a path, but keep the folder name plain.
    tag = f"torch{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}".replace("+", "_")
    return Path(root) / tag


def get(verbose: bool = False) -> ModuleType:
    """Compile (first time per torch version) and import the extension; sets ``get.load_s``.
    The build is the product's (``torchscope._native``), with this experiment's source."""
    from torchscope import _native

    missing = _native._tools_missing()
    if missing is not None:
        raise SystemExit(f"native_observer: {missing}")
    t0 = time.perf_counter()
    mod = _native.compile_extension(NAME, (SOURCE,), build_dir(), verbose=verbose)
    get.load_s = time.perf_counter() - t0  # type: ignore[attr-defined]
    return mod


if __name__ == "__main__":
    get(verbose="-v" in sys.argv)
    print(f"load() took {get.load_s:.2f}s; build dir {build_dir()}")  # type: ignore[attr-defined]
