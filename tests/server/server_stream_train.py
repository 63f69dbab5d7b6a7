"""A real torch training loop streaming to a server through torchscope's Transport.

Used by the real-server tests (until/alongside ``torchscope.watch``): it records the same
kinds of events the capture does, with gradient norms computed by plain PyTorch.
usage: server_stream_train.py FILE SERVER_URL SESSION_ID STEPS STEP_SECONDS [STOP_FILE]
With STOP_FILE it trains until that file exists (at least STEPS steps), so a test decides
when the run ends.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from torchscope.transport import Transport


def main() -> None:
    path, server, session_id, steps, pause = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    names = [n for n, _ in model.named_parameters()]
    tr = Transport(path, session_id, rank=0, server=server, flush_interval=0.1)
    tr.emit({"kind": "session", "schema": [1, 0], "session_id": session_id, "name": "stream", "rank": 0,
             "world_size": 1, "model": "Sequential", "started_at": time.time(),
             "params": [{"name": n, "module": n.rsplit(".", 1)[0]} for n in names]})
    stop_file = sys.argv[6] if len(sys.argv) > 6 else None
    step = 0
    while step < steps or (stop_file and not os.path.exists(stop_file)):
        x = torch.randn(32, 8)
        loss = (model(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        norms = [float(p.grad.norm()) for p in model.parameters() if p.grad is not None]
        opt.step()
        if step % 10 == 0:
            tr.emit({"kind": "graph", "step": step, "rank": 0, "micro": 0, "complete": True,
                     "ops": [{"id": i, "name": "aten::addmm", "module": "0" if i == 0 else "2"} for i in range(2)],
                     "nodes": [], "edges": []})
        tr.emit({"kind": "step", "step": step, "rank": 0, "t": time.time(), "loss": loss.item(),
                 "graph_captured": step % 10 == 0, "grads": {"norm": norms},
                 "memory": {"live": 1000 + step}})
        time.sleep(pause)
        step += 1
    tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": step})
    print(f"sent_seq={tr.sent_seq} frames={tr.writer.seq}", flush=True)


if __name__ == "__main__":
    main()
