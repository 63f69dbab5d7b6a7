"""Correct training loops the doctor once flagged (QA round 18), each with the real bug it must
still report: --variant picks one.  Run by tests/doctor/test_doctor_false_alarms.py with --record; by
hand: `python tests/doctor/false_alarm_runs.py --variant fp16_scaler --record /tmp/x.tscope --steps 30`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import torchscope


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    parser.add_argument("--record", default=None, metavar="PATH")
    parser.add_argument("--server", default="none", metavar="URL|none")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    args.server = None if args.server.lower() == "none" else args.server
    return args


# --- P14 / P2: float16 autocast with a GradScaler, by the documented recipe
def _amp(args: argparse.Namespace, *, scale_inputs: float = 1.0, dead_relu: bool = False,
         corrupt_from: int | None = None) -> None:
    """scaler.scale(loss).backward(); unscale_; clip_grad_norm_; scaler.step; scaler.update.
    A sum-reduced loss overflows float16 at the GradScaler's initial scale of 65536: it skips the
    first steps while it lowers the scale, then steps steadily."""
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4))
    if dead_relu:  # BUG: a bias so negative that no ReLU ever fires: layer 0 never learns
        nn.init.constant_(model[0].bias, -100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    torchscope.watch(model, opt, server=args.server, record=args.record, scaler=scaler)
    for step in range(args.steps):
        x = torch.randn(64, 32) * scale_inputs
        y = x[:, :4].argmax(1)
        if corrupt_from is not None and step >= corrupt_from and step % 3 == 0:
            x[0, 0] = float("inf")  # BUG: a corrupt sample every third batch: those steps overflow
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y, reduction="sum")
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    print(f"scale {scaler.get_scale()}")


def fp16_scaler_sum(args: argparse.Namespace) -> None:
    _amp(args)


def fp16_scaler(args: argparse.Namespace) -> None:
    """Larger inputs: a longer calibration, one more skip after a first stepped step."""
    _amp(args, scale_inputs=30.0)


def fp16_dead_relu(args: argparse.Namespace) -> None:
    _amp(args, dead_relu=True)


def fp16_corrupt_batches(args: argparse.Namespace) -> None:
    _amp(args, corrupt_from=12)


# --- P11: batch-norm statistics frozen while fine-tuning
def _bn_finetune(args: argparse.Namespace, each_step: Callable[[nn.Module, int], None]) -> None:
    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten())
    model = nn.Sequential(backbone, nn.Dropout(0.1), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    torchscope.watch(model, opt, server=args.server, record=args.record)
    for step in range(args.steps):
        each_step(model, step)
        x, y = torch.randn(8, 3, 12, 12), torch.randint(0, 4, (8,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"loss {loss.item():.4f}")


def _eval_if(kinds: tuple[type[nn.Module], ...]) -> Callable[[nn.Module], None]:
    def freeze(m: nn.Module) -> None:
        if isinstance(m, kinds):
            m.eval()
    return freeze


def frozen_bn(args: argparse.Namespace) -> None:
    """mmdetection's norm_eval=True: model.train(), then the batch-norm layers back in eval."""
    def each_step(model: nn.Module, step: int) -> None:
        model.train()
        model.apply(_eval_if((nn.BatchNorm2d,)))
    _bn_finetune(args, each_step)


def frozen_bn_and_dropout(args: argparse.Namespace) -> None:
    """BUG: the freeze catches the dropout too: it is off while training."""
    def each_step(model: nn.Module, step: int) -> None:
        model.train()
        model.apply(_eval_if((nn.BatchNorm2d, nn.Dropout)))
    _bn_finetune(args, each_step)


def backbone_left_in_eval(args: argparse.Namespace) -> None:
    """BUG: a feature check after step 4 puts the backbone (its batch-norm layers) in eval and
    never back: only from then on, not by the loop from the start."""
    def each_step(model: nn.Module, step: int) -> None:
        if step == 5:
            model[0].eval()
            with torch.no_grad():
                model[0](torch.randn(4, 3, 12, 12))
    _bn_finetune(args, each_step)


# --- P4: a non-finite learning rate
BASE_LR = 3e-3


def _lr_run(args: argparse.Namespace, factor: Callable[[int], float], *, by_scheduler: bool = False,
            nan_batch: int | None = None) -> None:
    """The learning rate is BASE_LR * factor(step): set by hand before each step, as warm-up code
    does, or by a LambdaLR stepped after optimizer.step()."""
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor) if by_scheduler else None
    torchscope.watch(model, opt, server=args.server, record=args.record)
    for step in range(args.steps):
        x = torch.randn(32, 16)
        y = x[:, :4].argmax(1)
        if step == nan_batch:
            x[3, 5] = float("nan")  # BUG: a corrupt sample
        loss = F.cross_entropy(model(x), y)
        if scheduler is None:
            for group in opt.param_groups:
                group["lr"] = BASE_LR * factor(step)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
    print(f"loss {loss.item()}")


def _ratio(a: float, b: float) -> float:
    """a / b as tensors compute it: 0/0 is NaN, not ZeroDivisionError."""
    return (torch.tensor(float(a)) / torch.tensor(float(b))).item()


def nan_lr_warmup(args: argparse.Namespace) -> None:
    """BUG: warm-up as step / step: 0/0 = NaN at step 0."""
    _lr_run(args, lambda step: _ratio(step, step))


def nan_lr_decay(args: argparse.Namespace) -> None:
    """BUG: a LambdaLR decaying linearly from step 10 over decay_steps, configured as 0: 0/0 = NaN
    at step 10."""
    warmup, decay_steps = 10, 0
    _lr_run(args, lambda step: 1.0 if step < warmup else 1 - _ratio(step - warmup, decay_steps), by_scheduler=True)


def nan_batch(args: argparse.Namespace) -> None:
    """BUG: a NaN in the data at step 5; the learning rate is fine."""
    _lr_run(args, lambda step: 1.0, nan_batch=5)


# --- P2: a layer pruned by torch.nn.utils.prune (QA round 26): its weight_orig's gradient is
# zero wherever the mask is -- 99% of it at 99% pruning -- which is no dead branch
def _pruned(args: argparse.Namespace, *, dead_relu: bool) -> None:
    import torch.nn.utils.prune as prune

    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    prune.l1_unstructured(model[2], name="weight", amount=0.99)
    if dead_relu:  # BUG: no ReLU after layer 0 ever fires: layer 0 never learns
        nn.init.constant_(model[0].bias, -100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torchscope.watch(model, opt, server=args.server, record=args.record)
    x_all = torch.randn(300, 20)
    for _ in range(args.steps):
        x = x_all[torch.randint(0, 300, (32,))]
        opt.zero_grad()
        loss = F.cross_entropy(model(x), x[:, :4].argmax(1))
        loss.backward()
        opt.step()


def pruned(args: argparse.Namespace) -> None:
    _pruned(args, dead_relu=False)


def pruned_dead_relu(args: argparse.Namespace) -> None:
    _pruned(args, dead_relu=True)


# --- P2: a WGAN-GP critic (QA round 27): its step's module-output gradients are those of the
# gradient penalty's forward D(x_hat), whose double backward leaves exact zeros at the
# LeakyReLU's input, while every weight of the critic learns
def wgan_gp(args: argparse.Namespace) -> None:
    critic = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    gen = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.9))
    torchscope.watch(critic, opt, server=args.server, record=args.record, sample_every=4)
    for _ in range(args.steps):
        real = torch.randn(16, 2) * 0.5 + 1.0
        with torch.no_grad():
            fake = gen(torch.randn(16, 8))
        eps = torch.rand(16, 1)
        x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
        (grad,) = torch.autograd.grad(critic(x_hat).sum(), x_hat, create_graph=True)
        penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
        loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
        opt.zero_grad()
        loss.backward()
        opt.step()


VARIANTS: dict[str, Callable[[argparse.Namespace], None]] = {f.__name__: f for f in [
    fp16_scaler_sum, fp16_scaler, fp16_dead_relu, fp16_corrupt_batches,
    frozen_bn, frozen_bn_and_dropout, backbone_left_in_eval,
    nan_lr_warmup, nan_lr_decay, nan_batch, pruned, pruned_dead_relu, wgan_gp,
]}

if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the tests run several side by side
    cli = _args()
    VARIANTS[cli.variant](cli)
