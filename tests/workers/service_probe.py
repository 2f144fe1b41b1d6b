"""Prints what a worker inherited, one JSON line: for the warm-service tests (``helper`` is a
module the test writes beside this script, to be changed between launches)."""

import json
import os
import resource
import signal
from pathlib import Path

import helper  # type: ignore[import-not-found]

print(json.dumps({
    "rank": os.environ["RANK"], "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
    "umask": os.umask(0o22), "helper": helper.VALUE,
    "env": {k: v for k, v in os.environ.items() if k.startswith("PROBE_")},
    "msgqueue": resource.getrlimit(resource.RLIMIT_MSGQUEUE)[0],
    "usr1": int(signal.getsignal(signal.SIGUSR1)),  # 0: SIG_DFL, 1: SIG_IGN
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "cgroup": Path("/proc/self/cgroup").read_text(),
}), flush=True)  # fmt: skip
if os.environ.get("PROBE_SLEEP"):
    signal.pause()
