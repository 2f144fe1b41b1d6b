"""Inside a fork of the warm-start template: become the worker ``python -u SCRIPT`` would be.

``become()`` sets up the process (its own process group, death with the template, stdio,
signal dispositions, environment, working directory, fresh per-process random state);
``run_job()`` then runs the script or module as ``__main__`` and ends the process the way
the interpreter would. What a worker can observe is the same as after a cold start:

- script: ``sys.argv == [SCRIPT, *ARGS]`` (as typed), ``sys.path[0]`` the real directory of
  the script, ``__file__`` the script joined to the working directory (not normalized), a
  fresh ``__main__`` with python's keys (``__loader__`` a ``SourceFileLoader``,
  ``__package__``/``__spec__``/``__cached__`` None), code compiled with no inherited
  ``__future__`` flags. The script is compiled and run here rather than with
  ``runpy.run_path``, which would set ``sys.argv[0]`` to the absolute path, ``__package__``
  to ``''`` and add its own frames to every traceback.
- module: exactly what ``python -m`` calls, ``runpy._run_module_as_main``, with
  ``sys.path[0]`` the working directory; a missing module exits with python's message.
- ``sys.path[0]`` is added just before the user's code runs: until then the working
  directory is not on ``sys.path`` (the template and every worker start with
  ``phalanx.worker.contract.isolated_main``), so the user's files cannot stand in for
  the modules phalanx imports.
- an uncaught exception prints through ``sys.excepthook`` with phalanx's frames removed and
  exits 1; ``SystemExit`` is left to the interpreter (codes, messages, ``None``); an
  uncaught ``KeyboardInterrupt`` ends the process by SIGINT after shutdown, as python does.
  Non-daemon threads are joined, ``atexit`` handlers run and files left open are flushed
  and closed; the process then leaves without tearing the interpreter down (see
  ``phalanx.worker.leave``: teardown would copy every page inherited from the template).

The command phalanx asks for is ``python -u -c BOOT_SHIM [-m] TARGET ...``, so a forked
worker runs ``phalanx.worker.boot.main`` first (the ``boot`` request), which installs
phalanx's worker-side code (progress counters, stack dumps on SIGUSR2) and then runs TARGET
through ``run_job`` again -- exactly what a cold worker does.

Known differences, none visible to the script itself: ``os.getppid()`` is the template,
``/proc/PID/cmdline`` shows the template's command, the string hash seed is the template's
(shared by the workers of a node), ``sys.modules`` already holds what the template
imported (torch, ``--preload`` modules), and the ``weakref.finalize`` callbacks those imports
registered are the template's: a worker does not run them at exit (``disown_finalizers``).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import ctypes
import importlib
import importlib.machinery
import os
import runpy
import signal
import sys
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from phalanx.worker.protocol import ForkRequest

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded in the template: no dlopen after fork

# Frames of these files are phalanx's, not the user's: cut from uncaught tracebacks.
_OWN_FILES = frozenset(
    {__file__, *(os.path.join(os.path.dirname(__file__), f) for f in ("template.py", "boot.py"))}
)
_die_by_sigint = False
_exit_hook_installed = False


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies; exit now if the parent is already gone.

    The getppid check closes the race at fork: a parent that died before ``prctl`` has
    already handed this process to another parent and would never send the signal.
    """
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _reseed_torch(module: Any) -> None:
    # A cold process seeds torch's default CPU generator from the OS at start-up.
    module.default_generator.seed()


def _reseed_numpy(module: Any) -> None:
    # A cold process seeds numpy's global RandomState from the OS when numpy.random loads.
    module.seed()


def _new_multiprocessing_identity(module: Any) -> None:
    # A cold process draws its own authkey and records its start directory on import.
    module.current_process().authkey = os.urandom(32)
    module.ORIGINAL_DIR = os.path.abspath(os.getcwd())


# Per-process state that a module creates when it is imported, and that forked workers would
# otherwise share with the template and each other (and repeat on every restart). Python's
# own ``random`` reseeds itself at fork. Applied only to modules the template imported.
FRESH_STATE: dict[str, Callable[[Any], None]] = {
    "torch": _reseed_torch,
    "numpy.random": _reseed_numpy,
    "multiprocessing.process": _new_multiprocessing_identity,
}


def disown_finalizers() -> None:
    """Leave the finalizers registered before the fork to the template: not run at this
    worker's exit (those the job registers are). torch's import registers 134, one per
    operator library, whose unregistering took 0.1-0.2 s of CPU at each worker's exit --
    work that dies with the process anyway; and a preloaded module's finalizer that removes
    a shared resource (its temporary directory) would remove it from under the template and
    every other worker. ``_registry`` is private, but ``finalize.atexit`` is public."""
    registry: dict[weakref.finalize[Any, Any], Any] = weakref.finalize._registry  # type: ignore[attr-defined]
    for finalizer in list(registry):
        finalizer.atexit = False


def become(
    request: ForkRequest,
    stdio: tuple[int, int],
    template_pid: int,
    signals: dict[int, Any],
    mask: set[int],
) -> None:
    """Turn this fresh fork into the worker: everything but running its code.

    ``signals`` and ``mask`` are the template's dispositions and signal mask right after its
    imports -- what a cold worker has after importing the same modules.
    """
    os.setpgid(0, 0)  # the supervisor and the guardian kill the group whose id is our pid
    disown_finalizers()
    die_with_parent(template_pid)  # the template in turn dies with the agent
    for target, fd in zip((1, 2), stdio, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    for signum, handler in signals.items():
        if signal.getsignal(signum) != handler:
            signal.signal(signum, handler)
    signal.set_wakeup_fd(-1)
    # The template forked with its stop signals blocked; unblocking them only now, with this
    # process's dispositions back, delivers one sent since the fork (the agent's SIGTERM)
    # instead of losing it to the template's SIG_IGN.
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    # os.environ's setters call putenv/unsetenv, so native code sees the new values too.
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    for name, refresh in FRESH_STATE.items():
        if name in sys.modules:
            refresh(sys.modules[name])
    importlib.invalidate_caches()  # the user's files may have changed since the template began
    sys.orig_argv = list(request.orig_argv)


def _fresh_main() -> types.ModuleType:
    """A ``__main__`` module with the names the interpreter gives it before running code."""
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __annotations__={}, __builtins__=builtins, __loader__=importlib.machinery.BuiltinImporter
    )
    sys.modules["__main__"] = main
    return main


def _set_path0(entry: str) -> None:
    # Nothing stands for python's sys.path[0] until now (isolated_main took it off); with
    # PYTHONSAFEPATH (-P) python prepends nothing, and neither do we.
    if not getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, entry)


def _run_script(request: ForkRequest) -> None:
    path = request.target
    sys.argv = [path, *request.args]
    _set_path0(os.path.dirname(os.path.realpath(path)))
    filename = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    try:
        with open(filename, "rb") as handle:
            source = handle.read()
    except OSError as exc:
        sys.stderr.write(
            f"{sys.executable}: can't open file {filename!r}: [Errno {exc.errno}] {exc.strerror}\n"
        )
        sys.exit(2)
    main = _fresh_main()
    main.__dict__.update(
        __file__=filename,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", filename),
    )
    exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__)


def _run_module(request: ForkRequest) -> None:
    sys.argv = ["-m", *request.args]
    _set_path0(os.getcwd())
    _fresh_main()
    run_as_main: Callable[[str, bool], object] = getattr(  # noqa: B009 -- private on purpose
        runpy, "_run_module_as_main"
    )
    run_as_main(request.target, True)


# How each kind of request runs; the template adds "boot" (the worker's boot, which itself
# runs its target through ``run_job``: this module cannot import it back).
RUNNERS: Mapping[str, Callable[[ForkRequest], None]] = {
    "script": _run_script,
    "module": _run_module,
}


def run_job(
    request: ForkRequest, runners: Mapping[str, Callable[[ForkRequest], None]] = RUNNERS
) -> None:
    """Run the worker's code with ``runners[request.kind]``; return only when it completed
    (the caller then exits 0).

    ``SystemExit`` propagates to the interpreter unchanged; any other exception is printed
    as python prints it and turned into exit status 1.
    """
    try:
        runners[request.kind](request)
    except SystemExit:
        raise
    except BaseException as exc:
        _report_uncaught(exc)
        raise SystemExit(1) from None


def _report_uncaught(exc: BaseException) -> None:
    global _die_by_sigint
    # Keep what follows phalanx's last frame: the user's code (under runpy's two frames for
    # a module, as with python -m). Before it are the frames that started the template.
    tb = exc.__traceback__
    entry = exc.__traceback__
    while entry is not None:
        if entry.tb_frame.f_code.co_filename in _OWN_FILES:
            tb = entry.tb_next
        entry = entry.tb_next
    exc = exc.with_traceback(tb)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    if isinstance(exc, KeyboardInterrupt):
        _die_by_sigint = True
    sys.excepthook(type(exc), exc, tb)


def install_exit_hook() -> None:
    """Register ``exit_hook`` once per process, before anything else registers a handler."""
    global _exit_hook_installed
    if not _exit_hook_installed:
        _exit_hook_installed = True
        atexit.register(exit_hook)


def exit_hook() -> None:
    """Registered with ``atexit`` before anything else, so it runs last.

    After an uncaught ``KeyboardInterrupt`` python finishes its shutdown and then kills
    itself with SIGINT, so that its parent sees a death by SIGINT; do the same.
    """
    if not _die_by_sigint:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
