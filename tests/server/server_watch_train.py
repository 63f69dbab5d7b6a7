"""A plain training script with the one added line, streaming to a given server.
usage: server_watch_train.py SERVER_URL RECORD_PATH STEPS"""

from __future__ import annotations

import sys

import torch

import torchscope


def main() -> None:
    server, record, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.watch(model, opt, server=server, record=record, name="watched"):
        for _ in range(steps):
            loss = (model(torch.randn(16, 8)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
