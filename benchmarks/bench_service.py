"""A repeated launch with the warm service, against torchrun, side by side in one run:
``python benchmarks/bench_service.py --reps 5 --nproc 8``.

Three launchers run the same job (``bench_worker.py launch``: import torch, a Gloo process
group, one barrier, leave), alternating which goes first, ``--reps`` times, medians:

- ``phalanx-service``: ``phalanx --keep-warm 600``, its service already warm (started by one
  launch before the measured ones, which is reported on its own as the first launch);
- ``torchrun``;
- ``phalanx``: the default, a template per run that imports torch while the rendezvous runs.

Launch: the launcher started -> every rank past the barrier; launch to exit: -> the launcher
exited. The services run in a directory of their own (``XDG_RUNTIME_DIR``) and are stopped
at the end. The targets (issue 43): the repeated launch of 8 workers at most 0.3 s to the
barrier and 0.6 s to exit, at least 12x faster than torchrun.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import sys
import tempfile
import time
from importlib.metadata import version

import scenarios
from bench import LAUNCHERS, table

import phalanx
from phalanx.service.client import ask_all

PY = sys.executable
SERVICE: scenarios.Command = lambda n, r, logs: [  # noqa: E731
    PY, "-m", "phalanx", "--keep-warm", "600", "--standalone", "--nproc-per-node", str(n),
    "--max-restarts", str(r), "--log-dir", logs,
]  # fmt: skip
COMMANDS = {"phalanx-service": SERVICE, "torchrun": LAUNCHERS["torchrun"],
            "phalanx": LAUNCHERS["phalanx"]}  # fmt: skip
TARGETS = {"launch": 0.3, "launch to exit": 0.6}  # seconds, the repeated launch with the service
SPEEDUP = 12.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=8)
    args = parser.parse_args(argv)
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="bench-service-")
    # As an installed phalanx has them: without .pyc files (a checkout run with
    # PYTHONDONTWRITEBYTECODE) every agent compiles its ~230 modules, 0.3 s of CPU here.
    compileall.compile_dir(os.path.dirname(phalanx.__file__), quiet=1)
    names = list(COMMANDS)
    samples: dict[str, dict[str, list[float]]] = {}
    units: dict[str, str] = {}
    load_before, started = os.getloadavg(), time.monotonic()
    try:
        scenarios.launch(COMMANDS["torchrun"], 1)  # the page cache: the first import is slower
        first = scenarios.launch(SERVICE, args.nproc)  # starts the service
        for rep in range(args.reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                barrier, exited = scenarios.launch(COMMANDS[name], args.nproc)
                for label, value in (("launch", barrier), ("launch to exit", exited)):
                    row = f"{label} N={args.nproc}"
                    units[row] = "s"
                    samples.setdefault(row, {}).setdefault(name, []).append(value)
            print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    finally:
        ask_all(os.environ, {"stop": 1})
    print(table(samples, units, names, args.reps))
    print()
    print(
        f"{args.reps} repetitions, medians; the service's first launch (it imports torch): "
        f"{first[0]:.2f} s to the barrier, {first[1]:.2f} s to exit; torch {version('torch')}, "
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; load average before "
        f"{load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"{time.monotonic() - started:.0f} s in all."
    )
    for label, bound in TARGETS.items():
        row = samples[f"{label} N={args.nproc}"]
        mine = statistics.median(row["phalanx-service"])
        theirs = statistics.median(row["torchrun"])
        print(
            f"target {label} N={args.nproc}: at most {bound} s: {mine:.3f} s, "
            f"{'met' if mine <= bound else 'NOT met'}; at least {SPEEDUP:g}x faster than "
            f"torchrun: {theirs / mine:.1f}x, {'met' if theirs / mine >= SPEEDUP else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
