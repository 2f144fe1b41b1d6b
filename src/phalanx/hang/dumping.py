"""One request for the stacks of a round's live ranks, under way in a thread of its own.

``request_dumps`` (``phalanx.hang.stacks``) signals every rank, starts py-spy, and waits for
both: 0.1 s at best, 2-5 s on a loaded host, up to ``LONGEST_DUMP``. Run on the agent's tick,
that wait was the tick's: a rank killed, a peer's failure or the store lost meanwhile was
acted on only once the dump was in. ``Dump`` runs it in a thread; the tick looks at ``done``
and goes on, and the one who needs the texts (the hang report) takes them with ``texts``,
which waits for what is left of it. A dump never outlives its round: the agent waits for it
when the round ends (``RoundWatch.close``), and by then its workers are gone, which ends the
dump's waits at once (a gone rank writes nothing more, py-spy finds no process).

Also here: a node's section of a stacks file (``node_section``), and what a rank's missing
dump says (``odd_state``, ``no_dump``).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

from phalanx.hang.analysis import HangAnalysis
from phalanx.hang.rhythm import Bound
from phalanx.hang.stacks import DumpTarget, catches, request_dumps
from phalanx.tick import Running
from phalanx.worker.contract import STACK_SIGNAL

log = logging.getLogger("phalanx")


class Dump:
    """Every target's stack, asked for now, in a thread. ``running`` and ``progress`` are the
    round's live workers and their progress when it was asked (what its analysis reads)."""

    def __init__(
        self,
        running: Running,
        targets: Sequence[DumpTarget],
        why: str,
        native: Collection[int] | None,
        progress: Mapping[int, tuple[int, int]],
    ) -> None:
        self.running = tuple(running)
        self.progress = dict(progress)
        self._texts: dict[int, str] = {}
        self._thread = threading.Thread(
            target=self._run, args=(targets, why, native), name="phalanx-stacks", daemon=True
        )
        self._thread.start()

    def _run(self, targets: Sequence[DumpTarget], why: str, native: Collection[int] | None) -> None:
        try:
            self._texts = request_dumps(targets, why, native=native)
        except Exception:  # a bug of ours must not end the watch: the report has no stacks
            log.exception("stacks: the dump of %d rank(s) failed", len(targets))

    def done(self) -> bool:
        """Whether every dump is in (or given up on): ``texts`` then returns at once."""
        return not self._thread.is_alive()

    def texts(self) -> dict[int, str]:
        """Each rank's new dump text ("" where none came), once the dump is over."""
        self._thread.join()  # bounded: ``request_dumps`` has its own deadlines
        return self._texts


class Naming(NamedTuple):
    """A hang being named (``RoundWatch``): its dump under way, said once it is in."""

    dump: Dump
    bound: Bound
    ranks: list[int]


def node_section(analysis: HangAnalysis, texts: Mapping[int, str], host: str) -> str:
    """This node's section of a stacks file: a line per rank, then each rank's dump."""
    lines = [f"stacks of {len(analysis.ranks)} rank(s) on {host} at {time.ctime()}"]
    lines += analysis.rank_lines()
    for state in analysis.ranks:
        lines.append("")
        lines.append(f"=== rank {state.rank} (local rank {state.local_rank}, pid {state.pid}) ===")
        lines.append(texts.get(state.rank, "").rstrip("\n") or no_dump(state.pid))
    return "\n".join(lines) + "\n"


def odd_state(pid: int) -> str:
    """Why ``pid`` cannot answer a stack request, when its state says (else ""). psutil is
    imported here, when a rank did not answer: not on every launch (8 ms of its start)."""
    import psutil

    # Process states in which no stack can come (``psutil``'s names), said in words.
    odd_states = {
        psutil.STATUS_STOPPED: "stopped (state T)",
        psutil.STATUS_TRACING_STOP: "stopped by a tracer (state t)",
        psutil.STATUS_DISK_SLEEP: "in the kernel (state D, disk sleep)",
        psutil.STATUS_ZOMBIE: "a zombie (state Z: exited, not yet reaped)",
    }
    try:
        return odd_states.get(psutil.Process(pid).status(), "")
    except psutil.Error:
        return ""


def no_dump(pid: int) -> str:
    """Why a rank has no dump, and what would give one."""
    if state := odd_state(pid):
        return f"(no dump: the process is {state})"
    if catches(pid, STACK_SIGNAL):
        return "(no dump: the process did not answer in time)"
    if shutil.which("py-spy") is None:
        # A --spawn-owner or --no-python process: nothing of phalanx inside to dump it.
        return (
            f"(no dump: this process has no phalanx code to catch {STACK_SIGNAL.name}, as a "
            "--spawn-owner or --no-python program; install py-spy (pip install py-spy) and "
            "its stack and those of the processes it started are shown)"
        )
    return f"(no dump: this process does not catch {STACK_SIGNAL.name} and py-spy gave none)"
