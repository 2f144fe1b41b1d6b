# usage: steps_then_hang.py STEPS RANK [PIDS] -- STEPS optimizer steps on every rank, each
# followed by an all-reduce (a rhythm for the hang watch); then RANK sleeps (the hang) while
# the others wait for it in the next all-reduce. PIDS: a folder where each rank writes its pid
# to <rank>.pid at its start.
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if len(sys.argv) > 3:
    (Path(sys.argv[3]) / f"{dist.get_rank()}.pid").write_text(str(os.getpid()))
weight = torch.nn.Parameter(torch.ones(2))
optimizer = torch.optim.SGD([weight], lr=0.1)
for _ in range(int(sys.argv[1])):
    optimizer.zero_grad()
    (weight**2).sum().backward()
    optimizer.step()
    dist.all_reduce(torch.ones(1))
    time.sleep(0.05)
if dist.get_rank() == int(sys.argv[2]):
    time.sleep(3600)  # the hang
dist.all_reduce(torch.ones(1))
