# TRELLIS.2's train.py parser as it is (it defines the five node flags itself), then
# phalanx.add_dist_args(parser) on top, then phalanx.spawn. Each process writes
# OUT/rank<R>.json with what it was given.
# usage: trellis_parser.py --out DIR [TRELLIS.2's flags] [--backend B]
import argparse
import json
import os

import phalanx


def main(local_rank, cfg):
    row = {
        "rank": int(os.environ["RANK"]),
        "world": int(os.environ["WORLD_SIZE"]),
        "num_gpus": cfg.num_gpus,
        "master_port": cfg.master_port,
        "backend": os.environ["PHALANX_BACKEND"],
    }
    with open(os.path.join(cfg.out, f"rank{row['rank']}.json"), "w") as handle:
        json.dump(row, handle)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--num_nodes", type=int, default=1, help="Number of nodes")
    parser.add_argument("--node_rank", type=int, default=0, help="Node rank")
    parser.add_argument("--num_gpus", type=int, default=-1, help="Number of GPUs per node")
    parser.add_argument("--master_addr", type=str, default="localhost", help="Master address")
    parser.add_argument("--master_port", type=str, default="12345", help="Port for distributed")
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
        backend=cfg.backend,
        log_dir=os.path.join(cfg.out, "logs"),
    )
