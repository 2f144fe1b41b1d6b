# A TRELLIS.2-style program that owns its launch: parses the node flags, mp.spawns one
# process per "GPU", each joins a Gloo group and all-reduces. With --pid_dir the workers
# record their pids and sleep (to test that phalanx cleans up the whole tree).
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(local_rank, args):
    rank = args.node_rank * args.num_gpus + local_rank
    world_size = args.num_nodes * args.num_gpus
    os.environ.update(MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    row = {"rank": rank, "world": world_size, "sum": value.item(), "has_RANK": "RANK" in os.environ}
    os.write(1, (json.dumps(row) + "\n").encode())  # one write: two processes share the pipe
    if args.pid_dir:
        with open(os.path.join(args.pid_dir, f"spawned{rank}.pid"), "w") as handle:
            handle.write(str(os.getpid()))
        time.sleep(300)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid_dir", default="")
    for flag, kind, default in (
        ("--num_nodes", int, 1),
        ("--node_rank", int, 0),
        ("--num_gpus", int, 1),
        ("--master_addr", str, "localhost"),
        ("--master_port", str, "12345"),
    ):
        parser.add_argument(flag, type=kind, default=default)
    args = parser.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.num_gpus, join=True)
