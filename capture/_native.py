"""The native extension: ``full`` mode's C++ op observer (``native/recorder.cpp``) and one-pass
gradient statistics (``native/stats.cpp``, every mode once it is built): build, load, and a
recorder with the Python ``OpRecorder``'s interface.

A Python dispatch mode costs 1.6-1.9x a small-op step before recording anything; this observer
records every op at ~1-2 us (see docs/capture.md).  It is compiled on the user's machine with
``torch.utils.cpp_extension`` -- once per torch and Python version, ~45 s, into
``$TORCHSCOPE_NATIVE_BUILD`` or ``~/.cache/torchscope/native/<versions>-<source hash>`` -- in a
background process the first time ``full`` mode runs, so training never waits for the compiler:
until it is loaded (or where there is no compiler, or ``TORCHSCOPE_NATIVE=0``) the Python
recorder records.  ``python -m torchscope._native`` builds it ahead of time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from ._console import say
from ._overlap import Region, region, writes_saved
from ._srcloc import _user_base, user_src
from .sessionfile import RawJSON

if TYPE_CHECKING:
    from ._autograd import AutogradWalk

log = logging.getLogger("torchscope")

_HERE = Path(__file__).resolve().parent / "native"
SOURCES = (_HERE / "recorder.cpp", _HERE / "stats.cpp", _HERE / "storage.cpp", _HERE / "graph.cpp")
HEADERS = (_HERE / "tensors.h",)  # part of the source a build is stamped with
NAME = "torchscope_native_recorder"
_lock = threading.Lock()
_ext: ModuleType | None = None
_error: str | None = None
_error_log = ""  # a failed build's whole compiler output (``python -m torchscope._native`` shows its end)
_building: _BackgroundBuild | None = None
_STALE_LOCK_S = 600  # a build takes under a minute
_claimed_by = 0  # id of the Watch whose recorder holds the extension's (process-wide) state


def build_dir() -> Path:
    root = os.environ.get("TORCHSCOPE_NATIVE_BUILD") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "torchscope", "native"
    )
    # an extension is valid only for the libtorch it was compiled against, and is its own
    # source's: two torchscope versions on one machine (two virtual environments) keep a build
    # each instead of rebuilding over each other
    tag = f"torch{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}".replace("+", "_")
    return Path(root) / f"{tag}-{_source_hash()[:12]}"


# ``os.environ.get`` of an unset variable raises and catches a KeyError inside (~2 us, and
# several times that in situ): it is asked several times a step, so the environment's own dict
# is read, with the key and value encoded as it stores them (set or unset at any time, as
# tests do with monkeypatch.setenv)
_ENV: Any = os.environ
_ENV_KEY = _ENV.encodekey("TORCHSCOPE_NATIVE")
_ENV_OFF = _ENV.encodevalue("0")


def enabled() -> bool:
    return bool(_ENV._data.get(_ENV_KEY) != _ENV_OFF)


def _tools_missing() -> str | None:
    if shutil.which(os.environ.get("CXX", "c++")) is None and shutil.which("g++") is None:
        return "no C++ compiler (install g++)"
    try:
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except RuntimeError:
        return "no ninja (apt-get install ninja-build, or pip install ninja)"
    return None


def compile_extension(name: str, sources: tuple[Path, ...], out: Path, verbose: bool = False) -> ModuleType:
    """Compile (or load the up-to-date build of) a RecordFunction observer's sources into ``out``."""
    from torch.utils.cpp_extension import load

    out.mkdir(parents=True, exist_ok=True)
    with _one_build(out):
        return load(
            name=name,
            sources=[str(p) for p in sources],
            build_directory=str(out),
            # -DNDEBUG is required, not an optimisation: ATen/record_function.h declares a member
            # only under #ifndef NDEBUG, and cpp_extension does not define it, so without it the
            # file's at::RecordFunction would not be the release libtorch's ("Called inputs()
            # outside RecordFunction start callback" on every read of an op's inputs)
            extra_cflags=["-O2", "-DNDEBUG"],
            verbose=verbose,
        )


@contextlib.contextmanager
def _one_build(out: Path) -> Iterator[None]:
    """One build of ``out`` at a time across processes.  cpp_extension's own lock file outlives
    a process that ends mid-build (a short full-mode script exits while the daemon build
    thread runs), and its wait for that file has no timeout: every later build of the folder
    waited forever.  An ``flock`` is released by the system however its holder ends, so while
    this process holds it no build runs, and a ``lock`` file there is a dead build's."""
    try:
        import fcntl
    except ImportError:  # Windows: the file's age tells a dead build's
        lock = out / "lock"
        if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink(missing_ok=True)
        yield
        return
    with open(out / "build.flock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            _await_orphans(out)
            (out / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_ORPHAN_WAIT_S = 300.0  # a build takes about a minute on 2 cores


def _await_orphans(out: Path) -> None:
    """Wait for the compilers of a build whose process is gone: cpp_extension runs ninja in the
    build folder, and ninja and its compilers outlive a script that exits mid-build (the flock
    does not: it is the script's).  Two builds writing the same objects race; the dead one's,
    finished, leaves this one nothing to compile.  Linux's /proc tells who runs in the folder."""
    deadline = time.monotonic() + _ORPHAN_WAIT_S
    while _running_in(out) and time.monotonic() < deadline:
        time.sleep(0.5)


def _running_in(folder: Path) -> bool:
    """Whether another process has ``folder`` as its working directory (False without /proc)."""
    target, me = os.path.realpath(folder), str(os.getpid())
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit() and d != me]
    except OSError:
        return False
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd") == target:
                return True
    return False


def _build() -> None:
    """Load the built library, building it first if need be (this process waits)."""
    global _ext, _error, _error_log
    try:
        out = build_dir()
        t0 = time.perf_counter()
        ext = _import_built(out)
        if ext is None:
            missing = _tools_missing()
            if missing is not None:
                raise RuntimeError(missing)
            ext = compile_extension(NAME, SOURCES, out)
            (out / _STAMP).write_text(_source_hash())
        ext.configure(_user_base)
        took = time.perf_counter() - t0
        log.debug("torchscope: native op recorder loaded in %.1f s", took)
        _ext = ext
    except Exception as exc:  # no compiler, a failed build: the Python recorder records
        _error, _error_log = describe_failure(exc), str(exc)
        log.info("torchscope: full mode records ops in Python (native recorder: %s)", _error)


def describe_failure(exc: Exception) -> str:
    """One line for a failed build.  cpp_extension's message is ninja's whole log, whose first
    line is a compiler command: the compiler's first ``error:`` line says what went wrong."""
    lines = str(exc).splitlines()
    cause = next((ln.strip() for ln in lines if "error:" in ln), None)
    if cause is not None:
        return f"{type(exc).__name__}: C++ build failed: {cause}"
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


_STAMP = "source.sha256"  # the source a finished build was made from


def _import_built(out: Path) -> ModuleType | None:
    """The finished build of this very source, imported as it is (~10 ms; cpp_extension's load
    would first ask ninja whether it is up to date, ~200 ms), or None."""
    so = out / f"{NAME}.so"
    if not _built() or not so.is_file():
        return None
    spec = importlib.util.spec_from_file_location(NAME, so)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except ImportError:  # a damaged build: compiled again
        return None
    return mod


@functools.cache
def _source_hash() -> str:
    h = hashlib.sha256()
    for p in SOURCES + HEADERS:
        h.update(p.read_bytes())
    return h.hexdigest()


def _built() -> bool:
    """A build of this very source is there: loading it takes a fraction of a second (one of
    an older torchscope's would be recompiled by ``load``, in the background instead)."""
    try:
        return (build_dir() / _STAMP).read_text() == _source_hash()
    except OSError:
        return False


class _BackgroundBuild:
    """The first full-mode watch's build, in a process of its own (``python -m torchscope._native
    --background``: its own session, niced, its output in the folder's ``build.log``) that
    outlives the script.  A daemon thread's build died with a short script, its ninja killed
    before it logged the objects it had compiled, so the next script compiled them all again:
    on a busy machine no run was ever long enough (QA 49b: three full-mode runs of ~170 s, and
    no library).  The training process loads the library once the process has made it."""

    def __init__(self, out: Path) -> None:
        self._pid = os.getpid()  # (a forked child, a DataLoader worker, waits for no one's build)
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self.done = False
        self._log = out / "build.log"
        out.mkdir(parents=True, exist_ok=True)
        with open(self._log, "wb") as log_file:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "torchscope._native", "--background"], stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def poll(self) -> None:
        """Load the library if the build has ended (a ``waitpid`` while it has not: ~1 us)."""
        if not self.done and os.getpid() == self._pid and self._proc.poll() is not None:
            self._finish()

    def join(self, timeout: float | None = None) -> None:
        if self.done or os.getpid() != self._pid:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)
            self._finish()

    def _finish(self) -> None:
        global _ext, _error, _error_log
        with self._lock:
            if self.done:
                return
            self.done = True
            took = time.perf_counter() - self._t0
            try:
                ext = _import_built(build_dir()) if self._proc.returncode == 0 else None
                if ext is not None:
                    ext.configure(_user_base)
                    _ext = ext
                    say(f"torchscope: C++ op recorder built in {took:.0f} s; full mode uses it from the next step")
                    return
                text = self._log.read_text(errors="replace")
            except Exception as exc:  # (an unreadable log, a library that will not load)
                text = f"{type(exc).__name__}: {exc}"
            line = next((ln for ln in text.splitlines() if ln.startswith(_UNAVAILABLE)), None)
            _error = line[len(_UNAVAILABLE):] if line else f"the build ended with status {self._proc.returncode}"
            _error_log = text
            log.info("torchscope: full mode records ops in Python (native recorder: %s)", _error)
            say(f"torchscope: full mode records ops in Python, ~2x slower ({_error[:200]}; see {self._log})")


_UNAVAILABLE = "torchscope: native recorder not available: "


def get(block: bool = False, build: bool = True) -> ModuleType | None:
    """The loaded extension, or None while it builds (in the background unless ``block``), where
    it cannot be built, or where ``TORCHSCOPE_NATIVE=0``.  ``build=False``: load a build that
    exists, never start one (light and default mode use it for statistics when it is there)."""
    global _building, _error
    if _ext is not None or _error is not None or not enabled() or not (build or _built()):
        return _ext
    with _lock:
        if _ext is None and _error is None:
            if block or _built():  # a cached build loads in a fraction of a second
                if _building is not None:
                    _building.join()
                else:
                    _build()
            elif _building is None:
                missing = _tools_missing()  # said at once, not after a process has started
                if missing is not None:
                    _error = missing
                    say(f"torchscope: full mode records ops in Python, ~2x slower ({missing})")
                    return None
                try:
                    _building = _BackgroundBuild(build_dir())
                except OSError as exc:  # an unwritable cache folder
                    _error = f"cannot build in {build_dir()} ({exc.strerror or exc})"
                    say(f"torchscope: full mode records ops in Python, ~2x slower ({_error})")
                    return None
                say(
                    "torchscope: building full mode's C++ op recorder in the background (a minute or more, once per "
                    "torch version); ops are recorded in Python until then",
                )
    return _ext


_epoch = 0


def next_epoch() -> int:
    """A number no earlier step's gradient hooks carry (see ``take_grads``)."""
    global _epoch
    _epoch += 1
    return _epoch


def loaded() -> ModuleType | None:
    """The extension if it is loaded and allowed (``TORCHSCOPE_NATIVE=0`` turns it all off);
    one that a background build has just made is loaded here."""
    # enabled() inlined: asked ~5 times a step (each ask() and each step's state), and a
    # Python call is most of its cost there
    if _ext is None and _building is not None and not _building.done:
        _building.poll()
    return _ext if _ext is not None and _ENV._data.get(_ENV_KEY) != _ENV_OFF else None


def ask(fn: str, *args: Any) -> Any:
    """The extension's ``fn(*args)``: None where it is not loaded, or where that call cannot
    read the tensors it was given (the caller's Python path then reads them all)."""
    ext = loaded()
    return getattr(ext, fn)(*args) if ext is not None else None


_marks: memoryview | None = None


def used_marks() -> memoryview:
    """The extension's table of forward outputs a backward reached (``watch_used``), by token."""
    global _marks
    if _marks is None:
        assert _ext is not None
        _marks = _ext.used_marks()
    return _marks


def pause_thread(on: bool) -> None:
    """The capture's own ops on this thread (statistics in a gradient hook) are not recorded."""
    if _ext is not None:
        _ext.pause_thread(on)


@contextlib.contextmanager
def _unrecorded(open_: list[Any]) -> Iterator[None]:
    pause_thread(True)
    try:
        with torch.no_grad(), torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
            yield
    finally:
        pause_thread(False)
        if open_:
            open_.pop()


_blocks = threading.local()  # .open: this thread's unrecorded() blocks entered and not left


def unrecorded() -> contextlib.AbstractContextManager[None]:
    """The capture's own tensor ops inside a recorded pass (statistics in a gradient hook): no
    recorder sees them -- the C++ observer paused on this thread, the Python dispatch and
    function modes skipped -- and no graph is built.  A Ctrl-C landing at the entry of its exit
    leaves those guards on, the block suspended: ``settle()`` ends it."""
    open_ = getattr(_blocks, "open", None)
    if open_ is None:
        open_ = _blocks.open = []
    block = _unrecorded(open_)
    open_.append(block)
    return block


def settle() -> None:
    """End this thread's unrecorded() blocks that a KeyboardInterrupt left open (at a step's
    close, where none is open otherwise): their guards off, the recorder's pause lifted --
    else every later step of the run records nothing (no function mode, no backward seen)."""
    open_ = getattr(_blocks, "open", None)
    while open_:
        block = open_[-1]
        with contextlib.suppress(Exception):
            block.gen.close()  # its finally: the guards' exits, the pause lifted, popped
        if open_ and open_[-1] is block:  # one interrupted before it began
            open_.pop()


def claim(owner: int) -> ModuleType | None:
    """The extension for ``owner``'s recorder; None when another watch's recorder holds it."""
    global _claimed_by
    ext = _ext
    if ext is None or _claimed_by not in (0, owner) or not enabled():
        return None
    _claimed_by = owner
    return ext


def release(owner: int) -> None:
    global _claimed_by
    if _claimed_by == owner:
        if _ext is not None:
            _ext.stop()
        _claimed_by = 0


_PHASES = {"forward": 0, "backward": 1, "optimizer": 2}  # (the extension's g_phase)


class NativeRecorder:
    """``OpRecorder``'s interface over the extension.  The records stay in the extension until
    ``payload()`` has them written as JSON, the same JSON the Python recorder's dicts make;
    each recorded phase's end (``__exit__``) brings over only what the watch uses during the
    step (grad_fn links, the ops' modules and casts, the timeline, node times)."""

    def __init__(
        self,
        ext: ModuleType,
        module_of: Callable[[], tuple[str, int, bool, str]],
        param_cdata: dict[int, str],
        baseline_live: int,
        check_nan: bool,
        max_ops: int,
        sid: Any,
    ) -> None:
        self.ext = ext
        self.module_of = module_of
        self.sid = sid
        self.n_ops = 0
        self._n_tensors = 0
        self._modules: list[str] = []  # by op id
        self._casts: set[int] = set()
        self.timeline: list[tuple[int, int]] = []
        self.shed = 0
        self.phase = "forward"
        self.micro = 0
        self.live = baseline_live
        self.baseline = baseline_live
        self.nan_seen = False
        self.autocast_seen = False
        self.failed: str | None = None
        self.links: dict[int, tuple[int, tuple[int, ...]]] = {}  # grad_fn sequence number -> (op, tensors)
        self.near: dict[int, int] = {}  # node index -> an op whose module it is in (node_links)
        self.node_times: list[tuple[int, int, int]] = []  # (sequence number, start ns, end ns) of nodes run
        self._timed: dict[int, int] = {}  # sequence number -> node index, of this backward's timed nodes
        self._contexts: dict[tuple[str, int, bool, str, bool], int] = {}
        self._explicit = 0
        self._paused = False
        ext.reset(baseline_live, check_nan, max_ops, param_cdata)

    # the Python recorder's plain attributes, passed on to the extension
    @property
    def explicit_casts(self) -> int:
        return self._explicit

    @explicit_casts.setter
    def explicit_casts(self, n: int) -> None:
        self._explicit = n
        self.ext.set_explicit(n)

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, on: bool) -> None:
        self._paused = on
        self.ext.set_paused(on)

    def sync(self) -> None:
        """Tell the extension the module, phase and micro-batch the next ops run in.  Runs in
        module hooks, inside the user's forward: never raises (the recorder fails instead)."""
        try:
            self._sync()
        except Exception as exc:
            self.failed = self.failed or repr(exc)

    def _sync(self) -> None:
        if self.phase == "backward":
            # the engine's ops: no module; their line is a custom Function's backward's, or
            # else the backward call's (the frames' walk stops there)
            key = ("", 0, False, user_src(), True)
        elif self.phase == "optimizer":  # no module either; every op's line the step() call's
            key = ("", 0, False, user_src(), False)
        else:
            module, call, inside, module_src = self.module_of()
            # inside a torch module the user's line is the one that called it; elsewhere the
            # op's own caller, read per op
            key = (module, call, inside, module_src, not module_src)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = self.ext.context(*key)
        self.ext.set_state(ctx, _PHASES[self.phase], self.micro)

    def __enter__(self) -> NativeRecorder:
        self.sync()
        self.ext.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ext.stop()
        self._drain()

    def _drain(self) -> None:
        links, timeline, nodes, self.shed, self.live, nan, autocast, failed, modules, casts, self.n_ops, self._n_tensors = (
            self.ext.drain(self.sid.ids)
        )
        self._modules += modules
        self._casts.update(casts)
        for link in links:
            self.links[link[0]] = (link[1], link[2:])
        self.node_times += nodes
        self.timeline.extend(timeline)
        self.nan_seen = self.nan_seen or nan
        self.autocast_seen = self.autocast_seen or autocast
        if failed and self.failed is None:
            self.failed = failed

    def _link_pending(self) -> None:
        """Nothing to do: ``__exit__`` drained the links with the records."""

    def untracked_free(self, nbytes: int) -> None:
        """As OpRecorder.untracked_free."""
        self.ext.untracked_free(nbytes)

    def follow(self, t: torch.Tensor, nbytes: int, counted: bool) -> bool:
        """As OpRecorder.follow."""
        return bool(self.ext.follow(t, nbytes, counted))

    def op_module(self, op: int) -> str:
        return self._modules[op] if 0 <= op < len(self._modules) else ""

    def cast_ops(self) -> set[int]:
        return self._casts

    def set_grad_fn(self, tid: int, node: int) -> None:
        self.ext.set_grad_fn(tid, node)

    def flag_inplace_saved(self, saved: dict[int, list[tuple[int, Region]]]) -> int:
        """See ``OpRecorder.flag_inplace_saved``."""
        first = {sid: min(op for op, _ in regions) for sid, regions in saved.items() if regions}
        n = 0
        for op, sid, offset, sizes, strides, item in self.ext.inplace_candidates(first):
            if writes_saved(saved[sid], op, region(offset, sizes, strides, item)):
                self.ext.flag_op_inplace_saved(op)
                n += 1
        return n

    def peak_live(self, since: int = 0, until: int | None = None) -> int:
        end = self.n_ops if until is None else until
        return max((live for op, live in self.timeline if since <= op < end), default=0)

    def payload(self) -> tuple[RawJSON, RawJSON]:
        """The graph event's ``ops`` and ``tensors``, as JSON arrays (call after ``finish``)."""
        ops, tensors = self.ext.encode()
        return RawJSON(ops, self.n_ops), RawJSON(tensors, self._n_tensors)

    def node_links(self, walk: AutogradWalk) -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
        """For each graph node (by index) the op that made it and that op's output tensors: a
        node's sequence number is the one the op's record saw it get."""
        ops: dict[int, int] = {}
        tensors: dict[int, tuple[int, ...]] = {}
        links = self.links
        unlinked: list[tuple[int, int]] = []
        for i, seq in enumerate(walk.seqs()):
            hit = links.get(seq)
            if hit is not None:
                ops[i], tensors[i] = hit
            elif seq >= 0:
                unlinked.append((seq, i))
        self.near = {}
        if unlinked:
            # an in-place op on a view makes its CopySlices, a custom autograd.Function its node,
            # without an output whose grad_fn links them: found by the sequence counter instead
            unlinked.sort()
            for (_, i), (op, during) in zip(unlinked, self.ext.made_by([seq for seq, _ in unlinked]), strict=True):
                if op < 0:
                    continue
                if during:
                    ops[i] = op
                else:
                    self.near[i] = op  # its module's op, not its maker: the Function ran no op of its own
        return ops, tensors

    def time_nodes(self, walk: AutogradWalk) -> set[int]:
        """Indexes of the nodes of the backward about to run that the extension times: those
        with a sequence number of their own (not AccumulateGrad's shared one)."""
        by_seq: dict[int, int] = {}
        dup: set[int] = set()
        for i, seq in enumerate(walk.seqs()):
            if seq < 0:
                continue
            if seq in by_seq:
                dup.add(seq)
            by_seq[seq] = i
        for seq in dup:
            del by_seq[seq]
        self._timed = by_seq
        return set(by_seq.values())

    def take_node_times(self) -> list[tuple[int, float, float]]:
        """(node index, start, end) of that backward's timed nodes, in seconds on the clock
        of ``time.perf_counter``; forgets them."""
        out = [(i, t0 / 1e9, t1 / 1e9) for seq, t0, t1 in self.node_times if (i := self._timed.get(seq)) is not None]
        self.node_times.clear()
        self._timed = {}
        return out

    def add_marker(self, name: str, t: torch.Tensor, flags: list[str]) -> None:
        self.sync()
        try:
            self.ext.marker(name, t, tuple(flags), user_src(2))
        except Exception as exc:
            self.failed = self.failed or repr(exc)

    def finish(self) -> None:
        self._drain()
        self.ext.finish()


if __name__ == "__main__":
    if "--background" in sys.argv[1:]:  # a full-mode watch's build (_BackgroundBuild): the training first
        os.nice(10)
    t0 = time.perf_counter()
    mod = get(block=True)
    if mod is None:
        say(f"{_UNAVAILABLE}{_error or 'TORCHSCOPE_NATIVE=0'}")
        if _error_log:
            say("\n".join(_error_log.splitlines()[-40:]))
        raise SystemExit(1)
    print(f"torchscope: native recorder ready in {time.perf_counter() - t0:.1f} s ({build_dir()})")
