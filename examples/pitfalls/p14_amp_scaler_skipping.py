"""P14: AMP GradScaler skips every step: raw, unnormalised inputs overflow float16.

The features are prices in the tens of thousands; under float16 autocast the scaled
gradients overflow, the scaler skips the step and halves its scale, again and again: the
model never updates and nothing crashes. (float16 autocast and GradScaler("cpu") run on CPU in
recent PyTorch, so this runs anywhere.)
The fix: normalise the inputs; unscale_ before clipping.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device)
    torchscope.watch(model, optimizer, server=args.server, record=args.record, scaler=scaler)
    for _ in range(args.steps):
        prices = torch.rand(16, 32, device=device) * 1e4  # raw prices
        x = prices / 1e4 if args.fixed else prices
        y = torch.rand(16, 1, device=device)
        optimizer.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            out = model(x)
            loss = nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    print(f"scale {scaler.get_scale()}")


if __name__ == "__main__":
    main()
