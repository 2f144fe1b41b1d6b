"""Worker exits as data, and the framed root-cause report."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class WorkerExit:
    rank: int
    local_rank: int
    host: str
    pid: int
    returncode: int  # negative: killed by that signal
    time: float  # wall clock, when the launcher noticed
    stopped_by_launcher: bool
    stderr_tail: tuple[str, ...] = ()
    error_message: str = ""  # from TORCHELASTIC_ERROR_FILE, when the worker wrote one
    log_dir: str = ""
    label: str = ""  # "rank3", or "node1" for a spawn owner
    node_rank: int = 0

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
        """For sentences: "rank 3 (local rank 1)", or "the spawn owner of node 1"."""
        if self.name.startswith("node"):
            return f"the spawn owner of node {self.rank}"
        return f"rank {self.rank} (local rank {self.local_rank})"

    @property
    def failed(self) -> bool:
        return self.returncode != 0 and not self.stopped_by_launcher

    @property
    def exit_code(self) -> int:
        """What a shell would report: the code, or 128+N for a death by signal N."""
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
        name = self.signal_name
        return f"killed by {name}" if name else f"exit code {self.returncode}"

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


def root_cause(exits: list[WorkerExit]) -> WorkerExit | None:
    failures = [e for e in exits if e.failed]
    return min(failures, key=lambda e: e.time) if failures else None


def format_report(exits: list[WorkerExit], attempts: int, width: int = 78, reason: str = "") -> str:
    """One framed summary: the root cause first, then the others marked as collateral."""
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
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(cause.time))
        lines += [
            f"phalanx: job failed after {attempts} attempt(s). Root cause: {cause.who} "
            f"on {cause.host} (node {cause.node_rank})",
            f"  pid {cause.pid}, {cause.describe_exit()}, at {when}",
            f"  logs: {cause.log_dir}",
        ]
        if cause.error_message:
            lines.append(f"  error: {cause.error_message}")
        if cause.stderr_tail:
            lines.append(
                "  last lines of its stderr (this error came from the worker, not phalanx):"
            )
            lines += [f"    {line}" for line in cause.stderr_tail]
    others = sorted((e for e in exits if e is not cause), key=lambda e: e.rank)
    if others:
        lines.append("-" * width)
        for other in others:
            if other.stopped_by_launcher:
                state = f"stopped by phalanx ({other.describe_exit()})"
            elif other.failed:
                state = f"also failed afterwards ({other.describe_exit()})"
            else:
                state = "finished (exit code 0)"
            lines.append(f"  {other.who} on {other.host} (node {other.node_rank}): {state}")
    lines.append(rule)
    return "\n".join(lines)
