"""A worker's exit as data (what the supervisor saw), and the message it left in its error file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from phalanx.errors import signal_name

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
        return signal_name(-self.returncode) if self.returncode < 0 else None

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
