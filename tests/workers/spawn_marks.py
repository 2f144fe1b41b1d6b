# usage: spawn_marks.py MARKER_DIR NODE_RANK MASTER_PORT [allow]: phalanx.spawn on 2 nodes of
# 1 process each; a process writes MARKER_DIR/rank<RANK> (proof it ran). "allow":
# allow_mismatch=True. Tests copy it into one checkout per node.
import os
import sys

import phalanx


def work(local_rank, marks):
    with open(os.path.join(marks, f"rank{os.environ['RANK']}"), "w") as marker:
        marker.write(os.getcwd())


if __name__ == "__main__":
    marks, node_rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        phalanx.spawn(
            work,
            (marks,),
            num_gpus=1,
            num_nodes=2,
            node_rank=node_rank,
            master_addr="127.0.0.1",
            master_port=port,
            log_dir=os.path.join(marks, os.pardir, f"logs{node_rank}"),
            allow_mismatch=sys.argv[4:] == ["allow"],
        )
    except phalanx.MismatchError as exc:
        print(f"phalanx: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
