"""Why a worker failed: one of a few kinds, from its exit and the evidence it left.

Pure functions: the agent gathers the evidence (stderr tail, error file, out-of-memory
evidence, the stack faulthandler wrote at a fatal signal) and ``classify`` decides.

=============  ==============================================================================
kind           when
=============  ==============================================================================
exception      an uncaught Python exception: a traceback ends its stderr, or it wrote an
               error file (torch's ``@record``); ``reason`` is ``Type: message``
exit_code      a non-zero exit without a traceback (``sys.exit(7)``, a C++ ``exit(1)``)
signal         killed by a signal phalanx did not send: SIGSEGV, SIGABRT, SIGBUS, SIGTERM...
killed         killed by SIGKILL that phalanx did not send, with no out-of-memory evidence
oom            killed by SIGKILL, and the cgroup's ``oom_kill`` count grew or the kernel log
               says it killed this pid for memory
hang           stopped by phalanx after it made no progress for ``--stall-timeout`` seconds
node_lost      its node stopped heartbeating (the agent died, the host went away)
=============  ==============================================================================

Apart from its kind, an exception or a signal is marked ``peer_error`` when its own message
says a peer went away (a Gloo connection closed or reset by the peer, NCCL's remote error,
the workers' store gone): the collective library's view of another rank's failure. The
job-wide order (``exits.causal_order``) puts such failures after every other, whichever
was reported first.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import replace

from phalanx.errors import signal_name
from phalanx.supervisor.exits import WorkerExit

KINDS = ("exception", "exit_code", "signal", "killed", "oom", "hang", "node_lost")

# torch.distributed's excepthook prefixes every line of a traceback with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[(?:rank|node)\d+\]: ")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s(.*))?$")
_EXCEPTION_NAME = re.compile(r"(Error|Exception|Interrupt|Exit|Warning|Failure)$")
_TRACEBACK = "Traceback (most recent call last):"
# What Gloo, NCCL and torch's TCPStore client say when the other end of a connection died
# or stopped answering: the failure is somebody else's.
_PEER_GONE = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|"
    r"failed to recv, got 0 bytes|ncclRemoteError|remote process exited|"
    r"NCCL communicator was aborted|"
    r"timed out waiting \d+ ?ms for (?:recv|send) operation|"
    r"watchdog caught collective operation timeout",
    re.IGNORECASE,
)


def exception_from(tail: Sequence[str]) -> str | None:
    """``"Type: message"`` of the traceback that ends ``tail`` (stderr's last lines), if any.

    The header may have scrolled out of a long traceback; then the last line alone counts
    when its name looks like an exception's (``...Error``, ``...Exception``, ...).
    """
    lines = [_RANK_PREFIX.sub("", line) for line in tail]
    lines = [line for line in lines if line.strip()]
    if not lines:
        return None
    headers = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if headers:
        # The first unindented line after the last header's frames is the exception, even
        # when the process printed more afterwards (NCCL's shutdown warnings, say).
        for line in lines[headers[-1] + 1 :]:
            if not line[:1].isspace():
                return line.strip() if _EXCEPTION_LINE.match(line) else None
        return None
    match = _EXCEPTION_LINE.match(lines[-1])
    if match is not None and _EXCEPTION_NAME.search(match.group(1)):
        return lines[-1].strip()
    return None



Rule = Callable[[WorkerExit, str, str], tuple[str, str] | None]


def _by_error_file(e: WorkerExit, oom: str, fatal: str) -> tuple[str, str] | None:
    if e.returncode > 0 and e.error_message:
        return "exception", e.error_message.strip().splitlines()[-1]
    return None


def _by_traceback(e: WorkerExit, oom: str, fatal: str) -> tuple[str, str] | None:
    # Python exits 1 after an uncaught exception; a traceback before another code was printed
    # by the program itself (traceback.print_exc(), then sys.exit(3)).
    found = exception_from(e.stderr_tail) if e.returncode == 1 else None
    return ("exception", found) if found else None


def _by_exit_code(e: WorkerExit, oom: str, fatal: str) -> tuple[str, str] | None:
    return ("exit_code", f"exit code {e.returncode}") if e.returncode > 0 else None


def _by_sigkill(e: WorkerExit, oom: str, fatal: str) -> tuple[str, str] | None:
    if e.returncode != -signal.SIGKILL:
        return None
    if oom:
        return "oom", f"killed by SIGKILL: out of memory ({oom})"
    return "killed", "killed by SIGKILL (not sent by phalanx; no out-of-memory evidence found)"


def _by_signal(e: WorkerExit, oom: str, fatal: str) -> tuple[str, str] | None:
    if e.returncode >= 0:
        return None
    where = f"; Python was at {fatal}" if fatal else ""
    return "signal", f"killed by {signal_name(-e.returncode)}{where}"


# First match wins.
RULES: tuple[Rule, ...] = (_by_error_file, _by_traceback, _by_exit_code, _by_sigkill, _by_signal)


def peer_error(exit_: WorkerExit) -> bool:
    """Whether a classified failure's own message says a peer went away: an exception (its
    line, its error file, or the traceback's last message) or a signal (the lines its
    process printed before, as NCCL's watchdog does before it aborts). A chosen exit code,
    a kill or a hang is never a peer's error."""
    if exit_.kind not in ("exception", "signal"):
        return False
    tail = list(exit_.stderr_tail)
    headers = [i for i, line in enumerate(tail) if line.strip().endswith(_TRACEBACK)]
    message = tail[headers[-1] + 1 :] if headers else tail
    evidence = [exit_.reason, exit_.error_message, *message]
    return any(_PEER_GONE.search(text) for text in evidence)


def classify(exit_: WorkerExit, *, oom_evidence: str = "", fatal_frame: str = "") -> WorkerExit:
    """``exit_`` with ``kind``, ``reason`` and ``peer_error`` filled in; unchanged when it
    did not fail on its own or is already classified (a hang, a record from another node)."""
    if not exit_.failed or exit_.kind:
        return exit_
    for rule in RULES:
        verdict = rule(exit_, oom_evidence, fatal_frame)
        if verdict is not None:
            kind, reason = verdict
            classified = replace(exit_, kind=kind, reason=reason)
            return replace(classified, peer_error=peer_error(classified))
    return exit_
