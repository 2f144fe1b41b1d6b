"""Prints what this worker holds, one JSON line: its rank, parent, directory, and every open
descriptor with what it is (for the batched-fork tests); then waits for SIGTERM when
``PROBE_WAIT`` is set. Stdlib only: no torch, so a per-run template imports nothing."""

import contextlib
import json
import os
import signal

fds = {}
for fd in os.listdir("/proc/self/fd"):
    with contextlib.suppress(OSError):  # the directory's own descriptor, closed once listed
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
print(json.dumps({
    "rank": os.environ["RANK"], "local_rank": os.environ["LOCAL_RANK"], "pid": os.getpid(),
    "ppid": os.getppid(), "cwd": os.getcwd(), "mark": os.environ.get("PROBE_MARK"), "fds": fds,
}), flush=True)  # fmt: skip
if os.environ.get("PROBE_WAIT"):
    signal.pause()
