"""The last step: resume from the step the job had reached, not from the last periodic save.

Every rank keeps an in-memory copy of its training state after each optimizer step
(``LastStep.update``). When the job stops for a failure, a surviving rank writes that copy
into the checkpoint directory as an ordinary, complete checkpoint (``save_if_newer``: atomic,
with its marker, under the directory's lock, and not at all when that step or a later one is
complete there already), so the next round's ``load_latest`` finds it. Two ways it is written:

- at the agent's notice: stopping a round after a failure (this node's, another node's, a
  hang), the agent writes ``LAST_STEP_NOTICE`` in the rank directory of each live rank that
  said it holds a copy (``LAST_STEP_HELD``, written at the first ``update``), waits for the
  first answer (``LAST_STEP_DONE``) for at most a short bound, then stops the workers as it
  always did. A thread watches for the notice, not a signal handler: a survivor's main
  thread is often blocked inside a collective when its peer is frozen or cut off (Gloo
  blocks; NCCL always does), and Python runs signal handlers in the main thread only;
- on the way out of a ``with LastStep(...)`` block that an exception ends: a survivor whose
  collective raised (Gloo, a peer SIGKILLed) exits before its agent knows of the failure, and
  on another node that agent's notice would come too late. This works outside phalanx too
  (``torchrun``, a plain ``python``); there, no rank directory, no thread and no notice.

Why any rank's copy is valid: rank r finishes step k's optimizer step only after every rank's
gradients of step k were reduced, so its copy at k is the job's state at k; a rank that failed
inside step k+1 (an exception, a hang) still holds step k's. Ranks differ by at most one step;
whichever writes first, the newest complete step wins and the others write nothing.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from phalanx.inscript import checkpoint_dir
from phalanx.worker.contract import LAST_STEP_DONE, LAST_STEP_HELD, LAST_STEP_NOTICE, rank_dir
from phalanx.worker.nofollow import replace_file

# How often the watch thread looks for the agent's notice: one stat(2) each time, and the
# agent waits this long at most (on top of the save) before the copy starts to be written.
NOTICE_POLL = 0.05


def cpu_copy(state: Any) -> Any:
    """A copy of ``state`` that shares no memory with it: every tensor detached and copied to
    the CPU, dicts, lists and tuples rebuilt, anything else deep-copied."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: cpu_copy(value) for key, value in state.items()}
    if isinstance(state, list):
        return [cpu_copy(value) for value in state]
    if isinstance(state, tuple):
        return tuple(cpu_copy(value) for value in state)
    return copy.deepcopy(state)


class LastStep:
    """An in-memory copy of a rank's *replicated* training state after its last completed
    step, written to ``directory`` as a checkpoint when the job stops for a failure.

    Use: ``with checkpoint.LastStep(ckpt_dir, keep=2) as last:`` around the training loop,
    and ``last.update(step, state)`` on every rank after each optimizer step, with the same
    dict the script passes to ``checkpoint.save`` (and the step it would save it as). The
    copy (tensors copied to the CPU) costs one state's worth of host memory and one copy per
    step. It is written (``save_if_newer``) when the phalanx agent asks for it while it stops
    the round after a failure, and when an exception ends the ``with`` block, inside phalanx
    or not; never on a normal exit or when the process is killed.

    Only for state that every rank holds whole (DDP, or a single process). Sharded state
    (FSDP, ZeRO, tensor or pipeline parallelism) must not use it: a rank's shard is not the
    job's state, and a checkpoint written from one rank's shard would be silently wrong.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep: int | None = checkpoint_dir.DEFAULT_KEEP,
        lock_timeout: float | None = checkpoint_dir.DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 or None, got {keep}")
        self.directory = Path(directory)
        self._keep = keep
        self._lock_timeout = lock_timeout
        self._held: tuple[int, Any] | None = None
        self._saving = threading.Lock()  # the watch thread and an exception exit, one at a time
        self._rank_dir = rank_dir(os.environ)
        self._watch: threading.Thread | None = None

    @property
    def step(self) -> int | None:
        """The step of the copy held (None before the first ``update``)."""
        held = self._held
        return None if held is None else held[0]

    def update(self, step: int, state: Any) -> None:
        """Hold a copy of ``state``, the job's state once ``step`` steps are done. Call it
        after the optimizer step, on every rank."""
        held = (step, cpu_copy(state))
        self._held = held  # one reference swapped: a save in progress keeps the copy it took
        if self._watch is None and self._rank_dir is not None:
            self._announce(self._rank_dir)

    def save(self) -> checkpoint_dir.Checkpoint | None:
        """Write the copy now, unless a complete checkpoint of its step or a later one is in
        the directory already (or there is no copy yet): then None."""
        with self._saving:
            held = self._held
            if held is None:
                return None
            step, state = held
            return checkpoint_dir.save_if_newer(
                state, self.directory, step, keep=self._keep, lock_timeout=self._lock_timeout
            )

    def __enter__(self) -> LastStep:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            return
        # The exception is the story: a save that fails too is said, never raised over it.
        try:
            done = self.save()
        except Exception as failed:  # any failure of the save, said once
            _say(f"could not save the last step {self.step} on the way out: {failed!r}")
            return
        if done is not None:
            _say(
                f"saved the last step {done.step} on the way out ({kind.__name__ if kind else ''})"
            )

    def _announce(self, where: str) -> None:
        notice = os.path.join(where, LAST_STEP_NOTICE)
        thread = threading.Thread(
            target=self._watch_for, args=(notice, where), name="phalanx-laststep", daemon=True
        )
        thread.start()
        self._watch = thread
        try:  # after the thread: the agent's notice never reaches a rank with no watcher
            replace_file(os.path.join(where, LAST_STEP_HELD), str(os.getpid()).encode())
        except OSError as exc:  # the agent then stops this rank as it always did
            _say(f"cannot write {os.path.join(where, LAST_STEP_HELD)}: {exc.strerror or exc}")

    def _watch_for(self, notice: str, where: str) -> None:
        while not os.path.exists(notice):
            time.sleep(NOTICE_POLL)
        answer: dict[str, object] = {"step": self.step, "written": False}
        try:
            done = self.save()
            answer["written"] = done is not None
            if done is not None:
                _say(f"saved the last step {done.step} at the agent's notice")
        except Exception as exc:  # said to the agent, which says it once
            answer["error"] = repr(exc)
            _say(f"could not save the last step {self.step}: {exc!r}")
        with contextlib.suppress(OSError):  # the agent then waits its bound, no more
            replace_file(os.path.join(where, LAST_STEP_DONE), json.dumps(answer).encode())


def _say(line: str) -> None:
    print(f"phalanx: {line}", file=sys.stderr, flush=True)
