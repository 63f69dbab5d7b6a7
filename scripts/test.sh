#!/usr/bin/env bash
# The one test command (README, CI): installs what the tests need, then lints and runs every tier.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# CPU build of torch first and pinned, so the package's `torch>=2.3` never pulls a CUDA build.
$PY -m pip install -q "torch==2.13.0"
$PY -m pip install -q -e ".[test]"

# Debian's chromium drives the browser tier (Playwright uses it via executable_path); g++ and
# ninja build full mode's C++ op recorder (capture/native/), which the capture tests run.
PKGS=""
[ -x /usr/bin/chromium ] || PKGS="chromium fonts-dejavu-core"
command -v g++ >/dev/null || PKGS="$PKGS g++"
command -v ninja >/dev/null || PKGS="$PKGS ninja-build"
if [ -n "$PKGS" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $PKGS >/dev/null
fi
# one build per torch version (~30 s), before the tests that load it in subprocesses
$PY -m torchscope._native

$PY -m ruff check .
$PY -m mypy
# three workers, each taking whole test files (a file's module-scoped fixtures -- the doctor's
# reproducer runs -- are made once): on a two-core machine the tests spend much of their time
# waiting on the training scripts, Chromium and uvicorn they start (two workers kept the cores
# ~80 % busy); TEST_WORKERS=0 runs everything in this one process.  The slowest 25 are listed.
$PY -m pytest -q -n "${TEST_WORKERS:-3}" --dist loadfile --durations=25 "$@"
