"""The non-building graph check (torchscope.server.graphcheck): it takes real captures' graphs,
and whatever it accepts pydantic accepts too, with the same summary.  Anything it refuses goes
to pydantic, so refusing is always safe; accepting something invalid never is."""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any, Union

import pydantic_core
import pytest
from conftest import EXAMPLES, run_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchscope import schema
from torchscope.server import graphcheck
from torchscope.server.frames import BadFrames, split_frames, validate_event
from torchscope.sessionfile import (
    FLAG_GRAPH,
    FRAME_HEADER_SIZE,
    decompress_payload,
    encode_frame,
    index,
    raw_frames,
)


def _compact(ev: Any) -> bytes:
    return json.dumps(ev, separators=(",", ":")).encode()


def _example(tp: Any, i: int) -> Any:
    """A value of annotation ``tp`` (every field of every TypedDict filled), from the schema itself."""
    if typing.is_typeddict(tp):
        return {k: _example(v, i + n) for n, (k, v) in enumerate(typing.get_type_hints(tp).items())}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return args[i % len(args)]
    if origin in (Union, types.UnionType):
        return _example(args[0], i)
    if origin is list:
        return [_example(args[0], i), _example(args[0], i + 1)]
    if origin is dict:
        return {"k": _example(args[1], i)}
    return {int: i, float: i + 0.25, str: f"s{i}", bool: i % 2 == 0}.get(tp, "x")


FULL_GRAPH = {**_example(schema.GraphEvent, 0), "kind": "graph", "step": 7, "micro": 1}
FULL_LINE = _compact(FULL_GRAPH)


def _accepted_the_reader_way(line: bytes) -> dict[str, Any]:
    """The authoritative decision: pydantic-core parses it, and the file reader's way
    (json.loads, then the schema through pydantic) validates it."""
    pydantic_core.from_json(line)
    ev = json.loads(line)
    validate_event(ev)
    return dict(ev)


def test_every_schema_field_takes_the_fast_path() -> None:
    fast = graphcheck.fast_summary(FULL_LINE)
    assert fast == {"kind": "graph", "step": 7, "micro": 1, "n_ops": 2, "n_nodes": 2}
    assert fast == graphcheck.summary(_accepted_the_reader_way(FULL_LINE))
    empty = graphcheck.fast_summary(b'{"kind":"graph","step":0,"ops":[],"nodes":[]}')
    assert empty == {"kind": "graph", "step": 0, "n_ops": 0, "n_nodes": 0}


@pytest.fixture(scope="module")
def real_graph_lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """Graph events of a real training run (op-level capture), as its session file holds them."""
    record = tmp_path_factory.mktemp("real") / "cnn.tscope"
    run_script(
        EXAMPLES / "cnn.py", "--steps", "3", "--server", "none", "--record", str(record), "--mode", "full"
    )
    _, infos = index(record)
    lines: list[bytes] = []
    for info, raw in zip(infos, raw_frames(record), strict=True):
        if info.flags & FLAG_GRAPH:
            lines += decompress_payload(info, raw[FRAME_HEADER_SIZE:], raw).splitlines()
    return lines


def test_real_capture_graphs_take_the_fast_path(real_graph_lines: list[bytes]) -> None:
    assert len(real_graph_lines) == 3
    for line in real_graph_lines:
        ev = _accepted_the_reader_way(line)
        assert ev["ops"] and ev["nodes"] and any(n.get("saved") for n in ev["nodes"])  # nested records too
        assert graphcheck.fast_summary(line) == graphcheck.summary(ev)


@pytest.mark.parametrize(
    "change",
    [
        {"ops": [{"dur_us": float("nan")}]},  # valid (pydantic allows NaN) but not plain JSON
        {"ops": [{"name": "aten::index[0]"}]},  # valid: brackets in strings are pydantic's to count
        {"ops": [{"id": 2**70}]},  # valid, longer than 64 bits
        {"ops": [{"id": 1, "extra": 1}]},  # valid: extra keys are kept by a newer minor version
        {"new_field": [1]},
        {"ops": [{"id": True}]},  # invalid from here on
        {"ops": [{"id": 1.0}]},
        {"ops": [{"phase": "sideways"}]},
        {"nodes": [{"saved": [{"shape": ["2"]}]}]},
        {"edges": [[0, 1, None]]},
        {"step": "3"},
        {"ops": {"id": 1}},
    ],
)
def test_what_the_regex_refuses_pydantic_decides(change: dict[str, Any]) -> None:
    line = _compact({**FULL_GRAPH, **change})
    assert graphcheck.fast_summary(line) is None
    frame = encode_frame(0, [json.loads(line)])
    try:
        ev = _accepted_the_reader_way(line)
    except ValueError:  # BadFrames is one
        with pytest.raises(BadFrames):
            split_frames(frame)
    else:
        assert split_frames(frame)[0].events == [graphcheck.summary(ev)]


def _with_string(raw: bytes) -> bytes:
    """FULL_LINE with its first string value replaced by the JSON text ``raw``."""
    return re.sub(rb':"s[0-9]+"', b":" + raw.replace(b"\\", b"\\\\"), FULL_LINE, count=1)


@pytest.mark.parametrize(
    "line",
    [
        _with_string(b'"\\ud800"'),  # a lone surrogate: pydantic-core refuses it
        _with_string(b'"\xff"'),  # not UTF-8
        FULL_LINE.replace(b'"kind":"graph"', b'"kind":"graph","kind":"step"'),  # the last kind counts
        FULL_LINE.replace(b'"step":7', b'"step": 7'),  # whitespace
        FULL_LINE.replace(b',"micro":1', b',"micro":1,'),
        FULL_LINE[:-1],
        FULL_LINE + b"x",
    ],
)
def test_refused_lines(line: bytes) -> None:
    assert graphcheck.fast_summary(line) is None


def test_escapes_and_unicode_are_accepted() -> None:
    ev = {**FULL_GRAPH, "ops": [{"name": 'a"b\\c\n/\u00e9\u4e2d', "src": "caf\u00e9.py:1"}]}
    for ascii_only in (True, False):
        line = json.dumps(ev, separators=(",", ":"), ensure_ascii=ascii_only).encode()
        assert graphcheck.fast_summary(line) == graphcheck.summary(_accepted_the_reader_way(line))


SCALARS = st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | st.text(max_size=8)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out += _paths(v, (*path, k))
    return out


def _put(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    obj = obj.copy()
    obj[path[0]] = _put(obj[path[0]], path[1:], value)
    return obj


SOUND = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_sound(line: bytes) -> None:
    fast = graphcheck.fast_summary(line)
    if fast is not None:
        assert fast == graphcheck.summary(_accepted_the_reader_way(line)), line


@SOUND
@given(data=st.data())
def test_accepts_nothing_pydantic_refuses_values(data: st.DataObject) -> None:
    """Any field, at any depth, given any JSON value (or a known key of another record)."""
    path = data.draw(st.sampled_from(_paths(FULL_GRAPH)[1:]))
    keys = [k for p in _paths(FULL_GRAPH) for k in p if isinstance(k, str)]
    value = data.draw(SCALARS | JSON_VALUES | st.dictionaries(st.sampled_from(keys), JSON_VALUES, max_size=2))
    _check_sound(_compact(_put(FULL_GRAPH, path, value)))


@SOUND
@given(data=st.data())
def test_accepts_nothing_pydantic_refuses_bytes(data: st.DataObject) -> None:
    """Bytes changed, inserted or cut anywhere in a valid line."""
    line = bytearray(FULL_LINE)
    structure = [i for i, b in enumerate(FULL_LINE) if b in b'{}[],:"']  # where a change is subtle
    for _ in range(data.draw(st.integers(1, 4))):
        pos = min(data.draw(st.sampled_from(structure) | st.integers(0, len(FULL_LINE) - 1)), len(line) - 1)
        byte = data.draw(st.sampled_from(b'{}[]",:-.0123456789eEtrufalsn\\u ') | st.integers(0, 255))
        action = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if action == "set":
            line[pos] = byte
        elif action == "insert":
            line.insert(pos, byte)
        else:
            del line[pos]
    _check_sound(bytes(line))


def test_hostile_shapes_are_refused() -> None:
    """Nesting, long runs and unterminated strings end in a refusal (re has no recursion to
    exhaust here; the patterns are atomic, so a refusal costs one pass)."""
    for line in (
        b'{"kind":"graph","ops":' + b"[" * 100_000,
        b'{"kind":"graph","ops":[{"name":"' + b"a" * 1_000_000,
        b'{"kind":"graph","edges":[' + b"[1,2]," * 200_000 + b"[1,",
    ):
        assert graphcheck.fast_summary(line) is None
