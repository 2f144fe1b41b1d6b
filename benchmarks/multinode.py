"""Restart on two nodes (see ``bench.py --multinode-reps``): two agents, each in a network
namespace of its own (``tests/support/netns.py``), one worker each, c10d rendezvous hosted by
node 0; after the first barrier global rank 1 SIGKILLs itself (``bench_worker.py kill``).
The figure: the kill -> every rank on both nodes past its first collective of the next
round (``--max-restarts 1``). Every clock read here is this machine's (namespaces share it).
torchrun counts restarts per node: node 0, restarted because node 1 came back, gives its
worker ``TORCHELASTIC_RESTART_COUNT=0`` again, so the worker tells the next round by the kill
stamp (``bench_worker.py``); before it did, rank 0 slept as in round 0 and torchrun "hung".

For phalanx, where the time went, from the agents' event logs (their ``mono`` times) and the
workers' stamps, as milestones after the kill (each phase is the step to the next one):
detect (the failed node began its stop), tell (the other node began its own), stop (every
worker of both nodes gone), re-form (the next round formed on both), node check (the check
before the round, ``--node-check``, done on both), fork (every rank of the next round running
its script), first collective (every rank past its barrier).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import scenarios  # next to this file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, below
from tests.support.netns import NetNamespaces, unavailable_reason

from phalanx.events.log import read_events

PY = sys.executable
PHASES = ("detect", "tell", "stop", "re-form", "node check", "fork", "first collective")
JOB_TIMEOUT = scenarios.JOB_TIMEOUT  # the whole job, startup included (slow under load)
GIVE_UP = 3  # failures in a row after which a launcher is not run again (each costs a timeout)
_ports = itertools.count(29400)  # inside namespaces made for this run: nobody else's ports


# Variants of phalanx this benchmark knows (``--launchers``): the flags they add.
PHALANX_FLAGS = {"phalanx-nocheck": ["--node-check", "off"]}


@dataclass(frozen=True)
class Sample:
    seconds: float
    phases: dict[str, float] | None  # phalanx only


def _argv(
    launcher: str, hosts: NetNamespaces, i: int, port: int, run_id: str, logs: Path
) -> list[str]:
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.addr(0)}:{port}",
              "--rdzv-id", run_id, "--local-addr", hosts.addr(i)]  # fmt: skip
    if launcher == "torchrun":
        # Its c10d handler hosts the store where the endpoint names this machine, which it
        # cannot tell inside a namespace (the host name resolves to the host's address).
        return [PY, "-m", "torch.distributed.run", *common, "--rdzv-conf", f"is_host={i == 0}"]
    return [PY, "-m", "phalanx", *common, *PHALANX_FLAGS.get(launcher, []), "--log-dir", str(logs)]


class TwoNodes:
    """The namespaces, made once for every repetition, and removed by ``close``."""

    def __init__(self) -> None:
        why = unavailable_reason()
        if why is not None:
            raise scenarios.BenchError(f"multi-node restart: {why}")
        self.hosts = NetNamespaces(2)
        self.hosts.create()

    def close(self) -> None:
        self.hosts.destroy()

    def restart(self, launcher: str, env: dict[str, str] | None = None) -> Sample:
        scratch = Path(tempfile.mkdtemp(prefix=f"bench-2nodes-{launcher}-"))
        out = scratch / "stamps"
        out.mkdir()
        port, run_id = next(_ports), f"bench-{uuid.uuid4().hex[:8]}"
        full_env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", **(env or {})}
        procs = []
        try:
            for i in range(2):
                argv = _argv(launcher, self.hosts, i, port, run_id, scratch / f"logs{i}")
                command = self.hosts.command(i, [*argv, scenarios.WORKER, "kill", str(out)])
                procs.append(scenarios._start(command, scratch / f"node{i}.log", full_env))
            codes = [scenarios._finish(proc, JOB_TIMEOUT)[0] for proc in procs]
        except subprocess.TimeoutExpired:
            raise scenarios.BenchError(
                f"{launcher}: hung for {JOB_TIMEOUT:.0f} s (killed); see {scratch}"
            ) from None
        finally:
            for proc in procs:  # a timeout above: nothing of this run is left behind
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
        if any(codes):
            raise scenarios.BenchError(f"{launcher}: exit codes {codes}; see {scratch}")
        kill = scenarios._stamps(out, "kill", 0)
        barrier = _mono_stamps(out, "barrier", 1)
        if len(kill) != 1 or len(barrier) != 2:
            raise scenarios.BenchError(f"{launcher}: stamps missing; see {scratch}")
        (killed, _), = kill.values()  # fmt: skip
        seconds = max(when for when, _ in scenarios._stamps(out, "barrier", 1).values()) - killed
        phases = None
        if launcher != "torchrun":
            logs = [next((scratch / f"logs{i}").glob("*/events.jsonl")) for i in range(2)]
            killed_mono = _mono_stamps(out, "kill", 0)[1]
            started = max(_mono_stamps(out, "start", 1).values())
            events = [read_events(p) for p in logs]
            phases = breakdown(events, killed_mono, started, max(barrier.values()))
        shutil.rmtree(scratch, ignore_errors=True)
        return Sample(seconds, phases)


def _mono_stamps(out: Path, event: str, restart: int) -> dict[int, float]:
    stamps = {}
    for path in out.glob(f"{event}.{restart}.*"):
        if path.suffix != ".tmp":
            stamps[int(path.name.rsplit(".", 1)[1])] = float(path.read_text().split()[2])
    return stamps


def breakdown(
    nodes: list[list[dict[str, Any]]], killed: float, started: float, barrier: float
) -> dict[str, float]:
    """The phases (seconds) from the two nodes' events and the workers' monotonic stamps."""

    def first(events: list[dict[str, Any]], kind: str, **match: Any) -> dict[str, Any]:
        return next(
            e for e in events if e["kind"] == kind and all(e[k] == v for k, v in match.items())
        )

    def began_stop(events: list[dict[str, Any]]) -> float:
        # written once stopped: its detected_at says when it began
        failure = first(events, "failure")
        return float(failure["mono"]) - (float(failure["t"]) - float(failure["detected_at"]))

    failures = [first(events, "failure") for events in nodes]
    failed = 0 if failures[0]["local"] else 1
    milestones = [
        killed,
        began_stop(nodes[failed]),
        began_stop(nodes[1 - failed]),
        max(float(first(events, "stopped")["mono"]) for events in nodes),
        max(float(first(events, "rdzv_done", attempt=2)["mono"]) for events in nodes),
        max(_checked(events, first(events, "rdzv_done", attempt=2)) for events in nodes),
        started,
        barrier,
    ]
    return {name: milestones[i + 1] - milestones[i] for i, name in enumerate(PHASES)}


def _checked(events: list[dict[str, Any]], formed: dict[str, Any]) -> float:
    """When the node check of the round ``formed`` ended on this node (when it formed, if
    there was none: ``--node-check off``)."""
    checks = [e for e in events if e["kind"] == "node_check" and e["round"] == formed["round"]]
    return float(checks[0]["mono"]) if checks else float(formed["mono"])


# seconds, phalanx: issue 29's p50 and max over 20 restarts, issue 41's p50 and p99 over 100
MULTINODE_TARGETS = {"p50": 0.25, "p99": 0.5, "max": 0.6}


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank): at 100 values the 99th is the second largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def report(names: list[str], reps: int, env: dict[str, dict[str, str]]) -> str:
    """Run ``reps`` two-node restarts per launcher (alternating) and say p50, max and, for
    phalanx, the median of each phase and the phases of the slowest run."""
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    failures: list[str] = []
    try:
        nodes = TwoNodes()
    except (scenarios.BenchError, RuntimeError) as exc:
        return f"restart on two nodes: not measured ({exc})"
    try:
        in_a_row = dict.fromkeys(names, 0)
        for rep in range(reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                if in_a_row[name] >= GIVE_UP:
                    continue
                try:
                    samples[name].append(nodes.restart(name, env.get(name)))
                    in_a_row[name] = 0
                except (scenarios.BenchError, StopIteration) as exc:
                    failures.append(f"{name}: {exc}")
                    in_a_row[name] += 1
                    if in_a_row[name] == GIVE_UP:
                        failures.append(f"{name}: failed {GIVE_UP} times in a row, not run again")
            print(f"two-node restart {rep + 1}/{reps} done", file=sys.stderr, flush=True)
    finally:
        nodes.close()
    return _table(samples, reps, failures)


def _table(samples: dict[str, list[Sample]], reps: int, failures: list[str]) -> str:
    lines = [f"| restart on 2 netns nodes ({reps} repetitions) | p50 | p99 | max | runs that failed |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, got in samples.items():
        seconds = [s.seconds for s in got]
        failed = sum(1 for f in failures if f.startswith(f"{name}:") and "in a row" not in f)
        tried = len(seconds) + failed
        if not seconds:
            lines.append(f"| {name} | failed | failed | failed | {failed} of {tried} |")
            continue
        lines.append(f"| {name} | {statistics.median(seconds):.3f} s "
                     f"| {percentile(seconds, 99):.3f} s | {max(seconds):.3f} s "
                     f"| {failed} of {tried} |")  # fmt: skip
    for name, got in samples.items():
        timed = [s for s in got if s.phases is not None]
        if not timed:
            continue
        slowest = max(timed, key=lambda s: s.seconds)
        assert slowest.phases is not None
        medians = {p: statistics.median(s.phases[p] for s in timed if s.phases) for p in PHASES}
        lines.append("")
        lines.append(f"{name}, where the time went (seconds): "
                     + ", ".join(f"{p} {medians[p]:.3f}" for p in PHASES) + " (medians); the "
                     f"slowest run ({slowest.seconds:.3f} s): "
                     + ", ".join(f"{p} {slowest.phases[p]:.3f}" for p in PHASES))  # fmt: skip
        seconds = [s.seconds for s in got]
        got_figures = {"p50": statistics.median(seconds), "p99": percentile(seconds, 99),
                       "max": max(seconds)}  # fmt: skip
        for figure, target in MULTINODE_TARGETS.items():
            verdict = "met" if got_figures[figure] <= target else "NOT met"
            lines.append(f"target restart on 2 nodes: {name} {figure} <= {target} s: "
                         f"{got_figures[figure]:.3f} s, {verdict}")  # fmt: skip
    for failure in failures:
        lines.append(f"failed two-node run: {failure}")
    return "\n".join(lines)
