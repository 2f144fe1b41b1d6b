# usage: mark_ran.py MARKER_DIR [--config FILE]: proof that a worker ran (MARKER_DIR/rank<RANK>,
# holding its working directory); tests copy it into one checkout per node.
import os
import sys

with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}"), "w") as marker:
    marker.write(os.getcwd())
