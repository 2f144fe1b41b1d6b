"""Progress counters: a worker bumps them, its agent reads them to tell a hang from progress.

Each rank's counters live in a memfd the agent makes before it starts the worker
(``make_counters``) and holds until the next round's workers start or the run ends
(``supervisor.counters``); ``<rank log dir>/progress`` is a symlink to it
(``/proc/<agent pid>/fd/<n>``). The worker opens it through that link and maps it: bumping
it is a store to memory (no syscall, no thread), and the agent reads it with one ``pread``
per check on the descriptor it holds (``hold``), never touching the worker or the
run directory -- also after the worker ended; other readers (``phalanx status``) go through
the link. The memory is the kernel's, not the run directory's: a page-in cannot fail
the way a file's can on a struggling NFS mount (SIGBUS in ``step``), and the memfd is sealed
against shrinking, so nobody can cut it short under the mapping either. Layout (native byte
order: both sides run on the same machine): ``beats`` (u64, +1 on every ``heartbeat()``,
``step()`` and optimizer step), ``step`` (i64, the last ``step(n)``; -1 if never called), then
``paused`` (i64, how many ``pause()`` blocks the rank is in: a checkpoint save, an evaluation;
the hang watch does not count a paused rank's silence against its rhythm, ``phalanx.hang``).

Sources of beats, none of which needs user code:

- every ``optimizer.step()`` of every torch optimizer, through torch's public global hook
  ``torch.optim.optimizer.register_optimizer_step_post_hook``. It is registered when
  ``torch.optim.optimizer`` is imported (at once if it already is, as in a warm worker),
  by a one-shot import hook, so a worker that never imports torch never does;
- ``phalanx.step(n)`` / ``phalanx.heartbeat()`` for scripts that want precise progress
  (an evaluation loop with no optimizer, say). Outside phalanx both do nothing.

Stdlib only: the warm-start template imports this before torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.machinery
import mmap
import os
import re
import stat
import struct
import sys
import threading
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from phalanx.worker.nofollow import open_dir
from phalanx.worker.slowio import Answers

if TYPE_CHECKING:
    from importlib.abc import Loader as _Loader
else:
    # importlib.abc imports importlib.resources with it (2-3 ms): the launcher imports this
    # module on every launch (to read the counters) and the import system needs no base class.
    _Loader = object

FILE_NAME = "progress"
LAYOUT = struct.Struct("=Qq")  # beats, step
PAUSED = struct.Struct("=q")  # after them: the pause depth
SIZE = LAYOUT.size + PAUSED.size  # of the memfd (a file of LAYOUT.size alone reads unpaused)
NO_STEP = -1
MEMFD_NAME = "phalanx-progress"
_LINK = re.compile(r"/proc/[0-9]+/fd/[0-9]+")  # what make_counters links to, nothing else
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_HOOKED_MODULE = "torch.optim.optimizer"

_beats: ctypes.c_uint64 | None = None
_step: ctypes.c_int64 | None = None
_paused: ctypes.c_int64 | None = None
_map: mmap.mmap | None = None  # kept alive: the counters are views into it
READ_WAIT = 0.2  # seconds the agent waits for a counter's reading before using the last
_READS: Answers[tuple[int, int, int]] = Answers("phalanx-progress")
# The counters this process made and holds (the agent's): path -> memfd. Read from the
# descriptor, they need neither the run directory nor a thread to answer; the lock keeps a
# read from meeting a descriptor closed (or its number reused) under it.
_HELD: dict[str, int] = {}
_HELD_LOCK = threading.Lock()


def heartbeat() -> None:
    """Record progress (any unit: a batch, an evaluation step, a chunk of work)."""
    beats = _beats
    if beats is not None:
        beats.value += 1


def step(n: int) -> None:
    """Record that the training loop reached step ``n`` (also a heartbeat).

    The hang report shows each rank's last step, and a rank whose step is behind the others
    is named as a suspect.
    """
    beats, last = _beats, _step
    if beats is not None and last is not None:
        last.value = n
        beats.value += 1


class Pause(contextlib.ContextDecorator):
    """``pause()``'s block: entered, the rank counts as paused until it is left."""

    def __enter__(self) -> Pause:
        paused = _paused
        if paused is not None:
            paused.value += 1
        return self

    def __exit__(self, *exc: object) -> None:
        paused = _paused
        if paused is not None and paused.value > 0:
            paused.value -= 1
        heartbeat()  # the gap after a pause is measured from its end


def pause() -> Pause:
    """A block (``with phalanx.pause():``) or function (``@phalanx.pause()``) during which
    this rank makes no progress on purpose: a long evaluation, a checkpoint save
    (``phalanx.checkpoint.save`` pauses by itself). The hang watch holds a paused rank to
    the start-up grace instead of its step rhythm, and only names it, never stops it. Costs
    two stores to memory; nests; outside phalanx it does nothing."""
    return Pause()


def make_counters(rank_dir: str) -> int:
    """The agent's side: a zeroed, sealed counters memfd and ``rank_dir/progress`` linked to
    it (replacing the last one, atomically); the memfd's descriptor, which the caller holds
    for as long as the link may be read. Raises ``OSError`` when either cannot be made (the
    memfd is closed then)."""
    fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, LAYOUT.pack(0, NO_STEP) + PAUSED.pack(0))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        where = open_dir(rank_dir)  # a symlink on the way to it is refused
        try:
            temporary = f"{FILE_NAME}.{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=where)  # left by a write that failed half-way
            os.symlink(f"/proc/{os.getpid()}/fd/{fd}", temporary, dir_fd=where)
            os.replace(temporary, FILE_NAME, src_dir_fd=where, dst_dir_fd=where)
        finally:
            os.close(where)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_counters(rank_dir: str) -> None:
    """Map this rank's counters (``make_counters``); the module's counters then count.

    Best effort: where they cannot be had (the run directory could not take the link: a
    full log disk, a read-only or deleted run directory) the worker runs anyway with
    counters that count nothing, says so once on its stderr; the agent then cannot know
    this rank's progress (``read`` finds no file) and never takes that for "no progress"
    (``agent.crashloop``). Only the agent's memfd is mapped: a file in the run directory,
    whose page-ins can fail, never is.
    """
    global _beats, _step, _paused, _map
    path = os.path.join(rank_dir, FILE_NAME)
    try:
        mapped = _map_counters(path)
    except OSError as exc:
        print(
            f"phalanx: cannot write {path} ({exc.strerror or exc}): this rank runs on, "
            "its progress unknown to phalanx",
            file=sys.stderr,
            flush=True,
        )
        return
    _map = mapped
    _beats = ctypes.c_uint64.from_buffer(mapped, 0)
    _step = ctypes.c_int64.from_buffer(mapped, ctypes.sizeof(ctypes.c_uint64))
    _paused = ctypes.c_int64.from_buffer(mapped, LAYOUT.size)


def _map_counters(path: str) -> mmap.mmap:
    """The agent's memfd behind ``path``, mapped; ``OSError`` for anything else there."""
    target = os.readlink(path)
    if not _LINK.fullmatch(target):
        raise OSError(f"not a link to phalanx's counters: {target!r}")
    # Non-blocking: whatever the link leads to, opening it must not wait (a FIFO would).
    fd = os.open(target, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode, size = os.fstat(fd).st_mode, os.fstat(fd).st_size
        if not (
            stat.S_ISREG(mode)
            and size == SIZE
            and os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{MEMFD_NAME} ")
            and fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
        ):
            raise OSError(f"{target} is not phalanx's counters")
        return mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)


def hold(rank_dir: str, fd: int | None) -> None:
    """From now on, ``read`` of ``rank_dir``'s counters reads ``fd`` (a memfd this process
    made with ``make_counters`` and keeps open); ``None``: through the path again. Call with
    ``None`` before closing the descriptor."""
    path = os.path.normpath(os.path.join(rank_dir, FILE_NAME))
    with _HELD_LOCK:
        if fd is None:
            _HELD.pop(path, None)
        else:
            _HELD[path] = fd


def read(path: str) -> tuple[int, int] | None:
    """``(beats, step)`` from a progress file, or None when it does not exist (yet)."""
    found = read_counters(path)
    return None if found is None else found[:2]


def read_counters(path: str) -> tuple[int, int, int] | None:
    """``(beats, step, paused)`` from a progress file, or None when it does not exist. The
    agent's tick calls this: counters it holds are read from their memfd (no filesystem, no
    thread: a tick with eight ranks costs eight ``pread``, not sixteen thread hand-offs);
    any other path is read by ``worker.slowio``, so a run directory that answers slowly (a
    struggling NFS) gives the last reading known instead of holding up the agent."""
    with _HELD_LOCK:
        fd = _HELD.get(os.path.normpath(path))
        if fd is not None:
            return _unpack(os.pread(fd, SIZE, 0))
    return _READS.ask(path, lambda: _read_now(path), READ_WAIT)


def read_now(path: str) -> tuple[int, int] | None:
    """``read``, waiting for the filesystem however long it takes."""
    found = _read_now(path)
    return None if found is None else found[:2]


def _read_now(path: str) -> tuple[int, int, int] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(fd, SIZE, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _unpack(data)


def _unpack(data: bytes) -> tuple[int, int, int] | None:
    if len(data) not in (LAYOUT.size, SIZE):  # LAYOUT.size: a final copy, or an older file
        return None
    beats, last = LAYOUT.unpack_from(data)
    paused = PAUSED.unpack_from(data, LAYOUT.size)[0] if len(data) == SIZE else 0
    return int(beats), int(last), int(paused)


def _on_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
    heartbeat()


def _register(module: types.ModuleType) -> None:
    module.register_optimizer_step_post_hook(_on_optimizer_step)


def watch_optimizers() -> None:
    """Count every optimizer step as a beat, without importing torch here."""
    module = sys.modules.get(_HOOKED_MODULE)
    if module is not None:
        _register(module)
    elif not any(isinstance(f, _OptimizerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _OptimizerFinder())


class _OptimizerFinder:
    """Finds nothing itself: when ``torch.optim.optimizer`` is about to load, it asks the
    other finders for its spec and wraps the loader, so the hook is registered right after
    the module runs. One use: it leaves ``sys.meta_path`` on that import."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _HOOKED_MODULE:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _HookingLoader(spec.loader)
                return spec  # type: ignore[no-any-return]
        return None


class _HookingLoader(_Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        # Leave no trace: the module's loader is the real one, as if we never were here.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _register(module)
