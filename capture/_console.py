"""The capture's lines for the person at the terminal or notebook."""

from __future__ import annotations

import sys


def say(msg: str) -> None:
    """One line to stderr in one write: ``print`` writes the text and its newline apart, and a
    line from the writer thread (a server it started) could land between the two -- a
    notebook's output showed them run together."""
    sys.stderr.write(msg + "\n")
