"""Pydantic models of the REST API's wire contract (what OpenAPI at /docs shows).

Events themselves (StepEvent, GraphEvent, ...) are the TypedDicts of ``torchscope.schema``;
they are served as stored, not re-modelled here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from torchscope.schema import SessionStatus as Status

from .labels import MAX_NAME, MAX_TAGS


class Health(BaseModel):
    ok: bool
    version: str
    error: str | None = Field(None, description="why not ok (a 503): the store cannot take writes")


class NextSeq(BaseModel):
    next_seq: int


class SessionSummary(BaseModel):
    id: str
    name: str
    status: Status
    steps: int = Field(description="steps recorded (the most of any rank)")
    ranks: list[int]
    started_at: float | None
    updated_at: float
    tags: list[str]
    model: str | None
    errors: int = Field(description="doctor findings of severity error (last computed)")
    warnings: int
    diagnosed: bool = Field(description="whether the doctor has computed findings yet: 0 errors before it did are no verdict")
    mode: Literal["light", "default", "full"] | None = Field(
        None, description="the capture mode (rank 0's session event); null before that event arrives")


class RankInfo(BaseModel):
    rank: int
    status: Status
    steps: int
    graphs: int
    frames: int
    events: int
    bytes: int
    last_seen: float


class SessionDetail(SessionSummary):
    meta: dict[str, Any] | None = Field(description="rank 0's session event")
    rank_info: list[RankInfo]


class SessionPatch(BaseModel):
    model_config = {"extra": "forbid"}
    name: str | None = Field(None, min_length=1, max_length=MAX_NAME)
    # strings; any JSON is taken here so that the route refuses the rest in one line
    tags: list[Any] | None = Field(None, max_length=MAX_TAGS, description="strings (at most 100 characters kept)")


class GraphIndexEntry(BaseModel):
    step: int
    micro: int
    ops: int
    nodes: int
    signature: str | None


class ImportResult(BaseModel):
    id: str
    url: str
    frames: int
    new_frames: int
    rank: int
    # what of the file could not be read and was left out (a torn tail, or everything from a
    # damaged frame on), one line; null when the whole file was read
    note: str | None = None
    # its run is still writing it, on the server's host: the run reads "running" while it is
    # imported again (what `torchscope open` does until the run ends)
    writing: bool = False
    # the file carried a name or tags given on another server (a download: labels.py), given to
    # the session here -- said by `open` when nothing else of the file was new
    labeled: bool = False


class Deleted(BaseModel):
    deleted: str
