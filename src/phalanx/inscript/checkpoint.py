"""Atomic checkpoints that survive being killed mid-write, and resuming from the newest one.

Layout of a checkpoint directory::

    step_000000100.pt         the checkpoint, written with ``torch.save``
    step_000000100.pt.done    its completion marker: JSON {"step", "path", "size", "time"}
    .step_000000120.pt.*.tmp  a write in progress (or one that was killed; the next save
                              removes it)

``save`` writes a temporary file in the same directory, flushes and fsyncs it, renames it
into place with ``os.replace``, fsyncs the directory, and only then writes the marker the
same atomic way. A checkpoint counts (``latest``, ``load_latest``) only when its marker
exists and names the file's step and size. A process killed at any moment (SIGKILL included)
therefore never replaces or hides the previous complete checkpoint: what it leaves is a
temporary file or a renamed file without a marker, and both are ignored, then pruned.

In a DDP job only rank 0 should call ``save`` (or ``prune``); this is not enforced. There is
one writer per directory: a ``save`` removes temporary files it did not create.

Crash-loop detection: when the environment variable ``PHALANX_CHECKPOINT_LOG`` names a file,
each completed ``save`` appends one JSON line ``{"step": ..., "path": ..., "time": ...}``
(``time`` in seconds since the epoch) to it. The phalanx agent sets it for its workers and
reads it to tell a job that keeps failing without progress from one that checkpoints
between failures.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from phalanx.worker.contract import CHECKPOINT_LOG_ENV
from phalanx.worker.nofollow import append_to

LOG_ENV = CHECKPOINT_LOG_ENV
DEFAULT_KEEP = 2

_NAME = re.compile(r"^step_(\d+)\.pt$")
_MARKER_SUFFIX = ".done"
_TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk."""

    path: Path
    step: int


def checkpoint_name(step: int) -> str:
    """File name of the checkpoint for ``step`` (zero-padded so names sort by step)."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step_{step:09d}.pt"


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    # Not tempfile.mkstemp: its 0600 mode would stick to the checkpoint; this honours umask.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # An exception (not a kill) leaves nothing behind; a kill leaves the .tmp for prune.
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def save_file(obj: object, path: str | os.PathLike[str]) -> Path:
    """``torch.save`` to ``path`` atomically: readers see the old file or the whole new one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(target, lambda f: torch.save(obj, f))
    return target


def save(
    obj: object, directory: str | os.PathLike[str], step: int, *, keep: int | None = DEFAULT_KEEP
) -> Checkpoint:
    """Save ``obj`` as the checkpoint for ``step``, then keep only the newest ``keep``.

    Returns the complete checkpoint. ``keep=None`` keeps every checkpoint. Only rank 0
    should call this in DDP (see the module docstring).
    """
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = save_file(obj, folder / checkpoint_name(step))
    now = time.time()
    marker = {"step": step, "path": path.name, "size": path.stat().st_size, "time": now}
    payload = json.dumps(marker).encode()
    _write_atomic(_marker(path), lambda f: f.write(payload))
    done = Checkpoint(path, step)
    _append_log(done, now)
    prune(folder, keep)
    return done


def _marker(path: Path) -> Path:
    return path.with_name(path.name + _MARKER_SUFFIX)


def _append_log(done: Checkpoint, when: float) -> None:
    log_path = os.environ.get(LOG_ENV)
    if not log_path:
        return
    line = json.dumps({"step": done.step, "path": str(done.path.resolve()), "time": when})
    # One write(2) on an O_APPEND descriptor: concurrent appenders never interleave lines.
    fd = append_to(log_path)  # in the run directory: never through a symlink
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _is_complete(path: Path, step: int) -> bool:
    try:
        marker = json.loads(_marker(path).read_text())
        return bool(
            marker["step"] == step
            and marker["path"] == path.name
            and marker["size"] == path.stat().st_size
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _candidates(folder: Path) -> list[Checkpoint]:
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Checkpoint(entry, int(match.group(1))))
    return sorted(found, key=lambda c: c.step)


def checkpoints(directory: str | os.PathLike[str]) -> list[Checkpoint]:
    """Every complete checkpoint in ``directory``, oldest first."""
    return [c for c in _candidates(Path(directory)) if _is_complete(c.path, c.step)]


def latest(directory: str | os.PathLike[str]) -> Checkpoint | None:
    """The newest complete checkpoint in ``directory``, or None (also when it does not exist)."""
    done = checkpoints(directory)
    return done[-1] if done else None


def load_latest(
    directory: str | os.PathLike[str],
    map_location: str | torch.device = "cpu",
    *,
    weights_only: bool = True,
) -> Any:
    """``torch.load`` the newest complete checkpoint, or return None when there is none."""
    newest = latest(directory)
    if newest is None:
        return None
    return torch.load(newest.path, map_location=map_location, weights_only=weights_only)


def prune(directory: str | os.PathLike[str], keep: int | None = DEFAULT_KEEP) -> list[Path]:
    """Remove all but the newest ``keep`` complete checkpoints, plus debris of killed writes.

    Debris is temporary files, checkpoint files without a valid marker, and markers without
    their checkpoint. Returns what was removed. ``keep=None`` removes only debris.
    """
    folder = Path(directory)
    if not folder.is_dir():
        return []
    complete = checkpoints(folder)
    n_stale = max(len(complete) - keep, 0) if keep is not None else 0
    kept = {c.path.name for c in complete[n_stale:]}
    removed: list[Path] = []
    for old in complete[:n_stale]:
        # Marker first: dying in between leaves debris, never a checkpoint that looks complete.
        _marker(old.path).unlink(missing_ok=True)
        old.path.unlink(missing_ok=True)
        removed.append(old.path)
    for entry in sorted(folder.iterdir()):
        base = entry.name.removesuffix(_MARKER_SUFFIX)
        is_tmp = entry.name.startswith(".step_") and entry.name.endswith(_TMP_SUFFIX)
        is_orphan = _NAME.match(base) is not None and base not in kept
        if is_tmp or is_orphan:
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
