"""``phalanx.preempted()``: whether the job is being preempted, the same answer on every rank.

With the default process group initialized it is a collective (an ``all_reduce`` MAX of
each rank's flag, on the group's device: a CPU tensor for Gloo, the current CUDA device for
NCCL), so every rank must call it at the same point of the loop, and all get True at the
same call: the checkpoint they then save is of one step. Without a process group it is
this process's own flag. The flag is the agent's notice (``phalanx.worker.preempt``).
"""

from __future__ import annotations

import sys

from phalanx.worker import preempt


def preempted() -> bool:
    """True once the job's scheduler asked it to stop (``--preempt-signals``): save a
    checkpoint and exit 0 within ``--preempt-grace``; phalanx then exits 75 (requeue)."""
    local = preempt.noticed()
    if "torch.distributed" not in sys.modules:  # no torch.distributed: no process group
        return local
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return local
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
