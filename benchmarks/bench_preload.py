"""A torch-free program under phalanx, torch in the template or not, and under torchrun:
``python benchmarks/bench_preload.py --reps 5``.

The warm-start template imports torch only when the program's source may import it
(``phalanx.supervisor.reach``). This measures what that saves for a program that never does
(a 10-line script that writes a file and exits, N workers, ``--standalone``), launch to
exit, as wall time and as the CPU time of every process of the launch (``RUSAGE_CHILDREN``
around it: the launcher, the template, the workers). The rows:

- ``phalanx``: the scan finds no torch; the template imports nothing;
- ``phalanx --preload json``: any ``--preload`` keeps torch in the template -- what every
  launch did before the scan;
- ``torchrun``: its launcher imports torch itself; its workers do not.

Also the scan's own cost, at agent start: ``may_import_torch`` on a script that imports torch
at its top, and on one that reads phalanx's progress counters (8 files read). Medians; the
ratios are to ``phalanx``. Machines shared with other work are noisy: read the load printed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
FREE = 'import os, sys\nopen(os.path.join(sys.argv[1], os.environ["RANK"]), "w").close()\n'
LAUNCHERS = {
    "phalanx": [PY, "-m", "phalanx", "--standalone"],
    "phalanx --preload json": [PY, "-m", "phalanx", "--standalone", "--preload", "json"],
    "torchrun": [PY, "-m", "torch.distributed.run", "--standalone"],
}
HERE = Path(__file__).resolve().parent


def once(command: list[str], nproc: int, work: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process it started) of one launch to exit."""
    marks = Path(tempfile.mkdtemp(dir=work))
    argv = [*command, "--nproc-per-node", str(nproc), str(work / "free.py"), str(marks)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    done = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or len(list(marks.iterdir())) != nproc:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def scan_cost(reps: int) -> dict[str, float]:
    from phalanx.supervisor.reach import may_import_torch

    scripts = {
        "imports torch at its top": HERE / "bench_worker.py",
        "calls phalanx.step (8 files read)": HERE.parent
        / "tests"
        / "workers"
        / "step_then_wait.py",
    }
    costs = {}
    for label, script in scripts.items():
        took = []
        for _ in range(reps):
            began = time.perf_counter()
            may_import_torch("script", str(script), os.getcwd(), {})
            took.append(time.perf_counter() - began)
        costs[label] = statistics.median(took)
    return costs


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "free.py").write_text(FREE)
        for name in LAUNCHERS:  # the page cache: the first torch import of a session is slower
            once(LAUNCHERS[name], 1, work)
        for rep in range(args.reps):
            for name in LAUNCHERS if rep % 2 == 0 else list(LAUNCHERS)[::-1]:
                samples[name].append(once(LAUNCHERS[name], args.nproc, work))
    base_wall = statistics.median(w for w, _ in samples["phalanx"])
    base_cpu = statistics.median(c for _, c in samples["phalanx"])
    print(f"A torch-free script, N={args.nproc}, {args.reps} reps, load {load[0]:.2f} -> "
          f"{os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print("| launcher | launch to exit, wall (s) | CPU of the launch (s) | ratio wall / CPU |")
    print("|---|---|---|---|")
    for name, runs in samples.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(
            f"| {name} | {wall:.2f} | {cpu:.2f} | {wall / base_wall:.2f} / {cpu / base_cpu:.2f} |"
        )
    print()
    for label, seconds in scan_cost(20).items():
        print(f"scan at agent start, a script that {label}: {seconds * 1000:.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
