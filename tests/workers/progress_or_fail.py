# usage: progress_or_fail.py DIR EVIDENCE -- every attempt, rank 0 shows EVIDENCE of progress
# (checkpoint: a phalanx.checkpoint save; optimizer: 3 optimizer steps; step: phalanx.step;
# heartbeat: phalanx.heartbeat; none: nothing; laststep: a LastStep held at step 7, which
# the agent's stop asks it to write), then writes DIR/shown.<restart>; the last rank waits for that file and
# exits 3, the same way every time. Rank 0 then sleeps until phalanx stops it. With "gate"
# after EVIDENCE, the last rank of the first attempt also waits for DIR/go before it fails.
import os
import sys
import time
from pathlib import Path

import phalanx

folder, evidence = Path(sys.argv[1]), sys.argv[2]
rank, last = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]) - 1
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
shown = folder / f"shown.{restart}"
if rank == 0:
    if evidence == "laststep":
        import torch

        from phalanx import checkpoint

        last = checkpoint.LastStep(folder / "ckpt")
        last.update(7, {"w": torch.ones(2)})
    elif evidence == "checkpoint":
        from phalanx import checkpoint

        checkpoint.save({"restart": restart}, folder / "ckpt", step=restart)
    elif evidence == "optimizer":
        import torch

        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
    elif evidence == "step":
        for n in range(3):
            phalanx.step(n)
    elif evidence == "heartbeat":
        phalanx.heartbeat()
    shown.touch()
if rank == last:
    deadline = time.monotonic() + 60
    while not shown.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    gate = folder / "go" if sys.argv[3:] == ["gate"] and restart == 0 else shown
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"rank {rank} fails the same way", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(300)
