"""``python -m phalanx.worker.run_path SCRIPT ARGS...``: torchrun's ``--run-path``.

Runs SCRIPT with ``runpy.run_path`` as ``__main__``, with ``sys.argv`` and ``sys.path[0]``
as ``python SCRIPT ARGS...`` would set them.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
