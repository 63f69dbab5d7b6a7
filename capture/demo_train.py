"""A small CPU training run to watch live: ``python -m torchscope.demo_train --server URL``.

``torchscope demo`` spawns it.  A tiny transformer language model learns a repeating token
pattern while an MLP regressor learns a noisy function; each step sleeps a little so the
dashboard has time to draw it.  Both models are watched (two sessions).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

# Ctrl-C in `torchscope demo` reaches this process too: while torch is still importing it ends
# it quietly (no traceback through torch's imports); main() restores KeyboardInterrupt, so a
# run interrupted later is closed by its watch as "interrupted"
if __name__ == "__main__":
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import torchscope  # noqa: E402


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, ctx: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.1, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.tok(idx) + self.pos[: idx.shape[1]]))


def main(argv: list[str] | None = None) -> None:
    if __name__ == "__main__":
        signal.signal(signal.SIGINT, signal.default_int_handler)
    ap = argparse.ArgumentParser(prog="python -m torchscope.demo_train", description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="auto", help='torchscope server URL, "auto", or "none"')
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--name", default="demo")
    ap.add_argument("--sleep", type=float, default=0.2, help="seconds to pause per step (to watch it live)")
    ap.add_argument("--record", default=None, help="session file path of the transformer run")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    server = None if args.server.lower() == "none" else args.server
    torch.manual_seed(0)
    torch.set_num_threads(1)

    lm = TinyLM()
    lm_opt = torch.optim.AdamW(lm.parameters(), lr=3e-3)
    mlp = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    mlp_opt = torch.optim.SGD(mlp.parameters(), lr=0.05, momentum=0.9)
    rec_mlp = args.record.replace(".tscope", "-mlp.tscope") if args.record else None
    with (
        torchscope.watch(lm, lm_opt, server=server, name=f"{args.name}-transformer", record=args.record),
        torchscope.watch(mlp, mlp_opt, server=server, name=f"{args.name}-mlp", record=rec_mlp),
    ):
        for step in range(args.steps):
            start = torch.randint(0, 64, (8, 1))
            seq = [start]
            for _ in range(16):
                seq.append((seq[-1] * 5 + 3) % 64)
            tokens = torch.cat(seq, dim=1)
            logits = lm(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
            lm_opt.zero_grad()
            loss.backward()
            lm_opt.step()

            x = torch.rand(32, 4) * 4 - 2
            y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.05 * torch.randn(32, 1)
            mse = nn.functional.mse_loss(mlp(x), y)
            mlp_opt.zero_grad()
            mse.backward()
            mlp_opt.step()
            if step % 20 == 0 or step == args.steps - 1:
                # one write a line: `torchscope demo` prints its URL into the same terminal
                sys.stdout.write(f"step {step}: lm loss {loss.item():.3f}, mlp loss {mse.item():.4f}\n")
                sys.stdout.flush()
            time.sleep(args.sleep)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C in `torchscope demo`: the runs are closed, no traceback
        sys.exit(130)
