"""A plain MLP training loop on synthetic data; torchscope is the one added line."""

import argparse

import torch
from torch import nn

import torchscope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--server", default="auto", help='a URL, "auto", or "none" (file only)')
    ap.add_argument("--record", default=None, help="session file path")
    ap.add_argument("--mode", default="default", choices=["default", "full", "light"])
    args = ap.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    torchscope.watch(model, optimizer, server=None if args.server == "none" else args.server, record=args.record, mode=args.mode)

    w_true = torch.randn(32, 4)
    for _ in range(args.steps):
        x = torch.randn(64, 32)
        y = (x @ w_true).argmax(dim=1)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
