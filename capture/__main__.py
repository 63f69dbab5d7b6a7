"""``python -m torchscope ...``: the ``torchscope`` command, for an environment whose scripts
folder is not on PATH (a venv not activated, ``pip install --user``, a notebook's ``!python -m``).

The one file of ``capture/`` that imports the server side (docs/architecture.md: ``capture/``
never imports ``server/``): ``import torchscope`` never imports it -- only ``python -m
torchscope`` runs it, as the CLI's entry point, the same as the ``torchscope`` console script
(pyproject.toml's ``[project.scripts]``).  The training process that watches never loads it.
"""

from __future__ import annotations

import sys

from torchscope.server.cli import main

if __name__ == "__main__":
    # (argparse would name it "__main__.py" in its usage and errors)
    sys.exit(main(prog="python -m torchscope"))
