"""P10: backward through a freed graph: the RNN's hidden state is carried over without detach.

The hidden state of batch N still points into batch N-1's graph, whose saved tensors the
previous backward freed: "Trying to backward through the graph a second time". The notebook
catches it, resets the state and goes on, so every other batch is lost.
The fix: `hidden = hidden.detach()` between batches (truncated backprop through time).
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


class CharRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(8, 16, batch_first=True)
        self.out = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        seq, hidden = self.rnn(x, hidden)
        return self.out(seq), hidden


def main() -> None:
    args = parse_args(__doc__)
    model = CharRNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    hidden = None
    for i in range(2 * args.steps):
        x, y = torch.randn(4, 10, 8), torch.randn(4, 10, 8)
        optimizer.zero_grad()
        pred, hidden = model(x, hidden)
        if args.fixed:
            hidden = hidden.detach()
        loss = nn.functional.mse_loss(pred, y)
        try:
            loss.backward()
        except RuntimeError as exc:
            print(f"batch {i} failed: {exc}")
            hidden = None  # start the sequence over
            continue
        optimizer.step()


if __name__ == "__main__":
    main()
