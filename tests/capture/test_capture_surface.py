"""The public surface: import cost boundaries, the generated schema page, argument errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from torch import nn

import torchscope
from torchscope._schemadoc import render


def test_import_does_not_pull_the_web_stack() -> None:
    code = (
        "import sys, torchscope\n"
        "bad = [m for m in ('fastapi', 'uvicorn', 'jinja2', 'starlette', 'pydantic') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert res.stdout.strip() == ""


def test_public_names() -> None:
    assert torchscope.__version__ == "0.1.0"
    assert callable(torchscope.watch) and callable(torchscope.load)
    assert isinstance(torchscope.Watch, type)


def test_event_schema_page_is_generated_from_schema() -> None:
    assert (REPO / "docs" / "event-schema.md").read_text() == render(), (
        "docs/event-schema.md is stale: python -m torchscope._schemadoc > docs/event-schema.md"
    )


def test_bad_mode_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        torchscope.watch(nn.Linear(2, 2), server=None, record=tmp_path / "x.tscope", mode="fast")
    assert not (tmp_path / "x.tscope").exists()


def test_close_twice_and_context_manager(tmp_path: Path) -> None:
    with torchscope.watch(nn.Linear(2, 2), server=None, record=tmp_path / "y.tscope") as w:
        assert w.path == str(tmp_path / "y.tscope") and w.url is None and w.session_id
    w.close()  # harmless
    assert (tmp_path / "y.tscope").stat().st_size > 16
