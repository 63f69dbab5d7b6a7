"""Command line shared by the pitfall reproducers: --record, --server, --fixed, --steps."""

from __future__ import annotations

import argparse

import torch


def parse_args(doc: str | None, steps: int = 8) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("--record", default=None, metavar="PATH", help="write the session to this .tscope file")
    parser.add_argument("--server", default="none", metavar="URL|none", help="torchscope server to stream to")
    parser.add_argument("--fixed", action="store_true", help="run the corrected version")
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps to run")
    args = parser.parse_args()
    if args.server.lower() == "none":
        args.server = None  # watch(server=None): record to the file only
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the tests run many reproducers side by side
    return args
