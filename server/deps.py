"""Named dependencies, so each route reads like its specification."""

from __future__ import annotations

import re
from typing import Annotated, TypeGuard

from fastapi import Depends, HTTPException, Path, Request
from pydantic import AfterValidator

from .config import Settings
from .live import LiveHub
from .store import Store

# Session ids are ours or the capture's: letters, digits and a few separators, never a path --
# nor dots alone (``valid_session_id``): "." and ".." are steps of a path, which browsers and
# curl resolve away, so a session named so could be neither opened nor deleted (QA 53b).  The
# pattern is checked in Rust (pydantic), which has no look-ahead: the dots are checked apart.
SESSION_ID_PATTERN = r"^[A-Za-z0-9._:@+=-]{1,200}$"
_SESSION_ID = re.compile(SESSION_ID_PATTERN)
DOTS_ALONE = "a session id cannot be dots alone ('.' and '..' are steps of a path)"


def valid_session_id(text: object) -> TypeGuard[str]:
    """Whether ``text`` is a session id the routes take (``SessionId``)."""
    return isinstance(text, str) and _SESSION_ID.fullmatch(text) is not None and text.strip(".") != ""


def _not_dots_alone(text: str) -> str:
    if not text.strip("."):
        raise ValueError(DOTS_ALONE)
    return text


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def get_hub(request: Request) -> LiveHub:
    hub: LiveHub = request.app.state.hub
    return hub


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


StoreDep = Annotated[Store, Depends(get_store)]
HubDep = Annotated[LiveHub, Depends(get_hub)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionId = Annotated[str, Path(pattern=SESSION_ID_PATTERN), AfterValidator(_not_dots_alone)]
Rank = Annotated[int, Path(ge=0, le=65535)]


def require_session(store: Store, session_id: str) -> None:
    if not store.exists(session_id):
        raise HTTPException(404, f"no session {session_id!r}")
