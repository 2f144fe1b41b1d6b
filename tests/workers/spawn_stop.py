# usage: spawn_stop.py OUT_DIR [catch] -- phalanx.spawn of one process that writes
# OUT_DIR/ready and waits to be stopped. "catch": the program catches phalanx.Interrupted,
# writes OUT_DIR/cleaned (its clean-up) and exits with the exception's code.
import os
import sys
import time

import phalanx


def work(local_rank, out_dir):
    open(os.path.join(out_dir, "ready"), "w").close()
    time.sleep(3600)


if __name__ == "__main__":
    out = sys.argv[1]
    logs = os.path.join(out, "logs")
    if sys.argv[2:] != ["catch"]:
        phalanx.spawn(work, (out,), num_gpus=1, master_port=0, log_dir=logs)
        sys.exit(0)
    try:
        phalanx.spawn(work, (out,), num_gpus=1, master_port=0, log_dir=logs)
    except phalanx.Interrupted as exc:
        with open(os.path.join(out, "cleaned"), "w") as marker:
            marker.write(f"{exc.exit_code} {exc}")
        sys.exit(exc.exit_code)
