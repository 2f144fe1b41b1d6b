"""For the fencing tests: record this worker's start, then a stamp every 10 ms while alive.

argv: DIR LABEL. Writes DIR/LABEL-<pid>.stamps: a first line ``start <t> world=<n>``, then
one ``time.monotonic()`` per line (one clock for every namespace of the machine), until
DIR/stop exists. SIGTERM does not stop it (a rank that saves a checkpoint when told to stop,
for as long as the launcher's --shutdown-timeout lets it): it writes a line ``sigterm`` and
goes on; only SIGKILL ends it early. On node "n0", the first attempt's worker exits 3 once
DIR/fail exists.
"""

import os
import signal
import sys
import time

out, label = sys.argv[1], sys.argv[2]
path = os.path.join(out, f"{label}-{os.getpid()}.stamps")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
signal.signal(signal.SIGTERM, lambda signum, frame: os.write(fd, b"sigterm\n"))
os.write(fd, f"start {time.monotonic()} world={os.environ['WORLD_SIZE']}\n".encode())
fails = label == "n0" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
stop, fail = os.path.join(out, "stop"), os.path.join(out, "fail")
while not os.path.exists(stop):
    if fails and os.path.exists(fail):
        sys.exit(3)
    os.write(fd, f"{time.monotonic()}\n".encode())
    time.sleep(0.01)
