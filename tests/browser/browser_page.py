"""Headless Debian Chromium for the browser tests: the one launch recipe this machine needs,
and a page whose JavaScript errors fail the test that used it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def checked_page(width: int = 1280, height: int = 800) -> Iterator[Any]:
    """A page in a fresh Chromium; on leaving, no uncaught error may have reached it."""
    with chromium() as b:
        page = b.new_page(viewport={"width": width, "height": height})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        yield page
        assert errors == [], f"JavaScript errors: {errors}"
