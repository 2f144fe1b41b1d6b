"""``python slowfs.py BACKING MOUNTPOINT LOW HIGH``: a passthrough FUSE filesystem whose every
operation takes LOW to HIGH seconds, the way a struggling NFS server answers.

Every operation is passed through to ``BACKING``; while the file ``BACKING/.slow`` exists
(the test creates it once a job is running), each first sleeps for a time drawn uniformly
from [LOW, HIGH] (the calling process waits in the kernel, as on a slow file server):
lookups, listings, opens, reads, writes, renames, closes alike. The sleeps run in FUSE's own threads
(``nothreads=False``), so two callers wait side by side, not one after the other. Used by
``slow_filesystem`` in ``support/tools.py``; it runs as its own process and ends when the
mountpoint is unmounted. (``hangfs.py`` is its sibling: a mount that stops answering.)
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

import mfusepy as fuse
from hangfs import Passthrough  # run as a script: its folder, support/, is on sys.path

_OPS = ("getattr", "readdir", "mkdir", "rmdir", "unlink", "rename", "chmod", "truncate",
        "utimens", "open", "create", "read", "write", "flush", "release", "fsync", "access")  # fmt: skip


class Slow(Passthrough):
    def __init__(self, backing: str, low: float, high: float) -> None:
        super().__init__(backing)
        self.low, self.high = low, high
        self.slow = os.path.join(backing, ".slow")

    def _slowly(self, name: str) -> Any:
        answer = getattr(super(), name)

        def op(*args: Any) -> Any:
            if os.path.exists(self.slow):
                time.sleep(random.uniform(self.low, self.high))
            return answer(*args)

        return op

    def __getattribute__(self, name: str) -> Any:
        # Every operation, the kernel's lookups (getattr) included, waits before it answers.
        if name in _OPS:
            return object.__getattribute__(self, "_slowly")(name)
        return object.__getattribute__(self, name)


if __name__ == "__main__":
    backing, mountpoint, low, high = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    fuse.FUSE(Slow(backing, float(low), float(high)), mountpoint, foreground=True,
              nothreads=False, allow_other=False, attr_timeout=0.0, entry_timeout=0.0)  # fmt: skip
