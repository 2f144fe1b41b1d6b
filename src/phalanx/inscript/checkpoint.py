"""Checkpoints that survive being killed mid-write, and resuming from the newest one.

Layout of a checkpoint directory::

    step_000000100.pt         the checkpoint, written with ``torch.save``
    step_000000100.pt.done    its completion marker: JSON {"step", "path", "size", "time"}
    .step_000000120.pt.*.tmp  a write in progress (or one that was killed; the next save
                              removes it)
    .checkpoint.lock          held (flock) by the process saving or pruning; names it

``save`` writes a temporary file in the same directory, flushes and fsyncs it, renames it
into place with ``os.replace``, fsyncs the directory, and only then writes the marker the
same atomic way. A checkpoint counts (``latest``, ``load_latest``) only when its marker
exists and names the file's step and size. A process killed at any moment (SIGKILL included)
therefore never replaces or hides the previous complete checkpoint: what it leaves is a
temporary file or a renamed file without a marker, and both are ignored, then pruned.

Saving a step again replaces a complete copy, so the marker is rewritten first to accept
either copy (``"previous_size"``), then the new file is renamed over the old one, then the
marker names the new file alone: at every moment one whole copy of the step counts.

Writers: in a DDP job only rank 0 should call ``save``; this is not enforced. Several
writers into one directory are safe: a save (and ``prune``) holds the directory's lock file,
so the others wait; one that has waited ``lock_timeout`` seconds raises ``CheckpointLocked``
naming the holder's pid and host. Only the lock's holder removes temporary and unmarked
files, so it never removes another writer's work in progress. On a filesystem without
``flock`` (Lustre mounted without it) saves go on unlocked, as one writer, after a warning.
Readers take no lock: ``load_latest`` opens a checkpoint before it checks the marker, and
moves to the previous complete checkpoint (or lists the directory again) when one is pruned
or replaced under it.

The last step (``LastStep``): every rank of a DDP job keeps an in-memory copy of its state
after each optimizer step; when the job stops for a failure one of them writes it here as an
ordinary checkpoint (``save_if_newer``), so the next round resumes from the step the job had
reached rather than from the last periodic save. Replicated state only (see ``LastStep``).

New directories are durable: ``save`` fsyncs the parent of each directory it creates.

Crash-loop detection: when the environment variable ``PHALANX_CHECKPOINT_LOG`` names a file,
each completed ``save`` appends one JSON line ``{"step": ..., "path": ..., "time": ...}``
(``time`` in seconds since the epoch) to it. The phalanx agent sets it for its workers and
reads it to tell a job that keeps failing without progress from one that checkpoints
between failures. That line is best effort: ``save`` raises only for the checkpoint's own
files; a log line that cannot be written (a full, read-only or deleted run directory) is
said once on stderr, and the checkpoint stands.
"""

from __future__ import annotations

from phalanx.inscript.checkpoint_dir import (
    DEFAULT_KEEP,
    DEFAULT_LOCK_TIMEOUT,
    LOCK_FILE,
    Checkpoint,
    CheckpointLocked,
    checkpoint_name,
    checkpoints,
    latest,
    load_latest,
    prune,
    save,
    save_file,
    save_if_newer,
)
from phalanx.inscript.laststep import LastStep

__all__ = [
    "DEFAULT_KEEP",
    "DEFAULT_LOCK_TIMEOUT",
    "LOCK_FILE",
    "Checkpoint",
    "CheckpointLocked",
    "LastStep",
    "checkpoint_name",
    "checkpoints",
    "latest",
    "load_latest",
    "prune",
    "save",
    "save_file",
    "save_if_newer",
]
