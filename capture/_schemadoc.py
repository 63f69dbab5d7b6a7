"""Render ``schema.py``'s TypedDicts as the Markdown of ``docs/event-schema.md``.

The schema stays the one definition: the page is generated from its source (field names,
types and the comment on each line), and a test fails when the page is out of date.

    python -m torchscope._schemadoc > docs/event-schema.md
"""

from __future__ import annotations

import ast
from pathlib import Path

from . import schema

_INTRO = """# Event schema

Generated from `capture/schema.py` by `python -m torchscope._schemadoc > docs/event-schema.md`;
do not edit by hand (a test checks it is current).  Every record in a `.tscope` file and on
the wire is one JSON object whose `kind` names its type.  All fields are optional for readers
(`total=False`) unless the capture documents otherwise in `docs/capture.md`.

"""


def render() -> str:
    src = Path(schema.__file__).read_text()
    lines = src.splitlines()
    tree = ast.parse(src)
    out = [_INTRO, f"Schema version: `{'.'.join(map(str, schema.SCHEMA_VERSION))}`\n"]
    doc = ast.get_docstring(tree)
    if doc:
        out.append(doc.split("\n\n", 1)[1] if "\n\n" in doc else doc)
        out.append("")
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {ast.unparse(b) for b in node.bases}
        if "TypedDict" not in bases:
            continue
        out.append(f"## `{node.name}`\n")
        cdoc = ast.get_docstring(node)
        if cdoc:
            out.append(cdoc + "\n")
        out.append("| field | type | meaning |")
        out.append("|---|---|---|")
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                line = lines[item.lineno - 1]
                comment = line.split("#", 1)[1].strip() if "#" in line else ""
                typ = ast.unparse(item.annotation).replace("|", "\\|")
                out.append(f"| `{item.target.id}` | `{typ}` | {comment.replace('|', '/')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
