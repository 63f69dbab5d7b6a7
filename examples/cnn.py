"""A plain small-CNN image-classification loop on synthetic images; torchscope is the one added line."""

import argparse

import torch
from torch import nn

import torchscope


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 8 * 8, 10),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--server", default="auto", help='a URL, "auto", or "none" (file only)')
    ap.add_argument("--record", default=None, help="session file path")
    ap.add_argument("--mode", default="default", choices=["default", "full", "light"])
    args = ap.parse_args()

    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torchscope.watch(model, optimizer, server=None if args.server == "none" else args.server, record=args.record, mode=args.mode)

    # class k = a bright square at position k of a 10-cell strip: learnable in a few steps
    for _ in range(args.steps):
        labels = torch.randint(0, 10, (32,))
        images = torch.randn(32, 3, 32, 32) * 0.1
        for i, k in enumerate(labels.tolist()):
            images[i, :, 12:20, 3 * k : 3 * k + 3] += 1.0
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
