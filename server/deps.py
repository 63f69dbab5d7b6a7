"""Named dependencies, so each route reads like its specification."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request

from .config import Settings
from .live import LiveHub
from .store import Store

# Session ids are ours or the capture's: letters, digits and a few separators, never a path.
SESSION_ID_PATTERN = r"^[A-Za-z0-9._:@+=-]{1,200}$"


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
SessionId = Annotated[str, Path(pattern=SESSION_ID_PATTERN)]
Rank = Annotated[int, Path(ge=0, le=65535)]


def require_session(store: Store, session_id: str) -> None:
    if not store.exists(session_id):
        raise HTTPException(404, f"no session {session_id!r}")
