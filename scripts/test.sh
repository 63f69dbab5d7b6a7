#!/usr/bin/env bash
# The one test command (README, CI): installs what the tests need, then lints and runs every tier.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# CPU build of torch first and pinned, so the package's `torch>=2.3` never pulls a CUDA build.
$PY -m pip install -q "torch==2.13.0"
$PY -m pip install -q -e ".[test]"

# Debian's chromium drives the browser tier (Playwright uses it via executable_path).
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi

$PY -m ruff check .
$PY -m mypy
$PY -m pytest -q "$@"
