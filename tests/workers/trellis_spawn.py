# TRELLIS.2's train.py, shaped as it is (ranks computed in main(), setup_dist called with the
# master address and port it was given), with mp.spawn replaced by phalanx.spawn.
# usage: trellis_spawn.py --out DIR [--crash_rank R] [--max_restarts N] <TRELLIS.2's flags>
# --crash_rank R: global rank R raises once (the first time; a marker file remembers).
import argparse
import json
import os

import torch
import torch.distributed as dist

import phalanx


def main(local_rank, cfg):
    rank = cfg.node_rank * cfg.num_gpus + local_rank
    world_size = cfg.num_nodes * cfg.num_gpus
    phalanx.setup_dist(rank, local_rank, world_size, cfg.master_addr, cfg.master_port)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    marker = os.path.join(cfg.out, f"crashed{rank}")
    if rank == cfg.crash_rank and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(f"rank {rank} crashes once")
    row = {
        "rank": rank,
        "world": world_size,
        "sum": value.item(),
        "port": os.environ["MASTER_PORT"],
        "restart": os.environ["TORCHELASTIC_RESTART_COUNT"],
    }
    with open(os.path.join(cfg.out, f"rank{rank}.json"), "w") as handle:
        json.dump(row, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--crash_rank", type=int, default=-1)
    parser.add_argument("--max_restarts", type=int, default=0)
    phalanx.add_dist_args(parser)
    cfg = parser.parse_args()
    phalanx.spawn(
        main,
        args=(cfg,),
        num_gpus=cfg.num_gpus,
        num_nodes=cfg.num_nodes,
        node_rank=cfg.node_rank,
        master_addr=cfg.master_addr,
        master_port=cfg.master_port,
        max_restarts=cfg.max_restarts,
        log_dir=os.path.join(cfg.out, f"logs{cfg.node_rank}"),
    )
