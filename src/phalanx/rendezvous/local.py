"""Single-node rendezvous: no store and no peers; every round gets a fresh master port."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.rendezvous.api import (
    JobEvent,
    NodeInfo,
    RendezvousResult,
    RoundVerdict,
    Signature,
    restarts_left,
)
from phalanx.resources.ports import free_port


def random_run_id() -> str:
    """A fresh run id, as ``str(uuid.uuid4())`` makes it: ``uuid`` is not imported for it
    (it imports ``platform``: 2-3 ms of every one-node launch's start)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122's variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class LocalRendezvous:
    """The whole job is this node. Used for ``--standalone`` and ``--nnodes 1``."""

    def __init__(
        self,
        run_id: str | None = None,
        master_addr: str = "localhost",
        first_port: int | None = None,
        worker_port: int | None = None,
    ) -> None:
        """``first_port``: the port for round 0 (a static ``--master-port``); later rounds
        take a fresh port so no restarted worker meets a dead worker's address -- unless
        ``worker_port`` is given: the port of every round (a program that uses the port it
        was given, ``phalanx.spawn``)."""
        self._run_id = run_id or random_run_id()
        self._master_addr = master_addr
        self._first_port = first_port
        self._worker_port = worker_port
        self._round = -1
        self._job = LocalJob()

    @property
    def run_id(self) -> str:
        return self._run_id

    def next_round(self, local_world_size: int) -> LocalRound:
        self._round += 1
        node = NodeInfo(0, socket.gethostname(), self._master_addr, local_world_size)
        result = RendezvousResult(
            run_id=self._run_id,
            round=self._round,
            restart_count=self._round,
            node_rank=0,
            nodes=(node,),
            master_addr=self._master_addr,
            master_port=self._port(),
        )
        return LocalRound(result, self._job)

    def _port(self) -> int:
        if self._worker_port:
            return self._worker_port
        return self._first_port if self._round == 0 and self._first_port else free_port()

    @property
    def quiet(self) -> bool:
        return True  # no peers, no store: nothing to poll for

    def poll(self) -> JobEvent | None:
        return None

    def failures(self) -> list[dict[str, object]]:
        return list(self._job.failures)

    def report_done(self, ok: bool, *, signum: int | None = None, preempted: bool = False) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def peers(self) -> None:
        return None  # no other node: no events pushed, no store to lose, nobody to ask


@dataclass
class LocalJob:
    """What a one-node job keeps across its rounds (a multi-node job keeps it in its store)."""

    failures: list[dict[str, object]] = field(default_factory=list)
    verdict: RoundVerdict | None = None  # the verdict on the last round judged
    judged: int = -1  # and that round
    preemption: dict[str, object] | None = None  # the notice of round ``preempted``
    preempted: int = -1


class LocalRound:
    """Round ``result`` of a one-node job: nobody to tell, nobody to wait for."""

    def __init__(self, result: RendezvousResult, job: LocalJob) -> None:
        self.result = result
        self._job = job

    def report_preemption(self, notice: dict[str, object]) -> dict[str, object]:
        job = self._job
        if job.preemption is None or job.preempted != self.result.round:
            job.preemption, job.preempted = dict(notice), self.result.round
        return job.preemption

    def preemption(self) -> dict[str, object] | None:
        job = self._job
        return job.preemption if job.preempted == self.result.round else None

    def report_failure(self, failure: dict[str, object]) -> int | None:
        seq = len(self._job.failures) + 1
        self._job.failures.append({"round": self.result.round, **failure, "seq": seq})
        return seq

    def judge_round(self, progressed: bool, signature: Signature) -> RoundVerdict:
        """The multi-node rule with this node as the whole job: nobody to wait for."""
        job, r = self._job, self.result.round
        if job.verdict is not None and job.judged == r:
            return job.verdict
        previous = job.verdict if job.judged == r - 1 else None
        records = [f for f in job.failures if f.get("round") == r]
        job.verdict, job.judged = RoundVerdict.after(previous, signature(records), progressed), r
        return job.verdict

    def claim_restart(self, max_restarts: int) -> bool:
        return restarts_left(self.result.restart_count, max_restarts) > 0

    def await_peers(self, interrupted: Callable[[], bool] = lambda: False) -> JobEvent | None:
        return None  # no peers

    def exchanges(self) -> None:
        return None  # nobody to ask
