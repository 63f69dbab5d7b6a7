"""A training loop that logs numbers of its own with torchscope.log(), streaming to a server.
usage: server_metrics_train.py SERVER_URL|none RECORD_PATH STEPS"""

from __future__ import annotations

import sys

import torch

import torchscope


def main() -> None:
    server, record, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.watch(model, opt, server=None if server == "none" else server, record=record, name="metrics"):
        for step in range(steps):
            x = torch.randn(16, 8)
            loss = (model(x) ** 2).mean()
            torchscope.log(batch_mean=x.mean())  # a one-element tensor, inside the step
            opt.zero_grad()
            loss.backward()
            opt.step()
            # after optimizer.step(): the step that just ended
            torchscope.log(acc=step / 10, val=float("nan") if step == 3 else 1.0 / (step + 1))
            if step % 3 == 0:
                torchscope.log(every3=step, rare=True)
        torchscope.log(step=1, acc=0.5)  # logged again for step 1 later: the later value holds


if __name__ == "__main__":
    main()
