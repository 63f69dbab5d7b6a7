"""Build and load the C++ recorder (recorder.cpp) with torch.utils.cpp_extension.

    python benchmarks/native_observer/ext.py      # build (or load the cached build), print the time

The build goes outside the repository, into one folder per torch and Python version under
``$TORCHSCOPE_NATIVE_OBSERVER_BUILD`` (if set) or the system temp dir, so nothing lands in the
working tree and a torch upgrade recompiles instead of loading an extension built against another
libtorch ABI.  A cold compile takes ~45 s on a 2-core machine; a cached load ~0.02 s.
"""

from __future__ import annotations

import os
import shutil
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


def _check_tools() -> None:
    # cpp_extension.load needs a C++ compiler and ninja; fail with the fix rather than a traceback
    # from deep inside the build.
    if shutil.which(os.environ.get("CXX", "c++")) is None and shutil.which("g++") is None:
        raise SystemExit("native_observer: no C++ compiler found (install g++)")
    try:
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except RuntimeError:
        raise SystemExit("native_observer: ninja not found (apt-get install ninja-build, or pip install ninja)") from None


def get(verbose: bool = False) -> ModuleType:
    """Compile (first time per torch version) and import the extension; sets ``get.load_s``."""
    from torch.utils.cpp_extension import load

    _check_tools()
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    mod = load(
        name=NAME,
        sources=[str(SOURCE)],
        build_directory=str(out),
        # -DNDEBUG is required, not an optimisation: cpp_extension does not add it, and
        # ATen/record_function.h declares a member (inputs_valid_) and debug asserts only under
        # #ifndef NDEBUG.  Without it this file's view of at::RecordFunction differs from the
        # release libtorch's (layout/ODR mismatch) and every fn.inputs() call throws "Called
        # inputs() outside RecordFunction start callback".
        extra_cflags=["-O2", "-DNDEBUG"],
        verbose=verbose,
    )
    get.load_s = time.perf_counter() - t0  # type: ignore[attr-defined]
    return mod


if __name__ == "__main__":
    get(verbose="-v" in sys.argv)
    print(f"load() took {get.load_s:.2f}s; build dir {build_dir()}")  # type: ignore[attr-defined]
