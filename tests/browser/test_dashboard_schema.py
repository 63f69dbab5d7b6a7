"""frontend/schema.js names the event fields the dashboard reads; each must exist in the
TypedDict of capture/schema.py it mirrors, so renaming a field there fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchscope import schema

SCHEMA_JS = Path(__file__).resolve().parents[2] / "frontend" / "schema.js"
KINDS = {"session": schema.SessionEvent, "step": schema.StepEvent, "graph": schema.GraphEvent, "end": schema.EndEvent,
         "log": schema.LogEvent}


def js_fields() -> dict[str, list[str]]:
    text = SCHEMA_JS.read_text()
    body = text[text.index("export const FIELDS = {"):]
    entries = re.findall(r"^\s*(\w+):\s*\[([^\]]*)\],?\s*$", body, flags=re.M)
    return {name: re.findall(r'"(\w+)"', items) for name, items in entries}


def typed_dict(name: str) -> type:
    return KINDS.get(name) or getattr(schema, name)


def test_schema_js_parses_into_every_kind_the_dashboard_reads() -> None:
    fields = js_fields()
    assert {"session", "step", "graph", "OpRecord", "NodeRecord", "TensorMeta", "Finding"} <= fields.keys()
    assert all(fields.values())


@pytest.mark.parametrize("name", sorted(js_fields()))
def test_every_js_field_exists_in_the_python_schema(name: str) -> None:
    td = typed_dict(name)
    missing = [f for f in js_fields()[name] if f not in td.__annotations__]
    assert missing == [], f"frontend/schema.js {name} names fields that capture/schema.py {td.__name__} lacks: {missing}"


def test_kind_literals_match() -> None:
    for kind, td in KINDS.items():
        assert schema.EVENT_TYPES[kind] is td
