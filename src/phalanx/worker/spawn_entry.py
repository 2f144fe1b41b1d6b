"""``python -m phalanx.worker.spawn_entry PAYLOAD``: the worker side of ``phalanx.spawn``.

PAYLOAD holds two pickles: multiprocessing's preparation data (so the user's main module is
imported as ``__mp_main__``, exactly as ``torch.multiprocessing.spawn`` children see it), then
``(fn, args)``. The worker calls ``fn(LOCAL_RANK, *args)``; an uncaught exception prints its
traceback and exits 1, which the agent reports as the root cause.
"""

from __future__ import annotations

import multiprocessing.spawn
import os
import pickle
import sys


def main() -> None:
    with open(sys.argv[1], "rb") as payload:
        multiprocessing.spawn.prepare(pickle.load(payload))
        fn, args = pickle.load(payload)
    fn(int(os.environ["LOCAL_RANK"]), *args)


if __name__ == "__main__":
    main()
