"""P9: a gradient penalty computed from ``torch.autograd.grad`` without ``create_graph=True``.

WGAN-GP's ``((g.norm(2, dim=1) - 1) ** 2).mean()``, R1's ``g.pow(2).sum()``, a Jacobian or
input-gradient norm regulariser: the gradient is taken of the critic's output for its input,
and the penalty made of it must itself be differentiated, through that gradient, back to the
weights.  Without ``create_graph=True`` the gradient is a plain tensor with no graph, the
penalty a constant, and ``loss + 10 * gp`` trains exactly as ``loss`` does -- no error, no
warning, the penalty's value logged as if it worked.  The capture follows such a gradient
through the loop's calls to where a one-value penalty made of it joins a one-value loss with a
graph (``events[{what: "grad_constant", grad_src, src}]``).
"""

from __future__ import annotations

from torchscope.schema import Finding

from ..finding import describe_steps, make
from ..run import Run, notes
from ..settings import Settings

FIX = ("Pass create_graph=True to torch.autograd.grad (grad = torch.autograd.grad(out, x, "
       "grad_outputs=torch.ones_like(out), create_graph=True)[0]): the penalty is then differentiated through the "
       "gradient, back to the weights. If the term is only logged, add its .item() to your logs, not to the loss.")


def check(run: Run, settings: Settings) -> list[Finding]:
    found: dict[tuple[str, str], list[int]] = {}
    for step, ev in run.step_events():
        for e in notes(ev, "grad_constant"):
            found.setdefault((str(e.get("grad_src", "")), str(e.get("src", ""))), []).append(step)
    findings: list[Finding] = []
    for (grad_src, src), steps in found.items():
        at = f" at {grad_src}" if grad_src else ""
        message = (f"torch.autograd.grad{at} ran without create_graph=True, so the gradient it returned has no graph: "
                   f"the penalty made from it joins the loss{f' at {src}' if src else ''} as a constant and trains "
                   f"nothing ({describe_steps(steps, run.last_step)}). The loss's value includes it; its gradients "
                   "do not.")
        findings.append(make("P9", "error", message, FIX, steps, rank=run.rank, src=grad_src or src or None,
                             view="gradients", title="Gradient penalty without create_graph"))
    return findings
