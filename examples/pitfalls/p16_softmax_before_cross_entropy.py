"""P16: the classifier ends in nn.Softmax and its output goes to nn.CrossEntropyLoss.

CrossEntropyLoss applies log_softmax to its input itself: given probabilities, the scores are
squashed twice, so the loss cannot fall much below log(classes) and the gradient that reaches
the model shrinks. The fix: give the loss the logits (no Softmax in the model), and apply
softmax only where probabilities are wanted, for predictions.
"""

import torch
from _common import parse_args
from torch import nn

import torchscope


def main() -> None:
    args = parse_args(__doc__)
    layers: list[nn.Module] = [nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10)]
    if not args.fixed:
        layers.append(nn.Softmax(dim=-1))  # "the model should output probabilities"
    model = nn.Sequential(*layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    torchscope.watch(model, optimizer, server=args.server, record=args.record)
    for _ in range(args.steps):
        x, y = torch.randn(32, 20), torch.randint(0, 10, (32,))
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        probs = torch.softmax(model(torch.randn(4, 20)), dim=-1) if args.fixed else model(torch.randn(4, 20))
    print(f"loss {loss.item():.4f}, predictions {probs.argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
