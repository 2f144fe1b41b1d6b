"""The agents' store under the load of a big job: ``python benchmarks/store_load.py``.

``--clients`` agents (1,024 by default), each one real socket connection to the store, put on
it the load that phalanx's rendezvous puts on it, by running phalanx's own rendezvous code
(see ``store_clients.py``): every agent joins a first round at once, its heartbeat thread
beating as it joins, as an agent's does (``--bare-first-round``: without, as this benchmark
ran before session 53, which favours the first round), then the heartbeat
threads run for ``--seconds`` (the steady state while workers train: about 4 store calls per
agent per second on the agent store, 10 on TCPStore, each agent's ticks at its own point of
the second), then every agent
rejoins a restart round with its heartbeats still on.
Each store in ``store_clients.STORES`` gets the same load in the same run, one after the
other; for each phase it prints the store calls per second, the calls per agent, and the
latency of one call (p50, p99, max; ``wait`` is counted but not timed, since it blocks
until its keys exist), with the CPU the server and the drivers used.

The store's server runs in a process of its own; the clients are spread over ``--drivers``
processes, one thread per client (and the heartbeat's threads, as in an agent; the drivers
switch threads every 0.2 s at most, see ``store_clients.SWITCH_INTERVAL``). The drivers' CPU
is printed so that one can tell whether they, and not the store, were the limit: compare
with a run at ``--clients 256``, or with more ``--drivers`` (32 held 1,024 agents better
than 16 here). ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import store_clients  # next to this file

CHILD = [sys.executable, str(Path(__file__).with_name("store_clients.py"))]
REPLY_TIMEOUT = 300.0  # a round of 1,024 agents takes seconds; this only catches a hang
# 1,024 TCPStore clients took 230 s to connect here (one connect in about 30 stalls for 5 s).
CONNECT_TIMEOUT = 900.0
TICK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    pass


@dataclass
class Child:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def reply(self, timeout: float = REPLY_TIMEOUT) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise BenchError(f"pid {self.proc.pid} gave no answer in {timeout:.0f} s") from None
        if line is None:
            raise BenchError(f"pid {self.proc.pid} exited with {self.proc.wait()}")
        return line

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def cpu(self) -> float:
        """CPU seconds (user + system) the process has used so far."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK


@contextmanager
def children(argvs: list[list[str]], logs: Path, env: dict[str, str]) -> Iterator[list[Child]]:
    """Start the children (stderr to files under ``logs``); end them all on the way out."""
    started: list[Child] = []
    try:
        for i, argv in enumerate(argvs):
            with open(logs / f"child{i}.log", "w") as err:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    env=env,
                )
            started.append(Child(proc))
        yield started
    finally:
        for child in started:
            if child.proc.stdin:
                child.proc.stdin.close()
        for child in started:
            try:
                child.proc.wait(10)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    connect: float = 0.0  # seconds until every client was connected
    server_cpu: float = 0.0
    driver_cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)
    waits: int = 0
    form_ops: int = 0


def run_store(
    kind: str, clients: int, seconds: float, drivers: int, logs: Path, bare: bool = False
) -> list[Phase]:
    """The three phases on store ``kind``; returns their measurements."""
    # The agent store's secret, from the environment as agents take it (never in argv).
    env = {**os.environ, "PHALANX_RDZV_TOKEN": secrets.token_hex(16)}
    with children([[*CHILD, "serve", kind]], logs / kind, env) as (server,):
        port = server.reply(60)
        run_id = f"load-{uuid.uuid4().hex[:8]}"
        shares = [clients // drivers + (i < clients % drivers) for i in range(drivers)]
        firsts = [sum(shares[:i]) for i in range(drivers)]
        mode = "bare" if bare else "beating"  # the first round's heartbeats
        argvs = [
            [*CHILD, "drive", kind, port, run_id, str(first), str(count), str(clients), mode]
            for first, count in zip(firsts, shares, strict=True)
            if count
        ]
        start = time.perf_counter()
        with children(argvs, logs / kind, env) as fleet:
            for driver in fleet:
                if driver.reply(CONNECT_TIMEOUT) != "ready":
                    raise BenchError(f"driver {driver.proc.pid} did not connect")
            phases = [Phase("round0"), Phase("steady"), Phase("round1")]
            phases[0].connect = time.perf_counter() - start
            for phase in phases:
                cpu = server.cpu(), sum(d.cpu() for d in fleet)
                start = time.perf_counter()
                for driver in fleet:
                    driver.send(phase.name)
                for driver in fleet:
                    driver.reply()
                if phase.name == "steady":
                    time.sleep(seconds)
                phase.seconds = time.perf_counter() - start
                phase.server_cpu = server.cpu() - cpu[0]
                phase.driver_cpu = sum(d.cpu() for d in fleet) - cpu[1]
            for driver in fleet:
                driver.send("stop")
            by_name = {p.name: p for p in phases}
            for driver in fleet:
                answer: dict[str, Any] = json.loads(driver.reply())
                for name, ops in answer["samples"].items():
                    for op, samples in ops.items():
                        if op == "wait":
                            by_name[name].waits += len(samples)
                        else:
                            by_name[name].latencies.extend(samples)
                for name, count in answer["form_ops"].items():
                    by_name[name].form_ops += count
    return phases


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


ROWS = {
    "round0": "first round (all join, + heartbeats)",
    "steady": "steady (heartbeat threads)",
    "round1": "restart round (+ heartbeats)",
}


def row(phase: str, bare: bool) -> str:
    return "first round (all join, no heartbeats)" if bare and phase == "round0" else ROWS[phase]


def table(results: dict[str, list[Phase]], clients: int, bare: bool = False) -> list[str]:
    connects = ", ".join(f"{kind} {phases[0].connect:.1f} s" for kind, phases in results.items())
    lines = [
        f"All {clients} clients connected (drivers started, imports included): {connects}.",
        "",
        "| store | phase | time | calls/s | calls per agent | p50 | p99 | max | server CPU | server CPU per call | drivers CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, phases in results.items():
        for p in phases:
            calls = len(p.latencies) + p.waits
            if p.name == "steady":
                per_agent = f"{calls / clients / p.seconds:.1f}/s"
            else:
                per_agent = f"{p.form_ops / clients:.1f} (round)"
            ms = [1000 * percentile(p.latencies, q) for q in (0.5, 0.99, 1.0)]
            lines.append(
                f"| {kind} | {row(p.name, bare)} | {p.seconds:.2f} s | {calls / p.seconds:,.0f} | "
                f"{per_agent} | {ms[0]:.2f} ms | {ms[1]:.2f} ms | {ms[2]:.2f} ms | "
                f"{100 * p.server_cpu / p.seconds:.0f}% | {1e6 * p.server_cpu / calls:.0f} us | "
                f"{100 * p.driver_cpu / p.seconds:.0f}% |"
            )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1024, help="agents, one connection each")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the steady state")
    parser.add_argument("--drivers", type=int, default=16, help="processes holding the clients")
    parser.add_argument("--stores", default=",".join(store_clients.STORES))
    parser.add_argument("--quick", action="store_true", help="16 clients, 1 s: a smoke run")
    parser.add_argument(
        "--bare-first-round", action="store_true",
        help="no heartbeats beside the first round (an agent's beat as it joins; figures "
        "before session 53 were taken so)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.seconds, args.drivers = 16, 1.0, 2
    kinds = args.stores.split(",")
    unknown = [k for k in kinds if k not in store_clients.STORES]
    if unknown or args.clients < 2 or args.drivers < 1 or args.seconds <= 0:
        print(
            f"store_load: expected --stores from {sorted(store_clients.STORES)}, --clients >= 2, "
            f"--drivers >= 1, --seconds > 0; got {args.stores!r}, {args.clients}, "
            f"{args.drivers}, {args.seconds}",
            file=sys.stderr,
        )
        return 2
    fds = store_clients.raise_fd_limit()
    load_before = os.getloadavg()[0]
    results: dict[str, list[Phase]] = {}
    with tempfile.TemporaryDirectory(prefix="store-load-") as scratch:
        for kind in kinds:
            (Path(scratch) / kind).mkdir()
            try:
                results[kind] = run_store(
                    kind, args.clients, args.seconds, args.drivers, Path(scratch),
                    args.bare_first_round,
                )  # fmt: skip
            except BenchError as exc:
                logs = "".join(p.read_text() for p in (Path(scratch) / kind).glob("*.log"))
                print(f"store_load: {kind}: {exc}\n{logs[-4000:]}", file=sys.stderr)
                return 1
    print("\n".join(table(results, args.clients, args.bare_first_round)))
    print(
        f"\n{args.clients} agents (one connection each) over {args.drivers} driver processes; "
        f"steady state {args.seconds:g} s; {os.cpu_count()} CPUs; open-file limit {fds}; "
        f"load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f}. CPU is a "
        "share of one core. Latency is one store call as the agent sees it (TcpKVStore's set "
        "is a SET and a CHECK: two round trips)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
