# usage: dump_env.py OUT_DIR -- writes this worker's environment to OUT_DIR/env_<RANK>.json.
import json
import os
import sys

with open(os.path.join(sys.argv[1], f"env_{os.environ['RANK']}.json"), "w") as handle:
    json.dump(dict(os.environ), handle)
