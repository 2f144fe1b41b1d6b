# usage: optim_then_hang.py MARKER STEPS -- a plain training loop (no phalanx call): STEPS
# optimizer steps, then MARKER is written and the script hangs (sleeps) until stopped.
import sys
import time

import torch

marker, steps = sys.argv[1], int(sys.argv[2])
weight = torch.nn.Parameter(torch.ones(2))
optimizer = torch.optim.SGD([weight], lr=0.1)
for _ in range(steps):
    optimizer.zero_grad()
    (weight**2).sum().backward()
    optimizer.step()
open(marker, "w").close()
time.sleep(3600)
