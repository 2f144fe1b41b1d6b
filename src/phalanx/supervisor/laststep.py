"""The agent's side of the last step (``phalanx.checkpoint.LastStep``): before it stops a
round's workers after a failure, it asks the ranks that hold a copy of their last step to
write it, and waits a short, bounded time for the first answer.

Every live rank on the node that holds a copy is asked, not only the lowest: a frozen one
(SIGSTOP, a main thread holding the GIL in C) cannot answer, and the others then still can.
Their saves go through the checkpoint directory's lock, and only the first writes the step
(``save_if_newer``); the agent stops waiting at the first answer. A round with no holder
(a job that does not use ``LastStep``) is stopped at once, exactly as before.

A stop the agent decides before it carries it out (a hang: the report's dump comes first) asks
at the decision (``notify``): the ranks write the step while the dump runs, and the stop finds
the answer there already, rather than waiting the worker's ``NOTICE_POLL`` and the save.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from phalanx.supervisor.slot import Slot
from phalanx.worker.contract import LAST_STEP_DONE, LAST_STEP_HELD, LAST_STEP_NOTICE
from phalanx.worker.nofollow import replace_file

log = logging.getLogger("phalanx")

# The longest the agent waits for a last step before it stops the workers (never longer
# than the shutdown timeout). A small model's save takes milliseconds; the bound is paid in
# full only when no holder on the node can answer (all frozen).
LAST_STEP_GRACE = 5.0
# How often the wait looks for an answer (a file): the workers' exits wake it at once.
_ANSWER_POLL = 0.02

# Waits up to the given seconds for worker events, and records them (``Reaper``).
WaitEvents = Callable[[float], None]


def ask_last_step(slots: list[Slot], bound: float, wait_events: WaitEvents) -> None:
    """Ask each live holder on this node to write its last step; return at the first answer,
    when no holder is left alive, or after ``bound`` seconds."""
    began = time.monotonic()
    live = {s.plan.log_dir: s for s in slots if s.exit is None}
    asked = [live[log_dir] for log_dir in notify(live)]
    deadline = began + bound
    while asked:
        for slot in asked:
            answer = _answer(slot)
            if answer is not None:
                _said(slot, answer, time.monotonic() - began)
                return
        left = deadline - time.monotonic()
        if left <= 0 or all(s.exit is not None for s in asked):
            break
        wait_events(min(_ANSWER_POLL, left))
    if asked and all(s.exit is not None for s in asked):
        return  # each ended on its own (an exception exit saves the copy on the way out)
    if asked:
        log.warning(
            "no last step written within %g s by %s; stopping them (the next round resumes "
            "from the newest complete checkpoint)",
            bound,
            ", ".join(s.plan.name for s in asked),
        )


def notify(rank_dirs: Iterable[Path]) -> list[Path]:
    """Write the notice in each of ``rank_dirs`` (live ranks') whose rank holds a last step;
    returns the ones asked. Asking again is harmless: a rank answers once."""
    asked = []
    for rank_dir in rank_dirs:
        if not (rank_dir / LAST_STEP_HELD).exists():
            continue
        try:
            replace_file(rank_dir / LAST_STEP_NOTICE, b"")
            asked.append(rank_dir)
        except OSError as exc:
            log.warning("cannot ask %s for its last step: %s", rank_dir.name, exc.strerror or exc)
    return asked


def _answer(slot: Slot) -> dict[str, object] | None:
    try:
        found = json.loads((slot.plan.log_dir / LAST_STEP_DONE).read_bytes())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _said(slot: Slot, answer: dict[str, object], took: float) -> None:
    if answer.get("error"):
        log.warning("%s could not write its last step: %s", slot.plan.name, answer["error"])
    elif answer.get("written"):
        log.info("%s wrote its last step %s (%.2f s)", slot.plan.name, answer.get("step"), took)
    else:
        log.info(
            "%s: its last step %s was complete already (%.2f s)",
            slot.plan.name, answer.get("step"), took,
        )  # fmt: skip
