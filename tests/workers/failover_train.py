# usage: failover_train.py OUT_DIR STEPS [reference] -- training whose result does not depend on
# the world size or on where it resumed: every rank takes the same step on the same batch
# (seeded by the step), then rank 0's parameters are broadcast (a real Gloo collective) and
# rank 0 checkpoints atomically. A restarted run resumes from the checkpoint. At the end rank 0
# writes OUT_DIR/final.bin, the parameters' bytes; "reference" trains in one process without
# torch.distributed and writes OUT_DIR/reference.bin. OUT_DIR/steps-<restart> has a line per step
# (its number, the world size, the wall-clock time: benchmarks/store_failover.py reads it).
# Each step sleeps FAILOVER_STEP_DELAY s (0.2), time for a fault and what follows it to happen
# while the job still runs; once OUT_DIR/fast exists (a test that saw what it waited for), none:
# the steps left need not take a cut-off node's time to come back (nor 0.2 s each, s56).
import os
import sys
import time

import torch

out, steps, reference = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["reference"]
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
rank, start, snapshot = 0, 0, os.path.join(out, "snapshot.pt")
delay, fast = float(os.environ.get("FAILOVER_STEP_DELAY", "0.2")), os.path.join(out, "fast")
if not reference:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if os.path.exists(snapshot):
        state = torch.load(snapshot)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"resumed at step {start} world={dist.get_world_size()}", flush=True)
for step in range(start, steps):
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(step))
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if reference:
        continue
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    if rank == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
        torch.save(state, snapshot + ".tmp")
        os.replace(snapshot + ".tmp", snapshot)
        with open(os.path.join(out, f"steps-{os.environ['TORCHELASTIC_RESTART_COUNT']}"), "a") as f:
            f.write(f"{step} world={dist.get_world_size()} t={time.time():.6f}\n")
    if not os.path.exists(fast):
        time.sleep(delay)
if rank == 0:
    data = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    with open(os.path.join(out, "reference.bin" if reference else "final.bin"), "wb") as f:
        f.write(data)
if not reference:
    dist.destroy_process_group()
