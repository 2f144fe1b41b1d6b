# usage: mark_ran.py MARKER_DIR [--config FILE]: proof that a worker ran: a file
# MARKER_DIR/rank<RANK>-<pid> holding its working directory and world size. Alone (world
# size 1) it then waits to be stopped for a bigger round. Tests copy it into one checkout per node.
import os
import sys
import time

name = f"rank{os.environ['RANK']}-{os.getpid()}"
with open(os.path.join(sys.argv[1], name), "w") as marker:
    marker.write(f"{os.getcwd()} {os.environ['WORLD_SIZE']}")
if os.environ["WORLD_SIZE"] == "1":
    time.sleep(120)
