"""Regenerate the README's pictures from real runs: `python scripts/screenshots.py`.

Starts a real `torchscope serve` on a free port, records examples/transformer.py and the P1
pitfall reproducer into it, and photographs each view with headless Chromium into
docs/images/.  Development aid only (not part of the tests).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "images"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def main() -> None:
    # a --help that runs the whole script would overwrite the tracked pictures: parse first
    argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=f"Writes its PNGs into {OUT}.").parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        srv = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port),
                                "--data", tmp, "--quiet"])
        try:
            for _ in range(300):
                try:
                    _get(url + "/api/health")
                    break
                except OSError:
                    time.sleep(0.1)
            runs = [(REPO / "examples" / "transformer.py", ["--steps", "60"]),
                    (REPO / "examples" / "pitfalls" / "p01_no_grad_detach.py", [])]
            for script, extra in runs:
                subprocess.run([sys.executable, str(script), "--server", url,
                                "--record", f"{tmp}/{script.stem}.tscope", *extra], check=True)
            time.sleep(1.0)
            listed = _get(url + "/api/sessions")
            assert isinstance(listed, list)
            lm = next(s["id"] for s in listed if s["model"] == "TinyLM")  # examples/transformer.py
            p1 = next(s["id"] for s in listed if s["id"] != lm)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(url + "/")
                page.wait_for_timeout(1500)
                page.screenshot(path=str(OUT / "sessions.png"))
                for view, name in [("graph", "graph"), ("memory", "memory"), ("gradients", "gradients")]:
                    page.goto(f"{url}/sessions/{lm}?view={view}")
                    page.wait_for_function("window.__torchscope && window.__torchscope.ready")
                    if view == "graph":
                        page.wait_for_function("(() => { const g = window.__torchscope.state().graph;"
                                               " return g && g.nodes.length > 0; })()")
                        page.evaluate("window.__torchscope.expand('blocks')")
                        page.evaluate("window.__torchscope.expand('blocks.layers')")
                        page.evaluate("window.__torchscope.expand('blocks.layers.0')")
                    page.wait_for_timeout(2000)
                    page.screenshot(path=str(OUT / f"{name}.png"))
                page.goto(f"{url}/sessions/{p1}?view=diagnostics")
                page.wait_for_function("window.__torchscope && window.__torchscope.ready")
                page.wait_for_timeout(4000)
                page.screenshot(path=str(OUT / "doctor.png"))
                page.click("button.finding[data-code=P1]")
                page.wait_for_timeout(2000)
                page.screenshot(path=str(OUT / "doctor-graph.png"))
                browser.close()
        finally:
            srv.terminate()
            srv.wait(10)
    print(f"wrote {sorted(p.name for p in OUT.glob('*.png'))}")


if __name__ == "__main__":
    main()
