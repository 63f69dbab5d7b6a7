"""``python -m torchscope ...``: the ``torchscope`` command, for an environment whose scripts
folder is not on PATH (a venv not activated, ``pip install --user``, a notebook's ``!python -m``).

``capture/`` never imports ``server/`` (docs/architecture.md), this file included: it replaces
this process with ``python -m torchscope.server.cli`` -- the same CLI the ``torchscope`` console
script runs (pyproject.toml's ``[project.scripts]``), its exit status this command's -- naming
itself ``python -m torchscope`` in its usage and errors (``TORCHSCOPE_PROG``).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    env = {**os.environ, "TORCHSCOPE_PROG": "python -m torchscope"}
    os.execve(sys.executable, [sys.executable, "-m", "torchscope.server.cli", *sys.argv[1:]], env)
