"""Finding runs: the run directories under a log base, newest first (``phalanx ls`` and
``phalanx clean``), and the ``RUN`` argument of ``status``, ``logs``, ``stacks``,
``timeline`` and ``stop``: the run's directory, or -- for a run under the default log base,
where runs go without ``--log-dir`` and which ``phalanx ls`` lists -- its name, a unique
prefix of the name, or ``last`` (the newest run), so a user coming back to a run needs
only what ``phalanx ls`` shows."""

from __future__ import annotations

import os
from pathlib import Path

from phalanx.errors import UsageError
from phalanx.resources.rundir import default_log_base
from phalanx.status.view import RunView, gather, is_run_dir

LAST = "last"


def started_at(view: RunView) -> float:
    """When the run started (its status, else its directory's modification time)."""
    started = view.own.get("started_at")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        return float(started)
    return view.run_dir.stat().st_mtime


def listed(base: Path) -> list[RunView]:
    """Every run under ``base``, newest first, read from its files (no agent is asked: a
    list reads status.json, at most ~2 s old)."""
    if not base.is_dir():
        return []
    views = [gather(p, 0, ask_agent=False) for p in base.iterdir() if p.is_dir() and is_run_dir(p)]
    return sorted(views, key=started_at, reverse=True)


def run_directory(command: str, text: str) -> Path:
    """``text`` as a run directory: a path to one, else a name, a unique name prefix or
    ``last`` under the default log base. A ``UsageError`` (exit 2, one line) otherwise,
    listing the runs when a prefix names several."""
    given = Path(text)
    if is_run_dir(given):
        return given
    base = default_log_base()
    hint = (
        f"give the run's directory, or its name as 'phalanx ls' lists the runs in {base} "
        f"(a unique prefix will do, or '{LAST}')"
    )
    if not text or os.sep in text or text in (".", ".."):
        raise UsageError(f"{command}: {text!r} is not a phalanx run directory; {hint}")
    if text == LAST:
        views = listed(base)
        if not views:
            raise UsageError(f"{command}: no runs in {base}; {hint}")
        return views[0].run_dir
    names = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    names = [n for n in names if is_run_dir(base / n)]
    found = [n for n in names if n == text] or [n for n in names if n.startswith(text)]
    if len(found) == 1:
        return base / found[0]
    if found:
        raise UsageError(
            f"{command}: {text!r} names {len(found)} runs in {base}: {', '.join(found)}; "
            "give more of the name"
        )
    raise UsageError(
        f"{command}: {text!r} is not a phalanx run directory, nor a run's name in {base}; {hint}"
    )
