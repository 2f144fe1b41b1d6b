"""The agent's watch over a running round: stall detection, stacks on request, and stacks
when another node reports a hang.

``RoundWatch.see`` is one of the tick's watchers (``phalanx.tick``: it is handed each tick's
reading of the workers' counters); ``RoundWatch.hear`` wraps the rendezvous ``poll``. Files it
writes:

- ``<attempt dir>/hang_report.txt`` and ``hang_report.json``: on a hang, this node's
  analysis (``phalanx.hang.analysis``); every rank's dump is in its ``stacks.txt``;
- ``<run dir>/stacks_<time>.txt``: every rank's stack on request (``phalanx stacks`` or
  ``STACK_SIGNAL`` to the launcher), the job going on: at once on a single node; on several,
  every node's, gathered through the rendezvous (``phalanx.hang.jobstacks``).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from phalanx.hang.rhythm import Bound, RhythmDetector
from phalanx.hang.settings import FAIL_FACTOR, HangWatch
from phalanx.hang.stall import StallDetector, main_thread_cpu
from phalanx.plan import RoundPlan
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.tick import Reading, Running

# What a hang or a stack request reads (the dumps, their analysis, the files), imported when
# one comes: not on every launch, whose start is on its critical path.
if TYPE_CHECKING:
    from phalanx.hang.analysis import HangAnalysis
    from phalanx.hang.dumping import Dump, Naming
    from phalanx.hang.jobstacks import JobStacks

log = logging.getLogger("phalanx")


class StackAsks(Protocol):
    """Where stack requests to this launcher come from (``SignalWatcher``)."""

    def take_stack_request(self) -> bool: ...


class HangEvents(Protocol):
    """Where the hang watch's verdicts go besides the log (``AttemptEvents``)."""

    def hang_named(
        self, ranks: list[int], suspects: list[int], report: Path | None, bound: float
    ) -> None: ...

    def hang_over(self, rank: int, seconds: float, bound: float) -> None: ...


class RoundWatch:
    """One round's watch. ``hang`` is set when this node found a hang that fails the round
    (the supervisor then stops it); ``peer_hang`` when it dumped its ranks because a peer
    found one. With a stall timeout the first bound fails the round; else the hang watch
    (``hang_watch``) names a rank at its bound and fails the round only at ``FAIL_FACTOR``
    times it (``phalanx.hang.rhythm``). The tick is never held by a naming's dump (a
    ``Dump``, in a thread; said at the first tick after it is in), and ``due`` says when a
    rank's silence reaches its bound or its round's fail, for the tick to come then."""

    def __init__(
        self,
        plan: RoundPlan,
        *,
        stall_timeout: float | None,
        requests: StackAsks | None,
        check_every: float,
        job: JobStacks | None = None,
        hang_watch: HangWatch | None = None,
        events: HangEvents | None = None,
        stopping: Callable[[list[Path]], object] = lambda rank_dirs: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``job``: the round's job-wide stacks requests (None: a single-node round, where a
        request is answered with a file at once). ``stopping``: told the live ranks' directories
        when this watch has decided that the round stops (its hang, or a peer's), before the
        dump it takes first: their last step is asked for then (``supervisor.laststep.notify``),
        and written while the dump runs rather than after it."""
        self._plan = plan
        self._requests = requests
        self._job = job
        self._check_every = check_every
        self._clock = clock
        self._detector = StallDetector(stall_timeout, clock) if stall_timeout else None
        self._rhythm = (
            RhythmDetector(hang_watch, clock) if hang_watch and not stall_timeout else None
        )
        self._events = events
        self._stopping = stopping
        self._naming: Naming | None = None  # a hang's first naming, its dump under way
        self._named: dict[int, Bound] = {}  # ranks named hung (the watch goes on), and why
        self._next_check = clock()
        self._running: Running = ()
        self._reading = Reading(clock())  # the last tick's
        self.host = socket.gethostname()
        self.hang: HangAnalysis | None = None
        self.peer_hang: HangAnalysis | None = None
        self.detected_at = 0.0  # wall clock of the hang
        self.report_path: Path | None = None
        self._texts: dict[int, str] = {}  # the last dump of each rank
        # Each rank's progress when py-spy last dumped it: a stop's dump leaves out py-spy
        # for a rank that has not moved since (``_analyse``).
        self._native: dict[int, tuple[int, int]] = {}

    def see(self, reading: Reading) -> bool:
        """A tick's reading: True stops the round (a hang was found that fails it)."""
        self._reading = reading
        self._running = reading.running
        if self._naming is not None and self._naming.dump.done():
            self._say_named()
        requested = self._requests is not None and self._requests.take_stack_request()
        if requested and (self._job is None or not self._job.request()):
            self.snapshot()  # a single node, or the other nodes cannot be asked
        if self._job is not None and (asked := self._job.unanswered()):
            self._job.answer(asked, self._node_stacks("stacks on request"))
        watching = self._detector is not None or self._rhythm is not None
        now, due = self._clock(), self.due()
        if not watching or self.hang is not None:
            return False
        if now < self._next_check and (due is None or now < due):
            return False
        self._next_check = now + self._check_every
        if self._rhythm is not None:
            return self._see_rhythm(self._rhythm, reading)
        return self._detector is not None and self._see_stall(self._detector, reading)

    def due(self) -> float | None:
        """When the watch must look, whatever the tick's pace (the clock's time; None: no
        moment): the first live rank's silence reaching its bound (named then) or, named,
        ``FAIL_FACTOR`` times the bound it was named at (its round fails then). While the
        ranks move, that moment is a bound away (60 s at the defaults), past the next tick:
        no wake-up is added; it comes only for a rank silent that long."""
        rhythm = self._rhythm
        if rhythm is None or self.hang is not None:
            return None
        moments = []
        for worker, _ in self._running:
            rank = worker.global_rank
            since, named = rhythm.moved_at(rank), self._named.get(rank)
            if since is None:
                continue
            if named is None:
                moments.append(since + rhythm.bound(rank).seconds)
            elif named.acts:
                moments.append(since + FAIL_FACTOR * named.seconds)
        return min(moments, default=None)

    def _see_stall(self, detector: StallDetector, reading: Reading) -> bool:
        """``--stall-timeout``: a rank silent that long fails the round at once."""
        for worker, pid in reading.running:
            counters = reading.counters.get(worker.global_rank)
            detector.observe(worker.global_rank, counters, main_thread_cpu(pid))
        live = {worker.global_rank for worker, _ in reading.running}
        stalled = [rank for rank in detector.stalled() if rank in live]  # not ranks that ended
        if not stalled:
            return False
        self._fail(stalled, detector.timeout, f"--stall-timeout {detector.timeout:g}")
        return True

    def _see_rhythm(self, rhythm: RhythmDetector, reading: Reading) -> bool:
        """The hang watch: name a rank past its bound (the job goes on), say when a named
        one moves again, and fail the round when one is silent ``FAIL_FACTOR`` times the
        bound it was named at (only a rank that had a rhythm and was not paused)."""
        live = []
        for worker, pid in reading.running:
            rank = worker.global_rank
            live.append(rank)
            cpu = main_thread_cpu(pid) if rhythm.wants_cpu(rank) else None
            paused = rank in reading.paused
            ended = rhythm.observe(rank, reading.counters.get(rank), paused, cpu)
            if ended is not None and rank in self._named:
                self._moves_again(rank, ended)
        for gone in [rank for rank in self._named if rank not in live]:
            del self._named[gone]  # it ended: a later hang is a new one, said again
        over = {}
        for rank in live:
            bound = rhythm.bound(rank)
            if rank not in self._named and rhythm.idle(rank) >= bound.seconds:
                over[rank] = bound
        if over:
            self._name(over)
        failing = [
            rank
            for rank, bound in sorted(self._named.items())
            if rank in live and bound.acts and rhythm.idle(rank) >= FAIL_FACTOR * bound.seconds
        ]
        if not failing:
            return False
        bound = self._named[failing[0]]
        self._fail(failing, FAIL_FACTOR * bound.seconds, f"{FAIL_FACTOR:g} x {bound.rule}")
        return True

    def _name(self, over: dict[int, Bound]) -> None:
        """Ranks past their bound: the first of a hang is said with every rank's stack (once
        the dump, started now, is in); the ones that stop while it lasts (waiting for it,
        most likely) join it quietly."""
        quiet = bool(self._named)
        self._named.update(over)
        if quiet:
            return
        from phalanx.hang.dumping import Naming

        bound = min(over.values(), key=lambda b: b.seconds)
        self._naming = Naming(self._ask("hang suspected", stopping=False), bound, sorted(over))

    def _say_named(self) -> None:
        """The naming's report, log line and event, its dump in (waiting for what is left)."""
        assert self._naming is not None
        dump, bound, ranks = self._naming
        self._naming = None
        analysis = self._analysed(dump, bound.seconds, bound.rule)
        path = self._write(analysis, "named here; the job goes on")
        then = (
            f"fails the round at {FAIL_FACTOR * bound.seconds:g} s without progress"
            if bound.acts
            else "is not stopped by phalanx (a rank in its start-up or in a pause)"
        )
        log.warning(
            "hang: no progress from rank(s) %s for %g s (bound %s)%s; stacks: %s; the job "
            "goes on and %s",
            ", ".join(map(str, ranks)), bound.seconds, bound.rule, _suspects(analysis),
            path or "not written", then,
        )  # fmt: skip
        if self._events is not None:
            suspects = [s.rank for s in analysis.suspects]
            self._events.hang_named(ranks, suspects, path, bound.seconds)

    def close(self) -> None:
        """The round ended: a naming's dump still under way is waited for and said (its
        workers are gone, which ends it at once), before the round's own end is."""
        if self._naming is not None:
            self._say_named()

    def _moves_again(self, rank: int, silence: float) -> None:
        self.close()  # the naming said before the end of the silence it named
        bound = self._named.pop(rank)
        log.warning(
            "hang over: rank %d moves again after %.1f s without progress (named at %g s); "
            "watched again",
            rank, silence, bound.seconds,
        )  # fmt: skip
        if self._events is not None:
            self._events.hang_over(rank, round(silence, 3), bound.seconds)

    def _fail(self, stalled: list[int], timeout: float, rule: str) -> None:
        self.detected_at = time.time()
        self._stopping([worker.log_dir for worker, _ in self._running])
        self.hang = self._analyse("hang detected", timeout, rule, stopping=True)
        self.report_path = self._write(self.hang, "detected here")
        log.warning(
            "hang: no progress from rank(s) %s for %g s%s; report: %s",
            ", ".join(str(rank) for rank in stalled),
            timeout,
            _suspects(self.hang),
            self.report_path or "not written",
        )

    def hear(self, event: JobEvent | None) -> JobEvent | None:
        """Wraps the rendezvous ``poll``: on a peer's hang, dump this node's ranks before the
        supervisor stops them, so the job-wide report can place every rank."""
        if (
            event is not None
            and event.kind is EventKind.PEER_FAILED
            and event.failure.get("kind") == "hang"
            and self.hang is None
            and self._running
        ):
            why = f"hang found by node {event.node_rank}"
            self._stopping([worker.log_dir for worker, _ in self._running])
            self.peer_hang = self._analyse(why, 0.0, stopping=True)
            self.report_path = self._write(self.peer_hang, f"reported by node {event.node_rank}")
            log.warning(
                "node %s found a hang; this node's stacks: %s",
                event.node_rank,
                self.report_path or "not written",
            )
        return event

    def snapshot(self) -> Path | None:
        """Every live rank's stack now, into one file in the run directory."""
        if not self._running:
            log.warning("stacks requested, but no worker is running")
            return None
        from phalanx.hang.files import write_stacks_file

        try:
            path = write_stacks_file(self._plan.run_dir, self._node_stacks("stacks on request"))
        except OSError as exc:  # a full, read-only or deleted run directory: the job goes on
            log.warning("stacks: cannot write the stacks file in %s: %s", self._plan.run_dir, exc)
            return None
        log.info("stacks of %d rank(s) written to %s", len(self._running), path)
        return path

    def _node_stacks(self, why: str) -> str:
        """This node's section of a stacks file: a line per rank, then each rank's dump."""
        from phalanx.hang.dumping import node_section

        # A watch's bound, so that each rank's time without progress is shown (0: unknown).
        watching = self._detector.timeout if self._detector else 0.0
        analysis = self._analyse(
            why, watching or (self._rhythm.settings.floor if self._rhythm else 0.0)
        )
        return node_section(analysis, self._texts, self.host)

    def _analyse(
        self, why: str, timeout: float, rule: str = "", *, stopping: bool = False
    ) -> HangAnalysis:
        """Every live rank's stack (``_ask``) and where it stands, waited for here (a
        naming's dump under way is said first: its report, then this one)."""
        self.close()
        return self._analysed(self._ask(why, stopping=stopping), timeout, rule)

    def _ask(self, why: str, *, stopping: bool) -> Dump:
        """Ask for every live rank's stack (``request_dumps``, in a ``Dump``'s thread).
        ``stopping``: the round is stopped once it is in, and each moment of it delays the
        stop, here and on the nodes still waiting for this one's word: py-spy (0.1-0.6 s a
        process, a second and more on a loaded host) dumps only the ranks that moved since
        its last dump of them; a rank named at its bound and silent since has its native
        stack on file from then, and its Python stack is taken again (faulthandler, at once)."""
        from phalanx.hang.dumping import Dump
        from phalanx.hang.stacks import DumpTarget

        targets = [DumpTarget(w.global_rank, pid, w.log_dir) for w, pid in self._running]
        detector = self._detector or self._rhythm
        progress = {
            t.rank: detector.progress(t.rank)
            if detector is not None
            else self._reading.counters.get(t.rank) or (0, -1)
            for t in targets
        }
        native = [t.rank for t in targets if self._native.get(t.rank) != progress[t.rank]]
        self._native.update((rank, progress[rank]) for rank in (native if stopping else progress))
        return Dump(self._running, targets, why, native if stopping else None, progress)

    def _analysed(self, dump: Dump, timeout: float, rule: str = "") -> HangAnalysis:
        """Where each rank of ``dump`` stands, its stack in (waiting for it)."""
        from phalanx.hang.analysis import RankState, analyse
        from phalanx.hang.dumping import odd_state
        from phalanx.hang.stacks import main_thread, parse_dump

        self._texts = dump.texts()
        detector = self._detector or self._rhythm
        states = []
        for worker, pid in dump.running:
            rank = worker.global_rank
            thread = main_thread(parse_dump(self._texts.get(rank, "")))
            beats, step = dump.progress[rank]
            idle = detector.idle(rank) if detector is not None else 0.0
            states.append(
                RankState(
                    rank=rank,
                    local_rank=worker.local_rank,
                    node_rank=self._plan.rendezvous.node_rank,
                    host=self.host,
                    pid=pid,
                    log_dir=str(worker.log_dir),
                    idle=round(idle, 3),
                    beats=beats,
                    step=step,
                    frames=thread.frames if thread is not None and thread.frames else None,
                    state=odd_state(pid) if thread is None or not thread.frames else "",
                )
            )
        return analyse(states, timeout, rule)

    def _write(self, analysis: HangAnalysis, how: str) -> Path | None:
        """The hang report's files; None when they cannot be written (a full, read-only or
        deleted run directory: said in one line, and the failure report still has it all)."""
        from phalanx.hang.files import write_atomic

        base = self._plan.attempt_dir / "hang_report"
        node = self._plan.rendezvous.node_rank
        header = f"hang on {self.host} (node {node}), {how}, at {time.ctime()}"
        data = {"host": self.host, "node_rank": node, "how": how, **analysis.to_json()}
        try:
            write_atomic(base.with_suffix(".txt"), "\n".join([header, *analysis.summary()]) + "\n")
            write_atomic(base.with_suffix(".json"), json.dumps(data, indent=2) + "\n")
        except OSError as exc:
            log.warning("hang: cannot write %s (%s)", base.with_suffix(".*"), exc.strerror or exc)
            return None
        return base.with_suffix(".txt")


def _suspects(analysis: HangAnalysis) -> str:
    """The suspects, for a log line; nothing when none stands out (on several nodes the
    job-wide report, with every node's stacks, names them)."""
    if not analysis.suspects:
        return ""
    return "; suspects: " + ", ".join(f"rank {s.rank}" for s in analysis.suspects)
