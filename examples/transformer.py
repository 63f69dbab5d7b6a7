"""A plain small-transformer language-model loop on synthetic tokens; torchscope is the one added line."""

import argparse

import torch
from torch import nn

import torchscope


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 64, heads: int = 4, layers: int = 2, ctx: int = 32) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        h = self.tok(idx) + self.pos[:t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--server", default="auto", help='a URL, "auto", or "none" (file only)')
    ap.add_argument("--record", default=None, help="session file path")
    ap.add_argument("--mode", default="default", choices=["default", "full", "light"])
    args = ap.parse_args()

    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torchscope.watch(model, optimizer, server=None if args.server == "none" else args.server, record=args.record, mode=args.mode)

    # a repeating pattern the model can learn: token t+1 = (t * 3 + 1) % vocab
    for _ in range(args.steps):
        start = torch.randint(0, 128, (8, 1))
        seq = [start]
        for _ in range(32):
            seq.append((seq[-1] * 3 + 1) % 128)
        tokens = torch.cat(seq, dim=1)
        x, y = tokens[:, :-1], tokens[:, 1:]
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
