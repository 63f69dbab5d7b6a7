"""Clean: mixed precision done right (float16 autocast + GradScaler, unscale_ before clipping).

Runs on CPU (recent PyTorch has float16 autocast and GradScaler("cpu")) or CUDA. The doctor
must stay silent: an occasional skipped step while the scaler calibrates is normal.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device)
    torchscope.watch(model, optimizer, server=args.server, record=args.record, scaler=scaler)
    for _ in range(args.steps):
        x, y = torch.randn(16, 32, device=device), torch.randn(16, 1, device=device)
        optimizer.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    print(f"loss {loss.item():.4f} scale {scaler.get_scale()}")


if __name__ == "__main__":
    main()
