# usage: owner_wait.py DIR --num_gpus N ... -- a spawn owner (TRELLIS.2 style): mp.spawns N
# processes; each writes DIR/ready.RANK, waits for DIR/go, exits 0.
import argparse
import os
import time

import torch.multiprocessing as mp


def wait_for_go(directory):
    while not os.path.exists(os.path.join(directory, "go")):
        time.sleep(0.05)


def main(local_rank, args):
    rank = args.node_rank * args.num_gpus + local_rank
    open(os.path.join(args.dir, f"ready.{rank}"), "w").close()
    wait_for_go(args.dir)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    for flag, kind in (("--num_nodes", int), ("--node_rank", int), ("--num_gpus", int)):
        parser.add_argument(flag, type=kind, default=1)
    parser.add_argument("--master_addr")
    parser.add_argument("--master_port")
    args = parser.parse_args()
    mp.spawn(main, args=(args,), nprocs=args.num_gpus, join=True)
