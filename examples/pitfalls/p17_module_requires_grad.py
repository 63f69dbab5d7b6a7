"""P17: a pretrained encoder "frozen" with `model.encoder.requires_grad = False`.

nn.Module has no requires_grad flag of its own: the assignment sets a plain Python attribute and
every parameter of the encoder still requires grad, so it gets gradients and the optimizer,
built over model.parameters(), keeps training it. The fix: `model.encoder.requires_grad_(False)`
(the method, with the underscore), and an optimizer over the parameters that still train.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def main() -> None:
    args = parse_args(__doc__)
    model = Classifier()
    if args.fixed:
        model.encoder.requires_grad_(False)
    else:
        model.encoder.requires_grad = False  # meant: keep the pretrained encoder as it is
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    before = model.encoder[0].weight.detach().clone()
    for _ in range(args.steps):
        x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    moved = (model.encoder[0].weight - before).abs().max().item()
    print(f"loss {loss.item():.4f}, encoder weight moved by {moved:.2e}")


if __name__ == "__main__":
    main()
