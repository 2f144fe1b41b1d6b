"""What a rendezvous hands the agent, and the interface every rendezvous implements.

The agent's loop is: ``next_round()`` (a ``Round``: the round's facts and its calls) -> start
workers -> while they run, call ``poll()`` every monitor tick -> on a local failure the
round's ``report_failure()``; on a remote event stop the local workers -> ``next_round()``
again (restart) or ``shutdown()``.

Which transitions spend the restart budget is the agent's choice; the multi-node handlers
assume this policy: a worker failure (local, or ``PEER_FAILED``) and ``NODE_LOST`` go through
``claim_restart`` (a lost node is a failure of the job); ``NODE_WAITING`` (a scale-up) goes
straight to ``next_round`` without claiming, as torchelastic does; ``JOB_STOPPED`` and
``STORE_LOST`` end the job (``report_done(False)``, then ``shutdown()``).

Crash loops are judged job-wide: after a round that ended in failure every node calls
``judge_round`` with whether it saw progress, and gets the same ``RoundVerdict`` back (the
round's root-cause failure, the one before it, whether any node progressed); the agent's
policy turns that into "restart" or "crash loop" identically everywhere.

Stacks on request (``phalanx stacks`` on any node) go through a ``StackExchange`` (a round's
``exchanges().stacks``): the node asked posts ``request_stacks()``; every node's watch sees
the number grow in ``stack_requests()``, dumps its ranks and ``post_stacks``; the requester's
helper thread ``gather_stacks`` the answers. ``phalanx status`` goes the same way through a
``StatusExchange``: each node answers with its status and events (``phalanx.status``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from phalanx.rendezvous.fencing import Fence


@dataclass(frozen=True)
class NodeInfo:
    """One member of a round."""

    node_rank: int
    hostname: str
    addr: str  # the address other nodes reach this node at
    local_world_size: int


@dataclass(frozen=True)
class RendezvousResult:
    """The membership the nodes agreed on for one round.

    ``master_addr``/``master_port`` are where global rank 0 hosts the workers' store
    (phalanx sets ``TORCHELASTIC_USE_AGENT_STORE=False``); the port is fresh every round so
    a restarted worker never sees a dead worker's address."""

    run_id: str
    round: int
    restart_count: int
    node_rank: int
    nodes: tuple[NodeInfo, ...]
    master_addr: str
    master_port: int
    # What each node (in ``nodes`` order) published about its code and versions
    # (``phalanx.consistency``); empty where the rendezvous carries none (one node).
    fingerprints: tuple[Mapping[str, str], ...] = ()
    # Each member's agent (in ``nodes`` order): an id fresh for every agent process, so a
    # node whose agent was restarted is a new member; empty where the rendezvous has none.
    node_ids: tuple[str, ...] = ()
    # Why the round before this one was abandoned (every member of it gone, the restart
    # opened by a node waiting to join: ``dynamic.abandoned``); "" it was not.
    abandoned: str = ""

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def world_size(self) -> int:
        return sum(n.local_world_size for n in self.nodes)

    @property
    def rank_offset(self) -> int:
        """Global rank of this node's local rank 0."""
        return sum(n.local_world_size for n in self.nodes if n.node_rank < self.node_rank)

    @property
    def this_node(self) -> NodeInfo:
        """``nodes`` is ordered by node rank, so this is ``nodes[node_rank]``."""
        return self.nodes[self.node_rank]


class EventKind(Enum):
    PEER_FAILED = "peer_failed"  # another node's workers failed this round
    NODE_LOST = "node_lost"  # another node stopped heartbeating
    NODE_WAITING = "node_waiting"  # a new node wants in (elastic scale-up at the next round)
    JOB_STOPPED = "job_stopped"  # some node gave up for good (budget spent, fatal error)
    STORE_LOST = "store_lost"  # this node cannot reach the rendezvous store; the job cannot go on
    # A node got a preemption signal: every node forwards it to its workers and stops them
    # by the job's deadline (``failure`` holds the notice: signal, time, grace, node).
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class JobEvent:
    kind: EventKind
    node_rank: int | None = None
    detail: str = ""
    failure: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundVerdict:
    """What the whole job agreed about a round that ended in failure: the inputs of the
    crash-loop rule, the same on every node (the first node to judge the round writes it).

    ``failure`` is the round's root cause as a signature (rank, exit, last line of stderr;
    "" when no worker failed on its own, e.g. its node was lost); ``previous`` the latest
    signature of the rounds before ("" none); ``progressed`` whether any node saw progress
    during the round (a completed checkpoint, a progress counter that moved)."""

    failure: str = ""
    previous: str = ""
    progressed: bool = False

    @property
    def repeated(self) -> bool:
        """The round failed the same way as the last failure before it."""
        return bool(self.failure) and self.failure == self.previous

    @property
    def latest(self) -> str:
        """The failure the next round is compared with (a round without one carries it on)."""
        return self.failure or self.previous

    @staticmethod
    def after(previous: RoundVerdict | None, failure: str, progressed: bool) -> RoundVerdict:
        """The verdict on a round whose own facts are ``failure`` and ``progressed``, given
        the verdict on the round before it (None: none, or it was not judged)."""
        return RoundVerdict(failure, previous.latest if previous else "", progressed)

    def to_json(self) -> dict[str, object]:
        return {"failure": self.failure, "previous": self.previous, "progressed": self.progressed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundVerdict:
        """Raises ``KeyError``/``TypeError`` on a malformed body (the caller names the key)."""
        failure, previous, progressed = data["failure"], data["previous"], data["progressed"]
        if not (isinstance(failure, str) and isinstance(previous, str)):
            raise TypeError(f"failure {failure!r}, previous {previous!r}")
        if not isinstance(progressed, bool):
            raise TypeError(f"progressed {progressed!r}")
        return cls(failure, previous, progressed)


# The round's root cause as a signature, from its failure records of every node.
Signature = Callable[[list[dict[str, object]]], str]


def restarts_left(restart_count: int, max_restarts: int) -> int:
    """The restarts the job may still spend after ``restart_count`` of ``--max-restarts``:
    the one place the budget is asked (the agent's loop, and each handler's
    ``claim_restart``, which holds the job-wide count)."""
    return max(0, max_restarts - restart_count)


class RendezvousHandler(Protocol):
    """One node's side of the rendezvous, across rounds: at most 8 members, as torch's
    handler (``tests/unit/test_layout.py`` holds it there). What belongs to one round is on the
    ``Round`` that ``next_round`` returns."""

    @property
    def run_id(self) -> str: ...

    def next_round(self, local_world_size: int) -> Round:
        """Join the next round and block until it forms (raises ``RendezvousError`` on timeout).

        Called for the first start and for every restart; ``restart_count`` in the result is
        job-wide, the same on every node."""

    @property
    def quiet(self) -> bool:
        """Whether ``poll`` never has anything to say (one node, no store): the supervisor
        then ticks only as often as the agent's own checks need, not every monitor interval."""

    def poll(self) -> JobEvent | None:
        """Non-blocking check for a job-wide event of the current round (one per call).

        Never waits on the network: multi-node handlers keep liveness fresh and read the
        events in a background thread, so a lost store shows up here as ``STORE_LOST``
        instead of a hang. A node never sees its own events."""

    def failures(self) -> list[dict[str, object]]:
        """The failures reported in the job's last rounds, from all nodes, oldest first (for
        the root-cause report). A long job's older rounds' records are deleted as it goes
        (at least the current round's and the one before it are kept); empty once the store
        is lost."""

    def report_done(self, ok: bool, *, signum: int | None = None, preempted: bool = False) -> None:
        """This node's workers finished (``ok=True``: peers see nothing) or the node gives up
        for good (``ok=False``: every peer sees ``JOB_STOPPED``, and no new round forms).
        ``False`` after ``True`` is allowed: the job failed elsewhere after this node finished.
        ``signum``: the node gives up because it was asked to stop by that signal (``phalanx
        stop``, Ctrl-C); the peers' ``JOB_STOPPED`` carries it as ``failure["signal"]``, so
        every node ends as interrupted by it. Also before any round formed (a node that
        leaves while joining)."""

    def shutdown(self) -> None:
        """Leave the rendezvous and release the store.

        After ``report_done(True)`` a multi-node handler first waits (bounded) until every
        node of the round is done, so the node hosting the store never takes it away from
        peers still finishing (torchrun's exit barrier). Without ``report_done`` first,
        peers see this node as ``NODE_LOST`` (a graceful scale-down).
        """

    def peers(self) -> Peers | None:
        """What only a job with other nodes has, per node (events pushed, rejoining, the
        fence); None for a single node, which has none of it."""


class Round(Protocol):
    """A round this node joined (``next_round``'s): the round's facts and its calls. It
    exists only once the round formed, so none of its calls asks whether one has."""

    @property
    def result(self) -> RendezvousResult:
        """The membership the nodes agreed on for this round."""

    def report_failure(self, failure: dict[str, object]) -> int | None:
        """Tell every node that this node's workers failed this round (``failure`` is JSON-able).

        Returns the failure's sequence number, job-wide and increasing in the order failures
        reached the store (``failures()`` returns it as ``seq`` in the record): the root cause
        is ordered by it, never by the hosts' clocks. None when the store could not take it."""

    def claim_restart(self, max_restarts: int) -> bool:
        """Whether the job-wide budget allows another round; idempotent per round across nodes.

        No restart once a node of the round has finished its workers (``report_done(True)``):
        they would not run again, so the next round could not form."""

    def judge_round(self, progressed: bool, signature: Signature) -> RoundVerdict:
        """After a round that ended in failure (this node's ``report_failure`` done, if it
        had one): say whether this node saw progress during the round, wait until every
        member of the round has said so too or left it (at most ``join_timeout``; a lost
        node is seen as such by the heartbeats), and return the job's verdict on the round:
        ``signature`` of the round's failure records from every node, the verdict before
        it, and whether any node progressed. The first node to judge writes the verdict
        for all: idempotent per round, the same on every node (as ``claim_restart``).
        Raises ``RendezvousError`` when the store cannot be reached."""

    def report_preemption(self, notice: dict[str, object]) -> dict[str, object]:
        """This node got a preemption signal (``notice``: JSON-able, its ``time`` the wall
        clock of that moment): the first node to say so in a round sets the job's notice
        and every other node sees ``PREEMPTED`` with it. Returns the job's notice (another
        node's if it was first; ``notice`` itself when the store cannot be reached)."""

    def preemption(self) -> dict[str, object] | None:
        """The job's preemption notice of this round (None: not preempted). A store read:
        for after the round, where workers that saw ``phalanx.preempted()`` through their
        collective may have ended before this node heard the event."""

    def await_peers(self, interrupted: Callable[[], bool] = ...) -> JobEvent | None:
        """After ``report_done(True)``: block until every node of the round is done, at most
        ``exit_barrier_timeout`` (torchrun's exit barrier), or until ``interrupted()`` (asked
        a few times a second; a signal to the launcher). ``None`` when they all finished,
        and also, with a warning, on the timeout or when the store is gone (nothing is known
        of a failure then); otherwise the event that shows the job failed elsewhere after
        this node's workers finished: ``PEER_FAILED``, ``NODE_LOST`` or ``JOB_STOPPED``.
        Such a job cannot restart (finished workers are not run again); the caller reports
        the failure and ``report_done(False)``. Repeated calls return the first answer."""

    def exchanges(self) -> Exchanges | None:
        """How this node asks the round's other nodes and answers them (stacks, status, the
        node check); None for a single node."""


class Peers(Protocol):
    """The multi-node half of a rendezvous, per node (``RendezvousHandler.peers``; none alone)."""

    def on_event(self, ring: Callable[[], None]) -> None:
        """Have ``ring`` called (from another thread) when ``poll`` has something new, so the
        agent acts on a peer's event at once rather than at its next tick."""

    def on_last_word(self, listener: Callable[[dict[str, Any] | None], None]) -> None:
        """Have ``listener`` called with this node's last word (``phalanx.rendezvous.
        lastword``: what its guardian needs to tell the others at once that its agent died),
        now and whenever it changes (a new node id on ``rejoin``); None while it has none
        (it hosts the store, or it is leaving on purpose)."""

    def rejoin(self, failover_only: bool = False) -> bool:
        """After this node lost the store or fenced itself (``STORE_LOST``): once the store
        answers again (within ``close_timeout``), or a successor serves it (c10d: design.md,
        "When the store's host is lost"), come back as a new member for the next round;
        False when it cannot (no store, one that stayed out of reach, or an expired etcd
        lease). ``failover_only``: this node's workers failed; if the store does not answer
        (its host went with their peers), only a failover brings the node back. Raises
        ``CutOff`` when this node served the store and the others moved the job to a
        successor's while it was away (it is out). Blocks; a signal to the launcher
        interrupts it (the caller's)."""

    def store_moved(self) -> dict[str, object] | None:
        """The failover of the rendezvous store that the last ``rejoin`` took this node to
        (the ``store_moved`` event's fields), once; None: none (``dynamic.failover``)."""

    def stop_heard(self) -> JobEvent | None:
        """The ``JOB_STOPPED`` of a node that was stopped by a signal (``phalanx stop``,
        Ctrl-C; ``failure["signal"]``), once this node has read it, whatever happened since:
        the store's host may leave with the stop before this node asks the store again (it
        was stopping its workers), and the job still ended by that signal. None: none heard."""

    def fence(self) -> Fence | None:
        """What SIGKILLs this node's workers once it may have lost the store for longer than
        the others wait (``phalanx.rendezvous.fencing``): the supervisor guards every worker
        group with it. None where the store proves nothing of this node's (a leased store that
        does not say when it renewed)."""

    def job_running(self) -> bool:
        """Whether the job runs without this node, which may then join once its warm start is
        ready (``agent.join_when_ready``): False at the job's start, while a restart round waits
        for nodes, for the store's host or a fixed rank, and if the store cannot be read."""

    def while_spare(self, work: Callable[[Callable[[], bool]], None]) -> None:
        """Have ``work(needed)`` called on each turn of a wait as a spare (the job runs at MAX
        without this node); ``needed()``: a round waits for it (``checking.probe_ahead``)."""


@dataclass(frozen=True)
class Exchanges:
    """What the nodes of one round ask each other through the store (``Round.exchanges``)."""

    stacks: StackExchange
    status: StatusExchange
    check: CheckExchange


class StackExchange(Protocol):
    """Stacks on request between the nodes of a round (``phalanx stacks``; see above)."""

    def request_stacks(self) -> int:
        """Ask every node of the current round for its ranks' stacks; return the request's
        number (1, 2, ... per round). Raises ``RendezvousError`` when the store cannot be
        reached (the caller then has only its own node's stacks)."""

    def stack_requests(self) -> int:
        """The newest stacks request of the current round this node knows of (0: none),
        including its own. Never waits on the network (read by the heartbeat thread)."""

    def post_stacks(self, request: int, text: str) -> None:
        """This node's answer to ``request`` of the current round (cut to 256 KiB). One
        store write; store trouble is only logged."""

    def gather_stacks(
        self, round: int, request: int, node_ranks: Sequence[int], timeout: float
    ) -> dict[int, str]:
        """Block up to ``timeout`` until the nodes ``node_ranks`` of round ``round`` answered
        ``request``; return the answers there are, by node rank. Meant for a helper thread
        (the round is given, since the agent may have moved on); store trouble only logged."""


class StatusExchange(Protocol):
    """Status on request between the nodes of a round (``phalanx status``), shaped as the
    ``StackExchange``: a counter of requests per round, one answer key per node and request."""

    def request_status(self) -> int:
        """Ask every node of the current round for its status; return the request's number.
        Raises ``RendezvousError`` when the store cannot be reached."""

    def status_requests(self) -> int:
        """The newest status request of the current round this node knows of (0: none),
        including its own. Never waits on the network (read by the heartbeat thread)."""

    def spares(self) -> int:
        """How many agents wait for the next round (spares, while the round runs with MAX
        members), as the heartbeat thread last read it. Never waits on the network."""

    def post_status(self, request: int, data: bytes) -> None:
        """This node's answer to ``request`` of the current round (the caller bounds its
        size: ``phalanx.status.exchange``). One store write; store trouble is only logged."""

    def gather_status(
        self, round: int, request: int, node_ranks: Sequence[int], timeout: float
    ) -> dict[int, bytes]:
        """Block up to ``timeout`` until the nodes ``node_ranks`` of round ``round`` answered
        ``request``; return the answers there are, by node rank (each deleted from the store
        once read). For a helper thread; store trouble only logged."""


class CheckExchange(Protocol):
    """The node check's records of the current round (``phalanx.nodecheck``): one record per
    node and phase, read by every node (kept until the round is swept)."""

    def post_check(self, phase: str, data: bytes) -> None:
        """This node's record for ``phase`` of the current round. One store write; a failed
        write is only logged (the others then name this node as not answering). Raises
        ``RendezvousError`` once the store counts as lost (``poll``'s ``STORE_LOST``)."""

    def gather_check(
        self, phase: str, node_ranks: Sequence[int], timeout: float
    ) -> dict[int, bytes]:
        """Block up to ``timeout`` until the nodes ``node_ranks`` posted ``phase`` in the
        current round; return the records there are, by node rank. A failed read is only
        logged; ``RendezvousError`` as soon as the store counts as lost, mid-wait too."""
