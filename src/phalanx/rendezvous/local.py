"""Single-node rendezvous: no store and no peers; every round gets a fresh master port."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable

from phalanx.rendezvous.api import (
    JobEvent,
    NodeInfo,
    RendezvousResult,
    RoundVerdict,
    Signature,
    restarts_left,
)
from phalanx.resources.ports import free_port


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
        self._run_id = run_id or str(uuid.uuid4())
        self._master_addr = master_addr
        self._first_port = first_port
        self._worker_port = worker_port
        self._round = -1
        self._failures: list[dict[str, object]] = []
        self._verdict: tuple[int, RoundVerdict] | None = None  # the last round judged
        self._preemption: tuple[int, dict[str, object]] | None = None

    @property
    def run_id(self) -> str:
        return self._run_id

    def next_round(self, local_world_size: int) -> RendezvousResult:
        self._round += 1
        node = NodeInfo(0, socket.gethostname(), self._master_addr, local_world_size)
        return RendezvousResult(
            run_id=self._run_id,
            round=self._round,
            restart_count=self._round,
            node_rank=0,
            nodes=(node,),
            master_addr=self._master_addr,
            master_port=self._port(),
        )

    def _port(self) -> int:
        if self._worker_port:
            return self._worker_port
        return self._first_port if self._round == 0 and self._first_port else free_port()

    @property
    def quiet(self) -> bool:
        return True  # no peers, no store: nothing to poll for

    def poll(self) -> JobEvent | None:
        return None

    def report_preemption(self, notice: dict[str, object]) -> dict[str, object]:
        if self._preemption is None or self._preemption[0] != self._round:
            self._preemption = (self._round, dict(notice))
        return self._preemption[1]

    def preemption(self) -> dict[str, object] | None:
        found = self._preemption
        return found[1] if found is not None and found[0] == self._round else None

    def report_failure(self, failure: dict[str, object]) -> int | None:
        seq = len(self._failures) + 1
        self._failures.append({"round": self._round, **failure, "seq": seq})
        return seq

    def judge_round(self, progressed: bool, signature: Signature) -> RoundVerdict:
        """The multi-node rule with this node as the whole job: nobody to wait for."""
        judged = self._verdict
        if judged is not None and judged[0] == self._round:
            return judged[1]
        previous = judged[1] if judged is not None and judged[0] == self._round - 1 else None
        records = [f for f in self._failures if f.get("round") == self._round]
        verdict = RoundVerdict.after(previous, signature(records), progressed)
        self._verdict = (self._round, verdict)
        return verdict

    def failures(self) -> list[dict[str, object]]:
        return list(self._failures)

    def claim_restart(self, max_restarts: int) -> bool:
        return restarts_left(self._round, max_restarts) > 0

    def report_done(self, ok: bool, *, signum: int | None = None, preempted: bool = False) -> None:
        pass

    def await_peers(self, interrupted: Callable[[], bool] = lambda: False) -> JobEvent | None:
        return None  # no peers

    def shutdown(self) -> None:
        pass

    def peers(self) -> None:
        return None  # no other node: no events pushed, no store to lose, nobody to ask
