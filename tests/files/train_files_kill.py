"""A real torch training loop that records a session file and prints ``STEP n`` after each
optimizer step, so a test can SIGKILL it at a random moment and know which steps had completed.

usage: train_files_kill.py RECORD_PATH MODE [STEPS]
MODE ``watch`` uses ``torchscope.watch`` (the product path); ``transport`` drives the
``Transport`` directly with step events computed here (exercises the file layer alone).
Environment: TSCOPE_TEST_SERVER streams to that server as well; TSCOPE_TEST_STOPFILE ends
the loop (normally, with close) as soon as that file exists.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import torch

import torchscope

record, mode = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
server = os.environ.get("TSCOPE_TEST_SERVER") or None
stopfile = os.environ.get("TSCOPE_TEST_STOPFILE")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
names = [n for n, _ in model.named_parameters()]

if mode == "watch":
    handle = torchscope.watch(model, opt, server=server, record=record, name="kill-test")
else:
    from torchscope.transport import Transport

    tr = Transport(record, session_id="kill-test-sid", server=server)
    tr.emit({"kind": "session", "session_id": "kill-test-sid", "name": "kill-test", "pid": os.getpid(),
             "host": socket.gethostname(), "started_at": time.time(), "rank": 0, "world_size": 1,
             "params": [{"name": n, "module": n.rsplit(".", 1)[0]} for n in names]})

for step in range(steps):
    if stopfile and os.path.exists(stopfile):
        steps = step
        break
    x = torch.randn(64, 16)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    if mode != "watch":
        norms = [float(p.grad.norm()) for p in model.parameters() if p.grad is not None]
        tr.emit({"kind": "step", "step": step, "t": time.time(), "loss": float(loss),
                 "grads": {"norm": norms}, "memory": {"live": 1000 + step}})
    opt.step()
    # "STEP n" means: optimizer step n has fully returned (and its record was handed over)
    print(f"STEP {step}", flush=True)
    time.sleep(0.004)

if mode == "watch":
    handle.close()
else:
    tr.close({"kind": "end", "t": time.time(), "status": "finished", "steps": steps})
print("DONE", flush=True)
