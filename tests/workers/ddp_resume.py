# usage: ddp_resume.py OUT_DIR crash|clean -- deterministic 2-rank DDP training for 6 epochs.
# Rank 0 snapshots after every epoch; with "crash", rank 1 SIGKILLs itself in epoch 3 of the
# first attempt. A restarted run resumes from the snapshot and must end bit-identical.
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

out_dir, mode = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
snapshot, start = os.path.join(out_dir, "snapshot.pt"), 0
if os.path.exists(snapshot):
    state = torch.load(snapshot)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["epoch"]
    print(f"resumed at epoch {start}", flush=True)
ddp = DistributedDataParallel(model)
for epoch in range(start, 6):
    generator = torch.Generator().manual_seed(1000 * epoch + rank)
    for _ in range(5):
        x = torch.randn(16, 8, generator=generator)
        loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if (
        mode == "crash"
        and epoch == 3
        and rank == 1
        and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    ):
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch + 1,
        }
        torch.save(state, snapshot + ".tmp")
        os.replace(snapshot + ".tmp", snapshot)
    dist.barrier()
if rank == 0:
    torch.save(model.state_dict(), os.path.join(out_dir, "final.pt"))
dist.destroy_process_group()
