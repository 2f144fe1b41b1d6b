"""Where a repeated launch's time goes: ``python benchmarks/launch_timeline.py --reps 5 --nproc 8``.

Runs ``phalanx --keep-warm 600 --standalone`` with ``bench_worker.py launch`` (its service
warmed by one launch first, as in ``bench_service.py``) and prints the medians of one
timeline, each step from the launcher's start:

- ``python up``: the interpreter started, before any phalanx module (the wrapper's first line);
- ``imported``: ``phalanx.cli.main`` imported and the launch path's modules with it
  (``parse_launch`` entered);
- ``parsed``: the command line is a ``Launch``;
- ``agent``: ``Agent.run`` entered (the agent's modules imported);
- ``service connected``: ``open_warm`` returned (connected, ``hello`` sent);
- ``rendezvous``: the standalone round is known (``LocalRendezvous.next_round`` returned);
- ``service ready``: the service's ``ready`` answer read;
- ``forks sent`` / ``forks answered``: the fork request of the round's workers sent (one
  request per 64 workers) / the service's last answer read;
- ``workers started``: the ``workers_started`` event;
- ``first start`` / ``last start``: a rank's first line (``bench_worker`` after its imports);
- ``all joined``: every rank's ``init_process_group`` returned (the store's rendezvous);
- ``all past barrier``; ``first left`` / ``all left``: past ``destroy_process_group``;
- ``first exit`` / ``last exit`` / ``job_end``: the agent's events; ``agent returned``,
  ``main returned``, ``atexit`` (the launcher's own), ``launcher exit`` (seen gone, as
  ``scenarios`` sees it);
- ``agent's CPU (s)``: the agent process's own user + system time, to its exit (not a step);
- the modules imported when the first fork request is sent (all, and phalanx's), printed
  after the table (the median launch's).

The stamps come from wrapping those functions, from outside: a wrapper script starts
python, installs an import hook that wraps them once their module ran, then runs ``phalanx``
as ``python -m`` would. Nothing in phalanx is changed for it. With ``--importtime`` the
agent's ``-X importtime`` is printed too (the modules by cumulative time).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import scenarios

import phalanx
from phalanx.service.client import ask_all

# module -> the functions to stamp (``Class.method`` or a function), on return
STAMPED = {
    "phalanx.cli.main": ["main"],
    "phalanx.cli.argv": ["parse_launch"],
    "phalanx.agent.agent": ["Agent.run"],
    "phalanx.supervisor.warmservice": ["open_warm"],
    "phalanx.rendezvous.local": ["LocalRendezvous.next_round"],
    # _fork_many: one request for a round's workers; _fork: one per worker (before issue 43's
    # batching: stamped too, so that the timeline reads the code before it the same way)
    "phalanx.supervisor.warm": ["Template._ready", "Template._fork", "Template._fork_many"],
}
WRAPPER = r"""
import sys, time, json, os, atexit, importlib.machinery, functools
STAMPS = [("python up", time.time())]
ENTRY = ("parse_launch", "Agent.run", "Template._fork", "Template._fork_many"); STAMPED = json.loads(sys.argv[1]); OUT = sys.argv[2]; sys.argv = ["phalanx", *sys.argv[3:]]
def stamp(name, fn, on_entry):
    @functools.wraps(fn)
    def wrapped(*a, **k):
        if name.startswith("Template._fork") and not any(s[0] == "modules" for s in STAMPS):
            STAMPS.extend([("modules", len(sys.modules)), ("phalanx modules", sum(m.startswith("phalanx") for m in sys.modules))])
        if on_entry: STAMPS.append((name + ">", time.time()))
        try: return fn(*a, **k)
        finally: STAMPS.append((name, time.time()))
    return wrapped
class Finder:  # not importlib.abc's: that import alone costs 20 ms
    def find_spec(self, name, path, target=None):
        if name not in STAMPED: return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            for dotted in STAMPED[name]:
                owner, _, attr = dotted.rpartition(".")
                holder = getattr(module, owner) if owner else module
                if hasattr(holder, attr):  # the code before a change may not have it
                    setattr(holder, attr, stamp(dotted, getattr(holder, attr), dotted in ENTRY))
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Finder())
import resource
def cpu():
    use = resource.getrusage(resource.RUSAGE_SELF)
    return [("atexit", time.time()), ("cpu", use.ru_utime + use.ru_stime)]
atexit.register(lambda: open(OUT, "w").write(json.dumps([*STAMPS, *cpu()])))
import runpy
runpy.run_module("phalanx", run_name="__main__", alter_sys=True)
"""
STEPS = [
    ("python up", "python up"),
    ("imported", "parse_launch>"),
    ("parsed", "parse_launch"),
    ("agent", "Agent.run>"),
    ("service connected", "open_warm"),
    ("rendezvous", "LocalRendezvous.next_round"),
    ("service ready", "Template._ready"),
    ("forks sent", "forks>"),
    ("forks answered", "forks*"),
    ("agent returned", "Agent.run"),
    ("main returned", "main"),
    ("atexit", "atexit"),
]


def one(nproc: int, importtime: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="launch-timeline-") as scratch:
        out, logs, stamps = Path(scratch, "out"), Path(scratch, "logs"), Path(scratch, "stamps")
        out.mkdir()
        flags = ["-X", "importtime"] if importtime else []
        command = [sys.executable, *flags, "-c", WRAPPER, json.dumps(STAMPED), str(stamps),
                   "--keep-warm", "600", "--standalone", "--nproc-per-node", str(nproc),
                   "--log-dir", str(logs), scenarios.WORKER, "launch", str(out)]  # fmt: skip
        started = time.time()
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        exited = time.time()  # within a few ms: no polling here
        if proc.returncode != 0:
            raise SystemExit(f"launch failed ({proc.returncode}):\n{proc.stderr}")
        if importtime:
            _print_importtime(proc.stderr)
        seen: dict[str, float] = {}
        for name, when in json.loads(stamps.read_text()):
            seen.setdefault(name, when)
            if name.startswith("Template._fork"):  # the first request sent, the last answer
                seen.setdefault("forks>", when)
                if not name.endswith(">"):
                    seen["forks*"] = when
        (events,) = logs.glob("*/events.jsonl")
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event["kind"] in ("workers_started", "worker_exit", "job_end"):
                seen.setdefault(event["kind"], event["t"])
                seen[event["kind"] + "*"] = event["t"]
        ranks = {e: scenarios._stamps(out, e, 0) for e in ("start", "joined", "barrier", "left")}
        row = {label: seen[key] - started for label, key in STEPS if key in seen}
        for label, key in (("workers started", "workers_started"), ("first exit", "worker_exit"),
                           ("last exit", "worker_exit*"), ("job_end", "job_end")):  # fmt: skip
            row[label] = seen[key] - started
        row["first start"] = min(t for t, _ in ranks["start"].values()) - started
        row["last start"] = max(t for t, _ in ranks["start"].values()) - started
        row["all joined"] = max(t for t, _ in ranks["joined"].values()) - started
        row["all past barrier"] = max(t for t, _ in ranks["barrier"].values()) - started
        row["first left"] = min(t for t, _ in ranks["left"].values()) - started
        row["all left"] = max(t for t, _ in ranks["left"].values()) - started
        row["launcher exit"] = exited - started
        row["agent's CPU (s)"] = seen["cpu"]
        row["modules"], row["phalanx modules"] = seen["modules"], seen["phalanx modules"]
        return row


def _print_importtime(stderr: str) -> None:
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            own, cumulative, name = line.split(":", 1)[1].split("|")
            rows.append((int(own), int(cumulative), name.rstrip()))
    phalanx_own = sum(own for own, _, name in rows if name.strip().startswith("phalanx"))
    print(f"-X importtime: {len(rows)} modules, {sum(r[0] for r in rows) / 1e3:.0f} ms in all; "
          f"{sum(1 for r in rows if r[2].strip().startswith('phalanx'))} of phalanx, "
          f"{phalanx_own / 1e3:.0f} ms of their own")  # fmt: skip
    for _, cumulative, name in rows:
        if cumulative >= 5000 and len(name) - len(name.lstrip()) <= 6:
            print(f"  {cumulative / 1e3:7.1f} ms {name}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--importtime", action="store_true", help="print one -X importtime")
    args = parser.parse_args(argv)
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="launch-timeline-")
    compileall.compile_dir(os.path.dirname(phalanx.__file__), quiet=1)
    rows = []
    try:
        one(args.nproc, False)  # starts the service
        if args.importtime:
            one(args.nproc, True)
        rows = [one(args.nproc, False) for _ in range(args.reps)]
    finally:
        ask_all(os.environ, {"stop": 1})  # it ends at once (no job), removing its socket
        shutil.rmtree(os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)
    print(f"{'step':<20} {'median s':>9} {'min s':>7}  ({args.reps} launches of {args.nproc})")
    counts = ("modules", "phalanx modules")
    steps = [label for label in rows[0] if label not in counts]
    for label in sorted(steps, key=lambda label: statistics.median(r[label] for r in rows)):
        values = [row[label] for row in rows if label in row]
        print(f"{label:<20} {statistics.median(values):9.3f} {min(values):7.3f}")
    modules = [statistics.median(row[label] for row in rows) for label in counts]
    print(f"modules at the first fork request: {modules[0]:.0f}, {modules[1]:.0f} of phalanx")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
