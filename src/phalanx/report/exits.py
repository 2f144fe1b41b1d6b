"""Worker exits as data, their causal order, and the framed root-cause report."""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

# Failures with no exit status of their own: the job exits 1 for them.
_NO_CODE = frozenset({"hang", "node_lost"})


@dataclass(frozen=True)
class WorkerExit:
    rank: int
    local_rank: int
    host: str
    pid: int
    returncode: int  # negative: killed by that signal
    time: float  # wall clock, when the launcher noticed: for display only (see causal_order)
    stopped_by_launcher: bool
    stderr_tail: tuple[str, ...] = ()
    error_message: str = ""  # from TORCHELASTIC_ERROR_FILE, when the worker wrote one
    log_dir: str = ""
    label: str = ""  # "rank3", or "node1" for a spawn owner
    node_rank: int = 0
    kind: str = ""  # why it failed (phalanx.report.classify): exception, exit_code, signal, ... hang
    reason: str = ""  # one line: "ValueError: boom", "killed by SIGSEGV", "no progress for 30 s"
    stuck_state: str = ""  # SIGKILLed but still there: its state ("in state D (disk sleep)")
    # Ordering (causal_order): the store's sequence number when its node posted it (0: not
    # posted), its node's monotonic clock when noticed, and whether its own evidence says a
    # peer went away (classify.peer_error).
    seq: int = 0
    monotonic: float = 0.0
    peer_error: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> WorkerExit:
        """Rebuild one from ``to_json`` (e.g. a peer's failure read from the rendezvous store)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        tail = data.get("stderr_tail")
        values["stderr_tail"] = tuple(str(line) for line in tail) if isinstance(tail, list) else ()
        return cls(**values)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        return self.label or f"rank{self.rank}"

    @property
    def who(self) -> str:
        """For sentences: "rank 3 (local rank 1)", "the spawn owner of node 1", or "node 1"
        (a lost node)."""
        if self.kind == "node_lost":
            return f"node {self.node_rank}"
        if self.name.startswith("node"):
            return f"the spawn owner of node {self.rank}"
        return f"rank {self.rank} (local rank {self.local_rank})"

    @property
    def failed(self) -> bool:
        """It failed on its own -- or phalanx found it hung, or its node was lost."""
        return (self.returncode != 0 and not self.stopped_by_launcher) or self.kind in _NO_CODE

    @property
    def exit_code(self) -> int:
        """What a shell would report: the code, or 128+N for a death by signal N; 1 for a
        hang or a lost node (no exit of its own)."""
        if self.kind in _NO_CODE:
            return 1
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe_exit(self) -> str:
        if self.stuck_state:
            return f"could not be ended: still {self.stuck_state} after SIGKILL"
        name = self.signal_name
        return f"killed by {name}" if name else f"exit code {self.returncode}"

    @property
    def summary(self) -> str:
        """One line for logs: the classified reason, or how it exited."""
        return self.reason or self.describe_exit()

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = asdict(self)
        data["stderr_tail"] = list(self.stderr_tail)
        data["exit_code"] = self.exit_code
        data["signal"] = self.signal_name
        return data


def read_error_file(path: Path) -> str:
    """The message a worker left in its error file (torch's ``@record`` format), if any."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    message = data.get("message", "") if isinstance(data, dict) else ""
    if isinstance(message, dict):
        return str(message.get("message", ""))
    return str(message)


def causal_order(exits: Iterable[WorkerExit]) -> list[WorkerExit]:
    """The failures among ``exits``, the root cause first, ordered without comparing the
    clocks of different hosts (a host whose clock is behind would win any such comparison):

    1. a failure whose own evidence says a peer went away (``peer_error``: a Gloo peer reset)
       comes after every failure that does not -- it is collateral even when it was noticed
       and reported first;
    2. then the order the store saw them in (``seq``, an atomic counter taken when a node
       posted its failure). A node's other failed ranks, which it did not post (its cause was
       at least as early), take its cause's number;
    3. within one node, its monotonic clock.

    Where neither tells failures apart (no peer error, the same sequence number), only
    exits of one node remain tied, and its own clock orders them.
    """
    failures = [e for e in exits if e.failed]
    node_seq: dict[int, int] = {}
    for e in failures:
        if e.seq:
            node_seq[e.node_rank] = min(e.seq, node_seq.get(e.node_rank, e.seq))

    def key(e: WorkerExit) -> tuple[bool, float, int, float]:
        seq = e.seq or node_seq.get(e.node_rank) or math.inf  # inf: never posted (no store)
        return (e.peer_error, seq, e.node_rank, e.monotonic)

    return sorted(failures, key=key)


def root_cause(exits: Iterable[WorkerExit]) -> WorkerExit | None:
    """The first of ``causal_order``, or None when no worker failed on its own."""
    ordered = causal_order(exits)
    return ordered[0] if ordered else None


def format_report(
    exits: list[WorkerExit],
    attempts: int,
    width: int = 78,
    reason: str = "",
    details: Sequence[str] = (),
) -> str:
    """One framed summary: the root cause first (its kind in the header line), ``details``
    under it (a hang's analysis), then every other rank, marked as collateral."""
    cause = root_cause(exits)
    rule = "=" * width
    lines = [rule]
    if cause is None:
        lines.append(
            f"phalanx: job stopped after {attempts} attempt(s); no worker failed on its own"
        )
        if reason:
            lines.append(f"  reason: {reason}")
    else:
        lines += _cause_lines(cause, attempts)
    lines += [f"  {line}" for line in details]
    others = sorted((e for e in exits if e is not cause), key=lambda e: (e.node_rank, e.rank))
    if others:
        lines.append("-" * width)
        if cause is not None:
            lines.append("  collateral (stopped because of the root cause, or failed after it):")
        for other in others:
            if other.failed:
                state = f"also failed afterwards ({other.summary})"
            elif other.stopped_by_launcher:
                state = f"stopped by phalanx ({other.describe_exit()})"
            else:
                state = "finished (exit code 0)"
            lines.append(f"  {other.who} on {other.host} (node {other.node_rank}): {state}")
    lines.append(rule)
    return "\n".join(lines)


def _cause_lines(cause: WorkerExit, attempts: int) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(cause.time))
    where = (
        f" ({cause.host})"
        if cause.kind == "node_lost"
        else f" on {cause.host} (node {cause.node_rank})"
    )
    kind = f" [{cause.kind}]" if cause.kind else ""
    lines = [
        f"phalanx: job failed after {attempts} attempt(s). Root cause: {cause.who}{where}{kind}"
    ]
    if cause.reason:
        lines.append(f"  {cause.reason}")
    if cause.kind == "node_lost":
        lines.append(f"  noticed at {when}")
        return lines
    how = cause.describe_exit()
    if cause.kind == "hang":
        how = f"then stopped by phalanx ({how})"
    lines.append(f"  pid {cause.pid}, {how}, at {when}")
    if cause.log_dir:
        lines.append(f"  logs: {cause.log_dir}")
    if cause.error_message and cause.error_message.strip() != cause.reason:
        lines.append(f"  error: {cause.error_message}")
    if cause.stderr_tail and cause.kind != "hang":
        lines.append("  last lines of its stderr (this error came from the worker, not phalanx):")
        lines += [f"    {line}" for line in cause.stderr_tail]
    return lines


def report_json(exits: list[WorkerExit], attempts: int, **extra: object) -> dict[str, object]:
    """``report.json``: the root cause with its kind, the collateral ranks, every exit."""
    cause = root_cause(exits)
    return {
        "attempts": attempts,
        "kind": cause.kind if cause is not None else None,
        "root_cause": cause.to_json() if cause is not None else None,
        "collateral": sorted(e.rank for e in exits if e is not cause and not e.failed),
        "also_failed": sorted(e.rank for e in exits if e is not cause and e.failed),
        **extra,
        "exits": [e.to_json() for e in exits],
    }
