"""Turning signals to the launcher into events on a file descriptor: one watcher for all.

The handlers only record the signal; the wakeup fd wakes the supervisor's ``select`` so it
can stop the workers in order, from ordinary code, with its ``finally`` blocks intact.
``--signals-to-handle`` stop the job (``pending``). ``--preempt-signals`` start a preemption
instead (``take_preempt``), even when also listed to stop: a preemption signal is not an
interrupt. ``STACK_SIGNAL`` (``phalanx stacks``), unless it is one of those, asks for every
rank's stack instead (``take_stack_request``). A SIGHUP ignored when the watcher starts
(``nohup``) stays ignored.

Where phalanx only waits on others -- opening the rendezvous, forming a round -- there is
no loop of ours to notice a recorded signal, so inside ``raising()`` the handler raises
``Interrupted`` instead (``Preempted`` for a preemption signal: no worker runs to save): the wait ends at once (the rendezvous waits in slices of at most
a heartbeat interval, so a blocking store call returns within about a second), and the
``finally`` blocks on the way out tell the other nodes and stop everything this node started.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType

from phalanx.errors import Interrupted, Preempted
from phalanx.worker.contract import STACK_SIGNAL


class SignalWatcher:
    def __init__(
        self,
        names: tuple[str, ...],
        *,
        stacks: bool = False,
        preempt: tuple[str, ...] = (),
        stop_marker: Path | None = None,
    ) -> None:
        """Watch the signals ``names`` (stop) and ``preempt``; with ``stacks``, also
        ``STACK_SIGNAL`` for stack requests (unless listed: it then does what it is listed for).
        A preemption signal that comes while ``stop_marker`` exists is a stop (``phalanx
        stop`` leaves it before its SIGTERM: a person's stop, not the scheduler's)."""
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._received: list[int] = []
        self._previous: dict[int, object] = {}
        self._old_wakeup = -1
        self._raising = False
        # Python delivers signals to the main thread only; elsewhere we cannot watch them.
        self.active = threading.current_thread() is threading.main_thread()
        self._preempt = [signal.Signals[name] for name in preempt]
        self._signals = [signal.Signals[n] for n in names if signal.Signals[n] not in self._preempt]
        listed = (*self._signals, *self._preempt)
        self.stacks_active = self.active and stacks and STACK_SIGNAL not in listed
        self._stack_request = False
        self._preempts: list[int] = []
        self._stop_marker = stop_marker

    @property
    def fd(self) -> int:
        return self._reader.fileno()

    def __enter__(self) -> SignalWatcher:
        if self.active:
            self._old_wakeup = signal.set_wakeup_fd(
                self._writer.fileno(), warn_on_full_buffer=False
            )
            for sig in self._signals:
                if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                    continue  # started under nohup: a closed terminal must not stop the job
                self._previous[sig] = signal.signal(sig, self._handle)
            for sig in self._preempt:
                self._previous[sig] = signal.signal(sig, self._handle_preempt)
            if self.stacks_active:
                self._previous[STACK_SIGNAL] = signal.signal(STACK_SIGNAL, self._handle_stacks)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.active:
            for sig, handler in self._previous.items():
                # None: a handler installed outside Python (faulthandler, in a phalanx worker
                # that runs phalanx.spawn); the default is the best that can be put back.
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # type: ignore[arg-type]
            signal.set_wakeup_fd(self._old_wakeup)
        self._reader.close()
        self._writer.close()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._received.append(signum)
        if self._raising:
            self._raising = False  # once: the way out must not be interrupted again
            raise Interrupted(signum)

    def _handle_preempt(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_marker is not None and self._stop_marker.exists():
            self._handle(signum, frame)
            return
        self._preempts.append(signum)
        if self._raising:
            self._raising = False
            raise Preempted(signum)

    def take_preempt(self) -> int | None:
        """The next preemption signal received, if any (each is taken once: a second one
        during the grace means "now")."""
        return self._preempts.pop(0) if self._preempts else None

    def preempt_pending(self) -> int | None:
        """The next preemption signal received, left for ``take_preempt``."""
        return self._preempts[0] if self._preempts else None

    def _handle_stacks(self, signum: int, frame: FrameType | None) -> None:
        self._stack_request = True

    def take_stack_request(self) -> bool:
        """Whether ``STACK_SIGNAL`` came since the last call."""
        asked, self._stack_request = self._stack_request, False
        return asked

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """Inside this block a handled signal raises ``Interrupted`` (one that came before
        it raises on entry)."""
        if self._received:
            raise Interrupted(self._received[0])
        if self._preempts:
            raise Preempted(self._preempts[0])
        self._raising = True
        try:
            yield
        finally:
            self._raising = False

    def drain(self) -> None:
        try:
            while self._reader.recv(4096):
                pass
        except BlockingIOError:
            pass

    def pending(self) -> int | None:
        """The first signal received, if any."""
        return self._received[0] if self._received else None
