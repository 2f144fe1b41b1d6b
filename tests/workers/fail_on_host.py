# usage: fail_on_host.py DIR ADDR -- round 0: the rank on the host that owns ADDR (it can bind
# it) waits until the other host's rank is up (DIR/up.0), then exits 3; every other rank
# marks DIR/up.0 and waits to be stopped. A later round: print the world size, exit 0. No torch.
import os
import socket
import sys
import time
from pathlib import Path

folder, addr = Path(sys.argv[1]), sys.argv[2]
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    print(f"finished at world {os.environ['WORLD_SIZE']}", flush=True)
    sys.exit(0)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
    try:
        probe.bind((addr, 0))
        here = True
    except OSError:  # not this host's address
        here = False
if here:
    deadline = time.monotonic() + 120
    while not (folder / "up.0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("this host's rank fails", file=sys.stderr, flush=True)
    sys.exit(3)
(folder / "up.0").touch()
time.sleep(300)
