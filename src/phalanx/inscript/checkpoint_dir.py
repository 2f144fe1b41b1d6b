"""The checkpoint directory's operations (atomic save, markers, latest, load, prune), as
``phalanx.checkpoint`` exports them; its docstring (``phalanx.inscript.checkpoint``) describes
the layout and the guarantees."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from phalanx.inscript.checkpoint_files import (
    TMP_SUFFIX,
    fsync_dir,
    make_dirs,
    rename_into_place,
    write_atomic,
    write_tmp,
)
from phalanx.inscript.checkpoint_lock import (
    DEFAULT_LOCK_TIMEOUT,
    LOCK_FILE,
    CheckpointLocked,
    locked,
)
from phalanx.inscript.checkpoint_log import append_log
from phalanx.worker.progress import pause

__all__ = [
    "DEFAULT_KEEP",
    "DEFAULT_LOCK_TIMEOUT",
    "LOCK_FILE",
    "Checkpoint",
    "CheckpointLocked",
    "checkpoint_name",
    "checkpoints",
    "latest",
    "load_latest",
    "prune",
    "save",
    "save_file",
    "save_if_newer",
]

DEFAULT_KEEP = 2
# A reader that keeps finding its checkpoint pruned or replaced lists the directory again;
# each pass races one save of the writer, so a few passes are plenty.
READ_PASSES = 100

_NAME = re.compile(r"^step_(\d+)\.pt$")
_MARKER_SUFFIX = ".done"


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


def save_file(obj: object, path: str | os.PathLike[str]) -> Path:
    """``torch.save`` to ``path`` atomically: readers see the old file or the whole new one."""
    target = Path(path)
    make_dirs(target.parent)
    write_atomic(target, lambda f: torch.save(obj, f))
    return target


def save(
    obj: object,
    directory: str | os.PathLike[str],
    step: int,
    *,
    keep: int | None = DEFAULT_KEEP,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
) -> Checkpoint:
    """Save ``obj`` as the checkpoint for ``step``, then keep only the newest ``keep``.

    Returns the complete checkpoint; the pruning that follows never removes it, even when
    newer ones exist. ``keep=None`` keeps every checkpoint. Waits for another writer's save
    into ``directory`` for at most ``lock_timeout`` seconds (None: as long as it takes),
    then raises ``CheckpointLocked``. Only rank 0 should call this in DDP. The rank counts as
    paused meanwhile (``phalanx.pause``): the hang watch holds it to its grace (300 s by
    default), not its step rhythm, and never stops it for a slow save.
    """
    done = _save_paused(obj, directory, step, keep, lock_timeout, newer_only=False)
    assert done is not None  # only ``newer_only`` skips a save
    return done


def save_if_newer(
    obj: object,
    directory: str | os.PathLike[str],
    step: int,
    *,
    keep: int | None = DEFAULT_KEEP,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
) -> Checkpoint | None:
    """``save``, unless ``directory`` holds a complete checkpoint of ``step`` or a later one
    already: then nothing is written (no log line either) and None is returned. Checked
    under the directory's lock, so of several writers of one step only the first writes it
    (``LastStep``: every rank holds the same state)."""
    return _save_paused(obj, directory, step, keep, lock_timeout, newer_only=True)


def _save_paused(
    obj: object,
    directory: str | os.PathLike[str],
    step: int,
    keep: int | None,
    lock_timeout: float | None,
    newer_only: bool,
) -> Checkpoint | None:
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    folder = Path(directory)
    path = folder / checkpoint_name(step)
    if newer_only and _has_newer(folder, step):
        # Before the pause, whose end is a heartbeat: a save that writes nothing is no
        # progress (``agent.crashloop``). Looked at again under the lock.
        return None
    with pause():
        return _save(obj, folder, path, step, keep, lock_timeout, newer_only)


def _has_newer(folder: Path, step: int) -> bool:
    newest = latest(folder)
    return newest is not None and newest.step >= step


def _save(
    obj: object,
    folder: Path,
    path: Path,
    step: int,
    keep: int | None,
    lock_timeout: float | None,
    newer_only: bool,
) -> Checkpoint | None:
    make_dirs(folder)
    with locked(folder, f"saving step {step}", lock_timeout):
        if newer_only and _has_newer(folder, step):
            return None
        replacing = _complete_size(path, step)
        tmp = write_tmp(path, lambda f: torch.save(obj, f))
        size = tmp.stat().st_size
        if replacing is not None and replacing != size:
            # The old marker would not accept the new file: until the new marker is written,
            # a kill must leave a marker that accepts whichever copy the name then holds.
            try:
                _write_marker(path, step, size, previous_size=replacing)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        rename_into_place(tmp, path)
        now = _write_marker(path, step, size)
        done = Checkpoint(path, step)
        append_log(done.step, done.path, now)
        _prune_locked(folder, keep, protect=path.name)
    return done


def _marker(path: Path) -> Path:
    return path.with_name(path.name + _MARKER_SUFFIX)


def _write_marker(path: Path, step: int, size: int, previous_size: int | None = None) -> float:
    now = time.time()
    marker: dict[str, object] = {"step": step, "path": path.name, "size": size, "time": now}
    if previous_size is not None:
        marker["previous_size"] = previous_size
    payload = json.dumps(marker).encode()
    write_atomic(_marker(path), lambda f: f.write(payload))
    return now


def _accepted_sizes(path: Path, step: int) -> set[int]:
    """Sizes of the file that ``path``'s marker accepts as a complete checkpoint of ``step``."""
    try:
        marker = json.loads(_marker(path).read_bytes())
        if marker["step"] != step or marker["path"] != path.name:
            return set()
        sizes = {marker["size"], marker.get("previous_size", marker["size"])}
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {s for s in sizes if type(s) is int}


def _complete_size(path: Path, step: int) -> int | None:
    """The size of the complete checkpoint at ``path``, or None when it is not one."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    return size if size in _accepted_sizes(path, step) else None


def _candidates(folder: Path) -> list[Checkpoint]:
    """Every ``step_N.pt`` in ``folder``, complete or not, oldest first."""
    try:
        entries = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        match = _NAME.match(entry.name)
        if match:
            found.append(Checkpoint(entry, int(match.group(1))))
    return sorted(found, key=lambda c: c.step)


def checkpoints(directory: str | os.PathLike[str]) -> list[Checkpoint]:
    """Every complete checkpoint in ``directory``, oldest first."""
    return [c for c in _candidates(Path(directory)) if _complete_size(c.path, c.step) is not None]


def latest(directory: str | os.PathLike[str]) -> Checkpoint | None:
    """The newest complete checkpoint in ``directory``, or None (also when it does not exist)."""
    done = checkpoints(directory)
    return done[-1] if done else None


def _open_complete(ck: Checkpoint) -> tuple[IO[bytes] | None, object]:
    """``ck`` opened for reading if it is complete, else None; and what was seen of it.

    The file is opened before its marker is read: once open, a prune or a re-save that
    removes the name cannot take the bytes away, and the marker then vouches for them.
    """
    try:
        f = open(ck.path, "rb")  # noqa: SIM115 (returned open, or closed below)
    except FileNotFoundError:
        return None, (ck.path.name, None)
    try:
        size = os.fstat(f.fileno()).st_size
        accepted = _accepted_sizes(ck.path, ck.step)
    except BaseException:
        f.close()
        raise
    if size in accepted:
        return f, None
    f.close()
    return None, (ck.path.name, size, sorted(accepted))


def load_latest(
    directory: str | os.PathLike[str],
    map_location: str | torch.device = "cpu",
    *,
    weights_only: bool = True,
) -> Any:
    """``torch.load`` the newest complete checkpoint, or return None when there is none.

    A checkpoint pruned or replaced while it is being opened is skipped for the previous
    complete one; when none of those is left either, the directory is listed again.
    """
    folder = Path(directory)
    seen: object = None
    for _ in range(READ_PASSES):
        candidates = _candidates(folder)
        if not candidates:
            return None
        failed = []
        for ck in reversed(candidates):
            f, what = _open_complete(ck)
            if f is not None:
                with f:
                    return torch.load(f, map_location=map_location, weights_only=weights_only)
            failed.append(what)
        # Nothing complete. Seen the same way twice in a row, that is the directory's state
        # (debris only); otherwise a writer changed it under this pass, so look again.
        if failed == seen:
            return None
        seen = failed
    raise RuntimeError(
        f"no checkpoint in {folder} could be read in {READ_PASSES} passes: each was pruned "
        "or replaced while it was being opened (is a writer saving in a tight loop?)"
    )


def prune(
    directory: str | os.PathLike[str],
    keep: int | None = DEFAULT_KEEP,
    *,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
) -> list[Path]:
    """Remove all but the newest ``keep`` complete checkpoints, plus debris of killed writes.

    Debris is temporary files, checkpoint files without a valid marker, and markers without
    their checkpoint; the lock keeps another writer's save in progress out of it. Returns
    what was removed. ``keep=None`` removes only debris.
    """
    folder = Path(directory)
    if not folder.is_dir():
        return []
    with locked(folder, "pruning", lock_timeout):
        return _prune_locked(folder, keep)


def _prune_locked(folder: Path, keep: int | None, protect: str | None = None) -> list[Path]:
    complete = checkpoints(folder)
    n_stale = max(len(complete) - keep, 0) if keep is not None else 0
    kept = {c.path.name for c in complete[n_stale:]}
    if protect is not None and protect in {c.path.name for c in complete}:
        kept.add(protect)  # a save never returns (and logs) a checkpoint it just removed
    removed: list[Path] = []
    for old in complete:
        if old.path.name in kept:
            continue
        # Marker first: dying in between leaves debris, never a checkpoint that looks complete.
        _marker(old.path).unlink(missing_ok=True)
        old.path.unlink(missing_ok=True)
        removed.append(old.path)
    for entry in sorted(folder.iterdir()):
        base = entry.name.removesuffix(_MARKER_SUFFIX)
        is_tmp = entry.name.startswith(".step_") and entry.name.endswith(TMP_SUFFIX)
        is_orphan = _NAME.match(base) is not None and base not in kept
        if is_tmp or is_orphan:
            entry.unlink(missing_ok=True)
            removed.append(entry)
    if removed:
        fsync_dir(folder)
    return removed
