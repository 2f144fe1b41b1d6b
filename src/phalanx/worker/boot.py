"""``python -u -c BOOT_SHIM [-m] TARGET ARGS...``: phalanx's worker-side code, then the user's
script or module, as ``python -u [-m] TARGET ARGS...`` would run it.

Every python worker runs this first: a cold worker as its command, a warm one forked by the
template (which calls ``main`` as the shim would). ``BOOT_SHIM``
(``phalanx.worker.contract.isolated_main``) takes the working directory off ``sys.path``
first, so that nothing phalanx imports can be shadowed by the user's files (a ``types.py``
in the working directory, a script named ``signal.py``); ``run_job`` puts the script's
directory (or, for ``-m``, the working directory) first on ``sys.path`` just before the
user's code runs, as python does. ``install`` sets up, in the rank's log directory (the
directory of ``TORCHELASTIC_ERROR_FILE``):

- ``progress``: the counters the agent watches for hangs (``phalanx.worker.progress``);
- ``stacks.txt``: where ``faulthandler`` writes every thread's Python stack when the worker
  receives ``STACK_SIGNAL`` (SIGUSR2; the agent sends it on a hang and for ``phalanx
  stacks``), and -- unless the user already enabled faulthandler -- the stack at a fatal
  signal (SIGSEGV, SIGABRT, ...), which the failure report quotes.

- ``preempt``: the job's ``--preempt-signals`` are absorbed while a preemption's grace runs
  (``phalanx.worker.preempt``), and ``phalanx.preempted()`` reads the agent's notice.

Then a rank on another node than rank 0 waits, at most a second, until rank 0's store
listens (``phalanx.worker.master``: torch's client backs off for long when it is early).

No thread is started and no signal but ``STACK_SIGNAL`` and the preemption signals is
touched. What a script could notice: SIGUSR2 dumps stacks instead of ending the process, ``faulthandler.is_enabled()``
is True, and ``/proc/self/cmdline`` shows the shim (``sys.orig_argv`` does not). The script then runs
through ``phalanx.worker.become.run_job``: the same ``sys.argv``, ``sys.path[0]``,
``__main__``, tracebacks and exit codes as a plain python, and ``sys.orig_argv`` as python
would have shown it. A "script" that is a zip app, a directory or a ``.pyc`` is handed to a
plain ``python -u`` with ``exec`` (python itself decides how to run those), without the
worker-side code.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import zipfile
from collections.abc import Mapping
from typing import TextIO

from phalanx.worker import become, preempt, progress
from phalanx.worker.contract import BOOT_SHIM, STACK_SIGNAL, STACKS_FILE, rank_dir
from phalanx.worker.master import await_master
from phalanx.worker.nofollow import append_to
from phalanx.worker.protocol import ForkRequest

_stacks: TextIO | None = None  # faulthandler writes to its descriptor: keep it open


def install(environ: Mapping[str, str]) -> None:
    """Progress counters and stack dumps for this worker (nothing outside a phalanx rank)."""
    global _stacks
    directory = rank_dir(environ)
    if directory is None:
        return
    progress.open_counters(directory)
    progress.watch_optimizers()
    preempt.install(environ, directory)
    path = os.path.join(directory, STACKS_FILE)
    try:
        _stacks = os.fdopen(append_to(path), "a")  # lives forever
    except OSError as exc:  # a read-only or deleted run directory: the job goes on
        print(f"phalanx: cannot write {path} ({exc.strerror or exc}): no stack dumps for "
              "this rank", file=sys.stderr, flush=True)  # fmt: skip
        return
    faulthandler.register(STACK_SIGNAL, file=_stacks, all_threads=True, chain=False)
    if not faulthandler.is_enabled():  # a user's -X faulthandler keeps writing to stderr
        faulthandler.enable(file=_stacks, all_threads=True)


def _python_runs_it_itself(path: str) -> bool:
    """A zip app, a directory or compiled code: python's own rules decide how to run it."""
    if os.path.isdir(path):
        return True
    return os.path.isfile(path) and (path.endswith(".pyc") or zipfile.is_zipfile(path))


def _python_prefix() -> list[str]:
    """The interpreter and its options, as this process was started (``sys.orig_argv``
    before ``-c BOOT_SHIM``, or before ``-m phalanx.worker.boot``)."""
    for marker in (BOOT_SHIM, "phalanx.worker.boot"):
        if marker in sys.orig_argv[2:]:
            return sys.orig_argv[: sys.orig_argv.index(marker, 2) - 1]
    return [sys.executable, "-u"]


def main(argv: list[str]) -> None:
    """Run ``[-m] TARGET ARGS...`` (``argv``) as python would, after ``install``. The working
    directory must not be on ``sys.path`` (``BOOT_SHIM``): ``run_job`` adds the target's."""
    become.install_exit_hook()
    if not argv:
        sys.exit("usage: python -c BOOT_SHIM [-m] TARGET [ARGS...]")
    prefix = _python_prefix()
    if argv[0] == "-m" and len(argv) > 1:
        kind, target, args = "module", argv[1], argv[2:]
    else:
        kind, target, args = "script", argv[0], argv[1:]
        if _python_runs_it_itself(target):
            os.execv(sys.executable, [*prefix, *argv])
    sys.orig_argv = [*prefix, *argv]
    install(os.environ)
    await_master(os.environ)  # rank 0's store listening first spares torch's connect back-off
    become.run_job(ForkRequest(kind, target, tuple(args), {}, os.getcwd(), tuple(sys.orig_argv)))


if __name__ == "__main__":  # ``python -m phalanx.worker.boot``, by hand: as the shim would
    if not getattr(sys.flags, "safe_path", False):
        sys.path.pop(0)
    main(sys.argv[1:])
