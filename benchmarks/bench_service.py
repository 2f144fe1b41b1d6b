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

``--check`` is the short form the suite runs (``tests/project/test_bench_service.py``): no
torchrun, no timing; one launch starts the service, ``--reps`` more fork from it, and it
fails unless every launch exits 0, every rank passes the barrier, every rank of a repeated
launch is a child of that one service (and the launch says "already warm"), and nothing is
left once the service is stopped: no worker, no service, no socket.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import sys
import tempfile
import time
from importlib.metadata import version

import psutil
import scenarios
from bench import LAUNCHERS, table

import phalanx
from phalanx.service.client import ask_all
from phalanx.service.paths import service_dir, sockets

PY = sys.executable
SERVICE: scenarios.Command = lambda n, r, logs: [  # noqa: E731
    PY, "-m", "phalanx", "--keep-warm", "600", "--standalone", "--nproc-per-node", str(n),
    "--max-restarts", str(r), "--log-dir", logs,
]  # fmt: skip
COMMANDS = {"phalanx-service": SERVICE, "torchrun": LAUNCHERS["torchrun"],
            "phalanx": LAUNCHERS["phalanx"]}  # fmt: skip
TARGETS = {"launch": 0.3, "launch to exit": 0.6}  # seconds, the repeated launch with the service
SPEEDUP = 12.0


def _forked_from(job: scenarios.Job) -> tuple[set[int], list[int]]:
    """The parents of a finished launch's ranks, and the ranks' pids (every rank must have
    passed the barrier: ``all_ranks`` raises otherwise)."""
    job.all_ranks("barrier", 0)
    stamps = [p.read_text().split() for p in job.out.glob("barrier.0.*") if p.suffix != ".tmp"]
    return {int(fields[3]) for fields in stamps}, [int(fields[1]) for fields in stamps]


def _gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """Those of ``pids`` still running (not zombies) after ``timeout`` seconds at most."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def check(reps: int, nproc: int) -> int:
    """The invariants of repeated launches from the service, no timing (see the module's doc)."""
    first = scenarios.Job(SERVICE, nproc, 0, "launch")
    first.finish()
    services = [int(a["pid"]) for a in ask_all(os.environ, {"status": 1})]
    if len(services) != 1 or _forked_from(first)[0] != set(services):
        raise scenarios.BenchError(f"the first launch's ranks are not the service's {services}")
    workers = _forked_from(first)[1]
    first.done(0.0)
    for rep in range(reps):
        job = scenarios.Job(SERVICE, nproc, 0, "launch")
        job.finish()
        parents, pids = _forked_from(job)
        if parents != set(services) or "already warm" not in job.log.read_text():
            raise scenarios.BenchError(f"launch {rep + 2}: ranks of {parents}, not the service's")
        workers += pids
        job.done(0.0)
    ask_all(os.environ, {"stop": 1})
    left = _gone(workers + services)
    socks = list(sockets(service_dir(os.environ)))
    if left or socks:
        raise scenarios.BenchError(f"left behind: processes {left}, sockets {socks}")
    print(f"check: ok: {reps + 1} launches of {nproc} ranks; every rank past the barrier; "
          f"launches 2..{reps + 1} forked from service pid {services[0]}; nothing left behind")  # fmt: skip
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--check", action="store_true", help="the suite's short form: invariants")
    args = parser.parse_args(argv)
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="bench-service-")
    if args.check:
        try:
            return check(args.reps, args.nproc)
        finally:
            ask_all(os.environ, {"stop": 1})  # none left on a failure either
            shutil.rmtree(os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)
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
        ask_all(os.environ, {"stop": 1})  # it ends at once (no job), removing its socket
        shutil.rmtree(os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)
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
