"""How a forked worker ends: what the interpreter's shutdown does, without its teardown.

A warm worker inherits the template's heap (torch and everything it imported). Letting the
interpreter tear itself down decrefs and frees every one of those objects, which writes to
-- and so copies -- every inherited page: on a 2-core machine about 2.5 s for 8 workers,
against 0.04 s for ``os._exit``. So a forked worker leaves through ``run_to_exit``, which
does what a program can observe of ``Py_FinalizeEx``, in its order, then calls ``os._exit``:

1. the exit status, as the interpreter takes it from ``SystemExit`` (``None`` -> 0, an int
   as is, anything else printed to stderr -> 1);
2. ``threading``'s shutdown: its exit hooks (``concurrent.futures`` executors stop their
   workers there), then every non-daemon thread joined;
3. ``atexit`` handlers, last registered first;
4. the files the program left open closed, which flushes their buffers (teardown would have
   finalized them): only objects created since the fork are looked at, since the template
   ``gc.freeze()``-s its own before forking, so nothing inherited is touched;
5. stdout and stderr flushed; a failed flush turns status 0 into 120, as python does.

Not repeated: ``__del__`` of objects still alive at exit, which python does not promise to
call either.

The launcher itself (``python -m phalanx``, the ``phalanx`` command) ends the same way
(``exit_launcher``) where nothing is left for the teardown to do: freeing its ~280 modules and
~20,000 objects took a median of 27-95 ms of a repeated launch's exit on a 2-core machine at
load 5-11. It imported no template's heap and froze nothing, so its files left open are
not closed but looked for: with one (a daemon thread may still write it), python ends it.
"""

from __future__ import annotations

import _io
import atexit
import contextlib
import gc
import io
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

# In-memory streams: closing them at exit has no effect anyone can see.
_IN_MEMORY = (io.BytesIO, io.StringIO)
# Closed after the wrappers above them (a TextIOWrapper, a GzipFile) have flushed into them.
_C_BUFFERED = (io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair)


def exit_status(exc: SystemExit) -> int:
    """The process status python would exit with for an uncaught ``exc`` (printing a
    non-integer code to stderr, as python does)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr if sys.stderr is not None else sys.__stderr__)
    return 1


def _layer(stream: io.IOBase) -> int:
    """Outermost first: text, Python-level buffered (gzip, bz2, lzma), C buffered, raw."""
    if isinstance(stream, io.TextIOBase):
        return 0
    if isinstance(stream, _C_BUFFERED):
        return 2
    if isinstance(stream, io.RawIOBase):
        return 3
    return 1


def _io_objects() -> list[io.IOBase]:
    """Every io object created since the last ``gc.freeze()`` but stdio, open or closed."""
    stdio: set[int] = set()
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        buffer = getattr(stream, "buffer", None)
        stdio.update(id(layer) for layer in (stream, buffer, getattr(buffer, "raw", None)))
    objects = [obj for generation in range(3) for obj in gc.get_objects(generation=generation)]
    # type(), not isinstance(): an instance check reads ``obj.__class__``, which some objects
    # answer with a side effect (torch's deprecated ``torch.distributed.reduce_op`` warns).
    # Each type asked once, of the C base every io class has (``io.IOBase`` is an ABC, whose
    # check took 3-30 ms of a launcher's 24,000 objects).
    kinds = {
        kind
        for kind in set(map(type, objects))
        if issubclass(kind, _io._IOBase) and not issubclass(kind, _IN_MEMORY)
    }
    return [obj for obj in objects if type(obj) in kinds and id(obj) not in stdio]


def _is_open(stream: io.IOBase) -> bool:
    try:
        return not stream.closed
    except Exception:  # a wrapper whose buffer was detached: nothing of its own to flush
        return False


def close_files_left_open() -> None:
    """Close every open io object created since the last ``gc.freeze()`` but stdio."""
    for stream in sorted(_io_objects(), key=_layer):
        # As in IOBase's finalizer: a failing close is no reason not to close the rest.
        with contextlib.suppress(Exception):
            if not stream.closed:
                stream.close()


def _flush_stdio() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            if not stream.closed:
                stream.flush()
        except Exception:
            ok = stream is not sys.stdout  # python reports only stdout's failure in the status
    return ok


def run_to_exit(job: Callable[[], None]) -> NoReturn:
    """Run ``job`` (the worker's code), then end the process as described above."""
    try:
        job()
        status = 0
    except SystemExit as exc:
        status = exit_status(exc)
    # What Py_FinalizeEx calls itself, private but the interpreter's own contract.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    close_files_left_open()
    if not _flush_stdio() and status == 0:
        status = 120
    os._exit(status)


def exit_launcher(status: int) -> NoReturn:
    """End the launcher with ``status`` as python would: its threads' shutdown and ``atexit``
    handlers (2 and 3 above), then, when no file but stdio is left open, stdout and stderr
    flushed and ``os._exit``; with one left open, python's own exit (which flushes it)."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    if any(_is_open(stream) for stream in _io_objects()):
        sys.exit(status)
    if not _flush_stdio() and status == 0:
        status = 120
    os._exit(status)
