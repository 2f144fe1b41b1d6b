# usage: spawn_user.py OUT_DIR [fail|hang] -- calls phalanx.spawn with a function of this file;
# "fail": rank 1 raises after the all-reduce; "hang": rank 1 sleeps instead of joining it
# (--stall-timeout's stall_timeout=3); "hangwatch": the same after 5 steps, under the hang
# watch (hang_watch="floor=1,grace=20": named, then the round failed at 10x its bound).
import os
import sys
import time

import torch
import torch.distributed as dist

import phalanx


def work(local_rank, out_dir, mode):
    dist.init_process_group(os.environ["PHALANX_BACKEND"])
    for n in range(5 if mode == "hangwatch" else 0):
        phalanx.step(n)
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)
    if mode in ("hang", "hangwatch") and dist.get_rank() == 1:
        time.sleep(3600)
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.txt"), "w") as handle:
        handle.write(
            f"{local_rank} {os.environ['RANK']} {dist.get_world_size()} {value.item()} {__name__}"
        )
    if mode == "fail" and dist.get_rank() == 1:
        raise RuntimeError("rank 1 broke")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        mode = sys.argv[2] if len(sys.argv) > 2 else ""
        phalanx.spawn(
            work,
            (sys.argv[1], mode),
            num_gpus=2,
            master_port=0,
            log_dir=os.path.join(sys.argv[1], "logs"),
            stall_timeout=3 if mode == "hang" else None,
            hang_watch="floor=1,grace=20" if mode == "hangwatch" else "on",
        )
    except phalanx.JobFailed as exc:
        print(f"caught JobFailed exit_code={exc.exit_code}: {exc}", flush=True)
        sys.exit(exc.exit_code)
    print("spawn returned", flush=True)
