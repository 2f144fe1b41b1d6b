# Prints argv, cwd and sys.path[0] as JSON, and a line on stderr.
import json
import os
import sys

print(
    json.dumps(
        {"argv": sys.argv, "path0": sys.path[0], "name": __name__, "rank": os.environ["RANK"]}
    )
)
print(f"to stderr from {os.environ['RANK']}", file=sys.stderr)
