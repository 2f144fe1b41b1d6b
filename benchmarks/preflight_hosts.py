"""How long the pre-flight takes for many hosts: ``python benchmarks/preflight_hosts.py``.

No machine has 64 hosts to spare, so each host is an sshd-less stand-in: an ``ssh`` on PATH
that takes the real client's options and runs the remote command here with ``sh -c``
(``-G`` answers ``hostname 127.0.0.1``). Everything after ssh is what a real host does: the
login shell's ``cd && exec python -c BOOTSTRAP``, the environment line read from stdin, the
re-exec into ``python -m phalanx.hosts.probe`` (versions from metadata, the script's sha256,
the port check on the first host), the JSON answer parsed and compared by the controller.
What it leaves out is ssh's own connection setup (a few ms on a LAN with a ControlMaster,
~100 ms without), which runs in parallel across hosts like the rest.

Prints the median and the spread over ``--reps`` runs for ``--hosts`` hosts (the issue's
target: under 5 s for 64), the time of one host alone, and the CPU time all the stand-ins
used: here every "host" shares this machine's cores, where real hosts each run their own
probe, so on a loaded machine the wall time says more about the neighbours than about
phalanx.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from phalanx.cli.argv import parse_config
from phalanx.hosts.plan import build_hosts_plan
from phalanx.hosts.preflight import preflight

FAKE_SSH = """#!/bin/sh
# A stand-in for ssh: skip the client's options, then run the remote command here.
while [ $# -gt 0 ]; do
    case "$1" in
        -o|-F) shift 2 ;;
        -G) echo "hostname 127.0.0.1"; exit 0 ;;
        -*) shift ;;
        *) break ;;
    esac
done
shift
exec sh -c "$1"
"""


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def measure(hosts: int, script: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process it started)."""
    argv = ["--hosts", ",".join(f"h{i}:1" for i in range(hosts)), str(script)]
    config = parse_config(argv, os.environ)
    started, cpu = time.perf_counter(), _children_cpu()
    plan = build_hosts_plan(config, argv)
    problems = preflight(config, plan)
    took = time.perf_counter() - started
    if problems:
        raise SystemExit(f"pre-flight found problems: {problems[:3]}")
    return took, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp) / "bin"
        bin_dir.mkdir()
        (bin_dir / "ssh").write_text(FAKE_SSH)
        (bin_dir / "ssh").chmod(0o755)
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        script = Path(tmp) / "train.py"
        script.write_text("print('hello')\n" * 1000)
        one = measure(1, script)[0]
        runs = [measure(args.hosts, script) for _ in range(args.reps)]
    many = [wall for wall, _ in runs]
    cpu = statistics.median(c for _, c in runs)
    print(json.dumps({
        "hosts": args.hosts,
        "cpus": os.cpu_count(),
        "preflight_s_median": round(statistics.median(many), 3),
        "preflight_s_min": round(min(many), 3),
        "preflight_s_max": round(max(many), 3),
        "one_host_s": round(one, 3),
        # Load-independent: all hosts' probes' CPU; on idle cores the wall time is about
        # this over the core count (every real host pays only its own share).
        "cpu_s_all_hosts": round(cpu, 2),
        "python": sys.version.split()[0],
        "load_average_1min": round(os.getloadavg()[0], 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
