# usage: spawn_user.py OUT_DIR [fail] -- calls phalanx.spawn with a function of this file.
import os
import sys

import torch
import torch.distributed as dist

import phalanx


def work(local_rank, out_dir, fail):
    dist.init_process_group(os.environ["PHALANX_BACKEND"])
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.txt"), "w") as handle:
        handle.write(
            f"{local_rank} {os.environ['RANK']} {dist.get_world_size()} {value.item()} {__name__}"
        )
    if fail and dist.get_rank() == 1:
        raise RuntimeError("rank 1 broke")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        phalanx.spawn(work, (sys.argv[1], len(sys.argv) > 2), num_gpus=2, master_port=0)
    except phalanx.JobFailed as exc:
        print(f"caught JobFailed exit_code={exc.exit_code}: {exc}", flush=True)
        sys.exit(exc.exit_code)
    print("spawn returned", flush=True)
