# usage: two_failures.py DIR ROLE -- one worker per node, each failing on its own (no peer
# error): ROLE "first" exits 7 once DIR/go.first exists, ROLE "second" exits 5 once
# DIR/go.second exists. Each first writes "<pid> <rank>" to DIR/ready.ROLE. No torch: nothing
# but the test orders the two failures.
import os
import sys
import time
from pathlib import Path

shared, role = Path(sys.argv[1]), sys.argv[2]
(shared / f".ready.{role}").write_text(f"{os.getpid()} {os.environ['RANK']}")
(shared / f".ready.{role}").rename(shared / f"ready.{role}")  # whole or absent: the test reads it
while not (shared / f"go.{role}").exists():
    time.sleep(0.02)
print(f"the {role} failure, on its own", file=sys.stderr, flush=True)
os._exit(7 if role == "first" else 5)
