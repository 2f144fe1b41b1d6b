"""The hang corpus at real scale, under phalanx's defaults: ``python benchmarks/hang_corpus.py``.

Runs the 8 hangs and the 8 healthy but irregular runs of issue 39 (``tests/support/
hang_corpus.py``, workers ``tests/workers/hang_case.py``: a 25 s checkpoint save, a 40 s first
step, 15 s evaluations every 10 steps, ...) as 2-rank phalanx jobs, all at once, with no
``--hang-watch`` or ``--stall-timeout`` flag, and prints the table published on
docs/how-to/hangs.md: per case the verdict, the time from the fault to the verdict, the bound
the rank was named at and the one where the round would fail (10x; each hang is stopped once
named, so that is not waited for), the suspects; then precision and recall. About 4 minutes;
``--out DIR`` keeps every run's directory. Exit 1 when a verdict is wrong.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.hang_corpus import HANGS, HEALTHY, figures, run_corpus, table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--scale", type=float, default=1.0, help="durations x this (default 1)")
    parser.add_argument("--watch", default="", help="--hang-watch for every case (default: none)")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hang-corpus-"))
    if args.out:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
    started = time.monotonic()
    try:
        outcomes = run_corpus(
            out, scale=args.scale, watch=args.watch, deadline=900, cases=(*HANGS, *HEALTHY)
        )
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    print("\n".join(table(outcomes)))
    print(f"wall {time.monotonic() - started:.0f} s, scale {args.scale:g}, "
          f"--hang-watch {args.watch or '(default)'}")  # fmt: skip
    return 0 if figures(outcomes) == (1.0, 1.0) else 1


if __name__ == "__main__":
    sys.exit(main())
