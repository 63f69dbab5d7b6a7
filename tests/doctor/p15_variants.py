"""Gradient accumulation written the ways real training loops write it, right and wrong (P15).

One script, one loop: --variant picks how each optimizer step's K micro-batches of B samples
become gradients.  Run by tests/doctor/test_doctor_p15_variants.py with --record; by hand:
`python tests/doctor/p15_variants.py --variant chunk_sum --record /tmp/x.tscope`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import torchscope

K, B = 4, 8  # micro-batches per optimizer step, samples per micro-batch

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
mse = nn.MSELoss()
mse_sum = nn.MSELoss(reduction="sum")
mse_none = nn.MSELoss(reduction="none")


V, T = 50, 6  # a language model's vocabulary and sequence length (the tokens_* variants train lm)
lm = nn.Sequential(nn.Embedding(V, 16), nn.Linear(16, V))


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """K * B sequences of T tokens and their next tokens, as a data loader of text hands them over."""
    seq = torch.randint(0, V, (K * B, T + 1))
    return seq[:, :-1], seq[:, 1:]


def _token_loss_sum(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(lm(inputs).reshape(-1, V), targets.reshape(-1), reduction="sum")


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """The batch as a data loader of 8-bit images hands it over."""
    return ((x.clamp(-2, 2) + 2) * 63).to(torch.uint8)


# --- wrong: the gradient of one optimizer step is K times the batch's mean loss's

def chunk_sum(x: torch.Tensor, y: torch.Tensor) -> None:
    loss = sum(mse(model(xc), yc) for xc, yc in zip(x.chunk(K), y.chunk(K), strict=True))
    loss.backward()  # type: ignore[union-attr]


def chunk_stack_sum(x: torch.Tensor, y: torch.Tensor) -> None:
    losses = [mse(model(xc), yc) for xc, yc in zip(x.split(B), y.split(B), strict=True)]
    torch.stack(losses).sum().backward()


def chunk_outputs_first(x: torch.Tensor, y: torch.Tensor) -> None:
    """All forwards first, then the losses (a loop that keeps the outputs for a metric)."""
    outs = [model(x[i * B:(i + 1) * B]) for i in range(K)]
    loss = torch.zeros(())
    for i, out in enumerate(outs):
        loss = loss + mse(out, y[i * B:(i + 1) * B])
    loss.backward()


def chunk_of_pixels(x: torch.Tensor, y: torch.Tensor) -> None:
    """Cross-entropy over slices of a uint8 batch, converted to float outside the model."""
    labels = y.argmax(dim=1)
    images = _pixels(x)
    loss = sum(nn.functional.cross_entropy(model(xc.float() / 255), yc)
               for xc, yc in zip(images.chunk(K), labels.chunk(K), strict=True))
    loss.backward()  # type: ignore[union-attr]


def mean_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        mse(model(xb), yb).backward()


class _SquaredError(torch.autograd.Function):
    """A loss written by hand as its own autograd Function: its node records no reduction."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(out - target)
        return (out - target).pow(2).mean()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (diff,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad * 2 * diff / diff.numel(), None


def custom_function_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        _SquaredError.apply(model(xb), yb).backward()


def label_smoothing_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    """Label smoothing weights two terms inside cross_entropy ((1 - e) * nll + e * smooth):
    weights, not a division by K."""
    for xb, yb in zip(x.chunk(K), y.argmax(1).chunk(K), strict=True):
        nn.functional.cross_entropy(model(xb), yb, label_smoothing=0.1).backward()


def weighted_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        (2.0 * mse(model(xb), yb)).backward()


def weighted_average_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    """Two losses averaged with weights summing to 1: the weights are no division by K."""
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        out = model(xb)
        (0.5 * mse(out, yb) + 0.5 * F.l1_loss(out, yb)).backward()


def distillation_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    """Hinton's distillation loss: alpha times the batchmean KL to a teacher's soft targets
    (a sum divided by the micro-batch size) plus (1 - alpha) times the mean loss, not / K."""
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        out = model(xb)
        kd = F.kl_div(F.log_softmax(out / 2, 1), F.softmax(yb / 2, 1), reduction="batchmean") * 4
        (0.9 * kd + 0.1 * F.cross_entropy(out, yb.argmax(1))).backward()


def adam_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    """Under Adam (main() picks it for adam_*): k times the gradients, about the same step."""
    mean_not_divided(x, y)


def adam_clip_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    """Under Adam with clipping: the clip sees k times the norm."""
    mean_not_divided(x, y)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)


# a sum over each micro-batch's samples divided by the micro-batch's size: a mean over the micro-batch

def sum_divided_by_micro_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        (mse_sum(model(xb), yb) / B).backward()


def sum_times_inverse_micro_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        (mse_sum(model(xb), yb) * (1 / len(xb))).backward()


def explicit_sum_divided_by_micro_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        (mse_none(model(xb), yb).sum() / xb.shape[0]).backward()


def tokens_divided_by_micro_batch_tokens(x: torch.Tensor, y: torch.Tensor) -> None:
    """A language model's summed token losses divided by the micro-batch's token count (B * T)."""
    inputs, targets = _tokens()
    for ib, tb in zip(inputs.chunk(K), targets.chunk(K), strict=True):
        (_token_loss_sum(ib, tb) / tb.numel()).backward()


def chunk_sum_divided_by_micro_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    loss = sum(mse_sum(model(xc), yc) / B for xc, yc in zip(x.chunk(K), y.chunk(K), strict=True))
    loss.backward()  # type: ignore[union-attr]


# under a GradScaler (main() makes one for scaler_*): scaler.scale(loss) multiplies by a tensor,
# which tells nothing of whether the loss it scales was divided

def scaler_not_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        scaler.scale(mse(model(xb), yb)).backward()


def scaler_chunk_sum(x: torch.Tensor, y: torch.Tensor) -> None:
    scaler.scale(sum(mse(model(xc), yc) for xc, yc in zip(x.chunk(K), y.chunk(K), strict=True))).backward()


# --- right: the gradient of the batch's mean loss (or of the sum the learning rate was chosen for)

def chunk_sum_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    loss = sum(mse(model(xc), yc) for xc, yc in zip(x.chunk(K), y.chunk(K), strict=True)) / K
    loss.backward()


def chunk_stack_mean(x: torch.Tensor, y: torch.Tensor) -> None:
    torch.stack([mse(model(xc), yc) for xc, yc in zip(x.chunk(K), y.chunk(K), strict=True)]).mean().backward()


def mean_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        (mse(model(xb), yb) / K).backward()


def label_smoothing_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.argmax(1).chunk(K), strict=True):
        (nn.functional.cross_entropy(model(xb), yb, label_smoothing=0.1) / K).backward()


def sum_divided_by_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        (mse_sum(model(xb), yb) / (K * B)).backward()


def sum_scaled_by_full_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    """Divided by the size of the batch the micro-batches were sliced from."""
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        (mse_sum(model(xb), yb) * (1 / len(x))).backward()


def tokens_divided_by_batch_tokens(x: torch.Tensor, y: torch.Tensor) -> None:
    """Divided by the whole batch's token count (K * B * T): its mean token loss."""
    inputs, targets = _tokens()
    for ib, tb in zip(inputs.chunk(K), targets.chunk(K), strict=True):
        (_token_loss_sum(ib, tb) / (K * tb.numel())).backward()


def scaler_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        scaler.scale(mse(model(xb), yb) / K).backward()


def weighted_average_divided(x: torch.Tensor, y: torch.Tensor) -> None:
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        out = model(xb)
        ((0.5 * mse(out, yb) + 0.5 * F.l1_loss(out, yb)) / K).backward()


def sum_reduction(x: torch.Tensor, y: torch.Tensor) -> None:
    """reduction='sum' with a learning rate chosen for it: K micro-batch sums are the batch's sum."""
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        mse_sum(model(xb), yb).backward()


def explicit_sum(x: torch.Tensor, y: torch.Tensor) -> None:
    """A loss summed over samples on purpose (with a learning rate to match): K micro-batch sums
    are the batch's sum."""
    for xb, yb in zip(x.chunk(K), y.chunk(K), strict=True):
        mse_none(model(xb), yb).sum().backward()


def chunk_explicit_sum(x: torch.Tensor, y: torch.Tensor) -> None:
    loss = sum(mse_none(model(xc), yc).sum() for xc, yc in zip(x.chunk(K), y.chunk(K), strict=True))
    loss.backward()  # type: ignore[union-attr]


def two_datasets(x: torch.Tensor, y: torch.Tensor) -> None:
    """Two tasks' batches, each its own tensor: a sum of two objectives, not of slices of one batch."""
    other_x, other_y = torch.randn(B, 16), torch.randn(B, 3)
    (mse(model(x[:B]), y[:B]) + mse(model(other_x), other_y)).backward()


def two_views(x: torch.Tensor, y: torch.Tensor) -> None:
    """Paired views of each sample stored side by side ([N, 2, 16]): one loss per view, not per slice."""
    pairs = torch.stack([x[:B], x[B:2 * B]], dim=1)
    (mse(model(pairs[:, 0]), y[:B]) + mse(model(pairs[:, 1]), y[:B])).backward()


VARIANTS: dict[str, Callable[[torch.Tensor, torch.Tensor], None]] = {
    f.__name__: f for f in (chunk_sum, chunk_stack_sum, chunk_outputs_first, chunk_of_pixels, mean_not_divided,
                            custom_function_not_divided, sum_divided_by_micro_batch, sum_times_inverse_micro_batch,
                            explicit_sum_divided_by_micro_batch, chunk_sum_divided_by_micro_batch,
                            chunk_sum_divided, chunk_stack_mean, mean_divided, sum_divided_by_batch,
                            sum_scaled_by_full_batch, sum_reduction, explicit_sum, chunk_explicit_sum,
                            two_datasets, two_views, label_smoothing_not_divided, weighted_not_divided,
                            adam_not_divided, adam_clip_not_divided, label_smoothing_divided,
                            tokens_divided_by_micro_batch_tokens, tokens_divided_by_batch_tokens,
                            scaler_not_divided, scaler_chunk_sum, scaler_divided, weighted_average_not_divided,
                            distillation_not_divided, weighted_average_divided)
}
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--record", required=True, metavar="PATH")
    parser.add_argument("--server", default="none", help="accepted for doctor_runs.record; always none")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--mode", default="default", choices=["light", "default", "full"])
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the tests run several of these side by side
    net = lm if args.variant.startswith("tokens") else model
    optimizer = (torch.optim.Adam(net.parameters(), lr=1e-3) if args.variant.startswith("adam")
                 else torch.optim.SGD(net.parameters(), lr=0.01))
    train = VARIANTS[args.variant]
    with torchscope.watch(net, optimizer, server=None, record=args.record, mode=args.mode):
        for _ in range(args.steps):
            x, y = torch.randn(K * B, 16), torch.randn(K * B, 3)
            optimizer.zero_grad()
            train(x, y)
            if args.variant.startswith("scaler"):
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()


if __name__ == "__main__":
    main()
