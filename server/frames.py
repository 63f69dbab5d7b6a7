"""Frames in: split a body of concatenated frames, decode each with the one codec
(``torchscope.sessionfile``) and validate every event against the one schema
(``torchscope.schema``, through pydantic ``TypeAdapter``; graph events first through the
non-building check of ``graphcheck``).  Anything wrong is a ``BadFrames`` whose message is one
line for a 400 or the CLI."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

import pydantic_core
import typing_extensions
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from torchscope import schema
from torchscope.sessionfile import (
    FLAG_GRAPH,
    FLAG_SERIES,
    FRAME_HEADER_SIZE,
    FrameInfo,
    Readable,
    SessionFileError,
    check_records,
    decompress_payload,
    parse_frame_header,
    raw_frames,
    salvage,
)

from . import graphcheck


class BadFrames(ValueError):
    """Frames that cannot be stored; the message is one line."""


_converted: dict[type, Any] = {}
_typed_dict: Any = typing_extensions.TypedDict  # the functional form, with a runtime name
# The records inside a GraphEvent (thousands per event) are validated but their extra keys
# not copied (~20% of ingest time): the server reads a graph back from its raw frame, and uses
# the validated copy only for step, micro and counts.
_GRAPH_RECORDS = {schema.OpRecord, schema.TensorMeta, schema.NodeRecord, schema.SavedTensor}


def _pydantic_type(tp: Any) -> Any:
    """The same type with every ``typing.TypedDict`` of the schema rebuilt as a
    ``typing_extensions.TypedDict``: pydantic needs those on Python < 3.12, while the schema
    module stays standard-library only (it is imported inside the training process)."""
    if typing_extensions.is_typeddict(tp):
        if tp not in _converted:
            hints = typing.get_type_hints(tp)
            fields = {k: _pydantic_type(v) for k, v in hints.items()}
            td = _typed_dict(tp.__name__, fields, total=False)
            if tp not in _GRAPH_RECORDS:
                # keep fields a newer minor version adds: the validated dict IS the stored event
                td.__pydantic_config__ = ConfigDict(extra="allow")
            _converted[tp] = td
        return _converted[tp]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is None or not args or origin is typing.Literal:
        return tp
    new = tuple(_pydantic_type(a) for a in args)
    if origin in (Union, types.UnionType):
        return Union.__getitem__(new)
    return origin[new]


_EVENT_UNION: Any = Union.__getitem__(tuple(_pydantic_type(t) for t in schema.EVENT_TYPES.values()))
_EVENT: TypeAdapter[Any] = TypeAdapter(Annotated[_EVENT_UNION, Field(discriminator="kind")])


@dataclass(frozen=True)
class Frame:
    raw: bytes  # exactly as received: export writes these bytes back
    info: FrameInfo
    # every event as validated, except graph events: their ``graphcheck.summary`` (kind, step,
    # micro, n_ops, n_nodes), as the server reads a graph back from its raw frame
    events: list[dict[str, Any]]


def validate_event(ev: dict[str, Any]) -> None:
    """Raise BadFrames unless ``ev`` is one of the schema's events.  Kinds this version does
    not know (a newer minor version) are kept raw and not interpreted."""
    if ev.get("kind") not in schema.EVENT_TYPES:
        return
    try:
        _EVENT.validate_python(ev, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"][1:]) or "event"
        raise BadFrames(f"invalid {ev.get('kind')} event: {where}: {err['msg']}") from None


def _parse_line(line: bytes) -> dict[str, Any]:
    """One JSON line -> a validated event.  The fast path parses and validates in one pass in
    pydantic-core (no json.loads, no second walk over a graph's thousands of ops); anything it
    refuses takes the exact path of ``decode_frame`` + ``validate_event``, so what is accepted
    and the error messages are those of the file reader and the schema."""
    try:
        ev: dict[str, Any] = _EVENT.validate_json(line, strict=True)
        return ev
    except ValidationError:
        # not JSON, an unknown kind (kept raw), or a schema error: decide as the reader does
        return _exact_event(line)


def _exact_event(line: bytes) -> dict[str, Any]:
    """One JSON line as ``sessionfile.decode_payload`` reads it, then ``validate_event``.
    pydantic-core's parser (the fast path's) reads it first, at twice json.loads's speed on
    the long number columns of series records; what it refuses, json.loads decides."""
    try:
        ev: dict[str, Any] = pydantic_core.from_json(line)
    except ValueError:
        try:
            ev = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise SessionFileError("frame holds a record that is not JSON") from exc
    if not isinstance(ev, dict) or not isinstance(ev.get("kind"), str):
        raise SessionFileError("frame holds a record without a kind")
    validate_event(ev)
    return ev


def _event(line: bytes, flags: int) -> dict[str, Any]:
    # the header's flags say what the frame holds (check_records checks them afterwards)
    if flags & FLAG_GRAPH and (fast := graphcheck.fast_summary(line)) is not None:
        return fast
    if flags & FLAG_SERIES:
        # a series record is no schema event (the pydantic pass would only refuse it, after
        # parsing its long columns): straight to the exact path, which keeps it raw
        return _exact_event(line)
    ev = _parse_line(line)
    return graphcheck.summary(ev) if ev["kind"] == "graph" else ev


def _decode(raw: bytes, info: FrameInfo) -> list[dict[str, Any]]:
    body = decompress_payload(info, raw[FRAME_HEADER_SIZE:], raw)
    events = [_event(line, info.flags) for line in body.splitlines() if line]
    check_records(info, events)
    if b"\\ud" in body or b"\\uD" in body:  # a surrogate escape: refused alone, as the reader refuses it
        _check_unicode(body)
    return events


def _check_unicode(body: bytes) -> None:
    """A lone surrogate escape (``\\ud800``) is no text: JSON parsers let it through, the file
    reader (``sessionfile.decode_payload``) refuses it, and SQLite cannot store it."""
    for line in body.splitlines():
        if b"\\ud" in line or b"\\uD" in line:
            try:
                json.dumps(json.loads(line), ensure_ascii=False).encode()
            except UnicodeEncodeError:
                raise SessionFileError("frame holds text that is not valid Unicode") from None
            except (ValueError, RecursionError):  # parsed already; the exact path decided on it
                pass


def split_frames(body: bytes) -> list[Frame]:
    """Every frame of a body, each event validated; all or nothing (a bad frame rejects the body)."""
    frames: list[Frame] = []
    offset = 0
    while offset < len(body):
        try:
            info = parse_frame_header(body[offset : offset + FRAME_HEADER_SIZE], offset)
            end = offset + FRAME_HEADER_SIZE + info.length
            if end > len(body):
                raise SessionFileError("truncated frame")
            raw = body[offset:end]
            events = _decode(raw, info)
        except (SessionFileError, BadFrames) as exc:  # (BadFrames: an event the schema refuses)
            raise BadFrames(f"frame {len(frames)} (byte {offset}): {exc}") from None
        frames.append(Frame(raw, info, events))
        offset = end
    return frames


def file_index(path: Path) -> Readable:
    """The frames of a ``.tscope`` file on disk that can be read (``sessionfile.salvage``: a
    torn tail, or everything from a damaged frame on, dropped as the readers drop it, and
    ``Readable.note`` says so); a file with no readable frame is refused."""
    try:
        found = salvage(path)
    except SessionFileError as exc:
        raise BadFrames(str(exc)) from None
    if not found.frames:
        raise BadFrames(found.error(path.name))
    return found


def file_frames(path: Path, infos: list[FrameInfo], start: int = 0) -> Iterator[Frame]:
    """The frames of ``file_index`` from the ``start``-th on, read from disk one at a time,
    each event validated; a bad one (its checksum holds, so no damage ``salvage`` could see:
    a bad writer or a crafted file) is corruption, as for the reader."""
    for info, raw in zip(infos[start:], raw_frames(path, infos[start:]), strict=True):
        try:
            events = _decode(raw, info)
        except (SessionFileError, BadFrames) as exc:  # (BadFrames: an event the schema refuses)
            raise BadFrames(f"{path.name} is corrupt at byte {info.offset}: {exc}") from None
        yield Frame(raw, info, events)
